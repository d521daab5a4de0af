// Package failpolicy keeps a limiter deciding, fast, when its store does
// not: a [ratelimit.Backend] decorator with a hard per-decision deadline, a
// circuit breaker, and a mode that decides while the store is away.
//
//	policy, err := failpolicy.Wrap(redisBackend, failpolicy.Local, failpolicy.WithInstances(4))
//	limiter := ratelimit.New(policy)
//
// # Deadline
//
// Every decision's context gets a deadline, 5 ms unless [WithTimeout] says
// otherwise, even when the caller's context has none; a caller's earlier
// deadline stands. The deadline is hard: each call runs in a goroutine of
// its own, and the decision returns at the deadline whatever the client
// does. The client should still end a call at its context's deadline, or
// calls left behind pile up: see docs/operations.md for the go-redis and
// rueidis settings, which their LowLatency helpers make.
//
// # Failures
//
// A decision fails when the store returns an error wrapping
// [ratelimit.ErrTimeout] or [ratelimit.ErrBackendUnavailable]: a timeout, a
// refused or broken connection, a server error. The [Mode] then decides
// it, marking the decision Degraded. Errors about the call itself (an
// invalid key, config or request) go straight back to the caller, as does
// the context error of a caller that cancelled.
//
// A call that timed out may still have been applied by the store: a
// paused Redis runs the queued scripts when it resumes. The decorator
// never retries, so a decision is never charged twice.
//
// # Circuit breaker
//
// After [WithBreaker]'s count of consecutive failures (5 by default) the
// breaker opens: for the cool-down (1s by default) no decision goes to the
// store, and the mode decides them at once. Then one decision probes the
// store; if it answers, the breaker closes and decisions go to the store
// again, and if not, it opens for another cool-down.
//
// # Hooks
//
// [Hooks] report degraded decisions and breaker changes, for metrics and
// logs.
package failpolicy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

// Mode says how a [Backend] decides when the store cannot.
type Mode uint8

const (
	// Open allows every request: availability over the limit.
	Open Mode = iota
	// Closed denies every request, with a RetryAfter of [WithRetryAfter]:
	// the limit over availability.
	Closed
	// Local decides in an in-process bucket per key that holds this
	// instance's share of each bandwidth: its Capacity and RefillTokens
	// divided by [WithInstances]'s count, rounded down, at least 1. With
	// every instance doing so, the service as a whole admits at most its
	// limit while the store is away.
	Local
	numModes
)

var modeNames = [...]string{"Open", "Closed", "Local"}

// String returns the mode's Go name.
func (m Mode) String() string {
	if m < numModes {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Defaults.
const (
	// DefaultTimeout is the per-decision deadline unless [WithTimeout] sets one.
	DefaultTimeout = 5 * time.Millisecond
	// DefaultFailures is how many consecutive failures open the breaker
	// unless [WithBreaker] says otherwise.
	DefaultFailures = 5
	// DefaultCoolDown is how long an open breaker keeps decisions from the
	// store unless [WithBreaker] says otherwise.
	DefaultCoolDown = time.Second
)

// ErrBreakerOpen is the cause [Hooks.Degraded] gets for a decision that
// the open breaker kept from the store.
var ErrBreakerOpen = errors.New("failpolicy: circuit breaker open")

// Hooks are called by a [Backend] as things happen; each may be nil. They
// run on the deciding goroutine, or on the probe's when it ends after its
// caller has had its decision, so they must be quick, safe for concurrent
// use, and must not call the Backend.
type Hooks struct {
	// Degraded is called for each decision the mode made instead of the
	// store, with the reason: the store's error, or [ErrBreakerOpen].
	Degraded func(ctx context.Context, key string, mode Mode, cause error)
	// BreakerChanged is called when the breaker changes state.
	BreakerChanged func(from, to BreakerState)
}

// Backend is a [ratelimit.Backend] that sends decisions to another under a
// deadline and a circuit breaker, and decides by its [Mode] when that one
// fails. It is safe for concurrent use. Create it with [Wrap]; if the mode
// is Local, call [Backend.Close] when done.
type Backend struct {
	next       ratelimit.Backend
	mode       Mode
	timeout    time.Duration
	retryAfter time.Duration
	instances  int64
	hooks      Hooks
	clock      ratelimit.Clock
	local      *memory.Backend // for Local
	breaker    breaker
}

var _ ratelimit.Backend = (*Backend)(nil)

// options are what the Options set before Wrap checks them.
type options struct {
	timeout    time.Duration
	failures   int
	coolDown   time.Duration
	retryAfter time.Duration
	instances  int
	hooks      Hooks
	clock      ratelimit.Clock
}

// Option configures a [Backend].
type Option func(*options)

// WithTimeout sets the per-decision deadline (default [DefaultTimeout]);
// it must be positive.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// WithBreaker sets how many consecutive failures open the breaker (at
// least 1; default [DefaultFailures]) and how long it stays open before a
// probe (positive; default [DefaultCoolDown]).
func WithBreaker(failures int, coolDown time.Duration) Option {
	return func(o *options) { o.failures, o.coolDown = failures, coolDown }
}

// WithRetryAfter sets the RetryAfter of a Closed mode's denials (positive;
// default: the breaker's cool-down).
func WithRetryAfter(d time.Duration) Option {
	return func(o *options) { o.retryAfter = d }
}

// WithInstances sets how many instances share each limit, so that the
// Local mode gives each the share 1/n (at least 1; default 1: each instance
// the whole limit).
func WithInstances(n int) Option {
	return func(o *options) { o.instances = n }
}

// WithHooks sets the [Hooks].
func WithHooks(h Hooks) Option {
	return func(o *options) { o.hooks = h }
}

// WithClock makes the breaker and the Local mode's buckets read time from
// c instead of the process's clock; tests pass a fake one.
func WithClock(c ratelimit.Clock) Option {
	return func(o *options) { o.clock = c }
}

// Wrap returns a Backend that decides with next, and by mode when next
// fails. A bad option is an error wrapping [ratelimit.ErrInvalidConfig]
// that names it.
func Wrap(next ratelimit.Backend, mode Mode, opts ...Option) (*Backend, error) {
	o := options{timeout: DefaultTimeout, failures: DefaultFailures, coolDown: DefaultCoolDown, instances: 1}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case next == nil:
		return nil, invalid("the next Backend is nil")
	case mode >= numModes:
		return nil, invalid("mode %v is not Open, Closed or Local", mode)
	case o.timeout <= 0:
		return nil, invalid("WithTimeout %v is not positive", o.timeout)
	case o.failures < 1 || o.failures > 1<<30:
		return nil, invalid("WithBreaker failures %d is not between 1 and 2^30", o.failures)
	case o.coolDown <= 0:
		return nil, invalid("WithBreaker cool-down %v is not positive", o.coolDown)
	case o.retryAfter < 0:
		return nil, invalid("WithRetryAfter %v is negative", o.retryAfter)
	case o.instances < 1:
		return nil, invalid("WithInstances %d is less than 1", o.instances)
	}
	if o.retryAfter == 0 {
		o.retryAfter = o.coolDown
	}
	if o.clock == nil {
		o.clock = systemClock{}
	}
	b := &Backend{
		next: next, mode: mode, timeout: o.timeout, retryAfter: o.retryAfter,
		instances: int64(o.instances), hooks: o.hooks, clock: o.clock,
		breaker: breaker{threshold: int32(o.failures), coolDown: int64(o.coolDown)},
	}
	if mode == Local {
		b.local = memory.New(memory.WithClock(o.clock))
	}
	return b, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: failpolicy: "+format, append([]any{ratelimit.ErrInvalidConfig}, args...)...)
}

// systemClock is the process's clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Close releases the Local mode's buckets. It is safe to call more than
// once, and does nothing for the other modes. It does not close the next
// Backend.
func (b *Backend) Close() error {
	if b.local != nil {
		return b.local.Close()
	}
	return nil
}

// Breaker returns the circuit breaker's state.
func (b *Backend) Breaker() BreakerState {
	return BreakerState(b.breaker.state.Load())
}

// Do decides req with the next Backend under the deadline, or by the mode
// if the breaker is open or the next Backend fails; see the package doc.
func (b *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	ok, probe, t := b.breaker.allow(b.now)
	b.report(t)
	if !ok {
		return b.degrade(ctx, key, cfg, req, ErrBreakerOpen)
	}
	wait, stopWait := context.WithTimeout(ctx, b.timeout)
	defer stopWait()
	var r result
	if probe {
		// The probe gets the cool-down to answer, not the deadline: a
		// store coming back may need a new connection and the script
		// loaded before it answers, and on a busy machine that takes
		// longer than a decision may wait. Its caller waits only the
		// deadline, and the probe judges the store when it ends.
		store, stopStore := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(b.breaker.coolDown))
		r = b.ask(wait, store, stopStore, key, cfg, req, true)
	} else {
		r = b.ask(wait, wait, func() {}, key, cfg, req, false)
		r.verdict = b.judge(r.err, errors.Is(ctx.Err(), context.Canceled), false)
	}
	switch {
	case r.verdict == answered:
		return r.d, nil
	case r.verdict == noVerdict, errors.Is(ctx.Err(), context.Canceled):
		return r.d, r.err
	}
	return b.degrade(ctx, key, cfg, req, r.err)
}

// verdict is what a call says of the store.
type verdict uint8

const (
	answered  verdict = iota // it answered
	failed                   // it timed out or failed
	noVerdict                // the call was bad, or its caller gave up
)

// judge records what a call's error says of the store in the breaker;
// cancelled says that the caller gave up, which a probe's caller cannot.
func (b *Backend) judge(err error, cancelled, probe bool) verdict {
	switch {
	case err == nil:
		b.report(b.breaker.succeeded(probe))
		return answered
	case cancelled,
		!errors.Is(err, ratelimit.ErrTimeout) && !errors.Is(err, ratelimit.ErrBackendUnavailable):
		b.breaker.abandoned(probe)
		return noVerdict
	}
	b.report(b.breaker.failed(probe, b.now()))
	return failed
}

// result is what the next Backend returned, and what it says of the store.
type result struct {
	d       ratelimit.Decision
	err     error
	verdict verdict
}

// ask asks the next Backend under store's deadline, and returns when it
// answers or when wait is done, whichever comes first. Both Redis clients
// end a call at its context's deadline on most paths, but not on all:
// rueidis, opening a connection to a server that stalled or closing one,
// waits up to a second. So the call runs in a goroutine of its own, on a
// copy of cfg's bandwidths that it may keep; stopStore runs when it ends.
// A call left behind ends when its client gives up, and the breaker keeps
// such calls few. A probe judges the store itself, when it ends; ask
// returns its verdict, or failed if it is still out.
func (b *Backend) ask(wait, store context.Context, stopStore context.CancelFunc, key string, cfg ratelimit.Config, req ratelimit.Request, probe bool) result {
	cfg.Bandwidths = slices.Clone(cfg.Bandwidths)
	done := make(chan result, 1)
	go func() {
		defer stopStore()
		var r result
		r.d, r.err = b.next.Do(store, key, cfg, req)
		if probe {
			r.verdict = b.judge(r.err, false, true)
		}
		done <- r
	}()
	select {
	case r := <-done:
		return r
	case <-wait.Done():
		select {
		case r := <-done: // it answered just in time
			return r
		default:
		}
		return result{
			err:     fmt.Errorf("%w: failpolicy: no answer within the deadline: %w", ratelimit.ErrTimeout, wait.Err()),
			verdict: failed,
		}
	}
}

func (b *Backend) now() int64 { return b.clock.Now().UnixNano() }

// report tells the hook of a change of the breaker's state.
func (b *Backend) report(t transition) {
	if t.from != t.to && b.hooks.BreakerChanged != nil {
		b.hooks.BreakerChanged(t.from, t.to)
	}
}

// degrade decides req by the mode, because of cause. Bad input is still
// an error, and so are the ops that change a bucket without deciding
// (Add, Reset, Replace): no mode can carry them out.
func (b *Backend) degrade(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request, cause error) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	switch req.Op {
	case ratelimit.Add, ratelimit.Reset, ratelimit.Replace:
		if cause == ErrBreakerOpen {
			cause = fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, cause)
		}
		return ratelimit.Decision{}, cause
	}
	if b.hooks.Degraded != nil {
		b.hooks.Degraded(ctx, key, b.mode, cause)
	}
	d := ratelimit.Decision{Degraded: true, Limit: cfg.MinCapacity()}
	switch b.mode {
	case Open:
		d.Allowed = true
		if req.Op != ratelimit.Estimate && req.Op != ratelimit.Inspect {
			d.Consumed = req.Tokens
		}
	case Closed:
		d.RetryAfter = b.retryAfter
	case Local:
		local, err := b.local.Do(ctx, key, Share(cfg, b.instances), req)
		if err != nil {
			// The share cannot be decided (the local store is full or
			// closed): deny, as Closed would.
			d.RetryAfter = b.retryAfter
			return d, nil
		}
		local.Degraded = true
		return local, nil
	}
	return d, nil
}

// Share returns cfg with each bandwidth's Capacity, RefillTokens and
// InitialTokens divided by instances, rounded down, at least 1: one
// instance's share of the limit, which the Local mode enforces.
func Share(cfg ratelimit.Config, instances int64) ratelimit.Config {
	if instances <= 1 {
		return cfg
	}
	bws := make([]ratelimit.Bandwidth, len(cfg.Bandwidths))
	for i, bw := range cfg.Bandwidths {
		bw.Capacity = max(1, bw.Capacity/instances)
		bw.RefillTokens = max(1, bw.RefillTokens/instances)
		if bw.InitialTokens != nil {
			n := min(bw.Capacity, *bw.InitialTokens/instances)
			bw.InitialTokens = &n
		}
		bws[i] = bw
	}
	cfg.Bandwidths = bws
	return cfg
}
