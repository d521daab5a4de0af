package lease

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

const (
	// DefaultTarget is how long a lease aims to last at a key's observed
	// rate unless [WithTarget] says otherwise.
	DefaultTarget = 20 * time.Millisecond
	// DefaultMaxShare is the largest lease, as a share of the key's
	// smallest capacity, unless [WithMaxShare] says otherwise.
	DefaultMaxShare = 0.1
	// DefaultMaxKeys is the most keys a Backend holds leases for unless
	// [WithMaxKeys] says otherwise.
	DefaultMaxKeys = 10_000
	// DefaultRefillTimeout bounds a refill's store call unless
	// [WithRefillTimeout] says otherwise.
	DefaultRefillTimeout = time.Second
)

// An Option configures [New]. A [Rule] is one too.
type Option interface{ apply(*options) }

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

type options struct {
	rules         []Rule
	target        time.Duration
	maxShare      float64
	maxKeys       int
	refillTimeout time.Duration
	clock         ratelimit.Clock
}

// WithTarget sets how long a lease aims to last: a refill takes the
// tokens this instance spent on the key in that long, at the rate it has
// seen, within [WithMaxShare]. Longer leases make fewer store calls, and
// hold more tokens away from the other instances. It must be positive.
func WithTarget(d time.Duration) Option {
	return optionFunc(func(o *options) { o.target = d })
}

// WithMaxShare sets the largest lease as a share of the key's smallest
// capacity, above 0 and at most 0.5: what one instance can hold away from
// the others, so that a quiet key does not hoard. A Consume of more
// tokens than the largest lease goes to the store unleased.
func WithMaxShare(share float64) Option {
	return optionFunc(func(o *options) { o.maxShare = share })
}

// WithMaxKeys caps the keys a Backend holds leases for, at least 1. A key
// the rules match when the cap is reached is decided by the store,
// unleased, until the sweep drops the lease of a key idle for a second.
func WithMaxKeys(n int) Option {
	return optionFunc(func(o *options) { o.maxKeys = n })
}

// WithRefillTimeout bounds each refill's call to the store, which runs on
// after the request that started it has gone (a fail policy below puts
// its own, shorter deadline on it). It must be positive.
func WithRefillTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) { o.refillTimeout = d })
}

// WithClock makes the Backend read time from c instead of the monotonic
// clock: for tests, with the memory backend on the same clock. Only the
// time between two readings counts.
func WithClock(c ratelimit.Clock) Option {
	return optionFunc(func(o *options) { o.clock = c })
}

// Rule chooses the keys to lease. Make one with [Keys], [Prefix] or
// [Match]; pass it to [New] or [Layer] as an Option. Keys no rule matches
// pass through to the store.
type Rule struct {
	keys   []string
	prefix string
	match  func(key string) bool
}

func (r Rule) apply(o *options) { o.rules = append(o.rules, r) }

// Keys returns a rule that leases each of keys.
func Keys(keys ...string) Rule { return Rule{keys: append([]string{}, keys...)} }

// Prefix returns a rule that leases every key starting with prefix.
func Prefix(prefix string) Rule { return Rule{prefix: prefix} }

// Match returns a rule that leases every key for which match returns
// true. It is called on every Consume of a key no [Keys] rule took, so it
// must be fast and safe for concurrent use.
func Match(match func(key string) bool) Rule { return Rule{match: match} }

// check returns what is wrong with rule i, or nil.
func (r *Rule) check(i int) error {
	kinds := 0
	for _, set := range []bool{r.keys != nil, r.prefix != "", r.match != nil} {
		if set {
			kinds++
		}
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: lease: rule %d: "+format, append([]any{ratelimit.ErrInvalidConfig, i}, args...)...)
	}
	switch {
	case kinds == 0:
		return bad("it matches no key: make it with Keys (with at least one key), Prefix (with a non-empty prefix) or Match (with a non-nil func)")
	case kinds > 1:
		return bad("it has more than one of keys, prefix and match")
	case r.keys != nil && len(r.keys) == 0:
		return bad("Keys has no key")
	case len(r.prefix) > ratelimit.MaxKeyLen:
		return bad("Prefix is %d bytes; a key may have at most %d", len(r.prefix), ratelimit.MaxKeyLen)
	}
	for j, k := range r.keys {
		if k == "" || len(k) > ratelimit.MaxKeyLen {
			return bad("key %d is %d bytes; a key has 1 to %d", j, len(k), ratelimit.MaxKeyLen)
		}
	}
	return nil
}

// rules is the rules of a Backend, in the form a lookup takes.
type rules struct {
	exact    map[string]bool
	prefixes []string
	matches  []func(string) bool
}

func newRules(rs []Rule) rules {
	var out rules
	for _, r := range rs {
		switch {
		case r.keys != nil:
			if out.exact == nil {
				out.exact = make(map[string]bool)
			}
			for _, k := range r.keys {
				out.exact[k] = true
			}
		case r.prefix != "":
			out.prefixes = append(out.prefixes, r.prefix)
		default:
			out.matches = append(out.matches, r.match)
		}
	}
	return out
}

// take reports whether a rule leases key.
func (r *rules) take(key string) bool {
	if r.exact[key] {
		return true
	}
	for _, p := range r.prefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	for _, m := range r.matches {
		if m(key) {
			return true
		}
	}
	return false
}

// check returns what is wrong with o, or nil.
func (o *options) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: lease: "+format, append([]any{ratelimit.ErrInvalidConfig}, args...)...)
	}
	if len(o.rules) == 0 {
		return bad("no rule: pass Keys, Prefix or Match, or every key would pass through")
	}
	for i := range o.rules {
		if err := o.rules[i].check(i); err != nil {
			return err
		}
	}
	switch {
	case o.target <= 0:
		return bad("WithTarget must be positive, got %v", o.target)
	case !(o.maxShare > 0 && o.maxShare <= 0.5):
		return bad("WithMaxShare must be above 0 and at most 0.5, got %v", o.maxShare)
	case o.maxKeys < 1:
		return bad("WithMaxKeys must be at least 1, got %d", o.maxKeys)
	case o.refillTimeout <= 0:
		return bad("WithRefillTimeout must be positive, got %v", o.refillTimeout)
	}
	return nil
}

// Layer returns a [ratelimit.Layer] for [ratelimit.Stack] that wraps the
// layer below it with [New] and opts. Its place is
// [ratelimit.PlaceLeasing]: above sharding, so that a split key's lease
// is gathered from its sub-buckets, and below telemetry, which then sees
// every decision, leased or not. Bad options are New's errors, which
// Stack returns.
func Layer(opts ...Option) ratelimit.Layer {
	return layer{opts: append([]Option(nil), opts...)}
}

type layer struct{ opts []Option }

func (layer) Place() ratelimit.Place { return ratelimit.PlaceLeasing }

func (l layer) Wrap(next ratelimit.Backend) (ratelimit.Backend, error) {
	b, err := New(next, l.opts...)
	if err != nil {
		return nil, err // not b: a nil *Backend in the interface would not be nil
	}
	return b, nil
}
