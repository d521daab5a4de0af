package distributed_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// BenchmarkHotKey measures one hot key on one 3-master cluster, in one
// run: decisions a second, their p99, the servers' CPU time per decision
// (used_cpu_user + used_cpu_sys of INFO, summed over the masters), and the
// busiest master's share of that CPU time, for go-redis (a pool as large as the goroutines) and rueidis
// (its defaults: pipelining on shared connections), at 64 and 256
// goroutines:
//
//   - bare: the backend on its own, every decision on the key's one slot;
//   - pass: the sharding decorator with a rule for another key, so the
//     hot key passes through it (what a key no rule matches costs);
//   - n3, n6: the key split 3 and 6 ways, one sub-bucket on each master
//     at least.
//
// The limit is far above what the run asks, so every decision is one
// allowed round trip. All the masters share this machine's cores with the
// client: docs/sharding.md says what the figures mean where each master
// has cores of its own.
//
//	go test -run '^$' -bench HotKey -count 6 ./internal/test/distributed | benchstat -col /split -
func BenchmarkHotKey(b *testing.B) {
	c := servers.StartCluster(b)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6).WithBurst(1 << 40)}}
	cpu := masterCPU(b, c.Addrs())
	for _, client := range []string{harness.BackendGoRedis, harness.BackendRueidis} {
		for _, goroutines := range []int{64, 256} {
			store, closeStore, err := benchStore(client, c.Addrs(), goroutines)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(closeStore)
			for _, split := range []string{"bare", "pass", "n3", "n6"} {
				key := fmt.Sprintf("hotkey:%s:%d:%s:%d", client, goroutines, split, time.Now().UnixNano())
				backend := store
				switch split {
				case "pass":
					backend = mustShard(b, store, sharding.Keys(3, key+":other"))
				case "n3":
					backend = mustShard(b, store, sharding.Keys(3, key))
				case "n6":
					backend = mustShard(b, store, sharding.Keys(6, key))
				}
				b.Run(fmt.Sprintf("client=%s/goroutines=%d/split=%s", client, goroutines, split), func(b *testing.B) {
					benchHotKey(b, backend, key, cfg, goroutines, cpu)
				})
			}
		}
	}
}

func mustShard(b *testing.B, next ratelimit.Backend, opts ...sharding.Option) ratelimit.Backend {
	s, err := sharding.New(next, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// benchHotKey makes b.N decisions on key from goroutines goroutines, and
// reports decisions/s, p99 and the masters' CPU per decision.
func benchHotKey(b *testing.B, backend ratelimit.Backend, key string, cfg ratelimit.Config, goroutines int, cpu func() []time.Duration) {
	ctx := context.Background()
	req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	if _, err := backend.Do(ctx, key, cfg, req); err != nil { // the script loaded, the connections up
		b.Fatal(err)
	}
	b.SetParallelism(max(1, goroutines/runtime.GOMAXPROCS(0)))
	var (
		mu        sync.Mutex
		latencies []time.Duration
		failures  int
	)
	cpu0 := cpu()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		failed := 0
		for pb.Next() {
			t0 := time.Now()
			_, err := backend.Do(ctx, key, cfg, req)
			mine = append(mine, time.Since(t0))
			if err != nil {
				failed++
			}
		}
		mu.Lock()
		latencies, failures = append(latencies, mine...), failures+failed
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	used := cpu()
	total, busiest := time.Duration(0), time.Duration(0)
	for i := range used {
		d := used[i] - cpu0[i]
		total, busiest = total+d, max(busiest, d)
	}
	if failures > 0 {
		b.Errorf("%d of %d decisions failed", failures, b.N)
	}
	slices.Sort(latencies)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "server-cpu-µs/op")
	b.ReportMetric(100*float64(busiest)/float64(max(total, 1)), "busiest-master-%")
}

// benchStore is the backend of client on the servers at addrs, with the
// best documented settings for goroutines callers: for go-redis a pool as
// large as the goroutines (redis.NewUniversalClient, a ClusterClient for
// more than one address); for rueidis its defaults, without client-side
// caching. Timeouts are long, so that a loaded machine slows the run
// rather than failing it. close closes the client.
func benchStore(client string, addrs []string, goroutines int) (backend ratelimit.Backend, close func(), err error) {
	switch client {
	case harness.BackendGoRedis:
		c := redis.NewUniversalClient(&redis.UniversalOptions{
			Addrs: addrs, MaxRetries: -1, ContextTimeoutEnabled: true, PoolSize: goroutines,
			ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second,
		})
		b, err := redisbackend.New(c)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return b, func() { c.Close() }, nil
	case harness.BackendRueidis:
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
		if err != nil {
			return nil, nil, err
		}
		b, err := rueidisbackend.New(c)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return b, c.Close, nil
	}
	return nil, nil, fmt.Errorf("client %q is not %q or %q", client, harness.BackendGoRedis, harness.BackendRueidis)
}

// masterCPU returns a function that reads the CPU time each server at
// addrs has used.
func masterCPU(b *testing.B, addrs []string) func() []time.Duration {
	clients := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1})
		b.Cleanup(func() { clients[i].Close() })
	}
	return func() []time.Duration {
		used := make([]time.Duration, len(clients))
		for i, c := range clients {
			info, err := c.Info(context.Background(), "cpu").Result()
			if err != nil {
				b.Fatal(err)
			}
			for line := range strings.SplitSeq(info, "\r\n") {
				name, value, _ := strings.Cut(line, ":")
				if name == "used_cpu_user" || name == "used_cpu_sys" {
					secs, err := strconv.ParseFloat(value, 64)
					if err != nil {
						b.Fatalf("INFO cpu %s: %v", line, err)
					}
					used[i] += time.Duration(secs * float64(time.Second))
				}
			}
		}
		return used
	}
}
