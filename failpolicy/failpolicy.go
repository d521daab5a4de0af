// Package failpolicy keeps a limiter deciding, fast, when its store does
// not: a [ratelimit.Backend] decorator with a hard per-decision deadline, a
// circuit breaker, and a mode that decides while the store is away.
//
//	policy, err := failpolicy.Wrap(redisBackend, failpolicy.Local, failpolicy.WithInstances(4))
//	limiter := ratelimit.New(policy)
//
// # Deadline
//
// Every decision's context gets a deadline, [DefaultTimeout] unless
// [WithTimeout] says otherwise, even when the caller's context has none; a
// caller's earlier deadline stands. The deadline is hard: each call runs
// in a goroutine of its own, and the decision returns at the deadline
// whatever the client does. The client should still end a call at its
// context's deadline, or calls left behind pile up: see docs/operations.md
// for the go-redis and rueidis settings, which their LowLatency helpers
// make, and for how the default was chosen.
//
// # Failures
//
// Only what says the store is unhealthy is a failure: the policy's own
// deadline passing, and an error wrapping [ratelimit.ErrTimeout] or
// [ratelimit.ErrBackendUnavailable] (a client's timeout, a refused or
// broken connection, a server error). The [Mode] then decides, marking the
// decision Degraded, and the breaker counts it.
//
// A client can return a deadline's error (one wrapping
// [context.DeadlineExceeded], or a [net.Error] timeout) a moment before
// the deadline it belongs to: rueidis hands a call the error of a dial
// it joined, which another call's deadline ended. Such an error, coming
// back at most 1ms before the call's deadline, counts as that deadline
// passing: the caller's, if the call ran to the caller's deadline, and
// otherwise the policy's.
//
// Everything else goes straight back to the caller, is not Degraded, and
// leaves the breaker as it was:
//
//   - the caller's own context ending, before or during the call: the
//     error wraps the context's ([context.Canceled] or
//     [context.DeadlineExceeded]), and a context already done takes
//     nothing. So a client that sets itself a short deadline (gRPC passes
//     the client's on) cannot open the breaker for everyone else;
//   - an error about the call or its key: bad input
//     ([ratelimit.ErrInvalidKey], [ratelimit.ErrInvalidConfig],
//     [ratelimit.ErrInvalidRequest]) or [ratelimit.ErrKeyRejected] (a key
//     holding a foreign value, a store at its key cap). Other keys are
//     decided as before.
//
// A call that timed out may still have been applied by the store: a
// paused Redis runs the queued scripts when it resumes. The decorator
// never retries, so a decision is never charged twice.
//
// # Panics
//
// A panic in the wrapped Backend is recovered on the call's goroutine and
// raised again on the caller's, as a [*PanicError] holding the value and
// the stack where it happened, so that a server that recovers its
// handlers' panics fails that one request, as it would without the policy.
// A panic after the caller has had its decision (a call that outlived the
// deadline, or the probe) goes to [Hooks.Panicked].
//
// # Circuit breaker
//
// After [WithBreaker]'s count of consecutive failures (5 by default) the
// breaker opens: for the cool-down (1s by default) no decision goes to the
// store, and the mode decides them at once. Then one decision probes the
// store with the cool-down to answer; if it answers, the breaker closes
// and decisions go to the store again. If it fails, or is still out when
// the cool-down has passed, the breaker opens for another cool-down: a
// probe that never returns does not hold the breaker half-open.
//
// The breaker is kept per store node when the next Backend can tell which
// node serves a key: when it is a [ratelimit.NodeLocator], as the Redis
// backends are on a cluster client, whose Node names the master that owns
// the key's slot. Each node's breaker counts that node's failures, opens
// and probes on its own, so a stalled Redis Cluster master sends only its
// own keys to the mode, and the keys on the other masters go on being
// decided by the store. One shared breaker covers the rest: every key
// when the next Backend cannot tell nodes (a standalone server, the
// memory backend), and the keys whose node it cannot name yet (a cluster
// whose slot map has not loaded). A failover gives a slot a new master,
// and so its keys a new breaker, closed.
//
// At most [MaxNodeBreakers] nodes have a breaker of their own. A new node
// beyond them first makes room by dropping the breakers that hold
// nothing: closed with no failure counted, or open with no call since
// their cool-down ended (a node no key is on any more). If none can go,
// or room was made less than a cool-down ago, the new node's keys share
// the shared breaker until room is made. [Backend.Breakers] reports each
// breaker's state, [Backend.Breaker] the most open of them, and
// [Hooks.BreakerChanged] names the node of each change.
//
// # The Local mode's bound
//
// The Local mode decides in per-instance shares of each bandwidth (see
// [Local]). The shares cannot know what the store admitted just before
// they took over, nor the store what they admitted, so every token a share
// admits is a debt of its key, charged to the store by the next call on
// the key that reaches it (on credit where the algorithm lends: the token
// bucket, GCRA and the leaky bucket), before that call's own request, and
// as of when the share admitted it ([ratelimit.Request.Ago]), so that the
// store refills it from then. A
// key's debt is capped at twice the share. For a bandwidth of capacity C
// refilling r a second, shared by n instances that all say
// [WithInstances](n), the service then admits over any interval of T
// seconds at most C + r·T (the limit) plus what is still owed at its end:
// for an outage every instance sees, at most 2C (the shares spent on top
// of the store's last tokens on the way in, and the store's refilled
// tokens on top of the shares' on the way out). Where the store lends,
// that is paid back from its refill once each instance reaches it again,
// so over an interval that also covers the 2C/r seconds after the outage
// the total is within the limit. Where only some instances lose the
// store, each of them adds up to its share's rate on top.
// docs/operations.md derives the bound and gives the measured counts.
//
// # Permits
//
// Permit calls ([Backend.DoPermit]: what a [ratelimit.Limiter]'s
// TryAcquire and Acquire, and a [ratelimit.Permit]'s Release and Renew,
// make) are judged as decisions are: under the same deadline and the same
// breakers (a node's breaker counts its keys' permit calls with their
// decisions), with the same failures, and with the caller's context and
// errors about the call or its key passed back as they are. When the
// store fails, or the breaker keeps a call from it, the mode decides,
// Degraded, and [Hooks.Degraded] is told:
//
//   - Open grants an Acquire, holding nothing, and a Renew, so that no
//     request is kept out or cut off; a Release is not granted, and is no
//     error ([ratelimit.Permit.Release] returns nil): the store frees the
//     permit when its lease ends. An Inspect is granted. A permit Open
//     granted is held nowhere: once the store is back, it does not know it
//     (unless it ran the timed-out Acquire late, as below); a
//     [ratelimit.Permit] whose acquire was Degraded so never reports it
//     lost, and its Renew and Release return nil.
//   - Closed denies an Acquire, with a RetryAfter of [WithRetryAfter], as
//     it denies a request; a Renew or a Release is not granted (a Permit's
//     Renew then returns an error wrapping
//     [ratelimit.ErrBackendUnavailable], on which [ratelimit.Permit.KeepAlive]
//     tries again while the permit's lease may still run; its Release
//     nil). An Inspect is not granted.
//   - Local decides in an in-process store of permits, the one that keeps
//     its rate shares, under this instance's share of the limit:
//     [PermitShare], the Limit divided by [WithInstances]'s count, rounded
//     up. The decision's Limit is the share. An Acquire is granted while
//     the share has room, and denied when it has none with the local count
//     in InFlight (above 0, as middleware tells the caller's share being
//     full from the limiter being out); one of a Weight above the share,
//     or for a new key while permits of [WithLocalKeys] keys are held, is
//     denied as Closed would, InFlight 0. A Release or a Renew goes to the
//     local store first, whether the store is failing or not: if it holds
//     the holder's permit, it decides, Degraded, with no store call (and
//     no hook: the store did not fail), so that a permit taken there is
//     released and renewed there, even once the store is back. Otherwise the call goes to the
//     store, and if that fails it is not granted, as in Closed: a renewal
//     granted without the store would keep a request running past its
//     permit's lease in the store, which would then let another in.
//
// What Local bounds: the store does not know what the shares hold, nor
// the shares what the store holds. While an outage lasts, each instance
// admits up to its share locally, and the permits taken from the store
// before it stay held there until they are released or their leases end;
// so the requests in flight across the fleet number at most Limit (the
// store's) plus instances × share. Once the store is back, new permits
// come from the store again, and once every local permit is released the
// total is at most Limit again. For a fleet that says [WithInstances](n),
// n × share is less than Limit + n.
//
// As with decisions, a permit call that timed out may still be applied by
// the store when it resumes: an Acquire the mode decided may then hold a
// permit in the store too, until its lease ends. That takes room in the
// store; it never adds any.
//
// # Hooks
//
// [Hooks] report degraded decisions, breaker changes and late panics, for
// metrics and logs.
package failpolicy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

// Mode says how a [Backend] decides when the store cannot. What each
// mode does with permit calls is in the package doc, under "Permits".
type Mode uint8

const (
	// Open allows every request: availability over the limit.
	Open Mode = iota
	// Closed denies every request, with a RetryAfter of [WithRetryAfter]:
	// the limit over availability. Its denials name no Bandwidth, as no
	// bandwidth ran out: that is how httplimit tells them apart from a
	// Local share's and answers 503 instead of 429.
	Closed
	// Local decides in an in-process bucket per key that holds this
	// instance's share of each bandwidth: its Capacity and RefillTokens
	// divided by [WithInstances]'s count, rounded down, at least 1. The
	// shares' admissions are charged to the store when it answers again;
	// see the package doc for the bound this keeps. At most
	// [WithLocalKeys] keys have a share at a time; a new key beyond them
	// is denied, as Closed would (naming no Bandwidth).
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
	// DefaultTimeout is the per-decision deadline unless [WithTimeout] sets
	// one. A healthy Redis meets it under a burst of 100 simultaneous
	// decisions from each of two processes on a 2-core machine: their
	// p99.9 was 24–29ms (docs/operations.md gives the figures). It is the
	// ReadTimeout the Redis backends' LowLatency helpers set, so that the
	// policy gives up on a call when the client would. Set a shorter one
	// with WithTimeout once your own p99.9 under load says it is met.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultFailures is how many consecutive failures open the breaker
	// unless [WithBreaker] says otherwise.
	DefaultFailures = 5
	// DefaultCoolDown is how long an open breaker keeps decisions from the
	// store unless [WithBreaker] says otherwise.
	DefaultCoolDown = time.Second
	// DefaultLocalKeys is how many keys the Local mode keeps a share and a
	// debt for unless [WithLocalKeys] says otherwise; docs/operations.md
	// gives the memory this takes.
	DefaultLocalKeys = 1 << 16
)

// ErrBreakerOpen is the cause [Hooks.Degraded] gets for a decision that
// the open breaker kept from the store.
var ErrBreakerOpen = errors.New("failpolicy: circuit breaker open")

// errDeadline is the cause of a decision's context when the policy's
// deadline ends it, and errProbeDeadline when the probe's does.
var (
	errDeadline      = errors.New("failpolicy: the decision's deadline passed")
	errProbeDeadline = errors.New("failpolicy: the probe's cool-down passed")
)

// Hooks are called by a [Backend] as things happen; each may be nil. They
// run on the deciding goroutine, or on the goroutine of a call that ends
// after its caller has had its decision, so they must be quick, safe for
// concurrent use, and must not call the Backend.
type Hooks struct {
	// Degraded is called for each decision, or permit call, the mode
	// made instead of the store, with the reason: the store's error, or
	// [ErrBreakerOpen].
	Degraded func(ctx context.Context, key string, mode Mode, cause error)
	// BreakerChanged is called when a breaker changes state, with the
	// node it is kept for: a name the next Backend's
	// [ratelimit.NodeLocator] gave, or "" for the shared breaker (see the
	// package doc).
	BreakerChanged func(node string, from, to BreakerState)
	// Panicked is called for a panic in the wrapped Backend that came
	// after its caller had its decision (a call that outlived the
	// deadline, or the probe), so that no goroutine of the caller's can
	// raise it again. Without it, such a panic is dropped.
	Panicked func(key string, p *PanicError)
}

// PanicError is what a [Backend] panics with on the caller's goroutine
// when the wrapped Backend panicked, and what [Hooks.Panicked] gets.
type PanicError struct {
	// Value is what the wrapped Backend panicked with.
	Value any
	// Stack is the stack of the goroutine that panicked, as
	// [debug.Stack] gives it.
	Stack []byte
}

// Error returns the panic's value and stack.
func (p *PanicError) Error() string {
	return fmt.Sprintf("failpolicy: the wrapped Backend panicked: %v\n\n%s", p.Value, p.Stack)
}

// Unwrap returns the panic's value if it is an error.
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
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
	debts      *ledger         // for Local
	breakers   breakers

	// next's optional capabilities, nil where it lacks them; its
	// NodeLocator is breakers.locator.
	slots    ratelimit.SlotMapper
	topology ratelimit.TopologyReporter
	permits  ratelimit.PermitBackend
}

var (
	_ ratelimit.Backend       = (*Backend)(nil)
	_ ratelimit.PermitBackend = (*Backend)(nil)
)

// options are what the Options set before Wrap checks them.
type options struct {
	timeout    time.Duration
	failures   int
	coolDown   time.Duration
	retryAfter time.Duration
	instances  int
	localKeys  int
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
// the whole limit): see [Share] and, for a concurrency limit,
// [PermitShare].
func WithInstances(n int) Option {
	return func(o *options) { o.instances = n }
}

// WithLocalKeys sets how many keys the Local mode keeps a share and a debt
// for, and, apart from those, how many keys it holds permits for (at
// least 1; default [DefaultLocalKeys]). A share is kept until it
// has refilled, never dropped early (that would hand its owner a full
// share), so while the store is away a flood of new keys fills them, and a
// new key beyond them is denied until one has refilled (for permits,
// until one's permits are all released or their leases have ended).
func WithLocalKeys(n int) Option {
	return func(o *options) { o.localKeys = n }
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
	o := options{timeout: DefaultTimeout, failures: DefaultFailures, coolDown: DefaultCoolDown, instances: 1, localKeys: DefaultLocalKeys}
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
	case o.localKeys < 1:
		return nil, invalid("WithLocalKeys %d is less than 1", o.localKeys)
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
	}
	b.slots, _ = next.(ratelimit.SlotMapper)
	b.topology, _ = next.(ratelimit.TopologyReporter)
	b.permits, _ = next.(ratelimit.PermitBackend)
	locator, _ := next.(ratelimit.NodeLocator)
	b.breakers.init(locator, int32(o.failures), int64(o.coolDown), b.now)
	if mode == Local {
		b.local = memory.New(memory.WithClock(o.clock), memory.WithMaxKeys(o.localKeys))
		b.debts = newLedger(o.localKeys)
	}
	return b, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: failpolicy: "+format, append([]any{ratelimit.ErrInvalidConfig}, args...)...)
}

// systemClock is the process's clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Unwrap returns the Backend that b sends decisions to, so that a
// decorator over b (the otel module's, naming the store in its spans)
// can find the store below.
func (b *Backend) Unwrap() ratelimit.Backend { return b.next }

// Close releases the Local mode's buckets. It is safe to call more than
// once, and does nothing for the other modes. It does not close the next
// Backend.
func (b *Backend) Close() error {
	if b.local != nil {
		return b.local.Close()
	}
	return nil
}

// Breaker returns the circuit breaker's state: with a breaker per node
// (see the package doc), the most open of them all, BreakerOpen over
// BreakerHalfOpen over BreakerClosed, so that one node in trouble shows.
// [Backend.Breakers] tells them apart.
func (b *Backend) Breaker() BreakerState {
	return b.breakers.worst()
}

// Breakers returns the state of each circuit breaker, by the node it is
// kept for (see the package doc). The shared breaker is under "": it is
// there when the next Backend is not a [ratelimit.NodeLocator], or once a
// key has used it because its node was unknown, or when there were
// [MaxNodeBreakers] nodes already. The map is the caller's.
func (b *Backend) Breakers() map[string]BreakerState {
	return b.breakers.states()
}

// Do decides req with the next Backend under the deadline, or by the mode
// if the breaker is open or the next Backend fails; see the package doc.
func (b *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if ctx.Err() != nil {
		if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
			return ratelimit.Decision{}, err
		}
		return ratelimit.Decision{}, ctxerr.Caller(ctx, what(req.Op, key), nil)
	}
	r, cause := b.send(ctx, &call{key: key, cfg: cfg, req: req})
	if cause != nil {
		return b.degrade(ctx, key, cfg, req, cause)
	}
	return r.d, r.err
}

// send makes c's call to the next Backend, a decision or a permit call,
// under the key's breaker and the deadline. It returns the call's result,
// for its caller as it is (an answer, an error about the call, or the
// caller's own context ending); or, when the store failed or the breaker
// kept the call from it, the cause, for the mode to decide instead.
func (b *Backend) send(ctx context.Context, c *call) (r result, cause error) {
	br := b.breakers.forKey(c.key)
	ok, probe, t := br.allow(b.now)
	b.report(br, t)
	if !ok {
		return result{}, ErrBreakerOpen
	}
	wait, stopWait := context.WithTimeoutCause(ctx, b.timeout, errDeadline)
	defer stopWait()
	c.b, c.br, c.probe, c.done = b, br, probe, make(chan result, 1)
	if probe {
		// The probe gets the cool-down to answer, not the deadline: a
		// store coming back may need a new connection and the script
		// loaded before it answers, and on a busy machine that takes
		// longer than a decision may wait. Its caller waits only the
		// deadline, and the probe judges the store when it ends.
		c.store, c.stopStore = context.WithTimeoutCause(context.WithoutCancel(ctx), time.Duration(br.coolDown), errProbeDeadline)
	} else {
		c.store, c.stopStore = wait, func() {}
	}
	r, back := c.await(wait)
	if r.panic != nil {
		panic(r.panic)
	}
	if !back || r.err != nil {
		// If the caller gave up, that is the answer, and no verdict. The
		// store's error is left out of it: a client that does not tell
		// the caller's deadline from its own would make it read as a
		// store failure.
		if err := ctxerr.Judged(ctx, c.what(), callersError(ctx, c.store, r.err)); err != nil {
			return result{err: err}, nil
		}
	}
	// The policy's deadline passed first, or the store's deadline error
	// came back a moment before it; read only when it matters, as it
	// reads the clock.
	expired := !back || r.err != nil && ctxerr.Ended(wait, r.err)
	switch {
	case !back:
		r.verdict = failed // for the probe's caller; the probe judges itself
	case !probe:
		r.verdict = verdictOf(r.err, expired)
	}
	if !probe {
		b.record(br, r.verdict, false)
	}
	if r.verdict != failed {
		return r, nil
	}
	cause = r.err
	if expired {
		cause = fmt.Errorf("%w: %s: no answer within %v", ratelimit.ErrTimeout, c.what(), b.timeout)
		if r.err != nil {
			cause = fmt.Errorf("%w: %w", cause, r.err)
		}
	}
	return result{}, cause
}

// callersError returns err, the next Backend's error, for judging whether
// the caller's context ended the call, or nil if store, the call's
// context, did not run to the caller's deadline: to the policy's, which
// came first, or to the probe's cool-down. A deadline's error is then the
// call's own, however near the caller's deadline is.
func callersError(ctx, store context.Context, err error) error {
	caller, ok := ctx.Deadline()
	if call, _ := store.Deadline(); !ok || !call.Equal(caller) {
		return nil
	}
	return err
}

// what names a call in errors: op is a [ratelimit.Op] or a
// [ratelimit.PermitOp].
func what(op fmt.Stringer, key string) string {
	return fmt.Sprintf("failpolicy: %v on key %q", op, key)
}

// verdict is what a call says of the store.
type verdict uint8

const (
	answered  verdict = iota // it answered
	failed                   // it timed out or failed
	noVerdict                // the call or its key was bad, or its caller gave up
)

// verdictOf says what a call's error says of the store; expired says the
// policy's (or the probe's) deadline passed first.
func verdictOf(err error, expired bool) verdict {
	switch {
	case err == nil:
		return answered
	case expired:
		return failed
	case errors.Is(err, ratelimit.ErrKeyRejected):
		return noVerdict
	case errors.Is(err, ratelimit.ErrTimeout), errors.Is(err, ratelimit.ErrBackendUnavailable):
		return failed
	}
	return noVerdict
}

// record tells br a call's verdict.
func (b *Backend) record(br *breaker, v verdict, probe bool) {
	switch v {
	case answered:
		b.report(br, br.succeeded(probe))
	case failed:
		b.report(br, br.failed(probe, b.now()))
	default:
		br.abandoned(probe)
	}
}

// result is what the next Backend returned, and what it says of the store.
type result struct {
	d       ratelimit.Decision       // a decision's
	pd      ratelimit.PermitDecision // a permit call's
	err     error
	panic   *PanicError
	verdict verdict
}

// call is one decision, or one permit call, sent to the next Backend, in
// a goroutine of its own: both Redis clients end a call at its context's deadline on most
// paths, but not on all (rueidis, opening a connection to a server that
// stalled or closing one, waits up to a second), and the decision must not
// wait for them. The call runs on a copy of cfg's bandwidths that it may
// keep. A call left behind ends when its client gives up, and the breaker
// keeps such calls few.
type call struct {
	b     *Backend
	br    *breaker // the breaker of the key's node
	key   string
	probe bool
	// A decision's config and request, and the key's debt, charged
	// before req.
	cfg  ratelimit.Config
	req  ratelimit.Request
	debt debt
	// A permit call's, if permit is set.
	permit bool
	lim    ratelimit.Concurrency
	preq   ratelimit.PermitRequest

	store     context.Context // the next Backend's
	stopStore context.CancelFunc
	done      chan result
	// left is set by whichever comes first: the call handing its result
	// to the caller, or the caller leaving without one.
	left atomic.Bool
	// judged is set once the probe's verdict is recorded: when it ends,
	// or when its time is spent, whichever comes first.
	judged atomic.Bool
}

// await starts the call and returns its result, or back false if wait
// ends first.
func (c *call) await(wait context.Context) (r result, back bool) {
	if !c.permit {
		c.cfg.Bandwidths = slices.Clone(c.cfg.Bandwidths)
		if c.b.debts != nil {
			c.debt = c.b.debts.take(c.key, c.b.now())
		}
	}
	go c.run()
	select {
	case r := <-c.done:
		return r, true
	case <-wait.Done():
		if !c.left.CompareAndSwap(false, true) {
			return <-c.done, true // it answered just in time
		}
		return result{}, false
	}
}

// run makes the call, and hands its result to the caller if the caller
// still waits.
func (c *call) run() {
	defer c.stopStore()
	if c.probe {
		stop := context.AfterFunc(c.store, func() { c.judge(failed) })
		defer stop()
	}
	r := c.do()
	if c.probe {
		v := verdictOf(r.err, ctxerr.Ended(c.store, r.err))
		if r.panic != nil {
			v = noVerdict
		}
		c.judge(v)
		r.verdict = v
	}
	if c.left.CompareAndSwap(false, true) {
		c.done <- r
		return
	}
	if r.panic != nil && c.b.hooks.Panicked != nil {
		c.b.hooks.Panicked(c.key, r.panic)
	}
}

// do charges the key's debt, then applies the request; or, for a permit
// call, applies its request; recovering a panic.
func (c *call) do() (r result) {
	defer func() {
		if p := recover(); p != nil {
			r = result{panic: &PanicError{Value: p, Stack: debug.Stack()}}
		}
	}()
	if c.permit {
		r.pd, r.err = c.b.permits.DoPermit(c.store, c.key, c.lim, c.preq)
		return r
	}
	if err := c.charge(); err != nil {
		return result{err: err}
	}
	r.d, r.err = c.b.next.Do(c.store, c.key, c.cfg, c.req)
	return r
}

// charge sends the key's debt to the store, a slot at a time in time
// order, each as of its slot's time (see [ratelimit.Request.Ago]): the
// store then refills what it takes from when the shares admitted it, and
// forgives only what its cap would have. On an error, the slot that failed
// and the ones after it go back to the ledger.
func (c *call) charge() error {
	d := c.debt
	now := c.b.now()
	for i := range d.n {
		for s := &d.slots[i]; s.tokens > 0; {
			req := chargeRequest(c.cfg, *s, now)
			if _, err := c.b.next.Do(c.store, c.key, c.cfg, req); err != nil {
				rest := debt{expires: d.expires}
				rest.n = copy(rest.slots[:], d.slots[i:d.n])
				c.b.debts.add(c.key, rest, c.b.debtLimit(c.cfg), c.b.now())
				return err
			}
			s.tokens -= req.Tokens
		}
	}
	return nil
}

// what names the call in errors.
func (c *call) what() string {
	if c.permit {
		return what(c.preq.Op, c.key)
	}
	return what(c.req.Op, c.key)
}

// judge records the probe's verdict, once.
func (c *call) judge(v verdict) {
	if c.judged.CompareAndSwap(false, true) {
		c.b.record(c.br, v, true)
	}
}

// chargeRequest is the request that charges s to the store, or its first
// part: one request takes at most the smallest capacity. It takes the
// tokens on credit where the algorithm lends, so that the store admits
// nothing more until it has refilled past them, and otherwise as many as
// the store has. It is made as of s's time, now less at most MaxAgo: a
// charge made later than its tokens were taken takes no less.
func chargeRequest(cfg ratelimit.Config, s slot, now int64) ratelimit.Request {
	req := ratelimit.Request{Op: ratelimit.ConsumeUpTo, Tokens: min(s.tokens, cfg.MinCapacity()), Ago: min(time.Duration(max(0, now-s.at)), ratelimit.MaxAgo)}
	if cfg.Algorithm.Supports(ratelimit.Reserve) {
		req.Op, req.MaxWait = ratelimit.Reserve, math.MaxInt64
	}
	return req
}

// debtLimit is the most a key's debt grows to: twice this instance's
// share. That is what the shares admit beyond the limit across an outage
// (the share spent on top of the store's last tokens on the way in, and
// the store's tokens, refilled while it was away, on top of the share on
// the way out); what a share admits beyond it, it admits at its refill
// rate, which the store, away, did not spend.
func (b *Backend) debtLimit(cfg ratelimit.Config) int64 {
	return 2 * Share(cfg, b.instances).MinCapacity()
}

func (b *Backend) now() int64 { return b.clock.Now().UnixNano() }

// report tells the hook of a change of br's state.
func (b *Backend) report(br *breaker, t transition) {
	if t.from != t.to && b.hooks.BreakerChanged != nil {
		b.hooks.BreakerChanged(br.node, t.from, t.to)
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
			cause = fmt.Errorf("%w: %s: %w", ratelimit.ErrBackendUnavailable, what(req.Op, key), cause)
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
		return b.decideLocally(ctx, key, cfg, req)
	}
	return d, nil
}

// decideLocally decides req in this instance's share of cfg, and records
// what it admits as the key's debt.
func (b *Backend) decideLocally(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	d, err := b.local.Do(ctx, key, Share(cfg, b.instances), req)
	switch {
	case ctx.Err() != nil && err != nil:
		return ratelimit.Decision{}, err // the caller gave up
	case err != nil:
		// The share cannot be decided (the local store is full or
		// closed): deny, as Closed would.
		return ratelimit.Decision{Degraded: true, Limit: cfg.MinCapacity(), RetryAfter: b.retryAfter}, nil
	}
	if d.Consumed > 0 {
		now := b.now()
		at := now - int64(req.Ago) // when the share decided it
		b.debts.add(key, debt{slots: [debtSlots]slot{{at: at, tokens: d.Consumed}}, n: 1, expires: at + int64(fillTime(cfg))}, b.debtLimit(cfg), now)
	}
	d.Degraded = true
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
