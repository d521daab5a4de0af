package plans

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The tests of this file hang the store (fakeStore.hold: every read blocks
// until released, or until its ctx ends at the load timeout) and check, in
// synctest's fake time, how long lookups wait for it: a subject with a
// plan in the cache never waits; a new subject, or one a notification has
// made out of date, waits the read wait at most.

// timedLookup looks subject up and returns its plan's first capacity and
// how long the lookup took, in the bubble's fake time.
func timedLookup(t *testing.T, c *Cache, subject string) (int64, time.Duration) {
	t.Helper()
	start := time.Now()
	n := capacity(t, c, subject)
	return n, time.Since(start)
}

// inFlight returns how many reads the cache has in flight.
func inFlight(c *Cache) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.flights)
}

// TestCacheStaleWhileRevalidate: with the store hung, lookups of a cached
// subject past its TTL return its cached plan at once, while the one read
// they share is still blocked; once the read lands, the cache serves what
// it read.
func TestCacheStaleWhileRevalidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("acme", 1, plan("pro", 2, 100))
		c := mustCache(t, s, WithHooks(lookupHooks(ev)), WithTTL(time.Minute))
		capacity(t, c, "acme")
		ev.take()

		s.set("acme", 1, plan("pro", 3, 200))
		release := s.hold()
		time.Sleep(time.Minute)
		for i := range 3 {
			if got, waited := timedLookup(t, c, "acme"); got != 100 || waited != 0 {
				t.Fatalf("lookup %d past the TTL, the store hung: capacity %d after %v; want the cached 100 at once", i+1, got, waited)
			}
		}
		synctest.Wait() // the read is blocked in the store
		expect(t, s, 2, ev, "miss acme", "miss acme", "miss acme")

		release()
		synctest.Wait() // the read lands
		expect(t, s, 2, ev, "loaded acme: pro v3, assignment v1")
		if got := capacity(t, c, "acme"); got != 200 {
			t.Errorf("capacity once the read landed = %d, want the new 200", got)
		}
		expect(t, s, 2, ev, "hit acme")
		if n := inFlight(c); n != 0 {
			t.Errorf("%d reads in flight after the last ended", n)
		}
	})
}

// TestCacheHungStoreNeverWaits: a store that never answers, under 200
// rounds of lookups 100ms apart (20s), each round looking up three
// subjects. The one cached before the store hung, and the one read then
// with no plan (so served the default plan), keep their plans without a
// lookup ever waiting, past their TTLs, their failed reads and their
// retries; the one never seen waits the read wait once, and no more.
// Each is read once per load timeout and retry backoff: 4 times in 20s.
func TestCacheHungStoreNeverWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		s.set("acme", 1, plan("pro", 2, 100))
		c := mustCache(t, s, WithTTL(time.Minute), WithNegativeTTL(time.Minute))
		capacity(t, c, "acme")
		capacity(t, c, "nobody")

		release := s.hold()
		defer release()
		time.Sleep(time.Minute)
		def := DefaultPlan().Bandwidths[0].Capacity
		var waitedNew time.Duration
		for range 200 {
			for _, want := range []struct {
				subject  string
				capacity int64
			}{{"acme", 100}, {"nobody", def}, {"never-seen", def}} {
				got, waited := timedLookup(t, c, want.subject)
				if got != want.capacity {
					t.Fatalf("%s, the store hung: capacity %d, want %d", want.subject, got, want.capacity)
				}
				if want.subject == "never-seen" {
					waitedNew += waited
				} else if waited != 0 {
					t.Fatalf("%s, the store hung: the lookup waited %v, want no wait", want.subject, waited)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		if waitedNew != DefaultReadWait {
			t.Errorf("never-seen waited %v in all over 200 lookups, want the read wait once, %v", waitedNew, DefaultReadWait)
		}
		synctest.Wait()
		if n := s.reads(); n != 2+3*4 {
			t.Errorf("store read %d times, want %d: 2 before it hung, then 4 per subject", n, 2+3*4)
		}
	})
}

// TestCacheColdWait: a lookup of a subject the cache holds nothing for
// waits for the store no longer than the read wait, then is served the
// default plan, as is every lookup of it while the read goes on; the read
// fills the cache when it lands.
func TestCacheColdWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("acme", 1, plan("pro", 2, 100))
		release := s.hold()
		c := mustCache(t, s, WithHooks(lookupHooks(ev)))
		def := DefaultPlan().Bandwidths[0].Capacity

		// Callers that come together all wait for the one read, and no
		// longer than the read wait.
		const callers = 10
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				if got, waited := timedLookup(t, c, "acme"); got != def || waited != DefaultReadWait {
					t.Errorf("cold lookup, the store hung: capacity %d after %v; want the default %d after the read wait, %v", got, waited, def, DefaultReadWait)
				}
			})
		}
		wg.Wait()
		if got, waited := timedLookup(t, c, "acme"); got != def || waited != 0 {
			t.Errorf("lookup after the wait ran out: capacity %d after %v; want the default %d at once", got, waited, def)
		}
		synctest.Wait()
		if n := s.reads(); n != 1 {
			t.Errorf("store read %d times, want 1", n)
		}
		ev.take()

		release()
		synctest.Wait() // the read lands
		expect(t, s, 1, ev, "loaded acme: pro v2, assignment v1")
		if got, waited := timedLookup(t, c, "acme"); got != 100 || waited != 0 {
			t.Errorf("lookup once the read landed: capacity %d after %v; want pro's 100 at once", got, waited)
		}
		expect(t, s, 1, ev, "hit acme")
	})
}

// TestCacheColdReadFails: a cold subject's read that ends in failure
// after its lookups stopped waiting leaves the default plan, retried
// after the backoff without a wait.
func TestCacheColdReadFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("acme", 1, plan("pro", 2, 100))
		release := s.hold()
		c := mustCache(t, s, WithHooks(ev.hooks()), WithLoadTimeout(time.Second), WithRetryBackoff(time.Second))
		def := DefaultPlan().Bandwidths[0].Capacity

		if got, waited := timedLookup(t, c, "acme"); got != def || waited != DefaultReadWait {
			t.Errorf("cold lookup, the store hung: capacity %d after %v; want the default after %v", got, waited, DefaultReadWait)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		expect(t, s, 1, ev, "failed acme: context deadline exceeded")
		release()
		time.Sleep(time.Second - DefaultReadWait)
		if got, waited := timedLookup(t, c, "acme"); got != def || waited != 0 {
			t.Errorf("the retry: capacity %d after %v; want the default at once", got, waited)
		}
		synctest.Wait()
		expect(t, s, 2, ev, "loaded acme: pro v2, assignment v1")
		if got := capacity(t, c, "acme"); got != 100 {
			t.Errorf("capacity after the retry = %d, want 100", got)
		}
	})
}

// TestCacheNotifiedWait: after a change notification, lookups wait for
// the subject's read, so that a store that answers within the read wait
// gives every lookup from then on the new plan; a store that does not
// answer makes the first lookup wait the read wait and get the old plan,
// later ones get it at once, and the read landing brings the new one.
func TestCacheNotifiedWait(t *testing.T) {
	changes := []struct {
		name   string
		change func(*Cache)
	}{
		{"assignment", func(c *Cache) { c.Invalidate(Change{Kind: AssignmentChanged, ID: "acme", Version: 5}) }},
		{"plan", func(c *Cache) { c.Invalidate(Change{Kind: PlanChanged, ID: "pro", Version: 6}) }},
		{"resync", func(c *Cache) { c.Resync() }},
	}
	for _, tt := range changes {
		t.Run(tt.name+"/answering", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newFakeStore()
				s.set("acme", 1, plan("pro", 2, 100))
				c := mustCache(t, s, WithTTL(time.Hour))
				capacity(t, c, "acme")

				// The store answers, after the lookups are all waiting.
				release := s.hold()
				s.set("acme", 5, plan("pro", 6, 200))
				tt.change(c)
				const callers = 10
				var wg sync.WaitGroup
				for range callers {
					wg.Go(func() {
						if got := capacity(t, c, "acme"); got != 200 {
							t.Errorf("lookup after the change: capacity %d, want the new 200", got)
						}
					})
				}
				synctest.Wait()
				release()
				wg.Wait()
				if n := s.reads(); n != 2 {
					t.Errorf("store read %d times, want 2", n)
				}
			})
		})
		t.Run(tt.name+"/hung", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newFakeStore()
				s.set("acme", 1, plan("pro", 2, 100))
				c := mustCache(t, s, WithTTL(time.Hour))
				capacity(t, c, "acme")

				release := s.hold()
				s.set("acme", 5, plan("pro", 6, 200))
				tt.change(c)
				if got, waited := timedLookup(t, c, "acme"); got != 100 || waited != DefaultReadWait {
					t.Errorf("first lookup after the change, the store hung: capacity %d after %v; want the old 100 after the read wait, %v", got, waited, DefaultReadWait)
				}
				for range 3 {
					if got, waited := timedLookup(t, c, "acme"); got != 100 || waited != 0 {
						t.Errorf("later lookup, the store hung: capacity %d after %v; want the old 100 at once", got, waited)
					}
				}
				release()
				synctest.Wait()
				if got, waited := timedLookup(t, c, "acme"); got != 200 || waited != 0 {
					t.Errorf("lookup once the read landed: capacity %d after %v; want the new 200 at once", got, waited)
				}
				if n := s.reads(); n != 2 {
					t.Errorf("store read %d times, want 2", n)
				}
			})
		})
	}
}

// TestCacheChangeDuringRevalidation: a notification that comes while a
// background read runs is not answered by it: the next lookup after that
// read waits for one of its own.
func TestCacheChangeDuringRevalidation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		s.set("acme", 1, plan("pro", 2, 100))
		c := mustCache(t, s, WithTTL(time.Minute))
		capacity(t, c, "acme")

		release := s.hold()
		time.Sleep(time.Minute)
		capacity(t, c, "acme") // starts the read, which takes its answer
		synctest.Wait()
		s.set("acme", 5, plan("pro", 6, 200))
		c.Invalidate(Change{Kind: AssignmentChanged, ID: "acme", Version: 5})
		if got, waited := timedLookup(t, c, "acme"); got != 100 || waited != 0 {
			t.Errorf("lookup during the read: capacity %d after %v; want the old 100 at once", got, waited)
		}
		release()
		synctest.Wait()
		if got := capacity(t, c, "acme"); got != 200 {
			t.Errorf("lookup after the read: capacity %d, want the new 200: the read from before the change was cached as fresh", got)
		}
		if n := s.reads(); n != 3 {
			t.Errorf("store read %d times, want 3", n)
		}
	})
}

// TestCacheManyColdSubjects: with the store hung, every new subject waits
// the read wait once; the reads, one per subject, all end at the load
// timeout (a minute, longer than the lookups of all the subjects take),
// and leave nothing in flight.
func TestCacheManyColdSubjects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		release := s.hold()
		defer release()
		c := mustCache(t, s, WithLoadTimeout(time.Minute))
		const subjects = 100
		for i := range subjects {
			subject := fmt.Sprint("s", i)
			for j, want := range []time.Duration{DefaultReadWait, 0} {
				if _, waited := timedLookup(t, c, subject); waited != want {
					t.Fatalf("lookup %d of %s: waited %v, want %v", j+1, subject, waited, want)
				}
			}
		}
		if n := inFlight(c); n != subjects {
			t.Errorf("%d reads in flight, want %d", n, subjects)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := inFlight(c); n != 0 {
			t.Errorf("%d reads in flight after the load timeout, want 0", n)
		}
	})
}

// TestCacheStaleAllocs: while the store hangs, serving a subject past its
// TTL allocates nothing once its read is in flight.
func TestCacheStaleAllocs(t *testing.T) {
	s := newFakeStore()
	s.set("acme", 1, plan("pro", 2, 100))
	c := mustCache(t, s, WithTTL(time.Nanosecond))
	capacity(t, c, "acme")
	release := s.hold()
	defer release()
	ctx := context.Background()
	capacity(t, c, "acme") // starts the read
	if n := testing.AllocsPerRun(1000, func() { _, _ = c.Config(ctx, "acme") }); n != 0 {
		t.Errorf("Config of a subject whose read is in flight allocates %v times, want 0", n)
	}
}
