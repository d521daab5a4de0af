package memory_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

// The two configs fix which path every timed call takes, so that a run
// measures one decision path and not a mix that depends on the speed of the
// machine.
var (
	// allowAll admits every call of a run: a burst of 1e9 tokens, more than
	// testing ever sets b.N to, so a bucket never runs dry; and a refill of 1
	// token a second, so a bucket touched again within a second is never
	// full again (a full bucket is dropped and would be allocated anew).
	allowAll = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1).WithBurst(1e9)}}
	// denyAll denies every timed call: the untimed setup takes each key's one
	// token, which returns only after an hour.
	denyAll = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(1)}}
)

// manyKeys is how many distinct keys the many-key cases cycle through: more
// than fit in the CPU caches, as for a service limiting per user or per IP.
const manyKeys = 100_000

// BenchmarkMemoryAllow measures one decision through the public path,
// ratelimit.New(memory.New()).Allow, on buckets that already exist (the
// steady state of a service): the config is built once, the keys before the
// timer starts, and every bucket is created by an untimed first call.
//
// Sub-benchmarks are named path=allowed|denied/keys=1|100k/mode=serial|parallel.
// mode=parallel runs b.RunParallel with each goroutine starting at a
// different point of the key list, so with 100k keys goroutines rarely meet
// on a bucket; with keys=1 every goroutine hits the same bucket, whose one
// greedy bandwidth each Consume takes from with a compare-and-swap.
func BenchmarkMemoryAllow(b *testing.B) {
	paths := []struct {
		name  string
		cfg   ratelimit.Config
		allow bool
	}{
		{"allowed", allowAll, true},
		{"denied", denyAll, false},
	}
	keyCounts := []struct {
		name string
		n    int
	}{
		{"1", 1},
		{"100k", manyKeys},
	}
	for _, p := range paths {
		for _, k := range keyCounts {
			prefix := "path=" + p.name + "/keys=" + k.name
			b.Run(prefix+"/mode=serial", func(b *testing.B) {
				lim, keys := setup(b, k.n, p.cfg)
				benchSerial(b, lim, keys, p.cfg, p.allow)
			})
			b.Run(prefix+"/mode=parallel", func(b *testing.B) {
				lim, keys := setup(b, k.n, p.cfg)
				benchParallel(b, lim, keys, p.cfg, p.allow)
			})
		}
	}
}

// setup returns a Limiter on a fresh memory Backend holding a bucket for
// each of n keys, each created by one call with cfg. It takes far less than
// the second in which an allowAll bucket refills its one token, so no bucket
// is full, dropped and allocated again once the timer runs.
func setup(b *testing.B, n int, cfg ratelimit.Config) (*ratelimit.Limiter, []string) {
	b.Helper()
	backend := memory.New()
	b.Cleanup(func() { backend.Close() })
	lim := ratelimit.New(backend)
	keys := make([]string, n)
	ctx := context.Background()
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
		if _, err := lim.Allow(ctx, keys[i], cfg); err != nil {
			b.Fatal(err)
		}
	}
	if got := backend.Len(); got != n {
		b.Fatalf("backend holds %d buckets after setup, want %d", got, n)
	}
	return lim, keys
}

func benchSerial(b *testing.B, lim *ratelimit.Limiter, keys []string, cfg ratelimit.Config, want bool) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	j := 0
	for range b.N {
		d, err := lim.Allow(ctx, keys[j], cfg)
		if err != nil || d.Allowed != want {
			b.Fatalf("Allow(%q) = %+v, %v; want Allowed %v", keys[j], d, err, want)
		}
		if j++; j == len(keys) {
			j = 0
		}
	}
}

func benchParallel(b *testing.B, lim *ratelimit.Limiter, keys []string, cfg ratelimit.Config, want bool) {
	ctx := context.Background()
	var goroutines atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// Spread the starting points far apart: goroutines then walk
		// disjoint stretches of the key list.
		j := int(goroutines.Add(1)*7919) % len(keys)
		for pb.Next() {
			d, err := lim.Allow(ctx, keys[j], cfg)
			if err != nil || d.Allowed != want {
				b.Errorf("Allow(%q) = %+v, %v; want Allowed %v", keys[j], d, err, want)
				return
			}
			if j++; j == len(keys) {
				j = 0
			}
		}
	})
}

// BenchmarkMemoryPermits measures a permit's acquire and release through
// the public path, ratelimit.New(memory.New()).TryAcquire and
// Permit.Release, with a limit no run fills (every acquire is granted).
// Sub-benchmarks are named keys=1|10k/mode=serial|parallel|crowded: serial
// is one goroutine; parallel, b.RunParallel's one per P; crowded, 32 per
// P. With keys=1 every goroutine takes and gives back permits of one key,
// a process-wide concurrency limit; with 10k keys they rarely meet.
func BenchmarkMemoryPermits(b *testing.B) {
	lim := ratelimit.InFlight(ratelimit.MaxPermits, time.Minute)
	for _, k := range []struct {
		name string
		n    int
	}{{"1", 1}, {"10k", 10_000}} {
		keys := make([]string, k.n)
		for i := range keys {
			keys[i] = "user:" + strconv.Itoa(i)
		}
		for _, mode := range []struct {
			name    string
			perProc int // goroutines per P; 0 for one goroutine
		}{{"serial", 0}, {"parallel", 1}, {"crowded", 32}} {
			b.Run("keys="+k.name+"/mode="+mode.name, func(b *testing.B) {
				backend := memory.New()
				b.Cleanup(func() { backend.Close() })
				limiter := ratelimit.New(backend)
				ctx := context.Background()
				var next atomic.Int64
				run := func(pb interface{ Next() bool }) {
					j := int(next.Add(1)*7919) % len(keys)
					for pb.Next() {
						p, d, err := limiter.TryAcquire(ctx, keys[j], lim, 1)
						if err != nil || p == nil {
							b.Errorf("TryAcquire(%q) = %+v, %v; want granted", keys[j], d, err)
							return
						}
						if err := p.Release(ctx); err != nil {
							b.Errorf("Release(%q): %v", keys[j], err)
							return
						}
						if j++; j == len(keys) {
							j = 0
						}
					}
				}
				b.ReportAllocs()
				if mode.perProc == 0 {
					b.ResetTimer()
					run(&serialPB{n: b.N})
					return
				}
				b.SetParallelism(mode.perProc)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) { run(pb) })
			})
		}
	}
}

// serialPB counts n iterations, as a testing.PB does b.N among goroutines.
type serialPB struct{ n int }

func (pb *serialPB) Next() bool {
	pb.n--
	return pb.n >= 0
}
