package oncall

import "strings"

// A query is one PromQL expression of docs/observability.md, run over the
// whole run with query_range. The expressions here are the ones the
// document shows, byte for byte: results.txt and the figures come from
// them and nothing else.
type query struct {
	// id names the query in results.txt.
	id string
	// what says what it measures, for results.txt.
	what string
	// expr is the PromQL.
	expr string
	// gauge marks the queries on sluice_rate_limit_rejected_keys, which
	// reports the previous whole minute: they are read at a phase's end
	// as well as its middle, and left out if the metric is missing.
	gauge bool
}

// The label names the OpenTelemetry Prometheus exporter makes of the otel
// module's attributes (dots become underscores); semconv's error.type
// becomes error_type. Seen on /metrics, not guessed: results.txt lists
// the series the run scraped.
const (
	lRoute  = "sluice_rate_limit_route"
	lClass  = "sluice_rate_limit_key_class"
	lResult = "sluice_rate_limit_result"
	lState  = "sluice_rate_limit_breaker_state"
	lCause  = "error_type"
)

// The on-call queries. Rates are over 30s, which needs a scrape interval
// of 15s or less (two samples a window); the run scrapes every second.
// The per-key query takes the increase over 1m to match the gauge's
// minute.
var (
	qRejections = query{
		id:   "rejections_by_route_class",
		what: "rejections per second, by route and key class",
		expr: `sum by (sluice_rate_limit_route, sluice_rate_limit_key_class) (
  rate(sluice_rate_limit_decisions_total{sluice_rate_limit_result="rejected"}[30s])
)`,
	}
	qRejectedKeys = query{
		id:    "rejected_keys_by_route_class",
		what:  "distinct keys rejected in the previous whole minute, by route and key class",
		gauge: true,
		expr: `sum by (sluice_rate_limit_route, sluice_rate_limit_key_class) (
  sluice_rate_limit_rejected_keys
)`,
	}
	qPerKey = query{
		id:    "rejections_per_rejected_key",
		what:  "rejections in the last minute per key rejected in the previous whole minute, by route and key class",
		gauge: true,
		expr: `sum by (sluice_rate_limit_route, sluice_rate_limit_key_class) (
  increase(sluice_rate_limit_decisions_total{sluice_rate_limit_result="rejected"}[1m])
)
/
sum by (sluice_rate_limit_route, sluice_rate_limit_key_class) (
  sluice_rate_limit_rejected_keys > 0
)`,
	}
	qCustomerShare = query{
		id:   "customer_rejected_share_by_route",
		what: "share of the customer class's decisions rejected, by route (0 to 1)",
		expr: `sum by (sluice_rate_limit_route) (
  rate(sluice_rate_limit_decisions_total{sluice_rate_limit_key_class="customer", sluice_rate_limit_result="rejected"}[30s])
)
/
sum by (sluice_rate_limit_route) (
  rate(sluice_rate_limit_decisions_total{sluice_rate_limit_key_class="customer"}[30s])
)`,
	}
	qRejectedCustomers = query{
		id:    "rejected_customers_by_route",
		what:  "distinct customers rejected in the previous whole minute, by route",
		gauge: true,
		expr: `sum by (sluice_rate_limit_route) (
  sluice_rate_limit_rejected_keys{sluice_rate_limit_key_class="customer"}
)`,
	}
	qP99 = query{
		id:   "p99_store_decision_seconds",
		what: "p99 of the decisions the store made (not degraded), in seconds",
		expr: `histogram_quantile(0.99,
  sum by (le) (
    rate(sluice_rate_limit_decision_duration_seconds_bucket{sluice_rate_limit_result=~"allowed|rejected"}[30s])
  )
)`,
	}
	qDegraded = query{
		id:   "degraded_by_cause",
		what: "decisions the fail policy made instead of the store, per second, by cause",
		expr: `sum by (error_type) (
  rate(sluice_rate_limit_degraded_total[30s])
)`,
	}
	qBreakers = query{
		id:   "breakers_not_closed",
		what: "circuit breakers not closed, by state",
		expr: `sum by (sluice_rate_limit_breaker_state) (
  sluice_rate_limit_breakers
)`,
	}
)

// allQueries is the order of results.txt.
var allQueries = []query{qRejections, qRejectedKeys, qPerKey, qCustomerShare, qRejectedCustomers, qP99, qDegraded, qBreakers}

// seriesName names a result series by its labels' values, the route
// first: "/v1/search customer", "timeout", "open"; "all" for a series
// with no labels.
func seriesName(metric map[string]string) string {
	var parts []string
	for _, l := range []string{lRoute, lClass, lCause, lState} {
		if v, ok := metric[l]; ok {
			parts = append(parts, v)
		}
	}
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, " ")
}
