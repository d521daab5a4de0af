package failpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// benchTimeout is the deadline of the benchmarks' calls, the default. At
// 5ms, 64 goroutines on 2 CPUs shared with redis-server saw a few calls
// late in every run, and they came together: 5 in a row opened the
// breaker, and the run measured degraded decisions instead (0.93 to 0.99
// of them).
const benchTimeout = failpolicy.DefaultTimeout

// BenchmarkHealthy measures what the policy adds to a healthy store's
// decision, in one run: each store bare; bare with a deadline on each
// call's context, which is the part of the policy's cost that any caller
// with a deadline pays; and behind a Closed policy. The memory store shows
// the decorator's own cost; rueidis on a local redis-server, what it adds
// to a round trip.
//
//	go test -run '^$' -bench Healthy -count 6 ./failpolicy | benchstat -col /policy -
func BenchmarkHealthy(b *testing.B) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6).WithBurst(1 << 40)}}
	stores := []struct {
		name string
		new  func(b *testing.B) ratelimit.Backend
	}{
		{"memory", func(b *testing.B) ratelimit.Backend {
			m := memory.New()
			b.Cleanup(func() { m.Close() })
			return m
		}},
		{"rueidis", func(b *testing.B) ratelimit.Backend {
			return adapters[1].connect(b, servers.StartRedis(b).Addr()) // rueidis, set up by LowLatency
		}},
	}
	for _, s := range stores {
		store := s.new(b)
		policy, err := failpolicy.Wrap(store, failpolicy.Closed, failpolicy.WithTimeout(benchTimeout))
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range []struct {
			name     string
			backend  ratelimit.Backend
			deadline bool // the loop gives each call benchTimeout itself
		}{{"bare", store, false}, {"bare+deadline", store, true}, {"failpolicy", policy, false}} {
			// decide makes one decision and counts it if it is late: a busy
			// machine can hold a local round trip past the deadline.
			decide := func(b *testing.B, late *atomic.Int64) bool {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if p.deadline {
					ctx, cancel = context.WithTimeout(ctx, benchTimeout)
				}
				d, err := p.backend.Do(ctx, "k", cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1})
				cancel()
				switch {
				case d.Degraded || errors.Is(err, context.DeadlineExceeded):
					late.Add(1)
				case err != nil || !d.Allowed:
					b.Errorf("%+v, %v", d, err)
					return false
				}
				return true
			}
			b.Run(fmt.Sprintf("store=%s/policy=%s", s.name, p.name), func(b *testing.B) {
				var late atomic.Int64
				b.ReportAllocs()
				for b.Loop() {
					if !decide(b, &late) {
						return
					}
				}
				b.ReportMetric(float64(late.Load())/float64(b.N), "late/op")
			})
			b.Run(fmt.Sprintf("store=%s-parallel/policy=%s", s.name, p.name), func(b *testing.B) {
				var late atomic.Int64
				b.ReportAllocs()
				b.SetParallelism(32) // 64 goroutines on 2 CPUs
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() && decide(b, &late) {
					}
				})
				b.ReportMetric(float64(late.Load())/float64(b.N), "late/op")
			})
		}
	}
}

// BenchmarkNodes measures what a breaker per node adds to a healthy
// store's decision: a memory store behind a Closed policy, with one
// shared breaker, and with a NodeLocator that puts each of 3 keys on a
// node of its own (as the Redis backends do on a cluster client, though
// their Node reads a slot map).
//
//	go test -run '^$' -bench Nodes -count 6 ./failpolicy | benchstat -col /locator -
func BenchmarkNodes(b *testing.B) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6).WithBurst(1 << 40)}}
	keys := []string{"a", "b", "c"}
	m := memory.New()
	b.Cleanup(func() { m.Close() })
	for _, l := range []struct {
		name  string
		store ratelimit.Backend
	}{{"none", wrapped{m}}, {"3nodes", nodeNamer{m}}} {
		// A deadline no busy machine misses: this measures the lookup, not
		// lateness (BenchmarkHealthy counts that).
		policy, err := failpolicy.Wrap(l.store, failpolicy.Closed, failpolicy.WithTimeout(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		decide := func(b *testing.B, i int) {
			d, err := policy.Do(context.Background(), keys[i%len(keys)], cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1})
			if err != nil || !d.Allowed {
				b.Errorf("%+v, %v", d, err)
			}
		}
		b.Run("run=serial/locator="+l.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				decide(b, i)
			}
		})
		b.Run("run=parallel/locator="+l.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					decide(b, i)
				}
			})
		})
	}
}

// nodeNamer is a store whose keys are each on a node of the key's name.
type nodeNamer struct{ ratelimit.Backend }

// wrapped is a store as nodeNamer is, but without a NodeLocator: its
// calls go through the same frames, so the two differ only in the lookup.
type wrapped struct{ ratelimit.Backend }

func (nodeNamer) Node(key string) string { return key }

// BenchmarkLocalFlood measures what the Local mode keeps for each key it
// decides while the store is away: the key's share in the local memory
// store and its debt, for keys of 20 and of 200 bytes, each new. It
// reports the heap in use per key, after a GC, which is what a flood of
// new keys during an outage costs until WithLocalKeys stops it.
//
//	go test -run '^$' -bench LocalFlood -benchtime 65536x ./failpolicy
func BenchmarkLocalFlood(b *testing.B) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(20), ratelimit.PerHour(1000)}}
	for _, size := range []int{20, 200} {
		b.Run(fmt.Sprintf("key=%dB", size), func(b *testing.B) {
			policy, err := failpolicy.Wrap(down{}, failpolicy.Local, failpolicy.WithInstances(2), failpolicy.WithLocalKeys(1<<22))
			if err != nil {
				b.Fatal(err)
			}
			defer policy.Close()
			keys := make([]string, b.N)
			pad := strings.Repeat("k", size-8)
			for i := range keys {
				keys[i] = fmt.Sprintf("%s%08x", pad, i)
			}
			before := heapInUse()
			b.ResetTimer()
			for i := range b.N {
				if d, err := policy.Do(context.Background(), keys[i], cfg, ratelimit.Request{Tokens: 1}); err != nil || !d.Allowed {
					b.Fatalf("%+v, %v", d, err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(heapInUse()-before)/float64(b.N), "heap-B/key")
			b.ReportMetric(float64(size), "key-B")
			runtime.KeepAlive(keys)
		})
	}
}

// heapInUse is the heap in use after a GC, in bytes.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}
