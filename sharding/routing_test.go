package sharding

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestFailingSubBuckets: sub-buckets that fail (each store sentinel) or
// that a fail policy denies do not count as retries: with no retries at
// all, every request is still decided by the one healthy sub-bucket, which
// admits exactly its share and then denies; the denial is the store's.
func TestFailingSubBuckets(t *testing.T) {
	failures := map[string]func(r *recorder, key string){
		"Unavailable": func(r *recorder, key string) { r.setFail(key, errDown) },
		"Timeout":     func(r *recorder, key string) { r.setFail(key, errTimeout) },
		"KeyRejected": func(r *recorder, key string) { r.setFail(key, errRejected) },
		"Degraded":    func(r *recorder, key string) { r.setDegraded(key) },
	}
	cfg := config(ratelimit.PerHour(40)) // 10 a sub-bucket
	for name, fail := range failures {
		for _, healthy := range []int{0, 2, 3} {
			t.Run(fmt.Sprintf("%s/healthy=%d", name, healthy), func(t *testing.T) {
				rec := newRecorder(newMemory(t, newClock()))
				b := mustNew(t, rec, Keys(4, "hot").WithRetries(0))
				keys := subKeys(t, b, "hot")
				for i, k := range keys {
					if i != healthy {
						fail(rec, k)
					}
				}
				for i := range 15 {
					d := do(t, b, "hot", cfg, consume(1))
					if d.Allowed != (i < 10) || d.Degraded {
						t.Fatalf("request %d: %+v; want allowed for the first 10, then the healthy sub-bucket's denial", i, d)
					}
					if decided := countKey(rec.calls(), keys[healthy]); decided != 1 {
						t.Fatalf("request %d: the healthy sub-bucket decided %d times; want once", i, decided)
					}
				}
			})
		}
	}
}

func countKey(calls []string, key string) int {
	n := 0
	for _, c := range calls {
		if c == key {
			n++
		}
	}
	return n
}

// TestAllSubBucketsFail: when every sub-bucket fails, the call's error
// wraps the sentinel of the last failure (so a fail policy over this
// decorator sees the store failing), and names the op and key; when a fail
// policy denied some, its denial is the answer, with the key's Limit. An
// error that is none of these ends the call at once.
func TestAllSubBucketsFail(t *testing.T) {
	cfg := config(ratelimit.PerHour(40))
	for _, sentinel := range []error{errDown, errTimeout, errRejected} {
		rec := newRecorder(newMemory(t, newClock()))
		b := mustNew(t, rec, Keys(4, "hot").WithRetries(1))
		for _, k := range subKeys(t, b, "hot") {
			rec.setFail(k, sentinel)
		}
		for _, req := range []ratelimit.Request{consume(1), estimate(1), upTo(5)} {
			_, err := b.Do(context.Background(), "hot", cfg, req)
			if !errors.Is(err, errors.Unwrap(sentinel)) || !errors.Is(err, sentinel) || !strings.Contains(err.Error(), `sharding: `+req.Op.String()+` on key "hot"`) {
				t.Errorf("%v, every sub-bucket failing with %v: %v", req.Op, sentinel, err)
			}
			if calls := rec.calls(); len(calls) != 4 {
				t.Errorf("%v: %d sub-buckets tried; want all 4, since failures are no retries", req.Op, len(calls))
			}
		}
		for _, req := range []ratelimit.Request{inspect(), reset(), add(3)} {
			if _, err := b.Do(context.Background(), "hot", cfg, req); !errors.Is(err, sentinel) {
				t.Errorf("%v, every sub-bucket failing with %v: %v", req.Op, sentinel, err)
			}
		}
	}

	rec := newRecorder(newMemory(t, newClock()))
	b := mustNew(t, rec, Keys(4, "hot"))
	for i, k := range subKeys(t, b, "hot") {
		if i%2 == 0 {
			rec.setDegraded(k)
		} else {
			rec.setFail(k, errDown)
		}
	}
	want := ratelimit.Decision{Degraded: true, Limit: 40, RetryAfter: time.Second}
	if d := do(t, b, "hot", cfg, consume(1)); d != want {
		t.Errorf("some sub-buckets failing, the others denied by a fail policy: %+v; want %+v", d, want)
	}

	rec = newRecorder(newMemory(t, newClock()))
	b = mustNew(t, rec, Keys(4, "hot").WithRetries(3))
	for _, k := range subKeys(t, b, "hot") {
		rec.setFail(k, errOther)
	}
	_, err := b.Do(context.Background(), "hot", cfg, consume(1))
	if !errors.Is(err, errOther) || !strings.HasPrefix(err.Error(), `sharding: Consume on key "hot": `) {
		t.Errorf("a sub-bucket's own error: %v; want it wrapped with the op and key", err)
	}
	if calls := rec.calls(); len(calls) != 1 {
		t.Errorf("a sub-bucket's own error: %d sub-buckets tried; want the call to end at the first", len(calls))
	}
}

// TestCancelledMidCall: the caller's context ending while a sub-bucket's
// call is out ends the call with the context's error, never a store
// sentinel, whatever the sub-bucket then answers, and tries no other.
func TestCancelledMidCall(t *testing.T) {
	cfg := config(ratelimit.PerHour(40))
	answers := map[string]func(r *recorder, key string){
		"Backend":     func(*recorder, string) {}, // memory: the context's error
		"Unavailable": func(r *recorder, key string) { r.setFail(key, errDown) },
		"Timeout":     func(r *recorder, key string) { r.setFail(key, errTimeout) },
		"Degraded":    func(r *recorder, key string) { r.setDegraded(key) },
	}
	reqs := []ratelimit.Request{consume(1), estimate(1), reserve(1, time.Second), upTo(3), add(2), inspect(), reset(), replace(ratelimit.AsIs)}
	for name, answer := range answers {
		for _, req := range reqs {
			t.Run(name+"/"+req.Op.String(), func(t *testing.T) {
				rec := newRecorder(newMemory(t, newClock()))
				b := mustNew(t, rec, Keys(4, "hot").WithRetries(3))
				for _, k := range subKeys(t, b, "hot") {
					answer(rec, k)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var once sync.Once
				rec.before = func(context.Context, string) { once.Do(cancel) } // the barrier: the first call out
				_, err := b.Do(ctx, "hot", cfg, req)
				if !errors.Is(err, context.Canceled) || errors.Is(err, ratelimit.ErrBackendUnavailable) || errors.Is(err, ratelimit.ErrTimeout) {
					t.Errorf("%v; want context.Canceled and no store sentinel", err)
				}
				if !strings.HasPrefix(fmt.Sprint(err), `context canceled: sharding: `+req.Op.String()+` on key "hot"`) {
					t.Errorf("%v; want it to start with the context's error and the call", err)
				}
				calls := rec.calls()
				if single := req.Op <= ratelimit.ConsumeUpTo; single && len(calls) != 1 {
					t.Errorf("%d sub-buckets tried: %q; want no more once the context ended", len(calls), calls)
				}
			})
		}
	}
}

// TestAffinity: WithAffinity sends a request first to its hash modulo the
// sub-buckets in use, and the retries on to the next ones in turn.
func TestAffinity(t *testing.T) {
	for _, tc := range []struct {
		capacity int64
		n, used  int
	}{{60, 6, 6}, {4, 6, 4}} {
		for _, h := range []uint64{0, 1, 5, 6, 13, 1<<64 - 1} {
			t.Run(fmt.Sprintf("capacity=%d/h=%d", tc.capacity, h), func(t *testing.T) {
				rec := newRecorder(newMemory(t, newClock()))
				b := mustNew(t, rec, Keys(tc.n, "hot").WithRetries(2).WithAffinity(fixed(h)))
				keys := subKeys(t, b, "hot")
				cfg := config(ratelimit.PerHour(tc.capacity))
				first := int(h % uint64(tc.used))
				share := tc.capacity / int64(tc.used)
				for range share {
					do(t, b, "hot", cfg, consume(1))
					if calls := rec.calls(); len(calls) != 1 || calls[0] != keys[first] {
						t.Fatalf("a Consume went to %q; want sub-bucket %d of %d, %q", calls, first, tc.used, keys[first])
					}
				}
				// The first is empty: the next takes it.
				do(t, b, "hot", cfg, consume(1))
				want := []string{keys[first], keys[(first+1)%tc.used]}
				if calls := rec.calls(); !equal(calls, want) {
					t.Fatalf("a Consume with sub-bucket %d empty went to %q; want %q", first, calls, want)
				}
			})
		}
	}
}

// TestRetries: with k retries, a denial has tried exactly k+1 sub-buckets
// that decided, in turn from the first; failed sub-buckets between them
// are skipped and not counted.
func TestRetries(t *testing.T) {
	const n = 6
	cfg := config(ratelimit.PerHour(6))
	for k := range n {
		t.Run(fmt.Sprintf("retries=%d", k), func(t *testing.T) {
			rec := newRecorder(newMemory(t, newClock()))
			b := mustNew(t, rec, Keys(n, "hot").WithRetries(k).WithAffinity(fixed(2)))
			keys := subKeys(t, b, "hot")
			for i := range n {
				do(t, rec, keys[i], subConfig(cfg, n, i), consume(1)) // empty each
			}
			rec.setFail(keys[3], errDown)
			rec.calls()
			d := do(t, b, "hot", cfg, consume(1))
			if d.Allowed {
				t.Fatalf("%+v; want denied", d)
			}
			calls := rec.calls()
			var want []string
			for i, decided := 2, 0; decided <= k && len(want) < n; i = (i + 1) % n {
				want = append(want, keys[i])
				if i != 3 {
					decided++
				}
			}
			if !equal(calls, want) {
				t.Errorf("tried %q; want %q, %d that decided", calls, want, k+1)
			}
			if calls := countDecided(calls, keys[3]); calls != min(k+1, n-1) {
				t.Errorf("%d sub-buckets decided; want %d", calls, min(k+1, n-1))
			}
		})
	}
}

func countDecided(calls []string, failed string) int {
	return len(calls) - countKey(calls, failed)
}
