package failpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestPermitStallIntegration stops Redis (SIGSTOP, or SIGKILL) while a
// permit taken from it is held, for each adapter and mode, and makes
// permit calls through the Limiter's handles: each must come back with
// the mode's answer (Open: granted, the held permit renewed and released
// without error; Closed: denied, the held permit's Renew lost; Local: the
// instance's share granted, and no more, renewed and released locally,
// the store's permit's Renew lost), within the deadline plus the
// scheduling delays measured meanwhile plus slack. Then Redis comes back,
// and permits come from the store again, while a Local permit is still
// released without error (an Open one, held nowhere, may be lost).
func TestPermitStallIntegration(t *testing.T) {
	for _, a := range adapters {
		for _, f := range faults {
			for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed, failpolicy.Local} {
				t.Run(fmt.Sprintf("%s/%s/%v", a.name, f.name, mode), func(t *testing.T) {
					t.Parallel()
					server := servers.StartRedis(t)
					store := a.connect(t, server.Addr())
					pb, ok := store.(ratelimit.PermitBackend)
					if !ok {
						t.Skipf("%T holds no permits: the Redis backends' DoPermit is not on this branch", store)
					}
					key := "permits:" + t.Name()
					lim := ratelimit.InFlight(4, time.Hour) // a share of 2 for each of 2 instances
					warmPermits(t, pb, key, lim)
					var log hookLog
					policy := newPolicy(t, store, mode, failpolicy.WithBreaker(3, stallCoolDown), failpolicy.WithInstances(2), failpolicy.WithHooks(log.hooks()))
					l := ratelimit.New(policy)
					ctx := context.Background()
					held := acquireFromStore(t, l, key, lim)

					f.stop(server, t)
					stopWatch := watchScheduling()
					var slowest time.Duration
					timed := func(call func()) {
						start := time.Now()
						call()
						slowest = max(slowest, time.Since(start))
					}
					var local []*ratelimit.Permit
					for i := range 3 {
						timed(func() {
							p, d, err := l.TryAcquire(ctx, key, lim, 1)
							want := mode == failpolicy.Open || mode == failpolicy.Local && i < 2
							if err != nil || !d.Degraded || (p != nil) != want {
								t.Errorf("TryAcquire %d with Redis %s: %v, %+v, %v; want Degraded, a permit %v", i, f.name, p, d, err, want)
							}
							if mode == failpolicy.Closed && d.RetryAfter != stallCoolDown {
								t.Errorf("Closed's denial: %+v; want a RetryAfter of the cool-down, %v", d, stallCoolDown)
							}
							if p != nil {
								local = append(local, p)
							}
						})
					}
					for _, p := range local {
						timed(func() {
							if err := p.Renew(ctx); err != nil {
								t.Errorf("Renew of a permit the mode granted: %v", err)
							}
						})
					}
					timed(func() {
						err := held.Renew(ctx)
						if unasked := errors.Is(err, ratelimit.ErrBackendUnavailable) && !errors.Is(err, ratelimit.ErrPermitLost); mode == failpolicy.Open && err != nil || mode != failpolicy.Open && !unasked {
							t.Errorf("Renew of the store's permit with Redis %s: %v; want nil in Open mode, else ErrBackendUnavailable (the store was not asked; KeepAlive tries again)", f.name, err)
						}
					})
					timed(func() {
						if err := held.Release(ctx); err != nil {
							t.Errorf("Release of the store's permit with Redis %s: %v; want nil: the store frees it when its lease ends", f.name, err)
						}
					})
					if len(local) > 0 {
						timed(func() {
							if err := local[0].Release(ctx); err != nil {
								t.Errorf("Release of a permit the mode granted: %v", err)
							}
						})
					}
					late := stopWatch()
					t.Logf("with Redis %s: the slowest permit call took %v; goroutines woke up to %v late meanwhile", f.name, slowest, late)
					if limit := stallTimeout + decisionWakeups*late + stallSlack; slowest > limit {
						t.Errorf("a permit call took %v; want at most %v: the %v deadline, %d × %v of scheduling delay, and %v",
							slowest, limit, stallTimeout, decisionWakeups, late, stallSlack)
					}

					f.restart(server, t)
					back := time.Now()
					for {
						p, d, err := l.TryAcquire(ctx, key+":after", lim, 1)
						if err != nil {
							t.Fatal(err)
						}
						if p != nil {
							if err := p.Release(ctx); err != nil && !d.Degraded {
								t.Fatalf("Release of a permit from the store: %v", err)
							}
						}
						if !d.Degraded && p != nil {
							break
						}
						if time.Since(back) > recoveryCap {
							t.Fatalf("still degraded %v after Redis came back", recoveryCap)
						}
						time.Sleep(time.Millisecond)
					}
					t.Logf("permits came from the store again %v after Redis came back", time.Since(back).Round(time.Millisecond))
					// Local's are released where they were taken. Open's
					// are held nowhere, unless the store ran the acquire
					// when it resumed: the store may not know them.
					for _, p := range local[min(1, len(local)):] {
						err := p.Release(ctx)
						if mode == failpolicy.Local && err != nil || err != nil && !errors.Is(err, ratelimit.ErrPermitLost) {
							t.Errorf("Release, Redis back, of a permit the %v mode granted: %v", mode, err)
						}
					}
				})
			}
		}
	}
}

// warmPermits makes a first permit call with the store, without the
// policy's deadline, as warm does for decisions: it dials and loads the
// script.
// acquireFromStore takes a permit through l, a policy over a working
// store, that the store granted: a call the policy's deadline cut short (a
// loaded machine running -race can take longer than a few milliseconds)
// is decided by the mode instead, so it is tried again, for up to 10s, a
// permit the mode granted given back first.
func acquireFromStore(t *testing.T, l *ratelimit.Limiter, key string, lim ratelimit.Concurrency) *ratelimit.Permit {
	t.Helper()
	var held *ratelimit.Permit
	err := retrySetup(func() error {
		p, d, err := l.TryAcquire(context.Background(), key, lim, 1)
		switch {
		case err != nil:
			return err
		case d.Degraded:
			if p != nil {
				_ = p.Release(context.Background())
			}
			return fmt.Errorf("%w: the mode decided: %+v", ratelimit.ErrTimeout, d)
		case p == nil:
			return fmt.Errorf("denied with Redis up: %+v", d)
		}
		held = p
		return nil
	}, storeFailed)
	if err != nil {
		t.Fatalf("TryAcquire with Redis up: %v; want a permit from the store", err)
	}
	return held
}

func warmPermits(t *testing.T, pb ratelimit.PermitBackend, key string, lim ratelimit.Concurrency) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := retrySetup(func() error {
		_, err := pb.DoPermit(ctx, key, lim, ratelimit.PermitRequest{Op: ratelimit.PermitInspect})
		return err
	}, storeFailed)
	if err != nil {
		t.Fatal(err)
	}
}
