package lease_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	ctx     = context.Background()
	consume = ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	// perSecond is a limit of 1000 a second with a burst of 100: a lease
	// holds up to 10 tokens by default.
	perSecond = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000).WithBurst(100)}}
)

// recorder is a Backend that records the calls that reach it and passes
// them to next, unless fail or block say otherwise.
type recorder struct {
	next ratelimit.Backend
	mu   sync.Mutex
	ops  []string
	fail error
	// block, if set, holds each call until it is closed or the call's
	// context ends.
	block chan struct{}
}

func (r *recorder) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	r.mu.Lock()
	r.ops = append(r.ops, req.Op.String()+" "+key)
	fail, block := r.fail, r.block
	r.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ratelimit.Decision{}, ctx.Err()
		}
	}
	if fail != nil {
		return ratelimit.Decision{}, fail
	}
	return r.next.Do(ctx, key, cfg, req)
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := r.ops
	r.ops = nil
	return ops
}

// setup is one instance leasing "hot" over a recorder over a memory
// store, on a fake clock.
func setup(t *testing.T, opts ...lease.Option) (*lease.Backend, *recorder, *ratelimittest.Clock) {
	t.Helper()
	clock := ratelimittest.NewClock(time.Unix(1e9, 0))
	store := memory.New(memory.WithClock(clock))
	t.Cleanup(func() { store.Close() })
	rec := &recorder{next: store}
	b, err := lease.New(rec, append([]lease.Option{lease.Keys("hot"), lease.WithClock(clock), lease.WithRefillTimeout(time.Minute)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, rec, clock
}

func do(t *testing.T, b *lease.Backend, key string, cfg ratelimit.Config, req ratelimit.Request) ratelimit.Decision {
	t.Helper()
	d, err := b.Do(ctx, key, cfg, req)
	if err != nil {
		t.Fatal(err)
	}
	b.WaitRefills()
	return d
}

// TestPassThrough: a key no rule matches, and every op but Consume, goes
// to the store as it came; Add, Reset and Replace of a leased key drop
// its lease.
func TestPassThrough(t *testing.T) {
	b, rec, clock := setup(t)
	do(t, b, "cold", perSecond, consume)
	do(t, b, "cold", perSecond, ratelimit.Request{Op: ratelimit.Estimate, Tokens: 1})
	if got := rec.take(); strings.Join(got, ",") != "Consume cold,Estimate cold" {
		t.Errorf("store saw %q", got)
	}
	for range 5 { // a lease held
		do(t, b, "hot", perSecond, consume)
		clock.Advance(time.Millisecond)
	}
	rec.take()
	for _, op := range []ratelimit.Op{ratelimit.Estimate, ratelimit.Inspect, ratelimit.ConsumeUpTo, ratelimit.Reserve} {
		do(t, b, "hot", perSecond, ratelimit.Request{Op: op, Tokens: 1})
	}
	if got := rec.take(); strings.Join(got, ",") != "Estimate hot,Inspect hot,ConsumeUpTo hot,Reserve hot" {
		t.Errorf("store saw %q", got)
	}
	before := b.Stats()
	do(t, b, "hot", perSecond, ratelimit.Request{Op: ratelimit.Add, Tokens: 1})
	after := b.Stats()
	if after.Lapsed-before.Lapsed != before.Leased-before.Spent-before.Lapsed || after.Lapsed == 0 {
		t.Errorf("after Add: %+v, before %+v: want the lease's tokens lapsed", after, before)
	}
}

// TestStoreCalls: at a steady load below the limit, one instance makes a
// store call for far fewer than every 50 decisions.
func TestStoreCalls(t *testing.T) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6).WithBurst(1e6)}}
	b, _, clock := setup(t)
	for range 100_000 {
		clock.Advance(2 * time.Microsecond) // 500k a second: half the limit
		if d := do(t, b, "hot", cfg, consume); !d.Allowed {
			t.Fatalf("denied at half the limit: %+v", d)
		}
	}
	st := b.Stats()
	if st.Decisions != 100_000 || st.Refills*50 > st.Decisions {
		t.Errorf("%+v: want 100000 decisions and at most one refill per 50", st)
	}
	t.Logf("%+v: a refill per %d decisions", st, st.Decisions/st.Refills)
}

// TestLapse: tokens leased from a full bucket lapse as the bucket
// refills, so that they cannot be spent on top of a full bucket again.
func TestLapse(t *testing.T) {
	b, _, clock := setup(t, lease.WithMaxShare(0.5), lease.WithTarget(time.Second))
	cfg := perSecond
	// Warm the lease's rate: 20 calls a ms apart.
	for range 20 {
		do(t, b, "hot", cfg, consume)
		clock.Advance(time.Millisecond)
	}
	st := b.Stats()
	held := st.Leased - st.Spent - st.Lapsed
	if held < 10 {
		t.Fatalf("%+v: want at least 10 tokens held", st)
	}
	// The store refills in 100ms; then it is full and holds 100 tokens:
	// the lease's must have lapsed, and the key admits 100 in this µs.
	clock.Advance(100 * time.Millisecond)
	store := b.Unwrap()
	for i := range 100 {
		if d, err := store.Do(ctx, "hot", cfg, consume); err != nil || !d.Allowed {
			t.Fatalf("the store's token %d: %+v, %v", i, d, err)
		}
	}
	if d := do(t, b, "hot", cfg, consume); d.Allowed {
		t.Errorf("the lease admitted on top of a full bucket drained: %+v; stats %+v", d, b.Stats())
	}
}

// TestLeasable: what cannot be leased is refused with the field named,
// and nothing reaches the store.
func TestLeasable(t *testing.T) {
	b, rec, _ := setup(t)
	bw := ratelimit.PerSecond(10)
	for _, c := range []struct {
		cfg  ratelimit.Config
		want string
	}{
		{ratelimit.Config{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{bw}}, "Config.Algorithm: SlidingWindowLog counts a request when the store is charged"},
		{ratelimit.Config{Algorithm: ratelimit.SlidingWindowCounter, Bandwidths: []ratelimit.Bandwidth{bw}}, "Config.Algorithm: SlidingWindowCounter counts"},
		{ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{bw, bw.WithRefill(ratelimit.Interval)}}, "Config.Bandwidths[1].Refill: a lease of a bandwidth of Interval refill cannot be bounded"},
		{ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{bw, ratelimit.PerMinute(100)}}, "Config.Bandwidths: a FixedWindow lease lapses when its window ends, which a decision tells for one bandwidth only; it has 2"},
	} {
		_, err := b.Do(ctx, "hot", c.cfg, consume)
		if !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `(key "hot")`) {
			t.Errorf("%v: %v; want ErrInvalidConfig with %q", c.cfg.Algorithm, err, c.want)
		}
	}
	if err := lease.Leasable(ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{bw}}, true); err == nil || !strings.Contains(err.Error(), "sub-buckets whose windows end at different times") {
		t.Errorf("a split FixedWindow: %v", err)
	}
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.LeakyBucket, ratelimit.FixedWindow} {
		if err := lease.Leasable(ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{bw}}, false); err != nil {
			t.Errorf("%v: %v", alg, err)
		}
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("store saw %q", got)
	}
	// Bad input is the store's error, before any call.
	if _, err := b.Do(ctx, "hot", perSecond, ratelimit.Request{Tokens: 0}); !errors.Is(err, ratelimit.ErrInvalidRequest) {
		t.Errorf("Tokens 0: %v", err)
	}
	if _, err := b.Do(ctx, "hot", ratelimit.Config{}, consume); !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Errorf("no bandwidth: %v", err)
	}
}

// TestFixedWindow: a FixedWindow lease lapses when the window it was
// charged in ends, so no window admits more than its capacity.
func TestFixedWindow(t *testing.T) {
	cfg := ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(100)}}
	b, _, clock := setup(t, lease.WithMaxShare(0.5), lease.WithTarget(time.Second))
	for range 5 {
		do(t, b, "hot", cfg, consume)
		clock.Advance(time.Millisecond)
	}
	if st := b.Stats(); st.Leased-st.Spent-st.Lapsed == 0 {
		t.Fatalf("%+v: want tokens held", st)
	}
	clock.Advance(time.Second) // the window has ended
	store := b.Unwrap()
	for i := range 100 {
		if d, err := store.Do(ctx, "hot", cfg, consume); err != nil || !d.Allowed {
			t.Fatalf("the new window's request %d: %+v, %v", i, d, err)
		}
	}
	if d := do(t, b, "hot", cfg, consume); d.Allowed {
		t.Errorf("a lease of the last window admitted in a full new one: %+v", d)
	}
}

// TestCallerContext: a caller that gives up while its refill is out gets
// its context's error, not a store failure; the refill lands anyway and
// the next call spends its tokens without a store call.
func TestCallerContext(t *testing.T) {
	b, rec, _ := setup(t)
	rec.block = make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error)
	go func() {
		_, err := b.Do(cctx, "hot", perSecond, consume)
		errc <- err
	}()
	for len(rec.take()) == 0 { // the refill has reached the store
		time.Sleep(time.Millisecond)
	}
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) || errors.Is(err, ratelimit.ErrBackendUnavailable) || errors.Is(err, ratelimit.ErrTimeout) {
		t.Errorf("canceled: %v; want context.Canceled alone", err)
	}
	close(rec.block)
	b.WaitRefills()
	before := b.Stats()
	if d := do(t, b, "hot", perSecond, consume); !d.Allowed {
		t.Errorf("after the refill landed: %+v", d)
	}
	// The landed token was spent; a refill went out ahead of need.
	if st := b.Stats(); st.Spent != before.Spent+1 || st.Refills > before.Refills+1 || slices.Contains(rec.take(), "Consume hot") {
		t.Errorf("stats %+v after %+v: want the landed lease spent", st, before)
	}
	// A canceled context before the call takes nothing.
	if _, err := b.Do(cctx, "hot", perSecond, consume); !errors.Is(err, context.Canceled) {
		t.Errorf("done before the call: %v", err)
	}
}

// TestRefillErrors: a store error reaches the calls that needed the
// refill; a store that does not answer in WithRefillTimeout is a timeout.
func TestRefillErrors(t *testing.T) {
	b, rec, _ := setup(t)
	rec.fail = ratelimit.ErrBackendUnavailable
	if _, err := b.Do(ctx, "hot", perSecond, consume); !errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Errorf("store down: %v", err)
	}
	b, rec, _ = setup(t, lease.WithRefillTimeout(10*time.Millisecond))
	rec.block = make(chan struct{})
	defer close(rec.block)
	_, err := b.Do(ctx, "hot", perSecond, consume)
	if !errors.Is(err, ratelimit.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("store silent: %v; want ErrTimeout", err)
	}
}

// TestKeyCap: at WithMaxKeys, a new key is decided by the store,
// unleased.
func TestKeyCap(t *testing.T) {
	clock := ratelimittest.NewClock(time.Unix(1e9, 0))
	store := memory.New(memory.WithClock(clock))
	defer store.Close()
	rec := &recorder{next: store}
	b, err := lease.New(rec, lease.Prefix("user:"), lease.WithMaxKeys(1), lease.WithClock(clock), lease.WithRefillTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	do(t, b, "user:1", perSecond, consume)
	rec.take()
	do(t, b, "user:2", perSecond, consume)
	if got := rec.take(); strings.Join(got, ",") != "Consume user:2" {
		t.Errorf("store saw %q; want the Consume itself", got)
	}
	if st := b.Stats(); st.Keys != 1 {
		t.Errorf("%+v: want 1 key", st)
	}
}

// TestConfigChange: a new config drops the lease taken for the old one.
func TestConfigChange(t *testing.T) {
	b, _, _ := setup(t)
	do(t, b, "hot", perSecond, consume)
	st := b.Stats()
	held := st.Leased - st.Spent - st.Lapsed
	other := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000).WithBurst(200)}}
	do(t, b, "hot", other, consume)
	if got := b.Stats().Lapsed - st.Lapsed; got != held {
		t.Errorf("%d lapsed; want the %d held for the old config", got, held)
	}
}

// TestBigRequest: a Consume of more than a lease holds goes to the store.
func TestBigRequest(t *testing.T) {
	b, rec, _ := setup(t)
	do(t, b, "hot", perSecond, ratelimit.Request{Tokens: 11}) // a lease is at most 10
	if got := rec.take(); strings.Join(got, ",") != "Consume hot" {
		t.Errorf("store saw %q", got)
	}
}

// TestOptions: bad options are refused with the option named.
func TestOptions(t *testing.T) {
	store := memory.New()
	defer store.Close()
	for _, c := range []struct {
		opts []lease.Option
		want string
	}{
		{nil, "no rule"},
		{[]lease.Option{lease.Keys()}, "rule 0: Keys has no key"},
		{[]lease.Option{lease.Keys("")}, "rule 0: key 0 is 0 bytes"},
		{[]lease.Option{lease.Rule{}}, "rule 0: it matches no key"},
		{[]lease.Option{lease.Prefix(strings.Repeat("p", 513))}, "rule 0: Prefix is 513 bytes"},
		{[]lease.Option{lease.Keys("k"), lease.WithTarget(0)}, "WithTarget must be positive"},
		{[]lease.Option{lease.Keys("k"), lease.WithMaxShare(0.6)}, "WithMaxShare must be above 0 and at most 0.5, got 0.6"},
		{[]lease.Option{lease.Keys("k"), lease.WithMaxKeys(0)}, "WithMaxKeys must be at least 1"},
		{[]lease.Option{lease.Keys("k"), lease.WithRefillTimeout(-1)}, "WithRefillTimeout must be positive"},
		{[]lease.Option{lease.Keys("k"), nil}, "an Option is nil"},
	} {
		_, err := lease.New(store, c.opts...)
		if !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want %q", c.opts, err, c.want)
		}
	}
	if _, err := lease.New(nil, lease.Keys("k")); !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Errorf("nil next: %v", err)
	}
	if _, err := ratelimit.Stack(store, lease.Layer()); err == nil || !strings.Contains(err.Error(), "no rule") {
		t.Errorf("Stack with a bad Layer: %v", err)
	}
}

// TestClose: after Close, a leased key's Consume is ErrClosed and no
// refill or sweep is left running (TestMain checks for leaks).
func TestClose(t *testing.T) {
	b, _, _ := setup(t)
	do(t, b, "hot", perSecond, consume)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Do(ctx, "hot", perSecond, consume); !errors.Is(err, lease.ErrClosed) || !errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Errorf("after Close: %v", err)
	}
	if d := do(t, b, "cold", perSecond, consume); !d.Allowed {
		t.Errorf("a key no rule matches after Close: %+v", d)
	}
	b.Close() // twice is fine
}

// TestConcurrent: many goroutines on one leased key and a few others,
// with -race; every decision is allowed under a limit far above them.
func TestConcurrent(t *testing.T) {
	store := memory.New()
	defer store.Close()
	b, err := lease.New(store, lease.Prefix("hot"), lease.WithRefillTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6).WithBurst(1e9)}}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			key := []string{"hot", "hot2", "cold"}[g%3]
			for range 2000 {
				if d, err := b.Do(ctx, key, cfg, consume); err != nil || !d.Allowed {
					t.Errorf("%s: %+v, %v", key, d, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if st := b.Stats(); st.Decisions < 2*16/3*2000 || st.Refills == 0 {
		t.Errorf("%+v", st)
	}
}

// TestRefundWouldBreakBound shows why unspent tokens are not given back:
// an instance B that returned its lease with an Add would let the store
// refill on top of instance A's lease, and one instant would admit more
// than C. Without the refund the same steps stay within C.
func TestRefundWouldBreakBound(t *testing.T) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}} // C = 10, a token each 100ms
	for _, refund := range []bool{false, true} {
		a, _, clock := setup(t, lease.WithMaxShare(0.5), lease.WithTarget(time.Hour))
		store := a.Unwrap()
		// B leases 5 with a call of its own.
		if d, err := store.Do(ctx, "hot", cfg, ratelimit.Request{Op: ratelimit.ConsumeUpTo, Tokens: 5}); err != nil || d.Consumed != 5 {
			t.Fatalf("B's lease: %+v, %v", d, err)
		}
		// A takes a token or a few, and leases the store's others ahead.
		for range 5 {
			if a.Stats().Leased == 5 {
				break
			}
			do(t, a, "hot", cfg, consume)
		}
		if st := a.Stats(); st.Leased != 5 || st.Spent > 3 {
			t.Fatalf("A's leases: %+v; want 5 tokens, at least 2 unspent", st)
		}
		if refund {
			if _, err := store.Do(ctx, "hot", cfg, ratelimit.Request{Op: ratelimit.Add, Tokens: 5}); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(400 * time.Millisecond)
		admitted := 0
		for range 20 { // all at one instant: at most C
			if d, err := store.Do(ctx, "hot", cfg, consume); err == nil && d.Allowed {
				admitted++
			}
			if d := do(t, a, "hot", cfg, consume); d.Allowed {
				admitted++
			}
		}
		if refund && admitted <= 10 {
			t.Errorf("with B's refund, %d admitted in one instant; the refund was meant to break the bound", admitted)
		}
		if !refund && admitted > 10 {
			t.Errorf("%d admitted in one instant; want at most C = 10", admitted)
		}
		t.Logf("refund %v: %d admitted in one instant", refund, admitted)
	}
}

// TestConformancePassThrough: with rules that match none of the suite's
// keys, the decorator passes the conformance suite as the memory backend
// does, its permits included.
func TestConformancePassThrough(t *testing.T) {
	ratelimittest.Run(t, ratelimittest.Harness{
		Permits: true,
		New: func(t *testing.T, c ratelimit.Clock) ratelimit.Backend {
			store := memory.New(memory.WithClock(c))
			t.Cleanup(func() { store.Close() })
			b, err := lease.New(store, lease.Keys("zzz-hot"), lease.Prefix("zzz-leased:"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			return b
		},
	})
}
