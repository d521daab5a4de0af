// Package sharding splits a hot key's limit across sub-buckets on distinct
// Redis Cluster slots, exactly: a [ratelimit.Backend] decorator.
//
// A global limit ("the whole public API: 50,000 requests a second") or one
// huge tenant puts every decision on one key, so on one slot and one
// Redis master. [New] wraps a backend with [Rule]s that name such keys;
// each one's bucket becomes n sub-buckets, each with 1/n of every
// bandwidth, and a decision goes to one of them:
//
//	backend, err := sharding.New(redisBackend, sharding.Keys(6, "global"))
//
// Keys no rule matches go straight to the wrapped backend, as they are.
//
// # Exactness
//
// Sub-bucket i of n gets, of every bandwidth, Capacity/n and
// InitialTokens/n, rounded down, plus one each for the first remainder
// sub-buckets, and 1/n of the refill: a greedy rate (the token bucket's
// default, GCRA's, the leaky bucket's) as RefillTokens every n times
// RefillPeriod, exactly 1/n with nothing to round; an interval refill or
// a window's count as RefillTokens/n each period, split as Capacity is.
// The sub-buckets add up to the configured limit exactly, for every
// algorithm and every bandwidth, and no token is lost or made by
// rounding. Each sub-bucket is an ordinary bucket in the store, exact
// however many processes share it, so over any interval of T seconds the
// key admits at most what its config allows, C + r·T for a bandwidth of
// capacity C refilling r a second: never more, for any n and any
// retries.
//
// A config with less than n to split (a Capacity below n, or an interval
// or window RefillTokens below n) uses fewer sub-buckets, as many as each
// bandwidth can give one token, the first ones. A plan change that moves
// a key across that line starts the sub-buckets it adds full, as new
// buckets, and leaves the tokens of those it drops unused. A valid
// config whose split is not (rarely: an interval bandwidth at the edge of
// [ratelimit.MaxScaled] whose shares round to a longer fill) is an error
// wrapping [ratelimit.ErrInvalidConfig] that names the sub-bucket and the
// field, before any sub-bucket is touched.
//
// What sharding costs is the other way: a request is rejected when the
// sub-buckets it tried were empty, even if another still had tokens (a
// false rejection). docs/sharding.md derives the bound and gives the
// measured rates.
//
// # Routing
//
// A Consume, Estimate or Reserve goes to one sub-bucket, chosen at random
// or by the rule's affinity hash ([Rule.WithAffinity]); if it rejects the
// request, the next sub-buckets are tried in turn, up to the rule's
// retries ([DefaultRetries] unless [Rule.WithRetries]). A sub-bucket that
// fails (an error wrapping [ratelimit.ErrBackendUnavailable],
// [ratelimit.ErrTimeout] or [ratelimit.ErrKeyRejected]), or that a fail
// policy inside this decorator denied (a Degraded rejection), does not
// count as a retry: the request moves on to the next one, so a stalled
// master fails only the sub-buckets on it. A caller's own context ending
// ends the call at once, with the context's error. [Hooks.Retried],
// set with [WithHooks], is told each time a request moves on, and why.
//
// The Decision reports the whole key: Limit is the configured capacity of
// the binding bandwidth; Remaining is an estimate, the sub-buckets seen
// scaled up to the whole (their Remaining times the key's Limit over
// their Limits); RetryAfter is the soonest among the sub-buckets tried;
// ResetAfter the latest among those seen; RefillAfter that of the
// sub-bucket that decided.
//
// # Ops
//
//   - Consume, Estimate and Reserve route as above. A request for more
//     tokens than the smallest sub-bucket holds (the smallest Capacity
//     divided by n, rounded down) is an error wrapping
//     [ratelimit.ErrInvalidRequest], never a silent over-admission. A
//     reservation's wait is that of one sub-bucket, refilling at r/n:
//     waiters spread over the sub-buckets, so together they get r.
//   - ConsumeUpTo takes what it can from the first sub-bucket and goes on
//     to the next ones, within the retries, for the rest.
//   - Add spreads its tokens over the sub-buckets as the config is split,
//     starting where a Consume would; each sub-bucket keeps what fits.
//     Its decision sums every sub-bucket's, as Inspect's does.
//   - Reset, Replace and Inspect go to every sub-bucket at once. Inspect
//     reports the sum of their Remaining, allowed if any one has a token.
//     Reset and Replace are not atomic across sub-buckets: an error may
//     leave some done and some not; both may be retried.
//
// # Permits
//
// A concurrency limit is never split: N permits spread over sub-buckets
// would not be exact (an acquire denied by the sub-bucket it went to
// while another had room, a release sent to a sub-bucket that does not
// hold the permit). [Backend.DoPermit] passes every permit call to the
// Backend below as it is, for the key as it is, even a key a rule splits:
// a hot key's permits stay on one slot, and its concurrency limit exact.
//
// # Placement
//
// On a backend that implements [ratelimit.SlotMapper] (the Redis
// backends, and failpolicy over one), sub-buckets are named so that
// sub-bucket i lands at the centre of the i-th of n equal parts of the
// slot space: on a cluster of up to n masters that split the slots evenly
// (as redis-cli --cluster create does), every master serves at least one.
// Names depend only on the key, i and n, never on the topology, so every
// process agrees on them, and a failover or a resharding moves a
// sub-bucket without renaming it (which would reset its counts). Changing
// a rule's n renames them all: the new sub-buckets start full.
// [Backend.Slots] shows where a hot key's sub-buckets live. A name is
// found by solving for the bytes that put it on its slot, not by
// searching: naming a new key's n sub-buckets costs a few hashes of the
// key and the names' own bytes, O(n) for a key of a given length.
//
// A sub-bucket's key is the hot key, a NUL byte, and a suffix of digits
// and dots; [Backend.Do] rejects a key of that form whose part before
// its last NUL is a hot key, even one a rule matches too, with an error
// wrapping [ratelimit.ErrInvalidKey] that changes nothing, so that no
// caller can reach a sub-bucket but through its hot key. Every key of up
// to [ratelimit.MaxKeyLen] bytes can be split: a key too long for its
// sub-keys to hold it whole (over 499 bytes) has sub-keys that hold its
// first 458 bytes, a NUL byte, and a suffix of digits and dots that
// starts with a 40-digit digest of the whole key and a dot. Where a rule
// may split such a key, Do rejects every key of that form too.
//
// # With failpolicy
//
// Put the fail policy inside, between this decorator and the backend:
//
//	policy, err := failpolicy.Wrap(redisBackend, failpolicy.Closed)
//	backend, err := sharding.New(policy, sharding.Keys(6, "global"))
//
// The policy then judges each sub-bucket's call under its own deadline
// and keeps a circuit breaker per master, so the sub-buckets on a stalled
// master fail fast and this decorator moves on to the others. In Closed
// mode nothing is admitted beyond the limit. Open and Local admit a
// degraded sub-bucket's request as those modes do.
//
// [ratelimit.Stack] puts the two in that order whatever order they are
// given in, with [Layer] and failpolicy.Layer:
//
//	backend, err := ratelimit.Stack(redisBackend,
//		sharding.Layer(sharding.Keys(6, "global")),
//		failpolicy.Layer(failpolicy.Closed),
//	)
package sharding

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

// DefaultRetries is how many other sub-buckets a request tries after the
// first rejects it, unless [Rule.WithRetries] says otherwise.
const DefaultRetries = 1

// MaxSubBuckets is the most sub-buckets a key may be split into.
const MaxSubBuckets = 64

// Backend is a [ratelimit.Backend] that splits the hot keys its rules
// match into sub-buckets of the Backend it wraps. It is safe for
// concurrent use. Make one with [New].
type Backend struct {
	next  ratelimit.Backend
	exact map[string]hotKey // the Keys rules' keys
	// exactLens has bit l set if a Keys rule has a key of l bytes: most
	// keys that pass through skip the map by their length.
	exactLens [ratelimit.MaxKeyLen/64 + 1]uint64
	rules     []*Rule // the Prefix and Match rules, in order
	// cuts is set if a rule may split a key longer than maxWholeLen, whose
	// sub-keys keep only its first cutLen bytes: isSubKey then rejects
	// every key of their form.
	cuts   bool
	namer  namer
	splits splitCache
	hooks  Hooks
}

// hotKey is a Keys rule's key: its rule and its sub-keys, named once.
type hotKey struct {
	rule  *Rule
	names []string
}

var (
	_ ratelimit.Backend       = (*Backend)(nil)
	_ ratelimit.PermitBackend = (*Backend)(nil)
)

// New returns a Backend that splits the keys its rules match, and passes
// every other key to next; opts are the [Rule]s and [WithHooks]. A key
// matched by a Keys rule is that rule's; any other, the first Prefix or
// Match rule's that matches it, in the order given. A nil option or a bad
// rule (no keys, n out of range, retries of n or more, a key that is empty
// or longer than [ratelimit.MaxKeyLen], a key in two Keys rules) is an
// error wrapping [ratelimit.ErrInvalidConfig] that names it: "rule i" is
// the i-th rule, counting rules only.
func New(next ratelimit.Backend, opts ...Option) (*Backend, error) {
	if next == nil {
		return nil, fmt.Errorf("%w: sharding: the next Backend is nil", ratelimit.ErrInvalidConfig)
	}
	b := &Backend{next: next}
	var rules []Rule
	for i, opt := range opts {
		switch o := opt.(type) {
		case Rule:
			rules = append(rules, o)
		case *Rule:
			if o == nil {
				return nil, fmt.Errorf("%w: sharding: option %d is a nil *Rule", ratelimit.ErrInvalidConfig, i)
			}
			rules = append(rules, *o)
		case hooksOption:
			b.hooks = o.h
		default:
			return nil, fmt.Errorf("%w: sharding: option %d is nil", ratelimit.ErrInvalidConfig, i)
		}
	}
	if s, ok := next.(ratelimit.SlotMapper); ok {
		if _, ok := s.Slot("k"); ok {
			b.namer.slots = s
		}
	}
	if err := b.addRules(rules); err != nil {
		return nil, err
	}
	return b, nil
}

// addRules checks rules and indexes them. rules is New's own copy, which
// the Backend keeps pointers into: the caller's slice is not shared.
func (b *Backend) addRules(rules []Rule) error {
	owner := map[string]int{}
	for i := range rules {
		r := &rules[i]
		if err := r.check(i); err != nil {
			return err
		}
		if r.keys == nil {
			b.rules = append(b.rules, r)
			b.cuts = true
			continue
		}
		if b.exact == nil {
			b.exact = map[string]hotKey{}
		}
		for _, k := range r.keys {
			if j, ok := owner[k]; ok {
				if j == i {
					return fmt.Errorf("%w: sharding: rule %d: Keys has key %q twice", ratelimit.ErrInvalidConfig, i, k)
				}
				return fmt.Errorf("%w: sharding: rule %d: key %q is rule %d's already", ratelimit.ErrInvalidConfig, i, k, j)
			}
			owner[k] = i
			b.exact[k] = hotKey{rule: r, names: b.namer.names(k, r.n, false)}
			b.exactLens[len(k)/64] |= 1 << (len(k) % 64)
			b.cuts = b.cuts || len(k) > maxWholeLen
		}
	}
	for i, r := range rules {
		for _, k := range r.keys {
			if b.isSubKey(k) {
				return fmt.Errorf("%w: sharding: rule %d: key %q has the form of a sub-bucket's key of another hot key, which Do rejects", ratelimit.ErrInvalidConfig, i, k)
			}
		}
	}
	return nil
}

// hot returns the rule that splits key and its sub-keys, or a nil rule.
// The sub-keys are nil for a key that is no bucket's (empty, or longer
// than MaxKeyLen).
func (b *Backend) hot(key string) (*Rule, []string) {
	if h, ok := b.exactKey(key); ok {
		return h.rule, h.names
	}
	if r := b.matching(key); r != nil {
		if checkKey(key) != nil {
			return r, nil
		}
		return r, b.namer.names(key, r.n, true)
	}
	return nil, nil
}

// ruleOf returns the rule that splits key, or nil, without naming its
// sub-keys (which a key matched by a Prefix or Match rule must compute).
func (b *Backend) ruleOf(key string) *Rule {
	if h, ok := b.exactKey(key); ok {
		return h.rule
	}
	return b.matching(key)
}

// exactKey returns the Keys rules' entry for key, if it has one.
func (b *Backend) exactKey(key string) (hotKey, bool) {
	if len(key) > ratelimit.MaxKeyLen || b.exactLens[len(key)/64]&(1<<(len(key)%64)) == 0 {
		return hotKey{}, false
	}
	h, ok := b.exact[key]
	return h, ok
}

// matching returns the first Prefix or Match rule that takes key, or nil.
func (b *Backend) matching(key string) *Rule {
	for _, r := range b.rules {
		if r.matches(key) {
			return r
		}
	}
	return nil
}

// Splits reports whether a rule splits key into sub-buckets. The lease
// package asks it: a lease of a split key is gathered from several
// sub-buckets, whose Remaining tells it nothing exact about any one.
func (b *Backend) Splits(key string) bool { return b.ruleOf(key) != nil }

// Unwrap returns the Backend that b splits keys over, so that a
// decorator over b (the otel module's, naming the store in its spans)
// can find the store below.
func (b *Backend) Unwrap() ratelimit.Backend { return b.next }

// Do applies req to the bucket at key: split over its sub-buckets if a
// rule matches key, else as the next Backend does; see the package doc
// for what each op means over sub-buckets.
func (b *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if b.isSubKey(key) {
		return b.reject(key, cfg, req)
	}
	r, names := b.hot(key)
	if r == nil {
		return b.next.Do(ctx, key, cfg, req)
	}
	return b.split(ctx, key, cfg, req, r, names)
}

// DoPermit implements [ratelimit.PermitBackend]: it passes every permit
// call to the next Backend as it is, for key as it is, even a key a rule
// splits (see "Permits" in the package doc). If the next Backend holds no
// permits, the call fails with an error wrapping [errors.ErrUnsupported].
func (b *Backend) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	return ratelimit.Permits(b.next).DoPermit(ctx, key, lim, req)
}

// reject refuses a key of a sub-bucket's form, after bad input.
func (b *Backend) reject(key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	return ratelimit.Decision{}, subKeyError(key)
}

// subKeyError is the error for a key of a sub-bucket's form.
func subKeyError(key string) error {
	return fmt.Errorf("%w: sharding: key %q names a sub-bucket of a hot key", ratelimit.ErrInvalidKey, key)
}

// split applies req to the hot key's sub-buckets; names are its
// sub-keys, which every key CheckRequest passes has. It is apart from Do
// so that a key passing through pays for none of its frame.
func (b *Backend) split(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request, r *Rule, names []string) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	c := &call{b: b, ctx: ctx, key: key, cfg: cfg, req: req, rule: r}
	c.n = parts(cfg, r.n)
	c.names = names[:c.n]
	if err := c.check(); err != nil {
		return ratelimit.Decision{}, err
	}
	if ctxerr.Done(ctx) != nil {
		return ratelimit.Decision{}, c.cancelled(nil)
	}
	switch req.Op {
	case ratelimit.Consume, ratelimit.Estimate, ratelimit.Reserve:
		return c.route()
	case ratelimit.ConsumeUpTo:
		return c.gather()
	case ratelimit.Add:
		return c.spread()
	}
	return c.all()
}

// isSubKey reports whether key has the form of a hot key's sub-key: a
// key a rule splits, sep, and a suffix of digits and dots; or, where a
// rule may split a key too long to keep whole, cutLen bytes, sep, and a
// suffix of digits and dots that starts with digestLen digits and a dot
// (whether a rule splits a key with those first bytes cannot be told).
// Such a key is never split or passed on, even if a rule matches it too,
// so that no call reaches a sub-bucket but through its hot key.
func (b *Backend) isSubKey(key string) bool {
	i := strings.LastIndexByte(key, sep[0])
	if i < 0 || !isSuffix(key[i+1:]) {
		return false
	}
	return b.cuts && i == cutLen && strings.IndexByte(key[i+1:], '.') == digestLen || b.ruleOf(key[:i]) != nil
}

// isSuffix reports whether s is digits and dots, as a sub-key's suffix is.
func isSuffix(s string) bool {
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '.' {
			return false
		}
	}
	return s != ""
}

// call is one decision on a hot key.
type call struct {
	b     *Backend
	ctx   context.Context
	key   string
	cfg   ratelimit.Config
	req   ratelimit.Request
	rule  *Rule
	n     int      // sub-buckets in use
	names []string // their keys
}

func (c *call) what() string {
	return fmt.Sprintf("sharding: %v on key %q", c.req.Op, c.key)
}

// check returns what makes the request unfit for the key's sub-buckets,
// before any of them is touched: more tokens than the smallest holds, or
// a config whose split gives some sub-bucket an invalid config.
func (c *call) check() error {
	switch c.req.Op {
	case ratelimit.Consume, ratelimit.Estimate, ratelimit.Reserve:
		if most := minShare(c.cfg, c.n); c.req.Tokens > most {
			return fmt.Errorf("%w: %s: Tokens %d is more than one of its %d sub-buckets holds (%d)", ratelimit.ErrInvalidRequest, c.what(), c.req.Tokens, c.n, most)
		}
	}
	if c.b.splits.valid(c.cfg, c.n) {
		return nil
	}
	if i, err := checkSplit(c.cfg, c.n); err != nil {
		// err names the field, but with the sub-bucket's numbers, not the
		// config's: say whose they are.
		why := strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidConfig.Error()+": ")
		return fmt.Errorf("%w: %s: the config split %d ways is invalid for sub-bucket %d of %d: %s", ratelimit.ErrInvalidConfig, c.what(), c.n, i, c.n, why)
	}
	c.b.splits.checked(c.cfg, c.n)
	return nil
}

// first is the sub-bucket a request goes to first.
func (c *call) first() int {
	if c.rule.affinity != nil {
		return int(c.rule.affinity(c.ctx, c.key) % uint64(c.n))
	}
	return rand.IntN(c.n)
}

// sub applies req to sub-bucket i.
func (c *call) sub(i int, req ratelimit.Request) (ratelimit.Decision, error) {
	return c.b.next.Do(c.ctx, c.names[i], subConfig(c.cfg, c.n, i), req)
}

// outcome is what a sub-bucket's answer means for the call.
type outcome uint8

const (
	decided  outcome = iota // the sub-bucket decided
	skipped                 // it failed, or a fail policy denied for it: try another
	finished                // the call ends with this error
)

// judge says what a sub-bucket's answer means, and turns an error that
// ends the call into the call's own. A decision stands even if the
// caller's context has ended since (the store applied it); anything that
// would move the call on to another sub-bucket ends it instead.
func (c *call) judge(d ratelimit.Decision, err error) (outcome, error) {
	degraded := err == nil && d.Degraded && !d.Allowed
	switch {
	case err == nil && !degraded:
		return decided, nil
	case ctxerr.Ended(c.ctx, err):
		return finished, c.cancelled(err)
	case degraded:
		return skipped, nil
	case errors.Is(err, ratelimit.ErrBackendUnavailable), errors.Is(err, ratelimit.ErrTimeout), errors.Is(err, ratelimit.ErrKeyRejected):
		return skipped, err
	}
	return finished, c.failed(err)
}

// cancelled is the call's error once the caller's context has ended:
// the context's, then err, what the sub-buckets said, if not nil. err is
// kept as text alone when it wraps a store failure's sentinel, which a
// sub-bucket's call may return as the context ends: the caller gave up,
// the store did not fail, and a fail policy or breaker over this
// decorator must not count it as failing.
func (c *call) cancelled(err error) error {
	if errors.Is(err, ratelimit.ErrBackendUnavailable) || errors.Is(err, ratelimit.ErrTimeout) {
		err = errors.New(err.Error())
	}
	return ctxerr.Caller(c.ctx, c.what(), err)
}

// failed wraps a sub-bucket's error (or the join of several) as the
// call's: "<sentinel>: sharding: <op> on key "k": <error>", with the
// sentinel of the error's first that has one.
func (c *call) failed(err error) error {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return fmt.Errorf("%w: %s: %w", s, c.what(), err)
		}
	}
	return fmt.Errorf("%s: %w", c.what(), err)
}

// sentinels are the errors a sub-bucket's error may wrap, in the order
// failed looks for them.
var sentinels = []error{
	ratelimit.ErrInvalidConfig, ratelimit.ErrInvalidRequest, ratelimit.ErrInvalidKey,
	ratelimit.ErrTimeout, ratelimit.ErrBackendUnavailable, ratelimit.ErrKeyRejected,
}

// route sends a Consume, Estimate or Reserve to one sub-bucket after
// another until one allows it or the retries are spent.
func (c *call) route() (ratelimit.Decision, error) {
	var v view
	start, rejected := c.first(), 0
	var why RetryReason // why the request left the last sub-bucket
	for j := 0; j < c.n && rejected <= c.rule.retries; j++ {
		if j > 0 {
			c.retried(why)
		}
		d, err := c.sub((start+j)%c.n, c.req)
		switch o, err := c.judge(d, err); o {
		case finished:
			return ratelimit.Decision{}, err
		case skipped:
			v.skip(d, err)
			why = skipReason(err)
			continue
		}
		v.see(d)
		if d.Allowed {
			return v.whole(c.cfg, d), nil
		}
		rejected++
		why = RetryRejected
	}
	return c.result(&v)
}

// retried tells the hooks that the request moves on to another
// sub-bucket, and why. It is called before the next sub-bucket is, and
// only then, so that a request its first sub-bucket decides, or whose
// last try spent the retries, makes no call.
func (c *call) retried(why RetryReason) {
	if h := c.b.hooks.Retried; h != nil {
		h(c.ctx, c.key, why)
	}
}

// skipReason is why a request moved on from a sub-bucket that [call.judge]
// skipped with err: it failed, or with no error, a fail policy denied.
func skipReason(err error) RetryReason {
	if err != nil {
		return RetryFailed
	}
	return RetryDegraded
}

// result is the call's outcome when no sub-bucket allowed it: the
// denial of the sub-buckets that decided, or if none did, a fail
// policy's denial, or the error of the last sub-bucket that failed.
func (c *call) result(v *view) (ratelimit.Decision, error) {
	switch {
	case v.seen > 0:
		return v.denial(c.cfg), nil
	case v.degraded != nil:
		d := *v.degraded
		d.Limit = limitOf(c.cfg, d.Bandwidth)
		return d, nil
	}
	return ratelimit.Decision{}, c.failed(v.err)
}

// gather takes up to req.Tokens with ConsumeUpTo from one sub-bucket after
// another, within the retries.
func (c *call) gather() (ratelimit.Decision, error) {
	var v view
	want, got := c.req.Tokens, int64(0)
	start, visited := c.first(), 0
	var last ratelimit.Decision // of the last sub-bucket that gave tokens
	var why RetryReason         // why the request left the last sub-bucket
	for j := 0; j < c.n && visited <= c.rule.retries && got < want; j++ {
		if j > 0 {
			c.retried(why)
		}
		req := c.req
		req.Tokens = want - got
		d, err := c.sub((start+j)%c.n, req)
		switch o, err := c.judge(d, err); o {
		case finished:
			return ratelimit.Decision{}, err
		case skipped:
			v.skip(d, err)
			why = skipReason(err)
			continue
		}
		v.see(d)
		visited++
		why = RetryRejected
		if d.Consumed > 0 {
			got += d.Consumed
			last = d
		}
	}
	if visited == 0 {
		return c.result(&v)
	}
	if got == 0 {
		return v.denial(c.cfg), nil
	}
	last.Allowed, last.Consumed = true, got
	return v.whole(c.cfg, last), nil
}

// spread adds req.Tokens over the sub-buckets, split as the config is,
// starting where a Consume would. A sub-bucket whose share is none (with
// fewer tokens than sub-buckets) is inspected instead, so that the
// decision sums every sub-bucket, as the other ops' do.
func (c *call) spread() (ratelimit.Decision, error) {
	start := c.first()
	subs := make([]int, c.n)
	for j := range subs {
		subs[j] = (start + j) % c.n
	}
	return c.fanOut(subs, func(j int) ratelimit.Request {
		req := c.req
		if req.Tokens = share(c.req.Tokens, c.n, j); req.Tokens == 0 {
			req.Op = ratelimit.Inspect
		}
		return req
	})
}

// all applies a Reset, Replace or Inspect to every sub-bucket at once.
func (c *call) all() (ratelimit.Decision, error) {
	subs := make([]int, c.n)
	for i := range subs {
		subs[i] = i
	}
	return c.fanOut(subs, func(int) ratelimit.Request { return c.req })
}

// fanOut sends the k-th of subs the request req(k), all at once, and sums
// their decisions as Inspect does. Every sub-bucket is tried; the errors
// are joined.
func (c *call) fanOut(subs []int, req func(k int) ratelimit.Request) (ratelimit.Decision, error) {
	decisions := make([]ratelimit.Decision, len(subs))
	errs := make([]error, len(subs))
	done := make(chan struct{}, len(subs))
	for k, i := range subs {
		go func() {
			decisions[k], errs[k] = c.sub(i, req(k))
			done <- struct{}{}
		}()
	}
	for range subs {
		<-done
	}
	err := errors.Join(errs...)
	if ctxerr.Done(c.ctx) != nil {
		return ratelimit.Decision{}, c.cancelled(err)
	}
	if err != nil {
		return ratelimit.Decision{}, c.failed(err)
	}
	return sum(c.cfg, decisions), nil
}
