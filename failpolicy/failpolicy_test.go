package failpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

func TestMain(m *testing.M) {
	// After a topology refresh, a rueidis client closes the connections it
	// dropped five seconds later, in a goroutine that outlives Close; it
	// ends on its own.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

// store is a Backend whose answers the test sets: the memory backend's
// decision, or err while it is set. It counts the calls that reached it.
type store struct {
	mem   *memory.Backend
	err   atomic.Pointer[error]
	calls atomic.Int64
	// refuse, while set, fails the requests it picks with errDown.
	refuse atomic.Pointer[func(ratelimit.Request) bool]
	// deadline is the deadline of the last call's context.
	mu       sync.Mutex
	deadline time.Time
}

func newStore(t *testing.T, clock ratelimit.Clock) *store {
	s := &store{mem: memory.New(memory.WithClock(clock))}
	t.Cleanup(func() { s.mem.Close() })
	return s
}

func (s *store) fail(err error) { s.err.Store(&err) }

func (s *store) heal() { s.err.Store(nil) }

func (s *store) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	if err := s.reach(ctx); err != nil {
		return ratelimit.Decision{}, err
	}
	if refuse := s.refuse.Load(); refuse != nil && (*refuse)(req) {
		return ratelimit.Decision{}, errDown
	}
	return s.mem.Do(ctx, key, cfg, req)
}

func (s *store) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	if err := s.reach(ctx); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	return s.mem.DoPermit(ctx, key, lim, req)
}

// reach counts a call that reached the store and notes its deadline; it
// returns the error the store fails it with, if one is set.
func (s *store) reach(ctx context.Context) error {
	s.calls.Add(1)
	s.mu.Lock()
	s.deadline, _ = ctx.Deadline()
	s.mu.Unlock()
	if err := s.err.Load(); err != nil {
		return *err
	}
	return nil
}

var (
	errDown    = fmt.Errorf("%w: connection refused", ratelimit.ErrBackendUnavailable)
	errTimeout = fmt.Errorf("%w: i/o timeout", ratelimit.ErrTimeout)
	perMinute  = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(10)}}
	consume    = ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
)

func newPolicy(t *testing.T, next ratelimit.Backend, mode failpolicy.Mode, opts ...failpolicy.Option) *failpolicy.Backend {
	t.Helper()
	p, err := failpolicy.Wrap(next, mode, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func do(t *testing.T, p *failpolicy.Backend, req ratelimit.Request) ratelimit.Decision {
	t.Helper()
	d, err := p.Do(context.Background(), "k", perMinute, req)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestWrapRefusesBadOptions(t *testing.T) {
	next := memory.New()
	defer next.Close()
	tests := []struct {
		name string
		next ratelimit.Backend
		mode failpolicy.Mode
		opt  failpolicy.Option
		want string
	}{
		{"NilNext", nil, failpolicy.Open, nil, "next Backend is nil"},
		{"Mode", next, failpolicy.Mode(7), nil, "mode Mode(7)"},
		{"Timeout", next, failpolicy.Open, failpolicy.WithTimeout(0), "WithTimeout 0s"},
		{"Failures", next, failpolicy.Open, failpolicy.WithBreaker(0, time.Second), "WithBreaker failures 0"},
		{"CoolDown", next, failpolicy.Open, failpolicy.WithBreaker(3, -time.Second), "WithBreaker cool-down -1s"},
		{"RetryAfter", next, failpolicy.Closed, failpolicy.WithRetryAfter(-1), "WithRetryAfter -1ns"},
		{"Instances", next, failpolicy.Local, failpolicy.WithInstances(0), "WithInstances 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []failpolicy.Option
			if tt.opt != nil {
				opts = append(opts, tt.opt)
			}
			p, err := failpolicy.Wrap(tt.next, tt.mode, opts...)
			if !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) || p != nil {
				t.Errorf("Wrap: %v, %v; want nil and an ErrInvalidConfig naming %q", p, err, tt.want)
			}
		})
	}
}

// TestConformance: a healthy store behind the policy passes the suite,
// its permits included.
func TestConformance(t *testing.T) {
	ratelimittest.Run(t, ratelimittest.Harness{
		Permits: true,
		New: func(t *testing.T, c ratelimit.Clock) ratelimit.Backend {
			return newPolicy(t, newStore(t, c), failpolicy.Closed, failpolicy.WithTimeout(time.Minute), failpolicy.WithClock(c))
		},
	})
}

// TestDeadline: the store's context carries the policy's deadline, or the
// caller's when that is earlier.
func TestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStore(t, nil)
		p := newPolicy(t, s, failpolicy.Closed, failpolicy.WithTimeout(50*time.Millisecond))
		// check makes a call and wants the store's deadline to be want(start,
		// end), of the call's start and end, or between the two.
		check := func(ctx context.Context, want func(start, end time.Time) (time.Time, time.Time)) {
			t.Helper()
			start := time.Now()
			if _, err := p.Do(ctx, "k", perMinute, consume); err != nil {
				t.Fatal(err)
			}
			lo, hi := want(start, time.Now())
			s.mu.Lock()
			got := s.deadline
			s.mu.Unlock()
			if got.Before(lo) || got.After(hi) {
				t.Errorf("the store's deadline was %v after the call's start; want %v to %v", got.Sub(start), lo.Sub(start), hi.Sub(start))
			}
		}
		policy := func(start, end time.Time) (time.Time, time.Time) {
			return start.Add(50 * time.Millisecond), end.Add(50 * time.Millisecond)
		}
		check(context.Background(), policy)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		caller, _ := ctx.Deadline()
		check(ctx, func(_, _ time.Time) (time.Time, time.Time) { return caller, caller })
		ctx, cancel = context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		check(ctx, policy)
	})
}

// TestModes: what each mode decides while the store fails.
func TestModes(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{{"Unavailable", errDown}, {"Timeout", errTimeout}} {
		err := tc.err
		t.Run(tc.name+"/Open", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newStore(t, nil)
				s.fail(err)
				p := newPolicy(t, s, failpolicy.Open)
				want := ratelimit.Decision{Allowed: true, Degraded: true, Limit: 10, Consumed: 1}
				if d := do(t, p, consume); d != want {
					t.Errorf("Consume: %+v; want %+v", d, want)
				}
				want.Consumed = 0
				if d := do(t, p, ratelimit.Request{Op: ratelimit.Estimate, Tokens: 3}); d != want {
					t.Errorf("Estimate: %+v; want %+v", d, want)
				}
			})
		})
		t.Run(tc.name+"/Closed", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newStore(t, nil)
				s.fail(err)
				p := newPolicy(t, s, failpolicy.Closed, failpolicy.WithRetryAfter(2*time.Second))
				want := ratelimit.Decision{Degraded: true, Limit: 10, RetryAfter: 2 * time.Second}
				if d := do(t, p, consume); d != want {
					t.Errorf("Consume: %+v; want %+v", d, want)
				}
			})
		})
		t.Run(tc.name+"/Local", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newStore(t, nil)
				s.fail(err)
				p := newPolicy(t, s, failpolicy.Local, failpolicy.WithInstances(3))
				admitted := 0
				for range 20 {
					d := do(t, p, consume)
					if !d.Degraded || d.Limit != 3 {
						t.Fatalf("%+v: want Degraded, Limit 3 (10 / 3 instances)", d)
					}
					if d.Allowed {
						admitted++
					}
				}
				if admitted != 3 {
					t.Errorf("admitted %d of 20; want the share, 3", admitted)
				}
			})
		})
	}
}

// TestPassedBack: errors about the call, and a caller's cancellation, come
// back as they are, in every mode and breaker state; so do the ops that
// change a bucket without deciding when the store is away.
func TestPassedBack(t *testing.T) {
	for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed, failpolicy.Local} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newStore(t, nil)
				p := newPolicy(t, s, mode, failpolicy.WithBreaker(1, time.Hour))
				check := func(state string) {
					t.Helper()
					if _, err := p.Do(context.Background(), "", perMinute, consume); !errors.Is(err, ratelimit.ErrInvalidKey) {
						t.Errorf("%s: empty key: %v; want ErrInvalidKey", state, err)
					}
					if _, err := p.Do(context.Background(), "k", ratelimit.Config{}, consume); !errors.Is(err, ratelimit.ErrInvalidConfig) {
						t.Errorf("%s: no bandwidths: %v; want ErrInvalidConfig", state, err)
					}
					if _, err := p.Do(context.Background(), "k", perMinute, ratelimit.Request{Tokens: 11}); !errors.Is(err, ratelimit.ErrInvalidRequest) {
						t.Errorf("%s: 11 tokens of 10: %v; want ErrInvalidRequest", state, err)
					}
				}
				check("healthy")
				if p.Breaker() != failpolicy.BreakerClosed {
					t.Fatalf("bad input moved the breaker to %v", p.Breaker())
				}

				s.fail(context.Canceled)
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if _, err := p.Do(ctx, "k", perMinute, consume); !errors.Is(err, context.Canceled) {
					t.Errorf("cancelled by the caller: %v; want context.Canceled", err)
				}
				if p.Breaker() != failpolicy.BreakerClosed {
					t.Fatalf("a cancelled call moved the breaker to %v", p.Breaker())
				}

				s.fail(errDown)
				for _, op := range []ratelimit.Op{ratelimit.Add, ratelimit.Reset, ratelimit.Replace} {
					if _, err := p.Do(context.Background(), "k", perMinute, ratelimit.Request{Op: op, Tokens: 1}); !errors.Is(err, ratelimit.ErrBackendUnavailable) {
						t.Errorf("%v with the store down: %v; want ErrBackendUnavailable", op, err)
					}
				}
				if p.Breaker() != failpolicy.BreakerOpen {
					t.Fatalf("after a failure with WithBreaker(1, …): %v; want BreakerOpen", p.Breaker())
				}
				check("breaker open")
				if _, err := p.Do(context.Background(), "k", perMinute, ratelimit.Request{Op: ratelimit.Reset}); !errors.Is(err, ratelimit.ErrBackendUnavailable) || !errors.Is(err, failpolicy.ErrBreakerOpen) {
					t.Errorf("Reset with the breaker open: %v; want ErrBackendUnavailable and ErrBreakerOpen", err)
				}
			})
		})
	}
}

// hookLog records what the hooks report.
type hookLog struct {
	mu       sync.Mutex
	degraded []error
	keys     []string    // the key of each degraded decision
	changes  []string    // "from>to", or "node:from>to" for a node's breaker
	at       []time.Time // when each change was reported
}

func (h *hookLog) hooks() failpolicy.Hooks {
	return failpolicy.Hooks{
		Degraded: func(_ context.Context, key string, _ failpolicy.Mode, cause error) {
			h.mu.Lock()
			h.degraded = append(h.degraded, cause)
			h.keys = append(h.keys, key)
			h.mu.Unlock()
		},
		BreakerChanged: func(node string, from, to failpolicy.BreakerState) {
			h.mu.Lock()
			change := from.String() + ">" + to.String()
			if node != "" {
				change = node + ":" + change
			}
			h.changes = append(h.changes, change)
			h.at = append(h.at, time.Now())
			h.mu.Unlock()
		},
	}
}

// TestBreaker walks the breaker: 3 failures open it; during the cool-down
// no call reaches the store; after it, one probe does; a failed probe
// opens it again, an answered one closes it.
func TestBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := ratelimittest.NewClock(time.Unix(1e9, 0))
		s := newStore(t, clock)
		var log hookLog
		p := newPolicy(t, s, failpolicy.Closed, failpolicy.WithBreaker(3, time.Second), failpolicy.WithClock(clock), failpolicy.WithHooks(log.hooks()))
		expect := func(state failpolicy.BreakerState, calls int64, degraded bool) {
			t.Helper()
			before := s.calls.Load()
			d := do(t, p, consume)
			if got := s.calls.Load() - before; got != calls || d.Degraded != degraded || p.Breaker() != state {
				t.Fatalf("%d calls reached the store, Degraded %v, breaker %v; want %d, %v, %v", got, d.Degraded, p.Breaker(), calls, degraded, state)
			}
		}
		s.fail(errTimeout)
		expect(failpolicy.BreakerClosed, 1, true)
		expect(failpolicy.BreakerClosed, 1, true)
		expect(failpolicy.BreakerOpen, 1, true) // the third failure opens it
		expect(failpolicy.BreakerOpen, 0, true)
		s.heal()
		clock.Advance(999 * time.Millisecond)
		expect(failpolicy.BreakerOpen, 0, true) // the cool-down is not over
		s.fail(errDown)
		clock.Advance(time.Millisecond)
		expect(failpolicy.BreakerOpen, 1, true) // the probe fails: open again
		clock.Advance(time.Second)
		s.heal()
		expect(failpolicy.BreakerClosed, 1, false) // the probe is answered
		expect(failpolicy.BreakerClosed, 1, false)

		// A success resets the count: 2 failures, a success, 2 failures keep
		// it closed.
		for _, fail := range []bool{true, true, false, true, true} {
			if fail {
				s.fail(errDown)
			} else {
				s.heal()
			}
			expect(failpolicy.BreakerClosed, 1, fail)
		}

		want := []string{
			"BreakerClosed>BreakerOpen", "BreakerOpen>BreakerHalfOpen", "BreakerHalfOpen>BreakerOpen",
			"BreakerOpen>BreakerHalfOpen", "BreakerHalfOpen>BreakerClosed",
		}
		if fmt.Sprint(log.changes) != fmt.Sprint(want) {
			t.Errorf("BreakerChanged: %v; want %v", log.changes, want)
		}
		var open int
		for _, cause := range log.degraded {
			if errors.Is(cause, failpolicy.ErrBreakerOpen) {
				open++
			}
		}
		if len(log.degraded) != 10 || open != 2 {
			t.Errorf("Degraded called %d times, %d with ErrBreakerOpen; want 10 and 2", len(log.degraded), open)
		}
	})
}

// slowStore answers from memory after delay, or fails when its context
// is done first, as a client that obeys deadlines does.
type slowStore struct {
	*store
	delay atomic.Int64 // ns
}

func (s *slowStore) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := s.wait(ctx); err != nil {
		return ratelimit.Decision{}, err
	}
	return s.mem.Do(ctx, key, cfg, req)
}

func (s *slowStore) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := s.wait(ctx); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	return s.mem.DoPermit(ctx, key, lim, req)
}

// wait counts a call and waits delay, or fails when ctx ends first.
func (s *slowStore) wait(ctx context.Context) error {
	s.calls.Add(1)
	select {
	case <-time.After(time.Duration(s.delay.Load())):
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ratelimit.ErrTimeout, ctx.Err())
	}
}

// TestProbe: the half-open breaker's probe has the cool-down to answer,
// though its caller waits only the deadline; while it is out, no other
// call reaches the store; it opens the breaker again if it fails within
// the cool-down, and closes it if it answers, even after its caller has
// had a degraded decision. It runs on synctest's clock, which moves only
// when every goroutine waits, so each step happens at its exact time.
func TestProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log hookLog
		s := &slowStore{store: newStore(t, nil)}
		const coolDown, timeout = 200 * time.Millisecond, 10 * time.Millisecond
		p := newPolicy(t, s, failpolicy.Open, failpolicy.WithBreaker(1, coolDown),
			failpolicy.WithTimeout(timeout), failpolicy.WithHooks(log.hooks()))
		// at waits until d after start, and wants the breaker in state.
		at := func(start time.Time, d time.Duration, state failpolicy.BreakerState) {
			t.Helper()
			time.Sleep(time.Until(start.Add(d)))
			synctest.Wait()
			if p.Breaker() != state {
				t.Fatalf("%v after the probe's start: breaker %v; want %v", d, p.Breaker(), state)
			}
		}

		s.delay.Store(int64(time.Hour)) // a store that never answers
		if d := do(t, p, consume); !d.Degraded || p.Breaker() != failpolicy.BreakerOpen {
			t.Fatalf("%+v, breaker %v; want Degraded and BreakerOpen", d, p.Breaker())
		}
		time.Sleep(coolDown)
		start := time.Now()
		if d := do(t, p, consume); !d.Degraded || p.Breaker() != failpolicy.BreakerHalfOpen {
			t.Fatalf("the probe's caller: %+v, breaker %v; want Degraded and BreakerHalfOpen", d, p.Breaker())
		}
		if waited := time.Since(start); waited != timeout {
			t.Errorf("the probe's caller waited %v; want the deadline, %v", waited, timeout)
		}
		for range 100 {
			if d := do(t, p, consume); !d.Degraded {
				t.Fatalf("%+v while the probe is out; want Degraded", d)
			}
		}
		if n := s.calls.Load(); n != 2 {
			t.Errorf("%d calls reached the store; want 2, the first and the probe", n)
		}
		at(start, coolDown-time.Nanosecond, failpolicy.BreakerHalfOpen)
		at(start, coolDown, failpolicy.BreakerOpen) // the probe fails at the end of its cool-down

		s.delay.Store(int64(50 * time.Millisecond)) // slower than the deadline, within the cool-down
		time.Sleep(coolDown)
		start = time.Now()
		if d := do(t, p, consume); !d.Degraded {
			t.Fatalf("the probe's caller: %+v; want Degraded: the store answers after the deadline", d)
		}
		at(start, 50*time.Millisecond-time.Nanosecond, failpolicy.BreakerHalfOpen)
		at(start, 50*time.Millisecond, failpolicy.BreakerClosed)
		s.delay.Store(0)
		if d := do(t, p, consume); d.Degraded {
			t.Fatalf("%+v after the probe's answer; want the store's decision", d)
		}
		want := []string{
			"BreakerClosed>BreakerOpen", "BreakerOpen>BreakerHalfOpen", "BreakerHalfOpen>BreakerOpen",
			"BreakerOpen>BreakerHalfOpen", "BreakerHalfOpen>BreakerClosed",
		}
		log.mu.Lock()
		defer log.mu.Unlock()
		if fmt.Sprint(log.changes) != fmt.Sprint(want) {
			t.Errorf("BreakerChanged: %v; want %v", log.changes, want)
		}
	})
}

// TestCancelledCaller: a caller that cancels gets its context's error,
// not a degraded decision, and leaves the breaker as it was.
func TestCancelledCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &slowStore{store: newStore(t, nil)}
		s.delay.Store(int64(time.Hour))
		p := newPolicy(t, s, failpolicy.Closed, failpolicy.WithBreaker(1, time.Hour), failpolicy.WithTimeout(time.Hour))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		if d, err := p.Do(ctx, "k", perMinute, consume); !errors.Is(err, context.Canceled) {
			t.Errorf("%+v, %v; want context.Canceled", d, err)
		}
		if p.Breaker() != failpolicy.BreakerClosed {
			t.Errorf("breaker %v; want BreakerClosed", p.Breaker())
		}
	})
}

func TestShare(t *testing.T) {
	five := int64(5)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(10).WithBurst(100).WithInitialTokens(five),
		ratelimit.PerHour(2),
	}}
	got := failpolicy.Share(cfg, 4)
	want := []struct{ capacity, refill, initial int64 }{{25, 2, 1}, {1, 1, -1}}
	for i, w := range want {
		bw := got.Bandwidths[i]
		initial := int64(-1)
		if bw.InitialTokens != nil {
			initial = *bw.InitialTokens
		}
		if bw.Capacity != w.capacity || bw.RefillTokens != w.refill || initial != w.initial {
			t.Errorf("Bandwidths[%d]: Capacity %d, RefillTokens %d, InitialTokens %d; want %d, %d, %d",
				i, bw.Capacity, bw.RefillTokens, initial, w.capacity, w.refill, w.initial)
		}
	}
	if cfg.Bandwidths[0].Capacity != 100 || *cfg.Bandwidths[0].InitialTokens != 5 {
		t.Error("Share changed its argument")
	}
	if got := failpolicy.Share(cfg, 1); &got.Bandwidths[0] != &cfg.Bandwidths[0] {
		t.Error("Share of 1 copied the config")
	}
}

// FuzzShare: every share lies between 1 and the whole; n shares never
// pass the whole when it has n tokens; and a bandwidth with RefillTokens
// equal to Capacity, as the window algorithms need, keeps them equal.
func FuzzShare(f *testing.F) {
	f.Add(int64(100), int64(10), int64(1000), int64(4), uint8(0))
	f.Add(int64(7), int64(7), int64(60_000_000), int64(3), uint8(2))
	f.Fuzz(func(t *testing.T, capacity, refill, periodMicros, n int64, alg uint8) {
		cfg := ratelimit.Config{
			Algorithm:  ratelimit.Algorithm(alg % 6),
			Bandwidths: []ratelimit.Bandwidth{{Capacity: capacity, RefillTokens: refill, RefillPeriod: time.Duration(periodMicros) * time.Microsecond}},
		}
		if cfg.Validate() != nil || n < 1 {
			return
		}
		got := failpolicy.Share(cfg, n).Bandwidths[0]
		if got.Capacity < 1 || got.Capacity > capacity || got.RefillTokens < 1 || got.RefillTokens > refill {
			t.Fatalf("share of %d/%d by %d: %d/%d", capacity, refill, n, got.Capacity, got.RefillTokens)
		}
		if capacity >= n && got.Capacity*n > capacity {
			t.Fatalf("%d shares of capacity %d hold %d", n, capacity, got.Capacity*n)
		}
		if refill == capacity && got.RefillTokens != got.Capacity {
			t.Fatalf("share of %d/%d by %d: %d/%d, no longer equal", capacity, refill, n, got.Capacity, got.RefillTokens)
		}
	})
}

// deafStore ignores its context: it answers after delay, as rueidis does
// on the paths where it waits a second whatever the deadline.
type deafStore struct{ delay time.Duration }

func (d deafStore) Do(context.Context, string, ratelimit.Config, ratelimit.Request) (ratelimit.Decision, error) {
	time.Sleep(d.delay)
	return ratelimit.Decision{}, errTimeout
}

// TestHardDeadline: a decision returns at the deadline even when the
// client ignores it, to the nanosecond on synctest's clock.
func TestHardDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay, timeout = 300 * time.Millisecond, 10 * time.Millisecond
		p := newPolicy(t, deafStore{delay}, failpolicy.Open, failpolicy.WithTimeout(timeout), failpolicy.WithBreaker(100, time.Hour))
		for range 3 {
			start := time.Now()
			if d := do(t, p, consume); !d.Degraded {
				t.Fatalf("%+v; want Degraded", d)
			}
			if took := time.Since(start); took != timeout {
				t.Errorf("a decision took %v; want the %v deadline, not the store's %v", took, timeout, delay)
			}
		}
		time.Sleep(delay) // the calls left behind end before the bubble
	})
}
