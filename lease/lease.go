package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

// ErrClosed is returned for a leased key's Consume after [Backend.Close].
// It wraps [ratelimit.ErrBackendUnavailable].
var ErrClosed = fmt.Errorf("%w: lease: backend closed", ratelimit.ErrBackendUnavailable)

// sweepEvery is how often the sweep drops the leases of keys idle for
// as long: their tokens have lapsed or soon will.
const sweepEvery = time.Second

// Backend leases tokens of hot keys from the Backend it wraps. Create one
// with [New] or [Layer]; stop it with [Backend.Close].
type Backend struct {
	next   ratelimit.Backend
	rules  rules
	o      options
	splits func(key string) bool // nil: nothing below splits a key

	leases *xsync.Map[string, *lease]
	keys   atomic.Int64 // leases held, never above o.maxKeys
	gone   counts       // the counts of leases the sweep dropped
	goneMu sync.Mutex

	origin time.Time

	// shut is set by Close, under mu: a refill starts under mu's read
	// lock, so none starts after Close waits for them.
	shut      atomic.Bool
	mu        sync.RWMutex
	refills   sync.WaitGroup
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

var (
	_ ratelimit.Backend       = (*Backend)(nil)
	_ ratelimit.PermitBackend = (*Backend)(nil)
)

// New returns next with the keys the rules in opts match leased. It
// starts a sweep; stop it with [Backend.Close]. Without a rule, or with a
// bad option, it returns an error wrapping [ratelimit.ErrInvalidConfig].
func New(next ratelimit.Backend, opts ...Option) (*Backend, error) {
	if next == nil {
		return nil, fmt.Errorf("%w: lease: the next Backend is nil", ratelimit.ErrInvalidConfig)
	}
	o := options{target: DefaultTarget, maxShare: DefaultMaxShare, maxKeys: DefaultMaxKeys, refillTimeout: DefaultRefillTimeout}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: lease: an Option is nil", ratelimit.ErrInvalidConfig)
		}
		opt.apply(&o)
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	b := &Backend{
		next:   next,
		rules:  newRules(o.rules),
		o:      o,
		splits: splitter(next),
		leases: xsync.NewMap[string, *lease](),
		origin: time.Now(),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if o.clock != nil {
		b.origin = o.clock.Now()
	}
	go b.sweep()
	return b, nil
}

// splitter finds the Backend below next that splits keys, if any.
func splitter(next ratelimit.Backend) func(string) bool {
	for b := next; b != nil; {
		if s, ok := b.(interface{ Splits(key string) bool }); ok {
			return s.Splits
		}
		u, ok := b.(interface{ Unwrap() ratelimit.Backend })
		if !ok {
			return nil
		}
		b = u.Unwrap()
	}
	return nil
}

// Unwrap returns the Backend b leases from.
func (b *Backend) Unwrap() ratelimit.Backend { return b.next }

// Close stops the sweep and waits for the refills in flight. The leases'
// unspent tokens are not given back to the store (see the package doc:
// a refund would break the bound); they lapse. Later Consumes on leased
// keys return [ErrClosed]; other calls still pass through. Close does not
// close the wrapped Backend.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock() // no refill is starting, and none starts from now on
		b.shut.Store(true)
		b.mu.Unlock()
		close(b.stop)
		<-b.done
		b.refills.Wait()
	})
	return nil
}

// Do implements [ratelimit.Backend]. A Consume of a key the rules match is
// decided from this instance's lease of the key's tokens, refilled from
// the store when it runs low; every other call passes through. An Add,
// Reset or Replace of a leased key drops this instance's lease first.
func (b *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if req.Op != ratelimit.Consume || req.Ago != 0 {
		switch req.Op {
		case ratelimit.Add, ratelimit.Reset, ratelimit.Replace:
			if b.rules.take(key) {
				b.forget(key)
			}
		}
		return b.next.Do(ctx, key, cfg, req)
	}
	fp := cfg.Fingerprint()
	l, ok := b.leases.Load(key)
	var c *checked
	if ok {
		c = l.checked.Load()
	}
	if c == nil || c.fp != fp || req.Tokens < 1 || req.Tokens > c.most {
		// A new key, or a config this key's lease has not seen: check.
		if !ok && !b.rules.take(key) {
			return b.next.Do(ctx, key, cfg, req)
		}
		var d ratelimit.Decision
		if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
			return d, err
		}
		split := b.splits != nil && b.splits(key)
		if err := Leasable(cfg, split); err != nil {
			return d, fmt.Errorf("%w (key %q)", err, key)
		}
		most := b.maxLease(&cfg)
		if req.Tokens > most {
			return b.next.Do(ctx, key, cfg, req) // more than a lease holds: the store decides
		}
		if !ok {
			if l = b.leaseOf(key, split); l == nil {
				return b.next.Do(ctx, key, cfg, req) // at the key cap: unleased
			}
		}
		l.checked.Store(&checked{fp: fp, most: most})
	}
	if ctx.Err() != nil {
		return ratelimit.Decision{}, ctxerr.Caller(ctx, fmt.Sprintf("lease: Consume on key %q", key), nil)
	}
	if b.shut.Load() {
		return ratelimit.Decision{}, ErrClosed
	}
	return b.consume(ctx, key, l, &cfg, fp, req.Tokens)
}

// DoPermit implements [ratelimit.PermitBackend]: a permit call passes
// through to the next Backend untouched, on a leased key or not, and after
// Close too: leases are for rates. If the next Backend holds no permits,
// the call fails with an error wrapping [errors.ErrUnsupported].
func (b *Backend) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	return ratelimit.Permits(b.next).DoPermit(ctx, key, lim, req)
}

// checked is a config a key's Consumes were checked on: its fingerprint,
// and the most tokens a lease of it holds.
type checked struct {
	fp   uint64
	most int64
}

// Leasable returns nil if a key of cfg can be leased, else an error
// wrapping [ratelimit.ErrInvalidConfig] that names the field and says
// why. split says whether sharding splits the key. A token bucket of
// Greedy refill, GCRA and LeakyBucket can be leased: their tokens lapse at
// the refill rate. A FixedWindow of one bandwidth can, on a key not split:
// its tokens lapse when the window ends. SlidingWindowLog and
// SlidingWindowCounter cannot: they count a request when it is charged,
// not when it is admitted, so tokens spent later than they were charged
// would leave the window early. Nor can a token bucket of Interval or
// IntervalAligned refill, whose tokens arrive at once.
func Leasable(cfg ratelimit.Config, split bool) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: lease: "+format, append([]any{ratelimit.ErrInvalidConfig}, args...)...)
	}
	switch cfg.Algorithm {
	case ratelimit.TokenBucket:
		for i, bw := range cfg.Bandwidths {
			if bw.Refill != ratelimit.Greedy {
				return bad("Config.Bandwidths[%d].Refill: a lease of a bandwidth of %v refill cannot be bounded, as its tokens arrive at once; lease Greedy refill only", i, bw.Refill)
			}
		}
	case ratelimit.GCRA, ratelimit.LeakyBucket:
	case ratelimit.FixedWindow:
		switch {
		case len(cfg.Bandwidths) != 1:
			return bad("Config.Bandwidths: a FixedWindow lease lapses when its window ends, which a decision tells for one bandwidth only; it has %d", len(cfg.Bandwidths))
		case split:
			return bad("Config.Algorithm: a FixedWindow lease of a key sharding splits is gathered from sub-buckets whose windows end at different times")
		}
	default:
		return bad("Config.Algorithm: %v counts a request when the store is charged, not when it is admitted; a lease spent later would leave the window early", cfg.Algorithm)
	}
	return nil
}

// maxLease is the most tokens one lease of cfg takes.
func (b *Backend) maxLease(cfg *ratelimit.Config) int64 {
	return max(1, int64(float64(cfg.MinCapacity())*b.o.maxShare))
}

// now is the time in µs since b was made.
func (b *Backend) now() int64 {
	if b.o.clock != nil {
		return b.o.clock.Now().Sub(b.origin).Microseconds()
	}
	return time.Since(b.origin).Microseconds()
}

// leaseOf returns key's lease, made if absent, or nil at the key cap.
// split says whether sharding splits key.
func (b *Backend) leaseOf(key string, split bool) *lease {
	if l, ok := b.leases.Load(key); ok {
		return l
	}
	if b.keys.Add(1) > int64(b.o.maxKeys) {
		b.keys.Add(-1)
		return nil
	}
	l, loaded := b.leases.LoadOrStore(key, &lease{split: split})
	if loaded {
		b.keys.Add(-1)
	}
	return l
}

// forget drops key's lease: its tokens lapse.
func (b *Backend) forget(key string) {
	if l, ok := b.leases.Load(key); ok {
		l.mu.Lock()
		l.dropAll()
		l.mu.Unlock()
	}
}

// consume decides a Consume of n tokens of key, whose lease is l.
func (b *Backend) consume(ctx context.Context, key string, l *lease, cfg *ratelimit.Config, fp uint64, n int64) (ratelimit.Decision, error) {
	counted := false
	for {
		l.mu.Lock()
		if l.dead { // the sweep dropped it: take the key's new one
			split := l.split
			l.mu.Unlock()
			if l = b.leaseOf(key, split); l == nil {
				return b.next.Do(ctx, key, *cfg, ratelimit.Request{Tokens: n})
			}
			continue
		}
		if l.fp != fp {
			l.dropAll()
			l.fp = fp
		}
		// The time under the lock: a lease's tokens lapse as time goes
		// on, so a time read before waiting for the lock could spend
		// some that lapsed meanwhile.
		now := b.now()
		l.used = now
		if !counted {
			l.demand += n
			l.c.decisions++
			counted = true
		}
		if d, ok := l.take(cfg, n, now); ok {
			b.ahead(ctx, key, l, cfg, now)
			l.mu.Unlock()
			return d, nil
		}
		if now < l.denyUntil {
			d := l.denial(cfg, n, now)
			l.mu.Unlock()
			return d, nil
		}
		call, mine := l.call, false
		if call == nil {
			if call = b.startRefill(ctx, key, l, cfg, n, now); call == nil {
				l.mu.Unlock()
				return ratelimit.Decision{}, ErrClosed
			}
			mine = true
		}
		l.mu.Unlock()
		select {
		case <-call.done:
		case <-ctx.Done():
			if mine {
				l.mu.Lock()
				l.leave(call)
				l.mu.Unlock()
			}
			return ratelimit.Decision{}, ctxerr.Caller(ctx, fmt.Sprintf("lease: Consume on key %q", key), nil)
		}
		switch {
		case call.err != nil:
			return ratelimit.Decision{}, call.err
		case mine:
			// The refill this call started gave it its tokens first, or
			// took too few: either way it is decided.
			if call.answer.Allowed {
				l.mu.Lock()
				if !l.dead && l.fp == fp {
					b.ahead(ctx, key, l, cfg, b.now())
				}
				l.mu.Unlock()
			}
			return call.answer, nil
		}
	}
}

// ahead sends a refill ahead of need if l holds half the last refill or
// less, none is in flight, and the store has not said it is empty. Called
// with l.mu held.
func (b *Backend) ahead(ctx context.Context, key string, l *lease, cfg *ratelimit.Config, now int64) {
	if l.call == nil && !l.short && now >= l.denyUntil && l.held(cfg, now) <= l.k/2 {
		b.startRefill(ctx, key, l, cfg, 0, now)
	}
}

// startRefill sends a refill of l for a call that needs need tokens (0: a
// refill ahead of need), and returns it; nil once b is closed. Called
// with l.mu held.
func (b *Backend) startRefill(ctx context.Context, key string, l *lease, cfg *ratelimit.Config, need, now int64) *refill {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.shut.Load() {
		return nil
	}
	k := l.size(need, b.maxLease(cfg), b.o.target, now)
	call := &refill{done: make(chan struct{}), need: need, asked: k}
	l.call = call
	l.c.refills++
	own := *cfg
	own.Bandwidths = slices.Clone(cfg.Bandwidths) // the call outlives Do
	fp := l.fp
	split := l.split
	b.refills.Go(func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.o.refillTimeout)
		d, err := b.next.Do(rctx, key, own, ratelimit.Request{Op: ratelimit.ConsumeUpTo, Tokens: k})
		if err != nil && ctxerr.Done(rctx) != nil && !errors.Is(err, ratelimit.ErrInvalidConfig) {
			err = fmt.Errorf("%w: lease: refill of key %q: no answer in %v", ratelimit.ErrTimeout, key, b.o.refillTimeout)
		}
		cancel()
		l.mu.Lock()
		l.land(call, &own, fp, d, err, now, split)
		l.call = nil
		l.mu.Unlock()
		close(call.done)
	})
	return call
}

// sweep drops, every sweepEvery, the leases of keys idle for as long.
func (b *Backend) sweep() {
	defer close(b.done)
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		idle := b.now() - sweepEvery.Microseconds()
		b.leases.Range(func(key string, l *lease) bool {
			l.mu.Lock()
			drop := l.call == nil && l.used <= idle
			if drop {
				l.dropAll()
				l.dead = true
				b.goneMu.Lock()
				b.gone.add(&l.c)
				b.goneMu.Unlock()
			}
			l.mu.Unlock()
			if drop {
				b.leases.Delete(key)
				b.keys.Add(-1)
			}
			return true
		})
	}
}

// Stats are a Backend's counts since [New].
type Stats struct {
	// Decisions are the Consumes of leased keys decided here, allowed or
	// denied, whether or not they waited for a refill.
	Decisions int64
	// Refills are the store calls that took leases (ConsumeUpTo).
	Refills int64
	// Leased, Spent and Lapsed are tokens: taken from the store by
	// refills, admitted from leases, and lost unspent (they lapsed, or
	// their lease was dropped).
	Leased, Spent, Lapsed int64
	// Keys is the keys holding a lease now.
	Keys int
}

// Stats returns b's counts: [Stats.Refills] / [Stats.Decisions] is the
// store calls per decision.
func (b *Backend) Stats() Stats {
	b.goneMu.Lock()
	c := b.gone
	b.goneMu.Unlock()
	keys := 0
	b.leases.Range(func(_ string, l *lease) bool {
		l.mu.Lock()
		if !l.dead {
			c.add(&l.c)
			keys++
		}
		l.mu.Unlock()
		return true
	})
	return Stats{Decisions: c.decisions, Refills: c.refills, Leased: c.leased, Spent: c.spent, Lapsed: c.lapsed, Keys: keys}
}

// counts are a lease's Stats.
type counts struct {
	decisions, refills, leased, spent, lapsed int64
}

func (c *counts) add(o *counts) {
	c.decisions += o.decisions
	c.refills += o.refills
	c.leased += o.leased
	c.spent += o.spent
	c.lapsed += o.lapsed
}

// decay is the tokens bw refills in dt µs, rounded up; math.MaxInt64 if
// more.
func decay(bw *ratelimit.Bandwidth, dt int64) int64 {
	p := uint64(bw.PeriodMicros())
	if dt <= 0 {
		return 0
	}
	if p == 0 {
		return math.MaxInt64
	}
	hi, lo := bits.Mul64(uint64(bw.RefillTokens), uint64(dt))
	if hi >= p {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, p)
	if r > 0 {
		q++
	}
	return int64(min(q, math.MaxInt64))
}

// lasts is the longest time in µs in which bw refills at most slack
// tokens (decay(bw, t) ≤ slack), or a time too long to matter.
func lasts(bw *ratelimit.Bandwidth, slack int64) int64 {
	if slack < 0 {
		return -1
	}
	hi, lo := bits.Mul64(uint64(slack), uint64(bw.PeriodMicros()))
	if hi >= uint64(bw.RefillTokens) {
		return math.MaxInt64 / 2
	}
	q, _ := bits.Div64(hi, lo, uint64(bw.RefillTokens))
	return int64(min(q, math.MaxInt64/2))
}

// micros is d in whole µs, rounded up.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
