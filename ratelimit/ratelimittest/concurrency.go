package ratelimittest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// concurrencyScenarios check that decisions are atomic: concurrent callers
// on one key are admitted exactly what the bucket holds. The buckets refill
// one token an hour, too slowly to matter while the scenario runs. Run them
// with -race.
var concurrencyScenarios = []scenario{
	{name: "Consume", run: testConcurrentConsume},
	{name: "ConsumeUpTo", run: testConcurrentConsumeUpTo},
	{name: "ManyKeys", run: testConcurrentManyKeys},
}

const (
	goroutines = 8
	callsEach  = 200
)

// readSkew is how much later than an hour a concurrent denial's
// RetryAfter may be under ServerClock. A store that reads its clock before
// it orders the calls (the memory backend on its own clock does, for
// speed) may decide a call at a time a little before that of one it
// applied first: the call's RetryAfter then counts from its own earlier
// reading, by as much as the caller was descheduled between its reading
// and its turn. A second covers any such pause on a loaded machine.
func (e *env) readSkew() time.Duration {
	if e.fake() {
		return 0
	}
	return time.Second
}

// testConcurrentConsume: 8 goroutines × 200 calls on a bucket of 500: exactly
// 500 are allowed, and their Remaining counts are 499 down to 0, each seen
// once.
func testConcurrentConsume(t *testing.T, e *env) {
	const capacity = 500
	cfg := config(ratelimit.PerHour(1).WithBurst(capacity))
	l := e.limiter()
	key := e.key("k")
	var (
		mu        sync.Mutex
		remaining = make(map[int64]int)
		denied    int
		wg        sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			for range callsEach {
				d, err := l.Allow(context.Background(), key, cfg)
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if !d.Allowed && (d.Remaining != 0 || d.RetryAfter <= 0 || d.RetryAfter > time.Hour+e.readSkew() || e.fake() && d.RetryAfter != time.Hour) {
					t.Errorf("denied decision %s; want Remaining 0 and RetryAfter 1h", format(d))
				}
				mu.Lock()
				if d.Allowed {
					remaining[d.Remaining]++
				} else {
					denied++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(remaining) != capacity || denied != goroutines*callsEach-capacity {
		t.Fatalf("%d concurrent calls on a bucket of %d: %d allowed with distinct Remaining, %d denied; want %d and %d",
			goroutines*callsEach, capacity, len(remaining), denied, capacity, goroutines*callsEach-capacity)
	}
	for r, n := range remaining {
		if r < 0 || r >= capacity || n != 1 {
			t.Errorf("Remaining %d reported %d times; want each of 0 to %d once", r, n, capacity-1)
		}
	}
}

// testConcurrentConsumeUpTo: goroutines taking up to 7 tokens at a time until
// none are left take exactly the capacity between them.
func testConcurrentConsumeUpTo(t *testing.T, e *env) {
	const capacity = 1000
	b := e.bucket(e.key("k"), config(ratelimit.PerHour(1).WithBurst(capacity)))
	var (
		total atomic.Int64
		wg    sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			for range capacity {
				n, err := b.ConsumeUpTo(context.Background(), 7)
				if err != nil {
					t.Errorf("ConsumeUpTo: %v", err)
					return
				}
				if n < 0 || n > 7 {
					t.Errorf("ConsumeUpTo(7) took %d", n)
				}
				if n <= 0 {
					return
				}
				total.Add(n)
			}
		})
	}
	wg.Wait()
	if got := total.Load(); got != capacity {
		t.Fatalf("concurrent ConsumeUpTo took %d tokens in all from a bucket of %d", got, capacity)
	}
}

// testConcurrentManyKeys: 8 goroutines spread 1600 calls over 16 keys of 30
// tokens, at least 96 calls a key: each key admits exactly 30.
func testConcurrentManyKeys(t *testing.T, e *env) {
	const keys, capacity = 16, 30
	cfg := config(ratelimit.PerHour(1).WithBurst(capacity))
	l := e.limiter()
	var (
		allowed [keys]atomic.Int64
		wg      sync.WaitGroup
	)
	for g := range goroutines {
		wg.Go(func() {
			for j := range callsEach {
				k := (g*7 + j) % keys
				d, err := l.Allow(context.Background(), e.key(string(rune('a'+k))), cfg)
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if d.Allowed {
					allowed[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for k := range allowed {
		if got := allowed[k].Load(); got != capacity {
			t.Errorf("key %c: %d calls allowed; want %d", 'a'+k, got, capacity)
		}
	}
}
