package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/plans"
)

// watch is an Invalidator and a set of ListenHooks that record what the
// listener does, in order, and let a test wait for it.
type watch struct {
	mu      sync.Mutex
	log     []string // "connected", "resync", "disconnected", "change", "bad"
	changes []plans.Change
	errs    []error // of Disconnected
	bad     []string
	signal  chan struct{} // cap 1: something was recorded
}

var _ plans.Invalidator = (*watch)(nil)

func newWatch() *watch { return &watch{signal: make(chan struct{}, 1)} }

func (w *watch) record(event string, f func()) {
	w.mu.Lock()
	w.log = append(w.log, event)
	if f != nil {
		f()
	}
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

func (w *watch) Invalidate(c plans.Change) {
	w.record("change", func() { w.changes = append(w.changes, c) })
}

func (w *watch) Resync() { w.record("resync", nil) }

func (w *watch) hooks() ListenHooks {
	return ListenHooks{
		Connected: func() { w.record("connected", nil) },
		Disconnected: func(err error, retryIn time.Duration) {
			w.record("disconnected", func() { w.errs = append(w.errs, err) })
		},
		BadPayload: func(payload string, err error) {
			w.record("bad", func() { w.bad = append(w.bad, payload) })
		},
	}
}

// count returns how often event was recorded.
func (w *watch) count(event string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return countIn(w.log, event)
}

// waitFor waits until cond holds, failing the test if it does not within
// waitTimeout. cond is called with w locked.
func (w *watch) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		w.mu.Lock()
		ok := cond()
		log := slices.Clone(w.log)
		w.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-w.signal:
		case <-deadline:
			t.Fatalf("no %s within %v; the listener did %v", what, waitTimeout, log)
		}
	}
}

// waitCount waits until event was recorded n times.
func (w *watch) waitCount(t testing.TB, event string, n int) {
	t.Helper()
	w.waitFor(t, fmt.Sprintf("%s #%d", event, n), func() bool {
		return countIn(w.log, event) >= n
	})
}

func countIn(log []string, event string) int {
	n := 0
	for _, e := range log {
		if e == event {
			n++
		}
	}
	return n
}

// waitChange waits until c was passed to Invalidate.
func (w *watch) waitChange(t testing.TB, c plans.Change) {
	t.Helper()
	w.waitFor(t, fmt.Sprintf("change %+v", c), func() bool { return slices.Contains(w.changes, c) })
}

// listen runs s.Listen for inv until the test ends, when it must return
// context.Canceled.
func listen(t testing.TB, s *Store, inv plans.Invalidator, opts ...ListenOption) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Listen(ctx, inv, opts...) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Listen returned %v, want context.Canceled", err)
			}
		case <-time.After(waitTimeout):
			t.Errorf("Listen did not return within %v of its context's end", waitTimeout)
		}
	})
}

// appName is an application_name unique to one listener.
func appName() string { return fmt.Sprintf("sluice-test-%08x", rand.Uint32()) }

func TestListen(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	w := newWatch()
	listen(t, s, w, WithListenHooks(w.hooks()))
	w.waitCount(t, "resync", 1)

	p := putPlan(t, s, proPlan())
	w.waitChange(t, plans.Change{Kind: plans.PlanChanged, ID: "pro", Version: p.Version})
	v := assign(t, s, "c:1", "pro")
	w.waitChange(t, plans.Change{Kind: plans.AssignmentChanged, ID: "c:1", Version: v})
	execSQL(t, pool, "UPDATE sluice.assignments SET plan = 'pro' WHERE subject = 'c:1'")
	raw := uint64(version(t, pool, "assignments", "subject", "c:1"))
	w.waitChange(t, plans.Change{Kind: plans.AssignmentChanged, ID: "c:1", Version: raw})

	execSQL(t, pool, "SELECT pg_notify('sluice_changes', 'garbage')")
	w.waitFor(t, "bad payload", func() bool { return slices.Equal(w.bad, []string{"garbage"}) })
	u, err := s.Unassign(context.Background(), "c:1")
	if err != nil {
		t.Fatal(err)
	}
	w.waitChange(t, plans.Change{Kind: plans.AssignmentChanged, ID: "c:1", Version: u})
	if got := w.count("connected"); got != 1 {
		t.Errorf("connected %d times, want 1", got)
	}
}

func TestListenOptions(t *testing.T) {
	s, err := New(unreachablePool(t))
	if err != nil {
		t.Fatal(err)
	}
	w := newWatch()
	tests := []struct {
		name string
		inv  plans.Invalidator
		opts []ListenOption
		want string
	}{
		{"nil invalidator", nil, nil, "nil Invalidator"},
		{"heartbeat", w, []ListenOption{WithHeartbeat(0)}, "WithHeartbeat(0s): must be > 0"},
		{"timeout", w, []ListenOption{WithTimeout(-time.Second)}, "WithTimeout(-1s): must be > 0"},
		{"backoff zero", w, []ListenOption{WithBackoff(0, time.Second)}, "WithBackoff(0s, 1s)"},
		{"backoff reversed", w, []ListenOption{WithBackoff(time.Second, time.Millisecond)}, "want 0 < min <= max"},
		{"application name", w, []ListenOption{WithApplicationName("")}, "WithApplicationName"},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		err := s.Listen(ctx, tt.inv, tt.opts...)
		cancel()
		if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Listen returned %v, want at once an error containing %q", tt.name, err, tt.want)
		}
	}
}

// unreachablePool is a pool of a server that is not there: a pool connects
// lazily, so it is made without error.
func unreachablePool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestListenRetriesUntilCanceled: with no server to reach, the listener
// reports each failed attempt, backing off, and returns once its context
// ends.
func TestListenRetriesUntilCanceled(t *testing.T) {
	t.Parallel()
	s, err := New(unreachablePool(t))
	if err != nil {
		t.Fatal(err)
	}
	w := newWatch()
	listen(t, s, w, WithListenHooks(w.hooks()), WithBackoff(time.Millisecond, 4*time.Millisecond))
	w.waitCount(t, "disconnected", 3)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.changes != nil || countIn(w.log, "resync") != 0 {
		t.Errorf("listener without a server did %v", w.log)
	}
	if !strings.Contains(w.errs[0].Error(), "postgres: listener: connect") {
		t.Errorf("Disconnected got %v, want a connect error", w.errs[0])
	}
}

// TestListenReconnects kills the listener's backend: the listener must
// notice, reconnect, resync, and pass later changes on.
func TestListenReconnects(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	w := newWatch()
	name := appName()
	listen(t, s, w, WithListenHooks(w.hooks()), WithApplicationName(name), WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	w.waitCount(t, "resync", 1)

	killed := queryInt(t, pool, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", name)
	if killed != 1 {
		t.Fatalf("terminated %d backends named %s, want 1", killed, name)
	}
	w.waitCount(t, "resync", 2)
	p := putPlan(t, s, proPlan())
	w.waitChange(t, plans.Change{Kind: plans.PlanChanged, ID: "pro", Version: p.Version})
	wantOrder(t, w, "connected", "resync", "disconnected", "connected", "resync")
}

// wantOrder checks that the listener's log, changes left out, begins with
// events.
func wantOrder(t testing.TB, w *watch, events ...string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var got []string
	for _, e := range w.log {
		if e != "change" && (len(got) == 0 || e != "disconnected" || got[len(got)-1] != "disconnected") {
			got = append(got, e)
		}
	}
	if len(got) < len(events) || !slices.Equal(got[:len(events)], events) {
		t.Errorf("listener did %v, want it to begin %v", w.log, events)
	}
}

// TestListenOutage stops the server under the listener, and starts it
// again: the listener must see the outage, reconnect, resync (it may have
// missed changes), and pass later changes on.
func TestListenOutage(t *testing.T) {
	t.Parallel()
	srv := servers.StartPostgres(t)
	pool := srv.NewDatabase(t).Pool(t)
	s := migrated(t, pool)
	w := newWatch()
	listen(t, s, w, WithListenHooks(w.hooks()), WithBackoff(10*time.Millisecond, 200*time.Millisecond))
	w.waitCount(t, "resync", 1)

	srv.Stop(t)
	w.waitCount(t, "disconnected", 1)
	srv.Start(t)
	w.waitCount(t, "resync", 2)
	pool.Reset() // its connections died with the server
	p := putPlan(t, s, proPlan())
	w.waitChange(t, plans.Change{Kind: plans.PlanChanged, ID: "pro", Version: p.Version})
	v := assign(t, s, "c1", "pro")
	w.waitChange(t, plans.Change{Kind: plans.AssignmentChanged, ID: "c1", Version: v})
	wantOrder(t, w, "connected", "resync", "disconnected", "connected", "resync")
}

// TestListenHeartbeat freezes the listener's backend (SIGSTOP), which
// keeps the connection open but silent, as a half-open connection is: the
// heartbeat must notice, and the listener reconnect.
func TestListenHeartbeat(t *testing.T) {
	t.Parallel()
	srv := servers.StartPostgres(t)
	pool := srv.NewDatabase(t).Pool(t)
	s := migrated(t, pool)
	w := newWatch()
	name := appName()
	listen(t, s, w, WithListenHooks(w.hooks()), WithApplicationName(name),
		WithHeartbeat(20*time.Millisecond), WithTimeout(2*time.Second), WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	w.waitCount(t, "resync", 1)

	// On a healthy connection, a heartbeat changes nothing: the listener
	// stays connected and passes changes on.
	waitHeartbeat(t, pool, name)
	p := putPlan(t, s, proPlan())
	w.waitChange(t, plans.Change{Kind: plans.PlanChanged, ID: "pro", Version: p.Version})
	if n := w.count("disconnected"); n != 0 {
		t.Fatalf("disconnected %d times from a healthy server: %v", n, w.errs)
	}

	pid := int(queryInt(t, pool, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", name))
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP the listener's backend %d: %v", pid, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	w.waitCount(t, "resync", 2)
	w.mu.Lock()
	first := w.errs[0]
	w.mu.Unlock()
	if !strings.Contains(first.Error(), "heartbeat") {
		t.Errorf("Disconnected got %v, want a heartbeat error", first)
	}
	p = putPlan(t, s, proPlan())
	w.waitChange(t, plans.Change{Kind: plans.PlanChanged, ID: "pro", Version: p.Version})
}

// waitHeartbeat waits until the backend of the connection named name has
// run the heartbeat's SELECT 1, as pg_stat_activity says; each check is a
// round trip, so the loop needs no sleep.
func waitHeartbeat(t testing.TB, pool *pgxpool.Pool, name string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		var query string
		err := pool.QueryRow(context.Background(), "SELECT query FROM pg_stat_activity WHERE application_name = $1", name).Scan(&query)
		switch {
		case err != nil:
			t.Fatalf("read the listener's last query: %v", err)
		case query == "SELECT 1":
			return
		case time.Now().After(deadline):
			t.Fatalf("the listener ran no heartbeat within %v; its last query is %q", waitTimeout, query)
		}
	}
}
