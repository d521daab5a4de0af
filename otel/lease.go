package otel

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/lease"
)

// The instruments of a lease.Backend's counts, which [LeaseMetrics]
// reports: each is read from [lease.Backend.Stats] at every collection.
const (
	// MetricLeaseDecisions counts the Consumes of leased keys a
	// lease.Backend decided in process, allowed or denied
	// ([lease.Stats].Decisions).
	MetricLeaseDecisions = "sluice.lease.decisions"
	// MetricLeaseRefills counts the store calls that took leases
	// ([lease.Stats].Refills): over MetricLeaseDecisions, the store calls
	// a decision costs.
	MetricLeaseRefills = "sluice.lease.refills"
	// MetricLeaseTokens counts tokens by [AttrLeaseTokenState]: "leased",
	// taken from the store by refills; "spent", admitted from leases;
	// "lapsed", lost unspent, their lease ended or dropped.
	MetricLeaseTokens = "sluice.lease.tokens"
	// MetricLeaseKeys is the keys holding a lease now ([lease.Stats].Keys).
	MetricLeaseKeys = "sluice.lease.keys"
)

// AttrLeaseTokenState is what became of the tokens [MetricLeaseTokens]
// counts: "leased", "spent" or "lapsed".
const AttrLeaseTokenState = attribute.Key("sluice.lease.token_state")

// LeaseMetrics reports b's counts ([lease.Backend.Stats]) as metrics on
// the meter of opts ([WithMeterProvider], else the global one), read at
// each collection: [MetricLeaseDecisions], [MetricLeaseRefills] and
// [MetricLeaseTokens], counters, and [MetricLeaseKeys], a gauge. These
// are the leases' own counts: a [Wrap] above the lease.Backend counts
// each decision as any other, one below it sees only the refills. It
// returns a function that stops the reporting. An instrument the meter
// cannot make, or a callback it cannot register, goes to otel.Handle, and
// the others still report.
func LeaseMetrics(b *lease.Backend, opts ...Option) (stop func() error) {
	m := meter(newConfig(opts))
	var made []metric.Observable
	counter := func(name, desc, unit string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		if err != nil {
			otel.Handle(err)
			return nil
		}
		made = append(made, c)
		return c
	}
	decisions := counter(MetricLeaseDecisions, "Consumes of leased keys decided in process.", "{decision}")
	refills := counter(MetricLeaseRefills, "Store calls that took leases.", "{call}")
	tokens := counter(MetricLeaseTokens, "Tokens leased from the store, spent from leases, and lapsed unspent.", "{token}")
	keys, err := m.Int64ObservableGauge(MetricLeaseKeys, metric.WithDescription("Keys holding a lease now."), metric.WithUnit("{key}"))
	if err != nil {
		otel.Handle(err)
		keys = nil
	} else {
		made = append(made, keys)
	}
	if len(made) == 0 {
		return func() error { return nil }
	}
	state := func(s string) metric.ObserveOption {
		return metric.WithAttributeSet(attribute.NewSet(AttrLeaseTokenState.String(s)))
	}
	leased, spent, lapsed := state("leased"), state("spent"), state("lapsed")
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := b.Stats()
		if decisions != nil {
			o.ObserveInt64(decisions, s.Decisions)
		}
		if refills != nil {
			o.ObserveInt64(refills, s.Refills)
		}
		if tokens != nil {
			o.ObserveInt64(tokens, s.Leased, leased)
			o.ObserveInt64(tokens, s.Spent, spent)
			o.ObserveInt64(tokens, s.Lapsed, lapsed)
		}
		if keys != nil {
			o.ObserveInt64(keys, int64(s.Keys))
		}
		return nil
	}, made...)
	if err != nil {
		otel.Handle(err)
		return func() error { return nil }
	}
	return reg.Unregister
}
