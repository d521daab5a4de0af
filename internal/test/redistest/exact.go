package redistest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// testExact: for every algorithm, 64 goroutines on two clients (so two
// connection pools, as two processes would have) race for one bucket of
// 100: exactly 100 are admitted, each Remaining from 99 down to 0 seen
// once.
func testExact(t *testing.T, a Adapter, tops []topology) {
	for _, top := range tops {
		t.Run(top.name, func(t *testing.T) {
			t.Parallel()
			b1, _ := a.Connect(t, top.addrs, top.cluster, Options{})
			b2, _ := a.Connect(t, top.addrs, top.cluster, Options{})
			for alg := range ratelimit.Algorithm(numAlgorithms) {
				t.Run(alg.String(), func(t *testing.T) { Exact(t, alg, b1, b2) })
			}
		})
	}
}

// testSentinel: a failover client, which asks a Sentinel for the master,
// decides exactly as well.
func testSentinel(t *testing.T, a Adapter) {
	t.Parallel()
	master := servers.StartRedis(t)
	sentinel := servers.StartSentinel(t, master.Addr())
	b1 := a.Sentinel(t, []string{sentinel.Addr()}, servers.SentinelMaster)
	b2 := a.Sentinel(t, []string{sentinel.Addr()}, servers.SentinelMaster)
	Exact(t, ratelimit.TokenBucket, b1, b2)
}

// Exact races 64 goroutines, alternately on each backend given, for one
// new bucket of alg of capacity 100 (that refills one token an hour, or
// admits 100 a day), 10 calls each, and wants exactly 100 admitted, with
// every Remaining from 99 to 0 once.
func Exact(t *testing.T, alg ratelimit.Algorithm, backends ...ratelimit.Backend) {
	t.Helper()
	const goroutines, calls, capacity = 64, 10, 100
	bw := ratelimit.PerHour(1).WithBurst(capacity)
	if !alg.Supports(ratelimit.Reserve) && alg != ratelimit.LeakyBucket {
		bw = ratelimit.Every(24*time.Hour, capacity)
	}
	cfg := ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{bw}}
	key := uniqueKey(t, "exact")
	var (
		mu        sync.Mutex
		remaining = map[int64]int{}
		wg        sync.WaitGroup
	)
	for g := range goroutines {
		l := ratelimit.New(backends[g%len(backends)])
		wg.Go(func() {
			for range calls {
				d, err := l.Allow(context.Background(), key, cfg)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					remaining[d.Remaining]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	admitted := 0
	for r, n := range remaining {
		admitted += n
		if n != 1 || r < 0 || r >= capacity {
			t.Errorf("Remaining %d seen %d times", r, n)
		}
	}
	if admitted != capacity {
		t.Errorf("admitted %d of %d calls; want exactly %d", admitted, goroutines*calls, capacity)
	}
	t.Logf("%d goroutines on %d clients, %d calls: %d admitted", goroutines, len(backends), goroutines*calls, admitted)
}
