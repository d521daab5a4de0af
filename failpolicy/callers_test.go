package failpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// impatient returns the contexts of callers that want an answer sooner
// than the store gives one: already past their deadline, or with a 50µs
// one.
func impatient(t *testing.T) []context.Context {
	expired, stop := context.WithDeadline(context.Background(), time.Unix(1, 0))
	t.Cleanup(stop)
	short, stop := context.WithTimeout(context.Background(), 50*time.Microsecond)
	t.Cleanup(stop)
	return []context.Context{expired, short}
}

// TestImpatientCallers: callers whose own deadlines pass before the store
// answers (issue 12, 1 and 4) get their context's error, not a degraded
// decision, and do not move the breaker, in any mode; so a client that
// sets itself a short deadline cannot switch limiting off (Open) or on
// (Closed) for the others, and the next patient caller is decided by the
// store.
func TestImpatientCallers(t *testing.T) {
	for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed, failpolicy.Local} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &slowStore{store: newStore(t, nil)}
				s.delay.Store(int64(time.Millisecond))
				var log hookLog
				p := newPolicy(t, s, mode, failpolicy.WithTimeout(10*time.Millisecond), failpolicy.WithHooks(log.hooks()))
				for range 20 {
					for _, ctx := range impatient(t) {
						d, err := p.Do(ctx, "attacker", perMinute, consume)
						if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ratelimit.ErrTimeout) || d.Degraded {
							t.Fatalf("an impatient caller: %+v, %v; want context.DeadlineExceeded, not ErrTimeout, not Degraded", d, err)
						}
					}
				}
				if p.Breaker() != failpolicy.BreakerClosed || len(log.changes) != 0 || len(log.degraded) != 0 {
					t.Fatalf("after 40 impatient callers: breaker %v, changes %v, %d degraded; want BreakerClosed and nothing reported", p.Breaker(), log.changes, len(log.degraded))
				}
				// The victim's bucket of 3 is decided by the store.
				victim := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3)}}
				admitted := 0
				for range 6 {
					d, err := p.Do(context.Background(), "victim", victim, consume)
					if err != nil || d.Degraded {
						t.Fatalf("a patient caller: %+v, %v; want the store's decision", d, err)
					}
					if d.Allowed {
						admitted++
					}
				}
				if admitted != 3 {
					t.Errorf("the victim's bucket of 3 admitted %d of 6; want 3", admitted)
				}
				time.Sleep(time.Millisecond) // the calls left behind end
			})
		})
	}
}

// TestKeyErrorsDoNotTrip: an error about one key (a full key cap, issue
// 12, 5) comes back to its caller and does not count against the store,
// so a flood of new keys cannot open the breaker and let the victim's
// drained bucket admit again.
func TestKeyErrorsDoNotTrip(t *testing.T) {
	for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Local} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memory.New(memory.WithMaxKeys(100))
				defer mem.Close()
				var log hookLog
				p := newPolicy(t, mem, mode, failpolicy.WithHooks(log.hooks()))
				victim := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(5)}}
				for range 5 {
					if d, err := p.Do(context.Background(), "victim", victim, consume); err != nil || !d.Allowed {
						t.Fatalf("draining the victim: %+v, %v", d, err)
					}
				}
				rejected := 0
				for i := range 200 {
					d, err := p.Do(context.Background(), fmt.Sprint("attacker-", i), perMinute, consume)
					switch {
					case errors.Is(err, memory.ErrTooManyKeys) && errors.Is(err, ratelimit.ErrKeyRejected) && !d.Degraded:
						rejected++
					case err != nil || d.Degraded:
						t.Fatalf("attacker key %d: %+v, %v; want the store's decision or ErrTooManyKeys", i, d, err)
					}
				}
				if rejected != 101 {
					t.Errorf("%d new keys rejected; want 101, beyond the cap of 100 with the victim's", rejected)
				}
				if p.Breaker() != failpolicy.BreakerClosed || len(log.changes) != 0 {
					t.Fatalf("breaker %v, changes %v; want BreakerClosed", p.Breaker(), log.changes)
				}
				for range 5 {
					if d, err := p.Do(context.Background(), "victim", victim, consume); err != nil || d.Allowed || d.Degraded {
						t.Fatalf("the drained victim: %+v, %v; want denied by the store", d, err)
					}
				}
			})
		})
	}
}

// panicStore panics, after delay, in every call, as a store with a bug
// does: its counts map is nil.
type panicStore struct {
	delay  time.Duration
	counts map[string]int
}

func (p panicStore) Do(_ context.Context, key string, _ ratelimit.Config, _ ratelimit.Request) (ratelimit.Decision, error) {
	time.Sleep(p.delay)
	p.counts[key]++ // assignment to entry in nil map
	return ratelimit.Decision{}, nil
}

// TestPanicReachesTheCaller: a panic in the wrapped Backend (issue 12, 6)
// is raised again on the caller's goroutine, where a server's recover
// catches it, as a *PanicError holding the value and the stack; the
// process lives, and the breaker is as it was.
func TestPanicReachesTheCaller(t *testing.T) {
	p := newPolicy(t, panicStore{}, failpolicy.Open, failpolicy.WithTimeout(time.Minute), failpolicy.WithBreaker(1, time.Hour))
	recovered := func() (v any) {
		defer func() { v = recover() }()
		_, _ = p.Do(context.Background(), "k", perMinute, consume)
		return nil
	}()
	pe, ok := recovered.(*failpolicy.PanicError)
	if !ok {
		t.Fatalf("recovered %T %v; want a *failpolicy.PanicError", recovered, recovered)
	}
	var re interface{ RuntimeError() }
	if !errors.As(pe, &re) || len(pe.Stack) == 0 {
		t.Errorf("PanicError %q: want the runtime error as Value, reachable with errors.As, and a stack", pe.Value)
	}
	if p.Breaker() != failpolicy.BreakerClosed {
		t.Errorf("breaker %v after a panic; want BreakerClosed", p.Breaker())
	}
}

// TestLatePanic: a panic after the caller had its decision goes to
// Hooks.Panicked.
func TestLatePanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu     sync.Mutex
			caught []*failpolicy.PanicError
		)
		hooks := failpolicy.Hooks{Panicked: func(_ string, p *failpolicy.PanicError) {
			mu.Lock()
			caught = append(caught, p)
			mu.Unlock()
		}}
		p := newPolicy(t, panicStore{delay: time.Second}, failpolicy.Open, failpolicy.WithTimeout(10*time.Millisecond), failpolicy.WithHooks(hooks))
		if d := do(t, p, consume); !d.Degraded || !d.Allowed {
			t.Fatalf("%+v; want Open's degraded admission at the deadline", d)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(caught) != 1 {
			t.Fatalf("Panicked called %d times; want once", len(caught))
		}
	})
}

// hangStore hangs, ignoring its context, while hanging is set, until
// release; otherwise it answers from memory.
type hangStore struct {
	*store
	mu      sync.Mutex
	hanging bool
	release chan struct{}
}

func (h *hangStore) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	h.calls.Add(1)
	h.mu.Lock()
	hang := h.hanging
	h.mu.Unlock()
	if hang {
		<-h.release
		return ratelimit.Decision{}, errTimeout
	}
	return h.mem.Do(ctx, key, cfg, req)
}

func (h *hangStore) heal() {
	h.mu.Lock()
	h.hanging = false
	h.mu.Unlock()
}

// TestProbeThatNeverReturns: a probe that hangs past its cool-down, its
// client ignoring the context (issue 12, 7), counts as failed then, so
// that once the store answers again the next probe closes the breaker,
// within one more cool-down.
func TestProbeThatNeverReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const coolDown, timeout = 100 * time.Millisecond, 10 * time.Millisecond
		h := &hangStore{store: newStore(t, nil), hanging: true, release: make(chan struct{})}
		defer close(h.release)
		var log hookLog
		p := newPolicy(t, h, failpolicy.Open, failpolicy.WithBreaker(1, coolDown), failpolicy.WithTimeout(timeout), failpolicy.WithHooks(log.hooks()))
		do(t, p, consume) // hangs: the breaker opens at the deadline
		time.Sleep(coolDown)
		do(t, p, consume) // the probe, which hangs too
		time.Sleep(coolDown)
		synctest.Wait()
		if p.Breaker() != failpolicy.BreakerOpen {
			t.Fatalf("a cool-down after the probe went out, still hanging: %v; want BreakerOpen", p.Breaker())
		}
		h.heal()
		time.Sleep(coolDown)
		if d := do(t, p, consume); d.Degraded {
			t.Fatalf("%+v a cool-down after the store came back; want the store's decision", d)
		}
		if p.Breaker() != failpolicy.BreakerClosed {
			t.Fatalf("breaker %v; want BreakerClosed", p.Breaker())
		}
		want := "[BreakerClosed>BreakerOpen BreakerOpen>BreakerHalfOpen BreakerHalfOpen>BreakerOpen BreakerOpen>BreakerHalfOpen BreakerHalfOpen>BreakerClosed]"
		log.mu.Lock()
		defer log.mu.Unlock()
		if fmt.Sprint(log.changes) != want {
			t.Errorf("BreakerChanged: %v; want %v", log.changes, want)
		}
	})
}

// TestLocalKeys: the Local mode keeps shares for at most WithLocalKeys
// keys (issue 12, 8); while the store is away a new key beyond them is
// denied, as Closed would, and the keys it holds are decided by their
// shares as before.
func TestLocalKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStore(t, nil)
		s.fail(errDown)
		p := newPolicy(t, s, failpolicy.Local, failpolicy.WithLocalKeys(100), failpolicy.WithRetryAfter(time.Second))
		for i := range 200 {
			d, err := p.Do(context.Background(), fmt.Sprint("flood-", i), perMinute, consume)
			if err != nil || !d.Degraded || d.Allowed != (i < 100) {
				t.Fatalf("flood key %d: %+v, %v; want Degraded, allowed for the first 100 only", i, d, err)
			}
			if i >= 100 && d.RetryAfter != time.Second {
				t.Fatalf("flood key %d: %+v; want Closed's RetryAfter, 1s", i, d)
			}
		}
		if d := do(t, p, consume); !d.Degraded || d.Allowed {
			t.Fatalf("a new key with the shares full: %+v; want denied", d)
		}
		if d, err := p.Do(context.Background(), "flood-7", perMinute, consume); err != nil || !d.Allowed || d.Remaining != 8 {
			t.Fatalf("a key with a share: %+v, %v; want allowed from its share, 8 left", d, err)
		}
	})
}

// TestLocalDebtIsCharged: what the Local mode's shares admit is charged to
// the store by the next call that reaches it, on credit for the token
// bucket and as far as the window goes for the fixed window, at most
// twice the share, before that call's own request.
func TestLocalDebtIsCharged(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  ratelimit.Config
		// admitted is what the share of 2 instances admits; inspect is
		// what the store holds after the charge and one more token.
		admitted  int
		remaining int64
		credit    bool
	}{
		{"TokenBucket", ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}, 5, 4, false},
		{"FixedWindow", ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}, 5, 4, false},
		// Drained first: the token bucket lends, so the store goes 5 into
		// credit and then denies; the window takes what it has, nothing.
		{"TokenBucketDrained", ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}, 5, 0, true},
		{"FixedWindowDrained", ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}, 5, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newStore(t, nil)
				p := newPolicy(t, s, failpolicy.Local, failpolicy.WithInstances(2), failpolicy.WithBreaker(100, time.Hour))
				drained := strings.HasSuffix(tc.name, "Drained")
				if drained {
					for range 10 {
						if d, err := p.Do(context.Background(), "k", tc.cfg, consume); err != nil || !d.Allowed {
							t.Fatalf("draining: %+v, %v", d, err)
						}
					}
				}
				s.fail(errDown)
				admitted := 0
				for range 20 {
					d, err := p.Do(context.Background(), "k", tc.cfg, consume)
					if err != nil || !d.Degraded {
						t.Fatalf("with the store down: %+v, %v", d, err)
					}
					if d.Allowed {
						admitted++
					}
				}
				if admitted != tc.admitted {
					t.Fatalf("the share admitted %d; want %d", admitted, tc.admitted)
				}
				s.heal()
				before := s.calls.Load()
				d, err := p.Do(context.Background(), "k", tc.cfg, consume)
				if err != nil || d.Degraded {
					t.Fatalf("the store back: %+v, %v", d, err)
				}
				if n := s.calls.Load() - before; n != 2 {
					t.Errorf("%d calls reached the store; want 2, the charge and the request", n)
				}
				if d.Allowed == drained || d.Remaining != tc.remaining {
					t.Errorf("the first call after the charge: %+v; want Remaining %d", d, tc.remaining)
				}
				in, err := s.mem.Do(context.Background(), "k", tc.cfg, ratelimit.Request{Op: ratelimit.Inspect})
				if err != nil {
					t.Fatal(err)
				}
				if tc.credit && in.RetryAfter < 5*6*time.Minute {
					t.Errorf("Inspect: %+v; want the store 5 tokens in credit: a RetryAfter of at least 30m at 10 an hour", in)
				}
				// The debt is paid: the next call is one request.
				before = s.calls.Load()
				if _, err := p.Do(context.Background(), "k", tc.cfg, consume); err != nil {
					t.Fatal(err)
				}
				if n := s.calls.Load() - before; n != 1 {
					t.Errorf("%d calls reached the store after the debt was paid; want 1", n)
				}
			})
		})
	}
}

// earlyStore returns, early before its context's deadline, the error a
// client returns for that deadline, as rueidis does when a call joins a
// dial that another call's deadline ended (see ctxerr.Slack). label makes
// the error as a Backend would: redisscript.Error, as the Redis backends
// do, or wrapping ErrTimeout, as a Backend that does not tell the
// caller's deadline from its own does.
type earlyStore struct {
	*store
	early time.Duration
	label func(ctx context.Context, err error) error
}

func (s *earlyStore) Do(ctx context.Context, _ string, _ ratelimit.Config, _ ratelimit.Request) (ratelimit.Decision, error) {
	s.calls.Add(1)
	if deadline, ok := ctx.Deadline(); ok {
		time.Sleep(time.Until(deadline) - s.early)
	}
	return ratelimit.Decision{}, s.label(ctx, fmt.Errorf("dial tcp 127.0.0.1:6379: %w", context.DeadlineExceeded))
}

// labels are the ways a Backend makes the error of an earlyStore.
var labels = []struct {
	name  string
	label func(ctx context.Context, err error) error
}{
	{"redisscript", func(ctx context.Context, err error) error {
		return redisscript.Error(ctx, err, `fake: Consume on key "k"`)
	}},
	{"ErrTimeout", func(_ context.Context, err error) error {
		return fmt.Errorf("%w: fake: %w", ratelimit.ErrTimeout, err)
	}},
}

// TestEarlyDeadlineError: a deadline's error that comes back a moment
// before the deadline it belongs to, within ctxerr.Slack, counts as that
// deadline passing. The caller's: the caller gets its context's error,
// not a degraded decision, and the breaker is untouched, so that a
// client cannot open it with deadlines that end in the store. The
// policy's, even with the caller's deadline just after it: a failure,
// Degraded and counted. In a synctest bubble, so that the error comes
// back exactly early before the deadline.
func TestEarlyDeadlineError(t *testing.T) {
	const early = 10 * time.Microsecond // about what rueidis was measured at
	tests := []struct {
		name string
		// caller is the caller's timeout (0: none), timeout the policy's.
		caller, timeout time.Duration
		policys         bool
	}{
		{"CallersDeadline", 5 * time.Millisecond, time.Minute, false},
		{"CallersDeadlineWithinSlack", ctxerr.Slack / 2, time.Minute, false},
		{"PolicysDeadline", 0, 5 * time.Millisecond, true},
		{"PolicysDeadlineCallersJustAfter", 5*time.Millisecond + ctxerr.Slack/2, 5 * time.Millisecond, true},
	}
	for _, l := range labels {
		for _, tt := range tests {
			t.Run(l.name+"/"+tt.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					s := &earlyStore{store: newStore(t, nil), early: early, label: l.label}
					var log hookLog
					p := newPolicy(t, s, failpolicy.Open, failpolicy.WithTimeout(tt.timeout), failpolicy.WithBreaker(1, time.Hour), failpolicy.WithHooks(log.hooks()))
					ctx := context.Background()
					if tt.caller > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, tt.caller)
						defer cancel()
					}
					d, err := p.Do(ctx, "k", perMinute, consume)
					log.mu.Lock()
					defer log.mu.Unlock()
					if !tt.policys {
						if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ratelimit.ErrTimeout) || errors.Is(err, ratelimit.ErrBackendUnavailable) || d.Degraded {
							t.Fatalf("%+v, %v; want context.DeadlineExceeded, no store sentinel, not Degraded", d, err)
						}
						if p.Breaker() != failpolicy.BreakerClosed || len(log.changes) != 0 || len(log.degraded) != 0 {
							t.Fatalf("breaker %v, changes %v, %d degraded; want BreakerClosed and nothing reported", p.Breaker(), log.changes, len(log.degraded))
						}
						return
					}
					if err != nil || !d.Degraded || !d.Allowed {
						t.Fatalf("%+v, %v; want Open's degraded admission", d, err)
					}
					if len(log.degraded) != 1 || !errors.Is(log.degraded[0], ratelimit.ErrTimeout) {
						t.Errorf("Degraded causes %v; want one, wrapping ErrTimeout", log.degraded)
					}
					if p.Breaker() != failpolicy.BreakerOpen {
						t.Errorf("breaker %v; want BreakerOpen: the failure counted", p.Breaker())
					}
				})
			})
		}
	}
}

// TestEarlyDeadlineErrorProbe: a probe whose store returns a deadline's
// error a moment before the probe's cool-down ends has failed, and opens
// the breaker again.
func TestEarlyDeadlineErrorProbe(t *testing.T) {
	for _, l := range labels {
		t.Run(l.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const coolDown, timeout = 100 * time.Millisecond, 10 * time.Millisecond
				s := &earlyStore{store: newStore(t, nil), early: 10 * time.Microsecond, label: l.label}
				var log hookLog
				p := newPolicy(t, s, failpolicy.Open, failpolicy.WithTimeout(timeout), failpolicy.WithBreaker(1, coolDown), failpolicy.WithHooks(log.hooks()))
				do(t, p, consume) // fails early before the deadline: the breaker opens
				time.Sleep(coolDown)
				do(t, p, consume) // the probe, which fails early before the cool-down ends
				time.Sleep(coolDown)
				synctest.Wait()
				want := "[BreakerClosed>BreakerOpen BreakerOpen>BreakerHalfOpen BreakerHalfOpen>BreakerOpen]"
				log.mu.Lock()
				defer log.mu.Unlock()
				if fmt.Sprint(log.changes) != want {
					t.Errorf("BreakerChanged: %v; want %v", log.changes, want)
				}
			})
		})
	}
}
