package benchmarks

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// The two limits fix which path every timed call takes, so that a run
// measures one decision path for every implementation, not a mix that
// depends on each one's speed.
var (
	// allowAll admits every call of a run: a burst of 1e9, more than
	// testing ever sets b.N to, refilled at one a second. (sluice drops a
	// bucket that is full again, so the slow refill also keeps every bucket
	// stored between two visits.)
	allowAll = limit{Burst: 1e9, Refill: 1, Period: time.Second}
	// denyAll denies every timed call: the untimed setup takes each key's
	// one request, which returns only after an hour.
	denyAll = limit{Burst: 1, Refill: 1, Period: time.Hour}
)

// manyKeys is how many distinct keys the many-key cases cycle through: more
// than fit in the CPU caches, as for a service limiting per user or per IP.
const manyKeys = 100_000

// BenchmarkAllow measures one decision per key on limiters whose keys all
// exist already (a service's steady state): every implementation gets the
// same limit, the same pre-built keys, and one untimed call per key before
// the timer starts.
//
// Names are path=allowed|denied/keys=1|100k/mode=serial|parallel/impl=NAME.
// mode=parallel runs b.RunParallel with each goroutine starting at a
// different point of the key list; with keys=1 every goroutine hits the same
// key (for information: its state is one lock in x/time/rate, go-limiter and
// ulule, and a compare-and-swap in throttled and sluice).
// Each call's outcome is checked, so a peer configured differently fails
// rather than measuring another path.
func BenchmarkAllow(b *testing.B) {
	paths := []struct {
		name  string
		limit limit
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
	modes := []struct {
		name string
		run  func(*testing.B, allowFunc, []string, bool)
	}{
		{"serial", benchSerial},
		{"parallel", benchParallel},
	}
	for _, p := range paths {
		for _, k := range keyCounts {
			keys := makeKeys(k.n)
			for _, m := range modes {
				for _, im := range impls {
					name := "path=" + p.name + "/keys=" + k.name + "/mode=" + m.name + "/impl=" + im.name
					b.Run(name, func(b *testing.B) {
						allow := im.start(b, p.limit)
						touch(b, allow, keys)
						m.run(b, allow, keys, p.allow)
					})
				}
			}
		}
	}
}

func makeKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	return keys
}

// touch creates every key's state with one untimed call. It takes far less
// than the second in which an allowAll bucket refills its one token, so no
// sluice bucket is full, dropped and allocated again once the timer runs.
func touch(b *testing.B, allow allowFunc, keys []string) {
	b.Helper()
	ctx := context.Background()
	for _, k := range keys {
		if _, err := allow(ctx, k); err != nil {
			b.Fatal(err)
		}
	}
}

func benchSerial(b *testing.B, allow allowFunc, keys []string, want bool) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	j := 0
	for range b.N {
		ok, err := allow(ctx, keys[j])
		if err != nil || ok != want {
			b.Fatalf("allow(%q) = %v, %v; want %v", keys[j], ok, err, want)
		}
		if j++; j == len(keys) {
			j = 0
		}
	}
}

func benchParallel(b *testing.B, allow allowFunc, keys []string, want bool) {
	ctx := context.Background()
	var goroutines atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// Spread the starting points: goroutines then walk disjoint
		// stretches of the key list.
		j := int(goroutines.Add(1)*7919) % len(keys)
		for pb.Next() {
			ok, err := allow(ctx, keys[j])
			if err != nil || ok != want {
				b.Errorf("allow(%q) = %v, %v; want %v", keys[j], ok, err, want)
				return
			}
			if j++; j == len(keys) {
				j = 0
			}
		}
	})
}

// BenchmarkAllowGoroutines measures the allowed path of BenchmarkAllow's
// implementations with exactly 1, 16, 64 and 256 goroutines sharing the
// b.N calls, as BenchmarkRedis does: decisions/s and the p50, p99 and
// p99.9 latency of one call ([timeDecisions]). The limit, keys and untimed
// first call per key are BenchmarkAllow's, and every call must be allowed.
//
// Names are keys=1|100k/goroutines=1|16|64|256/impl=NAME.
func BenchmarkAllowGoroutines(b *testing.B) {
	for _, k := range []struct {
		name string
		n    int
	}{
		{"100k", manyKeys},
		{"1", 1},
	} {
		keys := makeKeys(k.n)
		for _, g := range goroutineCounts {
			for _, im := range impls {
				name := "keys=" + k.name + "/goroutines=" + strconv.Itoa(g) + "/impl=" + im.name
				b.Run(name, func(b *testing.B) {
					allow := im.start(b, allowAll)
					touch(b, allow, keys)
					timeDecisions(b, allow, keys, g, true)
				})
			}
		}
	}
}
