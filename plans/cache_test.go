package plans

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

// fakeStore is a Store whose answers a test sets, counting its reads. With
// a gate, a read takes its answer, then waits for the gate to open (or for
// its ctx to end) before returning it: a database that answered, and an
// answer still on its way.
type fakeStore struct {
	mu      sync.Mutex
	assign  map[string]Assignment
	err     error // returned by every read while set
	gate    chan struct{}
	calls   int
	subject []string // the subjects read, in order
}

func newFakeStore() *fakeStore { return &fakeStore{assign: map[string]Assignment{}} }

func (s *fakeStore) Lookup(ctx context.Context, subject string) (Assignment, error) {
	s.mu.Lock()
	s.calls++
	s.subject = append(s.subject, subject)
	a, err, gate := s.assign[subject], s.err, s.gate
	s.mu.Unlock()
	a.Subject = subject
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return Assignment{}, ctx.Err()
		}
	}
	if err != nil {
		return Assignment{}, err
	}
	return a, nil
}

func (s *fakeStore) set(subject string, version uint64, p Plan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.assign[subject] = Assignment{Version: version, Plan: p}
}

func (s *fakeStore) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// hold makes reads wait until the returned function is called.
func (s *fakeStore) hold() (release func()) {
	gate := make(chan struct{})
	s.mu.Lock()
	s.gate = gate
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.gate = nil
		s.mu.Unlock()
		close(gate)
	}
}

func (s *fakeStore) reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// events records hook calls as lines of text.
type events struct {
	mu  sync.Mutex
	log []string
}

func (ev *events) hooks() Hooks {
	return Hooks{
		Loaded: func(subject string, a Assignment) {
			ev.add(fmt.Sprintf("loaded %s: %s v%d, assignment v%d", subject, a.Plan.Name, a.Plan.Version, a.Version))
		},
		StaleServed: func(subject string, err error) { ev.add(fmt.Sprintf("stale %s: %v", subject, err)) },
		LoadFailed:  func(subject string, err error) { ev.add(fmt.Sprintf("failed %s: %v", subject, err)) },
	}
}

func (ev *events) add(s string) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.log = append(ev.log, s)
}

// take returns the events since the last take, and forgets them.
func (ev *events) take() []string {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	log := ev.log
	ev.log = nil
	return log
}

func plan(name string, version uint64, perMinute int64) Plan {
	return Plan{Name: name, Version: version, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(perMinute)}}
}

func mustCache(t testing.TB, s Store, opts ...CacheOption) *Cache {
	t.Helper()
	c, err := NewCache(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// capacity returns the capacity of subject's config, which the tests use
// to tell plans apart.
func capacity(t testing.TB, c *Cache, subject string) int64 {
	t.Helper()
	cfg, err := c.Config(t.Context(), subject)
	if err != nil {
		t.Fatalf("Config(%q): %v", subject, err)
	}
	return cfg.Bandwidths[0].Capacity
}

func lookup(t testing.TB, c *Cache, subject string) Assignment {
	t.Helper()
	a, err := c.Lookup(t.Context(), subject)
	if err != nil {
		t.Fatalf("Lookup(%q): %v", subject, err)
	}
	return a
}

// expect checks that the store was read n times in all, and the hooks said
// want since the last check.
func expect(t *testing.T, s *fakeStore, n int, ev *events, want ...string) {
	t.Helper()
	if got := s.reads(); got != n {
		t.Errorf("store read %d times, want %d", got, n)
	}
	if got := ev.take(); !slices.Equal(got, want) {
		t.Errorf("hooks said\n\t%q\nwant\n\t%q", got, want)
	}
}

var errDown = errors.New("connection refused")

// waitForReads is a read wait longer than the load timeout, for the tests
// in real time that check what a lookup that waits is served: a lookup
// then waits for its read to end, however slowly a busy machine runs it
// (even a fake store's read, under -race beside CPU burners, can take
// longer than DefaultReadWait).
const waitForReads = time.Minute

func TestCacheServesPlan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("acme", 8, plan("pro", 7, 100))
		c := mustCache(t, s, WithHooks(ev.hooks()))

		a := lookup(t, c, "acme")
		if a.Subject != "acme" || a.Version != 8 || a.Plan.Name != "pro" || a.Plan.Version != 7 || a.ConfigVersion() != 8 {
			t.Errorf("Lookup = %+v, want acme on pro v7, assignment v8", a)
		}
		if got := capacity(t, c, "acme"); got != 100 {
			t.Errorf("capacity = %d, want pro's 100", got)
		}
		if cfg, err := c.Config(t.Context(), "acme"); err != nil || cfg.Version != 8 {
			t.Errorf("Config = %+v, %v; want Version 8, the later of the assignment's and the plan's", cfg, err)
		}
		expect(t, s, 1, ev, "loaded acme: pro v7, assignment v8")
	})
}

func TestCacheTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("acme", 1, plan("pro", 2, 100))
		c := mustCache(t, s, WithHooks(ev.hooks()), WithTTL(time.Minute))
		capacity(t, c, "acme")
		expect(t, s, 1, ev, "loaded acme: pro v2, assignment v1")

		s.set("acme", 1, plan("pro", 3, 200))
		time.Sleep(time.Minute - time.Nanosecond)
		if got := capacity(t, c, "acme"); got != 100 {
			t.Errorf("capacity before the TTL = %d, want the cached 100", got)
		}
		expect(t, s, 1, ev)

		// At the TTL, the lookup is served the cached plan and reads the
		// store in the background; the next gets what it read.
		time.Sleep(time.Nanosecond)
		if got := capacity(t, c, "acme"); got != 100 {
			t.Errorf("capacity at the TTL = %d, want the cached 100 while the store is read", got)
		}
		synctest.Wait() // the read lands
		expect(t, s, 2, ev, "loaded acme: pro v3, assignment v1")
		if got := capacity(t, c, "acme"); got != 200 {
			t.Errorf("capacity once the read landed = %d, want the new 200", got)
		}
		expect(t, s, 2, ev)
	})
}

func TestCacheNoPlan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		c := mustCache(t, s, WithHooks(ev.hooks()), WithTTL(time.Hour), WithNegativeTTL(10*time.Second))

		a := lookup(t, c, "nobody")
		def := DefaultPlan()
		if a.Subject != "nobody" || a.Version != 0 || a.Plan.Name != def.Name || a.Plan.Version != 0 || a.ConfigVersion() != 0 {
			t.Errorf("Lookup = %+v, want nobody on the default plan at version 0", a)
		}
		if got := capacity(t, c, "nobody"); got != def.Bandwidths[0].Capacity {
			t.Errorf("capacity = %d, want the default plan's %d", got, def.Bandwidths[0].Capacity)
		}
		expect(t, s, 1, ev, "loaded nobody:  v0, assignment v0")

		// Unassigned at version 12: its tombstone's version is the config's.
		s.set("nobody", 12, Plan{})
		time.Sleep(10*time.Second - time.Nanosecond)
		lookup(t, c, "nobody")
		expect(t, s, 1, ev)
		time.Sleep(time.Nanosecond)
		if cfg, err := c.Config(t.Context(), "nobody"); err != nil || cfg.Version != 0 {
			t.Errorf("Config at the negative TTL = %+v, %v; want Version 0, cached, while the store is read", cfg, err)
		}
		synctest.Wait()
		if cfg, err := c.Config(t.Context(), "nobody"); err != nil || cfg.Version != 12 {
			t.Errorf("Config after the negative TTL = %+v, %v; want Version 12, the tombstone's", cfg, err)
		}
		if a := lookup(t, c, "nobody"); a.Version != 12 || a.Plan.Name != "default" || a.ConfigVersion() != 12 {
			t.Errorf("Lookup after the negative TTL = %+v, want the default plan at assignment v12", a)
		}
		expect(t, s, 2, ev, "loaded nobody:  v0, assignment v12")

		// The negative TTL only applies to subjects with no plan.
		s.set("nobody", 13, plan("pro", 5, 100))
		time.Sleep(10 * time.Second)
		lookup(t, c, "nobody")
		synctest.Wait()
		time.Sleep(10 * time.Second)
		lookup(t, c, "nobody")
		expect(t, s, 3, ev, "loaded nobody: pro v5, assignment v13")
	})
}

func TestCacheWithDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		def := plan("trial", 20, 5)
		c := mustCache(t, s, WithDefault(def))
		def.Bandwidths[0].Capacity = 1 // the cache keeps its own copy

		s.set("old", 12, Plan{})
		s.set("new", 30, Plan{})
		for _, tt := range []struct {
			subject string
			version uint64
		}{{"never", 20}, {"old", 20}, {"new", 30}} {
			a := lookup(t, c, tt.subject)
			if a.Plan.Name != "trial" || a.ConfigVersion() != tt.version {
				t.Errorf("Lookup(%q) = %+v, want trial at config version %d", tt.subject, a, tt.version)
			}
			if got := capacity(t, c, tt.subject); got != 5 {
				t.Errorf("capacity(%q) = %d, want trial's 5", tt.subject, got)
			}
			if cfg, err := c.Config(t.Context(), tt.subject); err != nil || cfg.Version != tt.version {
				t.Errorf("Config(%q) = %+v, %v; want Version %d", tt.subject, cfg, err, tt.version)
			}
		}
	})
}

func TestCacheStaleIfError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("acme", 1, plan("pro", 2, 100))
		c := mustCache(t, s, WithHooks(ev.hooks()), WithTTL(time.Minute), WithRetryBackoff(time.Second))
		capacity(t, c, "acme")
		expect(t, s, 1, ev, "loaded acme: pro v2, assignment v1")

		s.fail(errDown)
		time.Sleep(time.Minute)
		if got := capacity(t, c, "acme"); got != 100 {
			t.Errorf("capacity with the store down = %d, want the last good 100", got)
		}
		synctest.Wait() // the read, in the background, fails
		expect(t, s, 2, ev, "stale acme: connection refused")

		// No read before the backoff has passed, however many requests.
		for range 100 {
			capacity(t, c, "acme")
		}
		time.Sleep(time.Second - time.Nanosecond)
		capacity(t, c, "acme")
		expect(t, s, 2, ev)

		time.Sleep(time.Nanosecond)
		if got := capacity(t, c, "acme"); got != 100 {
			t.Errorf("capacity after a second failure = %d, want the last good 100", got)
		}
		synctest.Wait()
		expect(t, s, 3, ev, "stale acme: connection refused")

		s.fail(nil)
		s.set("acme", 1, plan("pro", 4, 300))
		time.Sleep(time.Second)
		if got := capacity(t, c, "acme"); got != 100 {
			t.Errorf("capacity as the store comes back = %d, want the last good 100 while it is read", got)
		}
		synctest.Wait()
		if got := capacity(t, c, "acme"); got != 300 {
			t.Errorf("capacity once the store is back = %d, want 300", got)
		}
		expect(t, s, 4, ev, "loaded acme: pro v4, assignment v1")
		time.Sleep(time.Minute - time.Nanosecond)
		capacity(t, c, "acme")
		expect(t, s, 4, ev) // fresh for a whole TTL again
	})
}

func TestCacheColdFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("acme", 1, plan("pro", 2, 100))
		s.fail(errDown)
		c := mustCache(t, s, WithHooks(ev.hooks()), WithRetryBackoff(time.Second))

		def := DefaultPlan().Bandwidths[0].Capacity
		if a := lookup(t, c, "acme"); a.Plan.Name != "default" || a.ConfigVersion() != 0 {
			t.Errorf("Lookup with the store down = %+v, want the default plan at version 0", a)
		}
		if got := capacity(t, c, "acme"); got != def {
			t.Errorf("capacity = %d, want the default %d", got, def)
		}
		expect(t, s, 1, ev, "failed acme: connection refused")

		// The retry does not wait: the subject has the default plan to
		// serve meanwhile.
		time.Sleep(time.Second)
		capacity(t, c, "acme")
		synctest.Wait()
		expect(t, s, 2, ev, "failed acme: connection refused") // still no good read to serve

		s.fail(nil)
		time.Sleep(time.Second)
		if got := capacity(t, c, "acme"); got != def {
			t.Errorf("capacity as the store comes back = %d, want the default %d while it is read", got, def)
		}
		synctest.Wait()
		if got := capacity(t, c, "acme"); got != 100 {
			t.Errorf("capacity once the store is back = %d, want 100", got)
		}
		expect(t, s, 3, ev, "loaded acme: pro v2, assignment v1")
	})
}

func TestCacheInvalidData(t *testing.T) {
	storeErr := fmt.Errorf(`%w: plan "pro" version 3: bandwidths[0].capacity: missing`, ErrInvalidPlan)
	tests := []struct {
		name  string
		spoil func(s *fakeStore, subject string)
		msg   string
	}{
		{"store says", func(s *fakeStore, _ string) { s.fail(storeErr) }, storeErr.Error()},
		{"cache finds", func(s *fakeStore, subject string) { s.set(subject, 1, plan("pro", 3, 0)) },
			`plans: invalid plan: plan "pro" version 3: Bandwidths[0].Capacity must be between 1 and 2^50, got 0`},
		{"assignment version", func(s *fakeStore, subject string) { s.set(subject, 1<<53, plan("pro", 3, 10)) },
			`plans: invalid plan: subject "%s": assignment Version must be at most 2^53-1, got 9007199254740992`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, ev := newFakeStore(), new(events)
				c := mustCache(t, s, WithHooks(ev.hooks()), WithTTL(time.Minute))
				s.set("acme", 1, plan("pro", 2, 100))
				capacity(t, c, "acme")
				ev.take()
				msg := func(subject string) string {
					if tt.name == "assignment version" {
						return fmt.Sprintf(tt.msg, subject)
					}
					return tt.msg
				}

				tt.spoil(s, "acme")
				time.Sleep(time.Minute)
				capacity(t, c, "acme")
				synctest.Wait()
				if got := capacity(t, c, "acme"); got != 100 {
					t.Errorf("capacity = %d, want the last good 100", got)
				}
				expect(t, s, 2, ev, "stale acme: "+msg("acme"))

				// A subject read for the first time gets the default plan.
				tt.spoil(s, "new")
				if a := lookup(t, c, "new"); a.Plan.Name != "default" {
					t.Errorf("Lookup(new) = %+v, want the default plan", a)
				}
				expect(t, s, 3, ev, "failed new: "+msg("new"))
			})
		})
	}
}

// TestCacheLoadTimeout: a read of a store that does not answer ends at
// the load timeout, whether or not a lookup still waits for it; a read
// wait longer than the load timeout waits for it to end.
func TestCacheLoadTimeout(t *testing.T) {
	for _, tt := range []struct {
		name     string
		readWait time.Duration
		waited   time.Duration
	}{
		{"default read wait", DefaultReadWait, DefaultReadWait},
		{"longer read wait", time.Hour, 2 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, ev := newFakeStore(), new(events)
				s.set("acme", 1, plan("pro", 2, 100))
				release := s.hold()
				defer release()
				c := mustCache(t, s, WithHooks(ev.hooks()), WithLoadTimeout(2*time.Second), WithReadWait(tt.readWait))

				start := time.Now()
				if a := lookup(t, c, "acme"); a.Plan.Name != "default" {
					t.Errorf("Lookup of a store that does not answer = %+v, want the default plan", a)
				}
				if waited := time.Since(start); waited != tt.waited {
					t.Errorf("Lookup took %v, want %v", waited, tt.waited)
				}
				time.Sleep(2*time.Second - time.Since(start))
				synctest.Wait()
				expect(t, s, 1, ev, "failed acme: context deadline exceeded")
			})
		})
	}
}

func TestCacheStampede(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		s.set("acme", 1, plan("pro", 2, 100))
		release := s.hold()
		c := mustCache(t, s)

		const callers = 1000
		got := make([]int64, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				cfg, err := c.Config(context.Background(), "acme")
				if err != nil {
					t.Error(err)
					return
				}
				got[i] = cfg.Bandwidths[0].Capacity
			})
		}
		// Every caller is now blocked: waiting on the one read in flight,
		// which waits on the gate.
		synctest.Wait()
		if n := s.reads(); n != 1 {
			t.Fatalf("%d callers of a cold subject read the store %d times, want 1", callers, n)
		}
		release()
		wg.Wait()
		if n := s.reads(); n != 1 {
			t.Errorf("store read %d times, want 1", n)
		}
		for i, n := range got {
			if n != 100 {
				t.Fatalf("caller %d got capacity %d, want 100", i, n)
			}
		}
	})
}

func TestCacheCallerCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("acme", 1, plan("pro", 2, 100))
		release := s.hold()
		c := mustCache(t, s, WithHooks(ev.hooks()))

		ctx, cancel := context.WithCancel(context.Background())
		var errA, errB error
		var b ratelimit.Config
		var wg sync.WaitGroup
		wg.Go(func() { _, errA = c.Config(ctx, "acme") })
		wg.Go(func() { b, errB = c.Config(context.Background(), "acme") })
		synctest.Wait()
		cancel()
		synctest.Wait()
		if !errors.Is(errA, context.Canceled) {
			t.Errorf("the cancelled caller got %v, want context.Canceled", errA)
		}
		release()
		wg.Wait()
		if errB != nil || b.Bandwidths[0].Capacity != 100 {
			t.Errorf("the other caller got %+v, %v; want pro's config", b, errB)
		}
		expect(t, s, 1, ev, "loaded acme: pro v2, assignment v1")

		// A done context is an error only when the store must be read.
		if got, err := c.Config(ctx, "acme"); err != nil || got.Bandwidths[0].Capacity != 100 {
			t.Errorf("Config(cancelled ctx) of a cached subject = %+v, %v; want pro's config", got, err)
		}
		if _, err := c.Config(ctx, "cold"); !errors.Is(err, context.Canceled) {
			t.Errorf("Config(cancelled ctx) of a cold subject: %v, want context.Canceled", err)
		}
		expect(t, s, 1, ev)
	})
}

func TestCacheCancelledAloneStillCaches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		s.set("acme", 1, plan("pro", 2, 100))
		release := s.hold()
		c := mustCache(t, s)

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() {
			_, err := c.Config(ctx, "acme")
			done <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Config = %v, want context.Canceled", err)
		}
		release()
		synctest.Wait() // the read, left to finish on its own, commits
		if got := capacity(t, c, "acme"); got != 100 || s.reads() != 1 {
			t.Errorf("capacity = %d after %d reads, want 100 after the one read", got, s.reads())
		}
	})
}

func TestCacheInvalidatePlan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		s.set("a", 1, plan("pro", 5, 100))
		s.set("b", 2, plan("pro", 5, 100))
		s.set("c", 3, plan("free", 6, 10))
		c := mustCache(t, s, WithTTL(time.Hour))
		for _, sub := range []string{"a", "b", "c"} {
			capacity(t, c, sub)
		}

		c.Invalidate(Change{Kind: PlanChanged, ID: "pro", Version: 5})  // what is cached
		c.Invalidate(Change{Kind: PlanChanged, ID: "pro", Version: 4})  // older
		c.Invalidate(Change{Kind: PlanChanged, ID: "gold", Version: 9}) // not cached
		for _, sub := range []string{"a", "b", "c"} {
			capacity(t, c, sub)
		}
		if n := s.reads(); n != 3 {
			t.Fatalf("store read %d times after stale notifications, want 3", n)
		}

		s.set("a", 1, plan("pro", 9, 200))
		s.set("b", 2, plan("pro", 9, 200))
		c.Invalidate(Change{Kind: PlanChanged, ID: "pro", Version: 9})
		for _, sub := range []string{"a", "b", "c", "a", "b", "c"} {
			capacity(t, c, sub)
		}
		if got := capacity(t, c, "a") + capacity(t, c, "b") + capacity(t, c, "c"); got != 410 || s.reads() != 5 {
			t.Errorf("after pro v9: capacities sum to %d after %d reads, want 410 after 5", got, s.reads())
		}

		c.Invalidate(Change{Kind: PlanChanged, ID: "pro", Version: 9}) // duplicate
		c.Invalidate(Change{Kind: PlanChanged, ID: "pro", Version: 7}) // late
		capacity(t, c, "a")
		capacity(t, c, "b")
		if n := s.reads(); n != 5 {
			t.Errorf("store read %d times after a duplicate and a late notification, want 5", n)
		}
	})
}

func TestCacheInvalidatePlanStoreBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A notification for a version the store does not return (a
		// lagging replica) costs one read, not one per request.
		s := newFakeStore()
		s.set("a", 1, plan("pro", 5, 100))
		c := mustCache(t, s, WithTTL(time.Hour))
		capacity(t, c, "a")
		c.Invalidate(Change{Kind: PlanChanged, ID: "pro", Version: 6})
		for range 3 {
			capacity(t, c, "a")
		}
		if n := s.reads(); n != 2 {
			t.Errorf("store read %d times, want 2", n)
		}
	})
}

func TestCacheInvalidateAssignment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		s.set("a", 4, plan("pro", 2, 100))
		s.set("b", 5, plan("pro", 2, 100))
		c := mustCache(t, s, WithTTL(time.Hour))
		capacity(t, c, "a")
		capacity(t, c, "b")

		c.Invalidate(Change{Kind: AssignmentChanged, ID: "a", Version: 4})   // what is cached
		c.Invalidate(Change{Kind: AssignmentChanged, ID: "a", Version: 3})   // older
		c.Invalidate(Change{Kind: AssignmentChanged, ID: "zed", Version: 9}) // not cached
		capacity(t, c, "a")
		if n := s.reads(); n != 2 {
			t.Fatalf("store read %d times after stale notifications, want 2", n)
		}

		s.set("a", 7, plan("free", 6, 10))
		c.Invalidate(Change{Kind: AssignmentChanged, ID: "a", Version: 7})
		if got := capacity(t, c, "a"); got != 10 {
			t.Errorf("capacity after the move to free = %d, want 10", got)
		}
		capacity(t, c, "a")
		capacity(t, c, "b")
		c.Invalidate(Change{Kind: AssignmentChanged, ID: "a", Version: 7}) // duplicate
		capacity(t, c, "a")
		if n := s.reads(); n != 3 {
			t.Errorf("store read %d times, want 3", n)
		}
	})
}

func TestCacheResync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("a", 1, plan("pro", 2, 100))
		c := mustCache(t, s, WithHooks(ev.hooks()), WithTTL(time.Hour))
		capacity(t, c, "a")
		capacity(t, c, "nobody")
		ev.take()

		s.set("a", 1, plan("pro", 3, 200))
		c.Resync()
		if got := capacity(t, c, "a"); got != 200 {
			t.Errorf("capacity after Resync = %d, want 200", got)
		}
		capacity(t, c, "nobody")
		capacity(t, c, "a")
		expect(t, s, 4, ev, "loaded a: pro v3, assignment v1", "loaded nobody:  v0, assignment v0")

		// A resync the store cannot serve keeps the entries.
		s.fail(errDown)
		c.Invalidate(Change{Kind: 99}) // an unknown kind resyncs
		if got := capacity(t, c, "a"); got != 200 {
			t.Errorf("capacity after a failed resync = %d, want the stale 200", got)
		}
		expect(t, s, 5, ev, "stale a: connection refused")
	})
}

// lookupHooks is ev's hooks with Hit and Miss logged too, as "hit s" and
// "miss s", so that expect sees them in order with the reads.
func lookupHooks(ev *events) Hooks {
	h := ev.hooks()
	h.Hit = func(subject string) { ev.add("hit " + subject) }
	h.Miss = func(subject string) { ev.add("miss " + subject) }
	return h
}

// TestCacheHitMiss: each lookup is one Hit or one Miss: a Miss when a
// store read is due (cold, past the TTL or negative TTL, invalidated,
// resynced, a failed read's retry due, a read already in flight, a done
// ctx), called before the read's own hook, whether the lookup waits for
// the read or is served the cached plan while the read runs; otherwise a
// Hit, a stale or default plan served within a failed read's backoff
// included.
func TestCacheHitMiss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ev := newFakeStore(), new(events)
		s.set("acme", 1, plan("pro", 2, 100))
		c := mustCache(t, s, WithHooks(lookupHooks(ev)), WithTTL(time.Minute), WithNegativeTTL(10*time.Second), WithRetryBackoff(time.Second))
		ctx := t.Context()

		lookup(t, c, "acme")
		expect(t, s, 1, ev, "miss acme", "loaded acme: pro v2, assignment v1")
		lookup(t, c, "acme")
		capacity(t, c, "acme")
		if _, err := c.Supplier("acme")(ctx); err != nil {
			t.Fatal(err)
		}
		expect(t, s, 1, ev, "hit acme", "hit acme", "hit acme")

		// Past the TTL: a miss, served the cached plan while the read runs.
		time.Sleep(time.Minute - time.Nanosecond)
		lookup(t, c, "acme")
		expect(t, s, 1, ev, "hit acme")
		time.Sleep(time.Nanosecond)
		lookup(t, c, "acme")
		synctest.Wait()
		lookup(t, c, "acme")
		expect(t, s, 2, ev, "miss acme", "loaded acme: pro v2, assignment v1", "hit acme")

		// Notified: a miss that waits for the read.
		s.set("acme", 3, plan("pro", 2, 100))
		c.Invalidate(Change{Kind: AssignmentChanged, ID: "acme", Version: 3})
		lookup(t, c, "acme")
		lookup(t, c, "acme")
		expect(t, s, 3, ev, "miss acme", "loaded acme: pro v2, assignment v3", "hit acme")

		s.set("acme", 3, plan("pro", 4, 100))
		c.Invalidate(Change{Kind: PlanChanged, ID: "pro", Version: 4})
		lookup(t, c, "acme")
		c.Resync()
		lookup(t, c, "acme")
		lookup(t, c, "acme")
		expect(t, s, 5, ev, "miss acme", "loaded acme: pro v4, assignment v3", "miss acme", "loaded acme: pro v4, assignment v3", "hit acme")

		// A failed read: its stale plan, within the backoff, is a hit; the
		// retry is a miss, served the stale plan while it runs.
		s.fail(errDown)
		c.Resync()
		lookup(t, c, "acme")
		time.Sleep(time.Second - time.Nanosecond)
		lookup(t, c, "acme")
		time.Sleep(time.Nanosecond)
		lookup(t, c, "acme")
		synctest.Wait()
		expect(t, s, 7, ev, "miss acme", "stale acme: connection refused", "hit acme", "miss acme", "stale acme: connection refused")

		// So is the default plan, for a subject never read.
		lookup(t, c, "newcomer")
		lookup(t, c, "newcomer")
		expect(t, s, 8, ev, "miss newcomer", "failed newcomer: connection refused", "hit newcomer")
		s.fail(nil)

		// A subject with no plan, for the negative TTL.
		time.Sleep(time.Second)
		lookup(t, c, "newcomer")
		synctest.Wait()
		time.Sleep(10*time.Second - time.Nanosecond)
		lookup(t, c, "newcomer")
		time.Sleep(time.Nanosecond)
		lookup(t, c, "newcomer")
		synctest.Wait()
		expect(t, s, 10, ev, "miss newcomer", "loaded newcomer:  v0, assignment v0", "hit newcomer", "miss newcomer", "loaded newcomer:  v0, assignment v0")

		// While that read runs, every lookup of the subject is a miss.
		release := s.hold()
		time.Sleep(10 * time.Second)
		lookup(t, c, "newcomer")
		lookup(t, c, "newcomer")
		synctest.Wait()
		expect(t, s, 11, ev, "miss newcomer", "miss newcomer")
		release()
		synctest.Wait()
		lookup(t, c, "newcomer")
		expect(t, s, 11, ev, "loaded newcomer:  v0, assignment v0", "hit newcomer")

		// A lookup that ends with its ctx's error is a miss; a cached
		// subject is a hit whatever the ctx, and one due for a read is a
		// miss, served the cached plan.
		done, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := c.Config(done, "cold"); !errors.Is(err, context.Canceled) {
			t.Errorf("Config(done ctx) of a cold subject: %v, want context.Canceled", err)
		}
		if _, err := c.Lookup(done, "newcomer"); err != nil {
			t.Errorf("Lookup(done ctx) of a cached subject: %v", err)
		}
		time.Sleep(10 * time.Second)
		if _, err := c.Lookup(done, "newcomer"); err != nil {
			t.Errorf("Lookup(done ctx) of a subject past its negative TTL: %v", err)
		}
		synctest.Wait()
		expect(t, s, 12, ev, "miss cold", "hit newcomer", "miss newcomer", "loaded newcomer:  v0, assignment v0")
	})
}

// hitCounter counts Hit and Miss calls.
type hitCounter struct{ hits, misses atomic.Int64 }

func (h *hitCounter) hooks() Hooks {
	return Hooks{
		Hit:  func(string) { h.hits.Add(1) },
		Miss: func(string) { h.misses.Add(1) },
	}
}

// check checks the counts since the last check, and forgets them.
func (h *hitCounter) check(t *testing.T, hits, misses int64) {
	t.Helper()
	if got, gotMisses := h.hits.Swap(0), h.misses.Swap(0); got != hits || gotMisses != misses {
		t.Errorf("%d hits and %d misses, want %d and %d", got, gotMisses, hits, misses)
	}
}

// TestCacheStampedeHitMiss: lookups of a cold subject that wait for its
// one read are each a Miss, however many join it; those after it are
// hits; and racing lookups make exactly one Hit or Miss each.
func TestCacheStampedeHitMiss(t *testing.T) {
	const callers = 100
	lookups := func(c *Cache, subject string, n int) *sync.WaitGroup {
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if _, err := c.Config(context.Background(), subject); err != nil {
					t.Error(err)
				}
			})
		}
		return &wg
	}
	t.Run("AllJoin", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, h := newFakeStore(), new(hitCounter)
			release := s.hold()
			c := mustCache(t, s, WithHooks(h.hooks()))
			wg := lookups(c, "acme", callers)
			synctest.Wait() // every lookup waits on the one read
			h.check(t, 0, callers)
			release()
			wg.Wait()
			h.check(t, 0, 0)
			if n := s.reads(); n != 1 {
				t.Errorf("store read %d times, want 1", n)
			}
		})
	})
	t.Run("JoinThenHit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, h := newFakeStore(), new(hitCounter)
			release := s.hold()
			c := mustCache(t, s, WithHooks(h.hooks()))
			joined := lookups(c, "acme", 60)
			synctest.Wait()
			release()
			joined.Wait()
			lookups(c, "acme", callers-60).Wait()
			h.check(t, callers-60, 60)
			if n := s.reads(); n != 1 {
				t.Errorf("store read %d times, want 1", n)
			}
		})
	})
	t.Run("Racing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, h := newFakeStore(), new(hitCounter)
			c := mustCache(t, s, WithHooks(h.hooks()))
			lookups(c, "acme", callers).Wait()
			hits, misses := h.hits.Load(), h.misses.Load()
			if hits+misses != callers || misses < 1 {
				t.Errorf("%d lookups: %d hits and %d misses; want %d in all, at least the first a miss", callers, hits, misses, callers)
			}
			if n := s.reads(); n != 1 {
				t.Errorf("store read %d times, want 1", n)
			}
		})
	})
}

func TestCacheInFlightInvalidation(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Cache)
	}{
		{"assignment", func(c *Cache) { c.Invalidate(Change{Kind: AssignmentChanged, ID: "acme", Version: 5}) }},
		{"plan not yet cached", func(c *Cache) { c.Invalidate(Change{Kind: PlanChanged, ID: "pro", Version: 6}) }},
		{"resync", func(c *Cache) { c.Resync() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newFakeStore()
				s.set("acme", 1, plan("pro", 2, 100))
				c := mustCache(t, s, WithTTL(time.Hour))
				release := s.hold()

				got := make(chan int64)
				go func() { got <- capacity(t, c, "acme") }()
				synctest.Wait() // the store has answered pro v2; the answer is on its way
				s.set("acme", 5, plan("pro", 6, 200))
				tt.change(c)
				release()
				if n := <-got; n != 100 {
					t.Errorf("the read in flight returned capacity %d, want its answer, 100", n)
				}
				if n := capacity(t, c, "acme"); n != 200 {
					t.Errorf("the next call got capacity %d, want 200: the answer from before the change was cached as fresh", n)
				}
				if n := s.reads(); n != 2 {
					t.Errorf("store read %d times, want 2", n)
				}
			})
		})
	}
}

func TestCachePlanNameOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		for i := range maxPlanNames + 1 {
			s.set(fmt.Sprint("s", i), 1, plan(fmt.Sprint("p", i), 2, 100))
		}
		c := mustCache(t, s, WithTTL(time.Hour), WithSize(2*maxPlanNames))
		for i := range maxPlanNames {
			capacity(t, c, fmt.Sprint("s", i))
		}
		capacity(t, c, "s0")
		if n := s.reads(); n != maxPlanNames {
			t.Fatalf("store read %d times, want %d", n, maxPlanNames)
		}
		// One plan too many: the cache stops tracking the others, and reads
		// every subject again so that none misses a notification.
		capacity(t, c, fmt.Sprint("s", maxPlanNames))
		capacity(t, c, "s0")
		capacity(t, c, "s0")
		if n := s.reads(); n != maxPlanNames+2 {
			t.Errorf("store read %d times, want %d", n, maxPlanNames+2)
		}
		c.mu.Lock()
		tracked := len(c.plans)
		c.mu.Unlock()
		if tracked != 2 {
			t.Errorf("cache tracks %d plans, want 2", tracked)
		}
		s.set("s0", 1, plan("p0", 3, 300))
		c.Invalidate(Change{Kind: PlanChanged, ID: "p0", Version: 3})
		if got := capacity(t, c, "s0"); got != 300 {
			t.Errorf("capacity after a change once tracking restarted = %d, want 300", got)
		}
	})
}

func TestCacheSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		c := mustCache(t, s, WithSize(2), WithTTL(time.Hour))
		for _, sub := range []string{"a", "b", "a", "c", "a", "b"} {
			capacity(t, c, sub)
		}
		// c evicts b, the least recently used; b evicts c.
		s.mu.Lock()
		read := s.subject
		s.mu.Unlock()
		if want := []string{"a", "b", "c", "b"}; !slices.Equal(read, want) {
			t.Errorf("store read %q, want %q", read, want)
		}
	})
}

func TestNewCacheErrors(t *testing.T) {
	s := newFakeStore()
	tests := []struct {
		name  string
		store Store
		opt   CacheOption
		want  string
	}{
		{"nil store", nil, nil, "plans: NewCache: store is nil"},
		{"size", s, WithSize(0), "plans: WithSize: size must be at least 1, got 0"},
		{"ttl", s, WithTTL(0), "plans: WithTTL: TTL must be more than 0, got 0s"},
		{"negative ttl", s, WithNegativeTTL(-time.Second), "plans: WithNegativeTTL: TTL must be more than 0, got -1s"},
		{"backoff", s, WithRetryBackoff(0), "plans: WithRetryBackoff: backoff must be more than 0, got 0s"},
		{"load timeout", s, WithLoadTimeout(0), "plans: WithLoadTimeout: timeout must be more than 0, got 0s"},
		{"read wait", s, WithReadWait(-time.Millisecond), "plans: WithReadWait: wait must be more than 0, got -1ms"},
		{"default", s, WithDefault(plan("", 0, 1)),
			`plans: WithDefault: plans: invalid plan: plan "" version 0: Name must not be empty`},
		{"default bandwidths", s, WithDefault(plan("d", 0, 0)),
			`plans: WithDefault: plans: invalid plan: plan "d" version 0: Bandwidths[0].Capacity must be between 1 and 2^50, got 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewCache(tt.store, tt.opt)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("NewCache = %v, %v; want error %s", c, err, tt.want)
			}
		})
	}
	if _, err := NewCache(s, WithDefault(plan("d", 0, 0))); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("WithDefault of an invalid plan: %v does not wrap ErrInvalidPlan", err)
	}
}

func TestCacheHitAllocs(t *testing.T) {
	s := newFakeStore()
	s.set("acme", 1, plan("pro", 2, 100))
	c := mustCache(t, s, WithTTL(time.Hour))
	ctx := context.Background()
	capacity(t, c, "acme")
	if n := testing.AllocsPerRun(1000, func() { _, _ = c.Config(ctx, "acme") }); n != 0 {
		t.Errorf("Config of a cached subject allocates %v times, want 0", n)
	}

	h := new(hitCounter)
	c = mustCache(t, s, WithTTL(time.Hour), WithHooks(h.hooks()), WithReadWait(waitForReads))
	capacity(t, c, "acme")
	if n := testing.AllocsPerRun(1000, func() { _, _ = c.Config(ctx, "acme") }); n != 0 {
		t.Errorf("Config of a cached subject, with a Hit hook, allocates %v times, want 0", n)
	}
	if hits, misses := h.hits.Load(), h.misses.Load(); hits != 1001 || misses != 1 {
		t.Errorf("%d hits and %d misses, want 1001 (AllocsPerRun's warm-up run and its 1000) and 1", hits, misses)
	}
}

func TestCacheBucket(t *testing.T) {
	s := newFakeStore()
	s.set("acme", 1, plan("pro", 2, 3))
	c := mustCache(t, s, WithReadWait(waitForReads))
	backend := memory.New(memory.WithSweepInterval(0))
	defer backend.Close()
	l := ratelimit.New(backend)

	b := c.Bucket(l, "acme:key1", "acme")
	for i := range 4 {
		d, err := b.TryConsume(t.Context(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 3) {
			t.Errorf("request %d: Allowed = %v, want %v under a plan of 3 a minute", i+1, d.Allowed, i < 3)
		}
	}
}

func BenchmarkCacheHit(b *testing.B) {
	s := newFakeStore()
	s.set("acme", 1, plan("pro", 2, 100))
	c := mustCache(b, s, WithTTL(time.Hour))
	capacity(b, c, "acme")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Config(ctx, "acme"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// countingStore answers every subject with one plan, counting its reads.
type countingStore struct{ reads atomic.Int64 }

func (s *countingStore) Lookup(_ context.Context, subject string) (Assignment, error) {
	s.reads.Add(1)
	return Assignment{Subject: subject, Version: 1, Plan: plan("pro", 2, 100)}, nil
}

func BenchmarkColdStampede(b *testing.B) {
	const callers = 1000
	s := new(countingStore)
	c := mustCache(b, s, WithTTL(time.Hour))
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		subject := fmt.Sprint("cold", i)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				<-start
				if _, err := c.Config(ctx, subject); err != nil {
					b.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
	}
	b.ReportMetric(float64(s.reads.Load())/float64(b.N), "lookups/op")
}
