package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// BenchmarkHotKey is one key decided from many goroutines, on the memory
// store alone (lease=off) and leased over it (lease=on): what a leased
// decision costs in memory, where the store is as fast as the lease.
// internal/test/distributed's BenchmarkHotKeyLeased measures it where it
// counts, over Redis.
func BenchmarkHotKey(b *testing.B) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6).WithBurst(1 << 40)}}
	for _, on := range []bool{false, true} {
		name := "lease=off"
		if on {
			name = "lease=on"
		}
		b.Run(name, func(b *testing.B) {
			store := memory.New()
			defer store.Close()
			var backend ratelimit.Backend = store
			if on {
				l, err := lease.New(store, lease.Keys("hot"))
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				backend = l
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if d, err := backend.Do(ctx, "hot", cfg, consume); err != nil || !d.Allowed {
						b.Errorf("%+v, %v", d, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkFleet simulates docs/scale.md's global key: 20 instances
// leasing one key of PerSecond(250,000) (a burst of 250,000) at 80, 100
// and 150 % of its rate, requests spread evenly over the instances, on
// one memory store and a fake clock (each refill landing at once), with
// the default options. It reports the store calls per decision, the
// decisions admitted as a share of those asked for and of what the limit
// allowed over the run (C + r·T), and the tokens that lapsed unspent as a
// share of those leased. b.N is simulated seconds.
func BenchmarkFleet(b *testing.B) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(250_000)}}
	for _, load := range []float64{0.8, 1, 1.5} {
		b.Run(fmt.Sprintf("load=%v", load), func(b *testing.B) {
			clock := ratelimittest.NewClock(time.Unix(1e9, 0))
			store := memory.New(memory.WithClock(clock))
			defer store.Close()
			s := newSim(b, clock, store, 20, cfg, true)
			calls := int(float64(b.N) * load * 250_000)
			start := clock.Now()
			adm, denied, st := s.run(b, rand.New(rand.NewPCG(1, 2)), calls, load, []int64{1})
			bound := 250_000 + 250_000*clock.Now().Sub(start).Seconds()
			b.ReportMetric(float64(st.Refills)/float64(st.Decisions), "store-calls/decision")
			b.ReportMetric(100*float64(len(adm))/float64(len(adm)+denied), "admitted-%-of-asked")
			b.ReportMetric(100*float64(len(adm))/bound, "admitted-%-of-C+rT")
			b.ReportMetric(100*float64(st.Lapsed)/float64(max(st.Leased, 1)), "lapsed-%-of-leased")
		})
	}
}

// grantAll is a store that grants every ConsumeUpTo in full and keeps
// nothing, so that BenchmarkLeaseMemory counts the leases' heap alone.
type grantAll struct{}

func (grantAll) Do(_ context.Context, _ string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	c := cfg.Bandwidths[0].Capacity
	return ratelimit.Decision{Allowed: true, Consumed: req.Tokens, Limit: c, Remaining: c - req.Tokens, Bandwidth: "0"}, nil
}

// BenchmarkLeaseMemory reports the live heap a leased key takes in an
// instance: 100,000 keys of one bandwidth, each with a lease, the heap
// divided by the keys that still hold one (the sweep drops those idle for
// a second).
func BenchmarkLeaseMemory(b *testing.B) {
	const keys = 100_000
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000)}}
	var perKey float64
	for range b.N {
		before := liveHeap()
		l, err := lease.New(grantAll{}, lease.Prefix("user:"), lease.WithMaxKeys(keys))
		if err != nil {
			b.Fatal(err)
		}
		for i := range keys {
			if _, err := l.Do(ctx, "user:"+strconv.Itoa(i), cfg, consume); err != nil {
				b.Fatal(err)
			}
		}
		l.WaitRefills()
		heap := liveHeap()
		// The sweep may have dropped the first keys' leases meanwhile.
		held := l.Stats().Keys
		if held < keys/2 {
			b.Fatalf("%d keys hold a lease; want most of %d", held, keys)
		}
		perKey += float64(int64(heap)-int64(before)) / float64(held)
		runtime.KeepAlive(l)
		l.Close()
	}
	b.ReportMetric(perKey/float64(b.N), "B/key")
}

// liveHeap is the heap that survives a collection.
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
