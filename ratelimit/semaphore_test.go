package ratelimit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

// inFlight returns the permits held at key under lim, failing the test on
// error.
func inFlight(t *testing.T, l *ratelimit.Limiter, key string, lim ratelimit.Concurrency) int64 {
	t.Helper()
	d, err := l.Semaphore(key, func(context.Context) (ratelimit.Concurrency, error) { return lim, nil }).InFlight(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return d.InFlight
}

func TestAcquireWaitsForARelease(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		ctx := context.Background()
		lim := ratelimit.InFlight(1, time.Hour)
		p, err := l.Acquire(ctx, "k", lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time)
		go func() {
			q, err := l.Acquire(ctx, "k", lim, 1)
			if err != nil {
				t.Error(err)
			}
			got <- time.Now()
			_ = q.Release(ctx)
		}()
		time.Sleep(10 * time.Second)
		released := time.Now()
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// The waiter's backoff has reached its cap: it tries again within
		// MaxAcquireBackoff.
		if waited := (<-got).Sub(released); waited > ratelimit.MaxAcquireBackoff {
			t.Fatalf("the waiter took the permit %v after its release; want at most %v", waited, ratelimit.MaxAcquireBackoff)
		}
	})
}

func TestAcquireWaitsNoLongerThanTheFirstLease(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		ctx := context.Background()
		if _, _, err := l.TryAcquire(ctx, "k", ratelimit.InFlight(1, 5*time.Millisecond), 1); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		p, err := l.Acquire(ctx, "k", ratelimit.InFlight(1, time.Hour), 1)
		if err != nil {
			t.Fatal(err)
		}
		// Backoffs of 0.5-1ms, then 1-2ms, then the RetryAfter, which
		// comes sooner than the next: the lease's end, to the µs the
		// store's clock counts in.
		if waited := time.Since(start); waited < 5*time.Millisecond || waited > 5*time.Millisecond+time.Microsecond {
			t.Fatalf("Acquire took %v; the lease held ended at 5ms", waited)
		}
		_ = p.Release(ctx)
	})
}

func TestAcquireGivesUpWithItsContext(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		lim := ratelimit.InFlight(1, time.Hour)
		if _, _, err := l.TryAcquire(context.Background(), "k", lim, 1); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p, err := l.Acquire(ctx, "k", lim, 1)
		if p != nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire = %v, %v; want none and DeadlineExceeded", p, err)
		}
		if n := inFlight(t, l, "k", lim); n != 1 {
			t.Fatalf("%d held; want 1", n)
		}
	})
}

func TestKeepAliveHoldsPastTheLease(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		lim := ratelimit.InFlight(1, 30*time.Millisecond)
		p, _, err := l.TryAcquire(context.Background(), "k", lim, 1)
		if err != nil || p == nil {
			t.Fatal(p, err)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- p.KeepAlive(ctx) }()
		time.Sleep(time.Second)
		if n := inFlight(t, l, "k", lim); n != 1 {
			t.Fatalf("after a second, %d held; want the kept permit", n)
		}
		stop()
		if err := <-done; err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		time.Sleep(lim.Lease)
		if n := inFlight(t, l, "k", lim); n != 0 {
			t.Fatalf("a lease after KeepAlive stopped, %d held; want 0", n)
		}
	})
}

func TestKeepAliveReportsALostPermit(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		lim := ratelimit.InFlight(1, 30*time.Millisecond)
		p, _, err := l.TryAcquire(context.Background(), "k", lim, 1)
		if err != nil || p == nil {
			t.Fatal(p, err)
		}
		time.Sleep(lim.Lease)
		if err := p.KeepAlive(context.Background()); !errors.Is(err, ratelimit.ErrPermitLost) {
			t.Fatalf("KeepAlive of a permit whose lease ended: %v; want ErrPermitLost", err)
		}
	})
}

func TestKeepAliveEndsWithTheRelease(t *testing.T) {
	inBubble(t, func(t *testing.T, l *ratelimit.Limiter) {
		lim := ratelimit.InFlight(1, 30*time.Millisecond)
		p, _, err := l.TryAcquire(context.Background(), "k", lim, 1)
		if err != nil || p == nil {
			t.Fatal(p, err)
		}
		done := make(chan error)
		go func() { done <- p.KeepAlive(context.Background()) }()
		time.Sleep(25 * time.Millisecond)
		if err := p.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("KeepAlive of a released permit: %v; want nil", err)
		}
	})
}

// rateOnly is a Backend that holds no permits.
type rateOnly struct{ ratelimit.Backend }

func TestPermitsNeedAPermitBackend(t *testing.T) {
	lim := ratelimit.InFlight(1, time.Second)
	b := memory.New(memory.WithSweepInterval(0))
	defer b.Close()
	if _, _, err := ratelimit.New(rateOnly{b}).TryAcquire(context.Background(), "k", lim, 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("TryAcquire on a Backend without permits: %v; want ErrUnsupported", err)
	}
	if _, _, err := ratelimit.New(nil).TryAcquire(context.Background(), "k", lim, 1); !errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Errorf("TryAcquire with no Backend: %v; want ErrBackendUnavailable", err)
	}
	if _, _, err := ratelimit.New(rateOnly{b}).TryAcquire(context.Background(), "k", ratelimit.InFlight(0, time.Second), 1); !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Errorf("TryAcquire of a bad limit on a Backend without permits: %v; want ErrInvalidConfig first", err)
	}
	s, err := ratelimit.Stack(b)
	if err != nil {
		t.Fatal(err)
	}
	if p, _, err := ratelimit.New(s).TryAcquire(context.Background(), "k", lim, 1); err != nil || p == nil {
		t.Errorf("TryAcquire through a Stack: %v, %v; want a permit", p, err)
	}
}

func TestHoldersAreUnique(t *testing.T) {
	b := memory.New(memory.WithSweepInterval(0))
	defer b.Close()
	l := ratelimit.New(b)
	seen := make(map[string]bool)
	for range 1000 {
		p, _, err := l.TryAcquire(context.Background(), "k", ratelimit.InFlight(ratelimit.MaxPermits, time.Hour), 1)
		if err != nil || p == nil {
			t.Fatal(p, err)
		}
		if seen[p.Holder()] || len(p.Holder()) > ratelimit.MaxHolderLen {
			t.Fatalf("holder %q: seen before, or longer than MaxHolderLen", p.Holder())
		}
		seen[p.Holder()] = true
	}
}

// policyStore answers permit calls as a fail policy does while the store
// is away, when down is set: Open's grants, and a release or renew it
// could not ask the store about.
type policyStore struct {
	*memory.Backend
	down atomic.Bool
}

func (s *policyStore) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if !s.down.Load() {
		return s.Backend.DoPermit(ctx, key, lim, req)
	}
	return ratelimit.PermitDecision{Granted: req.Op == ratelimit.PermitAcquire, Degraded: true, Limit: lim.Limit}, nil
}

func TestPermitsAFailPolicyAnswered(t *testing.T) {
	ctx := context.Background()
	b := memory.New(memory.WithSweepInterval(0))
	defer b.Close()
	s := &policyStore{Backend: b}
	l := ratelimit.New(s)
	lim := ratelimit.InFlight(1, time.Hour)

	// A permit the store granted, renewed and released while the policy
	// answers: the store was not asked, which is not a lost permit.
	held, _, err := l.TryAcquire(ctx, "k", lim, 1)
	if err != nil || held == nil {
		t.Fatal(held, err)
	}
	s.down.Store(true)
	if err := held.Renew(ctx); !errors.Is(err, ratelimit.ErrBackendUnavailable) || errors.Is(err, ratelimit.ErrPermitLost) {
		t.Errorf("Renew answered by the policy: %v; want ErrBackendUnavailable", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("Release answered by the policy: %v; want nil: the store frees the permit when its lease ends", err)
	}

	// A permit the policy granted is never lost, whoever answers later.
	degraded, d, err := l.TryAcquire(ctx, "j", lim, 1)
	if err != nil || degraded == nil || !d.Degraded {
		t.Fatal(degraded, d, err)
	}
	if err := degraded.Renew(ctx); err != nil {
		t.Errorf("Renew of a degraded permit, the policy answering: %v", err)
	}
	s.down.Store(false)
	if err := degraded.Renew(ctx); err != nil {
		t.Errorf("Renew of a degraded permit, the store answering: %v", err)
	}
	if err := degraded.Release(ctx); err != nil {
		t.Errorf("Release of a degraded permit, the store answering: %v", err)
	}
}
