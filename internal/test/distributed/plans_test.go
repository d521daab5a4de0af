package distributed_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/plans/postgres"
	"github.com/sluicehq/sluice/ratelimit"
)

// The plan tests' plans: free is 10 a minute, pro 100.
var (
	free = plans.Plan{Name: "free", Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(10).WithID("minute")}}
	pro  = plans.Plan{Name: "pro", Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(100).WithID("minute")}}
)

// frozen is a clock that never moves, shared by processes that agree on
// its time: the counts of a plan change then owe nothing to refill.
type frozen struct{}

func (frozen) Now() time.Time { return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC) }

// env variables that make a test binary the other process of
// TestPlanChangeAcrossProcessesIntegration.
const (
	envPlanChild = "SLUICE_PLAN_CHILD"   // the Postgres URL
	envPlanRedis = "SLUICE_PLAN_REDIS"   // the redis-server's address
	envPlanKey   = "SLUICE_PLAN_SUBJECT" // the subject, also its bucket key
)

// planStore returns a migrated plan store over a new pool of db, holding
// free and pro.
func planStore(t *testing.T, db *servers.PGDatabase) (*postgres.Store, *pgxpool.Pool) {
	t.Helper()
	pool := db.Pool(t)
	s, err := postgres.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []plans.Plan{free, pro} {
		if _, err := s.PutPlan(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	return s, pool
}

// listen runs s.Listen for c until the test ends, with hooks.
func listen(t *testing.T, s *postgres.Store, c plans.Invalidator, hooks postgres.ListenHooks) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.Listen(ctx, c, postgres.WithListenHooks(hooks), postgres.WithBackoff(10*time.Millisecond, 200*time.Millisecond)); !errors.Is(err, context.Canceled) {
			t.Errorf("Listen: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// TestPlanChangeAcrossProcessesIntegration is a tier change end to end, on
// real Postgres and real Redis: a subject on free takes 4 of its 10; a
// second process, with a plan cache and listener of its own, has free
// cached; the admin call moves the subject to pro (one UPDATE). The test
// measures how long the other process takes to see pro, which must be
// within a second, and checks the balance it then finds: with Additive,
// the 6 left plus the 90 gained, 95 after its own call.
func TestPlanChangeAcrossProcessesIntegration(t *testing.T) {
	skipShort(t)
	db := servers.Postgres(t)
	store, _ := planStore(t, db)
	srv := servers.StartRedis(t)
	ctx := context.Background()
	const subject = "cust-42"
	if _, err := store.Assign(ctx, subject, "free"); err != nil {
		t.Fatal(err)
	}

	gr := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { gr.Close() })
	backend, err := redisbackend.New(gr, redisbackend.WithClock(frozen{}))
	if err != nil {
		t.Fatal(err)
	}
	// The first calls check the plan they get: they wait for its read,
	// however slowly a busy machine runs it.
	cache, err := plans.NewCache(store, plans.WithReadWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	bucket := cache.Bucket(ratelimit.New(backend, ratelimit.WithInheritance(ratelimit.Additive)), subject, subject)
	for range 4 {
		if d, err := bucket.TryConsume(ctx, 1); err != nil || !d.Allowed || d.Limit != 10 {
			t.Fatalf("TryConsume on free: %+v, %v", d, err)
		}
	}

	child := exec.Command(os.Args[0], "-test.run=^TestPlanChildProcess$", "-test.v")
	child.Env = append(os.Environ(), envPlanChild+"="+db.ConnString(), envPlanRedis+"="+srv.Addr(), envPlanKey+"="+subject)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	lines := bufio.NewScanner(out)
	next := func(prefix string) []string {
		t.Helper()
		for lines.Scan() {
			if f := strings.Fields(lines.Text()); len(f) > 0 && f[0] == prefix {
				return f[1:]
			}
		}
		t.Fatalf("the other process ended before it said %q: %v", prefix, lines.Err())
		return nil
	}
	next("ready")

	upgraded := time.Now()
	if _, err := store.Assign(ctx, subject, "pro"); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	seen := next("seen") // unix ns, limit, remaining
	at, _ := strconv.ParseInt(seen[0], 10, 64)
	lag := time.Unix(0, at).Sub(committed)
	t.Logf("the other process saw pro %v after the admin call committed (%v after it began); its call then: Limit %s, Remaining %s",
		lag.Round(10*time.Microsecond), time.Unix(0, at).Sub(upgraded).Round(10*time.Microsecond), seen[1], seen[2])
	if lag > time.Second {
		t.Errorf("the other process saw the change %v after it committed: want within 1s", lag)
	}
	if seen[1] != "100" || seen[2] != "95" {
		t.Errorf("the other process's call on pro: Limit %s, Remaining %s; want 100 and 95 (6 left on free + 90 gained - 1)", seen[1], seen[2])
	}
	if d, err := bucket.Inspect(ctx); err != nil || d.Limit != 100 || d.Remaining != 95 {
		t.Errorf("this process, after its cache sees pro too: Inspect = %+v, %v; want Limit 100, Remaining 95", d, err)
	}
}

// TestPlanChildProcess is the other process of
// TestPlanChangeAcrossProcessesIntegration; run alone it does nothing.
func TestPlanChildProcess(t *testing.T) {
	url := os.Getenv(envPlanChild)
	if url == "" {
		t.Skip("the other process of TestPlanChangeAcrossProcessesIntegration")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := postgres.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := plans.NewCache(store, plans.WithReadWait(time.Minute)) // as the parent's
	if err != nil {
		t.Fatal(err)
	}
	listening := make(chan struct{}, 1)
	listen(t, store, cache, postgres.ListenHooks{Connected: func() {
		select {
		case listening <- struct{}{}:
		default:
		}
	}})
	<-listening
	subject := os.Getenv(envPlanKey)
	before, err := cache.Config(ctx, subject)
	if err != nil || before.Bandwidths[0].Capacity != 10 {
		t.Fatalf("Config on free: %+v, %v", before, err)
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(envPlanRedis)}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	backend, err := rueidisbackend.New(rc, rueidisbackend.WithClock(frozen{}))
	if err != nil {
		t.Fatal(err)
	}
	limiter := ratelimit.New(backend, ratelimit.WithInheritance(ratelimit.Additive))
	fmt.Println("ready")
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		cfg, err := cache.Config(ctx, subject)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Version == before.Version {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		at := time.Now()
		d, err := limiter.Allow(ctx, subject, cfg)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("seen", at.UnixNano(), d.Limit, d.Remaining)
		return
	}
	t.Fatal("never saw the plan change")
}

// TestPlansOutageIntegration stops Postgres under two plan caches. One,
// with a TTL of 1ms, shows stale-if-error: its cached subject keeps its
// plan though its reads of the store now fail. The other, with a TTL of an
// hour and a listener, shows invalidation: during the outage its cached
// subject keeps its plan and a subject it never saw gets the default plan;
// after the restart a change made while its listener is still away (held
// in its Disconnected hook) is not seen until the listener reconnects, and
// then lands through the resync; later changes arrive by notification
// again.
func TestPlansOutageIntegration(t *testing.T) {
	skipShort(t)
	server := servers.StartPostgres(t)
	store, _ := planStore(t, server.NewDatabase(t))
	ctx := context.Background()
	for _, s := range []string{"a", "b"} {
		if _, err := store.Assign(ctx, s, "free"); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	var stale, failed []string
	// The lookups that wait for a read (the first of each subject) wait
	// for it to end, however slowly a busy machine runs it.
	short, err := plans.NewCache(store, plans.WithTTL(time.Millisecond), plans.WithReadWait(time.Minute), plans.WithHooks(plans.Hooks{
		StaleServed: func(subject string, err error) { mu.Lock(); stale = append(stale, subject); mu.Unlock() },
	}))
	if err != nil {
		t.Fatal(err)
	}
	live, err := plans.NewCache(store, plans.WithTTL(time.Hour), plans.WithReadWait(time.Minute), plans.WithHooks(plans.Hooks{
		LoadFailed: func(subject string, err error) { mu.Lock(); failed = append(failed, subject); mu.Unlock() },
	}))
	if err != nil {
		t.Fatal(err)
	}
	connected, disconnected := make(chan struct{}, 16), make(chan struct{}, 1)
	hold := make(chan struct{}) // closed to let the listener reconnect
	listen(t, store, live, postgres.ListenHooks{
		Connected: func() { connected <- struct{}{} },
		Disconnected: func(error, time.Duration) {
			select {
			case disconnected <- struct{}{}:
			default:
			}
			<-hold
		},
	})
	var release sync.Once
	let := func() { release.Do(func() { close(hold) }) }
	t.Cleanup(let) // before the listener's cleanup waits for it
	<-connected
	capacity := func(c *plans.Cache, subject string) int64 {
		t.Helper()
		cfg, err := c.Config(ctx, subject)
		if err != nil {
			t.Fatalf("Config(%q): %v", subject, err)
		}
		return cfg.Bandwidths[0].Capacity
	}
	for _, c := range []*plans.Cache{short, live} {
		for _, s := range []string{"a", "b"} {
			if got := capacity(c, s); got != 10 {
				t.Fatalf("%s before the outage: capacity %d, want free's 10", s, got)
			}
		}
	}

	server.Stop(t)
	<-disconnected
	time.Sleep(2 * time.Millisecond) // past the short TTL: its next lookup goes to the store
	if got := capacity(short, "a"); got != 10 {
		t.Errorf("a during the outage, TTL passed: capacity %d, want free's 10, served stale", got)
	}
	if got := capacity(live, "a"); got != 10 {
		t.Errorf("a during the outage, cached: capacity %d, want free's 10", got)
	}
	if got, want := capacity(live, "never-seen"), plans.DefaultPlan().Bandwidths[0].Capacity; got != want {
		t.Errorf("never-seen during the outage: capacity %d, want the default plan's %d", got, want)
	}
	// short's lookup, past the TTL, did not wait for its read: the read
	// fails in the background.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := min(len(stale), len(failed))
		mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
	}
	mu.Lock()
	t.Logf("during the outage: stale served for %v, the default plan for %v", stale, failed)
	if len(stale) == 0 || stale[0] != "a" || len(failed) == 0 || failed[0] != "never-seen" {
		t.Errorf("hooks: StaleServed %v, LoadFailed %v; want a and never-seen", stale, failed)
	}
	mu.Unlock()

	server.Start(t)
	if _, err := store.Assign(ctx, "a", "pro"); err != nil { // while the listener is held off
		t.Fatal(err)
	}
	if got := capacity(live, "a"); got != 10 {
		t.Fatalf("a, changed while the listener is away: capacity %d; want free's 10 until the listener resyncs", got)
	}
	let()
	<-connected
	waitCapacity := func(subject string, want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for capacity(live, subject) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: capacity still %d, want %d", subject, capacity(live, subject), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitCapacity("a", 100) // through the resync
	if _, err := store.Assign(ctx, "b", "pro"); err != nil {
		t.Fatal(err)
	}
	waitCapacity("b", 100) // through a notification
}
