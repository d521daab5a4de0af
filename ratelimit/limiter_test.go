package ratelimit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// inBubble runs f in a synctest bubble with a Limiter over a memory backend
// that reads the bubble's fake time.
func inBubble(t *testing.T, f func(t *testing.T, l *ratelimit.Limiter)) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.New(memory.WithSweepInterval(0))
		defer b.Close()
		f(t, ratelimit.New(b))
	})
}

func fixed(cfg ratelimit.Config) func(context.Context) (ratelimit.Config, error) {
	return func(context.Context) (ratelimit.Config, error) { return cfg, nil }
}

var fivePerSecond = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(5)}}

func TestWaitReturnsAtOnceWhenTokensAreThere(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		start := time.Now()
		if err := l.Bucket("k", fixed(fivePerSecond)).Wait(context.Background(), 5); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("waited %v, want 0", waited)
		}
	})
}

func TestWaitSleepsExactlyUntilTheTokensAreDue(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		b := l.Bucket("k", fixed(fivePerSecond))
		ctx := context.Background()
		if err := b.Wait(ctx, 5); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range 3 { // each waiter queues behind the last: 200ms apart
			if err := b.Wait(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
		if waited := time.Since(start); waited != 600*time.Millisecond {
			t.Fatalf("three waits for one token at 5/s took %v, want 600ms", waited)
		}
	})
}

func TestWaitQueuesConcurrentWaitersOnCredit(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		b := l.Bucket("k", fixed(fivePerSecond))
		ctx := context.Background()
		if _, err := b.ConsumeUpTo(ctx, 5); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var done [10]atomic.Int64
		for i := range done {
			go func() {
				if err := b.Wait(ctx, 1); err != nil {
					t.Error(err)
				}
				done[i].Store(int64(time.Since(start)))
			}()
		}
		synctest.Wait()
		time.Sleep(3 * time.Second)
		var last time.Duration
		for i := range done {
			last = max(last, time.Duration(done[i].Load()))
		}
		if last != 2*time.Second {
			t.Fatalf("the last of 10 waiters at 5/s finished after %v, want 2s", last)
		}
	})
}

func TestWaitPastTheDeadlineTakesNothing(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		b := l.Bucket("k", fixed(fivePerSecond))
		if _, err := b.TryConsume(context.Background(), 5); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 199*time.Millisecond)
		defer cancel()
		if err := b.Wait(ctx, 1); !errors.Is(err, ratelimit.ErrWaitExceedsDeadline) {
			t.Fatalf("Wait: err = %v, want ErrWaitExceedsDeadline", err)
		}
		d, err := b.Inspect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if d.RetryAfter != 200*time.Millisecond {
			t.Fatalf("after a refused Wait, the next token is due in %v, want 200ms", d.RetryAfter)
		}
	})
}

// TestWaitPollsAlgorithmsThatCannotReserve: on a window algorithm or a
// leaky bucket, Wait takes the tokens once they are free, sleeping for
// each denial's RetryAfter; a deadline before that fails at once, and a
// cancelled poll takes nothing.
func TestWaitPollsAlgorithmsThatCannotReserve(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter, ratelimit.LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
				cfg := ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(5)}}
				b := l.Bucket("k", fixed(cfg))
				ctx := context.Background()
				time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second))) // a whole second, for the counter's windows
				start := time.Now()
				if err := b.Wait(ctx, 5); err != nil {
					t.Fatal(err)
				}
				short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
				defer cancel()
				if err := b.Wait(short, 1); !errors.Is(err, ratelimit.ErrWaitExceedsDeadline) {
					t.Fatalf("Wait with 10ms to go: %v, want ErrWaitExceedsDeadline", err)
				}
				if err := b.Wait(ctx, 1); err != nil {
					t.Fatal(err)
				}
				d, err := b.Inspect(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if waited := time.Since(start); waited <= 0 || waited > 2*time.Second || d.Remaining > 4 {
					t.Fatalf("Wait(1) after 5 returned after %v, leaving %+v; want a wait of at most 2s and the token taken", waited, d)
				}
				cancelled, cancelNow := context.WithCancel(ctx)
				go func() {
					time.Sleep(time.Millisecond)
					cancelNow()
				}()
				before, _ := b.Inspect(ctx)
				if err := b.Wait(cancelled, 5); !errors.Is(err, context.Canceled) {
					t.Fatalf("Wait cancelled while polling: %v, want context.Canceled", err)
				}
				if after, _ := b.Inspect(ctx); after.Remaining != before.Remaining {
					t.Fatalf("a cancelled poll left Remaining %d, was %d", after.Remaining, before.Remaining)
				}
			})
		})
	}
}

func TestCancelledWaitGivesTheTokensBack(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		b := l.Bucket("k", fixed(fivePerSecond))
		if _, err := b.TryConsume(context.Background(), 5); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		if err := b.Wait(ctx, 2); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait: err = %v, want context.Canceled", err)
		}
		// 100ms refilled half a token; the two reserved came back.
		d, err := b.Inspect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if d.RetryAfter != 100*time.Millisecond {
			t.Fatalf("after a cancelled Wait the next token is due in %v, want 100ms", d.RetryAfter)
		}
	})
}

func TestPlanChangeAppliesOnTheNextRequest(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []ratelimit.Option
		wantLeft int64
	}{
		{"AsIs by default", nil, 5},
		{"ResetTokens", []ratelimit.Option{ratelimit.WithInheritance(ratelimit.ResetTokens)}, 99},
		{"Additive", []ratelimit.Option{ratelimit.WithInheritance(ratelimit.Additive)}, 95},
		{"Proportionally", []ratelimit.Option{ratelimit.WithInheritance(ratelimit.Proportionally)}, 59},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				backend := memory.New(memory.WithSweepInterval(0))
				defer backend.Close()
				l := ratelimit.New(backend, tc.opts...)
				plan := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}
				b := l.Bucket("customer-1", func(context.Context) (ratelimit.Config, error) { return plan, nil })
				ctx := context.Background()
				if n, err := b.ConsumeUpTo(ctx, 4); n != 4 || err != nil {
					t.Fatalf("ConsumeUpTo = %d, %v", n, err)
				}
				plan = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(100)}} // the customer upgrades
				d, err := b.TryConsume(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Limit != 100 || d.Remaining != tc.wantLeft {
					t.Fatalf("after the upgrade: Limit %d, Remaining %d; want 100, %d", d.Limit, d.Remaining, tc.wantLeft)
				}
			})
		})
	}
}

func TestReplaceConvertsNow(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		small := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}
		big := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(20)}}
		b := l.Bucket("k", fixed(big))
		ctx := context.Background()
		if _, err := l.AllowN(ctx, "k", small, 6); err != nil {
			t.Fatal(err)
		}
		if err := b.Replace(ctx, big, ratelimit.Proportionally); err != nil {
			t.Fatal(err)
		}
		d, err := b.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d.Limit != 20 || d.Remaining != 8 {
			t.Fatalf("after Replace: Limit %d, Remaining %d; want 20, 8", d.Limit, d.Remaining)
		}
	})
}

func TestBucketErrors(t *testing.T) {
	ctx := context.Background()
	backend := memory.New(memory.WithSweepInterval(0))
	defer backend.Close()
	l := ratelimit.New(backend)

	boom := errors.New("plans store is down")
	_, err := l.Bucket("k", func(context.Context) (ratelimit.Config, error) { return ratelimit.Config{}, boom }).TryConsume(ctx, 1)
	if !errors.Is(err, boom) {
		t.Fatalf("supplier failure: err = %v, want it to wrap the supplier's error", err)
	}
	if _, err := l.Bucket("k", nil).TryConsume(ctx, 1); !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Fatalf("nil supplier: err = %v, want ErrInvalidConfig", err)
	}
	if _, err := l.Bucket("", fixed(fivePerSecond)).TryConsume(ctx, 1); !errors.Is(err, ratelimit.ErrInvalidKey) {
		t.Fatalf("empty key: err = %v, want ErrInvalidKey", err)
	}
	if _, err := l.Bucket("k", fixed(fivePerSecond)).TryConsume(ctx, 6); !errors.Is(err, ratelimit.ErrInvalidRequest) {
		t.Fatalf("more tokens than the capacity: err = %v, want ErrInvalidRequest", err)
	}
	if _, err := ratelimit.New(nil).Allow(ctx, "k", fivePerSecond); !errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Fatalf("nil backend: err = %v, want ErrBackendUnavailable", err)
	}
}
