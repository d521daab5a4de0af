//go:build linux

package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/plans"
)

// freeze stops every process of server's cluster with SIGSTOP (the
// postmaster first, so that it forks no more, then its children: the
// backends and the auxiliary processes) and returns once the kernel
// reports them all stopped. Its sockets stay open: a client connects, and
// sends, and never gets an answer, as from a hung database. The returned
// thaw continues them; t.Cleanup thaws them too, before the server's own
// cleanup, which would otherwise wait for a stopped postmaster, and leave
// its stopped children behind. freeze is only for a server of the test's
// own, from servers.StartPostgres.
func freeze(t testing.TB, server *servers.PGServer) (thaw func()) {
	t.Helper()
	postmaster := postmasterPID(t, server)
	signal(t, postmaster, syscall.SIGSTOP)
	pids := append(children(t, postmaster), postmaster)
	for _, pid := range pids[:len(pids)-1] {
		signal(t, pid, syscall.SIGSTOP)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			for _, pid := range slices.Backward(pids) {
				_ = syscall.Kill(pid, syscall.SIGCONT) // a process gone is not frozen
			}
		})
	}
	t.Cleanup(thaw)
	deadline := time.Now().Add(waitTimeout)
	for _, pid := range pids {
		for !stopped(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("postgres process %d not stopped %v after SIGSTOP", pid, waitTimeout)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return thaw
}

// postmasterPID returns the pid of server's postmaster, from the first
// line of postmaster.pid in the data directory the server itself names.
func postmasterPID(t testing.TB, server *servers.PGServer) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, server.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var dir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(line)
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	return pid
}

// procStat returns the state and parent pid of process pid, from
// /proc/<pid>/stat, whose command, in parentheses, may hold any character.
func procStat(pid int) (state byte, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err
}

// children returns the pids of parent's children.
func children(t testing.TB, parent int) []int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if _, ppid, err := procStat(pid); err == nil && ppid == parent {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopped reports whether process pid runs no more code: every thread of
// it is stopped by a signal, or it has exited (a backend that ended just
// before the freeze is a zombie that its stopped postmaster cannot reap).
func stopped(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(task, "stat"))
		if err != nil {
			continue // the thread has exited
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || !strings.ContainsRune("TtZX", rune(b[i+2])) {
			return false
		}
	}
	return true
}

func signal(t testing.TB, pid int, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("signal %v to postgres process %d: %v", sig, pid, err)
	}
}

// readsStore counts the reads in flight of the Store it wraps, so that a
// test can wait for the last to end (close). A read the cache started just
// before close may not have reached Lookup yet: once closed, Lookup
// refuses it without asking the store, so that no read reaches the
// database after close, and none is counted while close waits.
type readsStore struct {
	plans.Store
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // one per read in flight; Add only under mu, before closed
}

// errReadsClosed is what Lookup returns once the store is closed.
var errReadsClosed = errors.New("readsStore: closed")

func (s *readsStore) Lookup(ctx context.Context, subject string) (plans.Assignment, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return plans.Assignment{}, errReadsClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	return s.Store.Lookup(ctx, subject)
}

// close refuses reads from now on and waits for those in flight to end.
func (s *readsStore) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
}

// frozenFixture is a plan cache in front of a store on a cluster of the
// test's own, then frozen: "acme" and "newcomer" are on pro, acme cached
// by the cache and past its TTL, newcomer never looked up; pro's capacity
// was raised from 100 to 200 after acme was cached.
type frozenFixture struct {
	server *servers.PGServer
	store  *readsStore
	cache  *plans.Cache
	thaw   func()
}

// frozenTTL is the fixture's cache TTL: short, so that the cached subject
// is past it as soon as the cluster is frozen.
const frozenTTL = 10 * time.Millisecond

func newFrozenFixture(t testing.TB, opts ...plans.CacheOption) *frozenFixture {
	t.Helper()
	f := &frozenFixture{server: servers.StartPostgres(t)}
	s := migrated(t, f.server.NewDatabase(t).Pool(t))
	pro := putPlan(t, s, proPlan())
	assign(t, s, "acme", "pro")
	assign(t, s, "newcomer", "pro")
	f.store = &readsStore{Store: s}
	var err error
	f.cache, err = plans.NewCache(f.store, append([]plans.CacheOption{plans.WithTTL(frozenTTL)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	waitCapacity(t, f.cache, "acme", 100)
	pro.Bandwidths[0].Capacity = 200
	putPlan(t, s, pro)
	f.thaw = freeze(t, f.server)
	time.Sleep(frozenTTL)
	return f
}

// end thaws the cluster and waits for the cache's reads of it to end.
func (f *frozenFixture) end() {
	f.thaw()
	f.store.close()
}

// waitCapacity waits until c serves subject a plan of capacity want.
func waitCapacity(t testing.TB, c *plans.Cache, subject string, want int64) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		cfg, err := c.Config(context.Background(), subject)
		if err == nil && cfg.Bandwidths[0].Capacity == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %+v, %v after %v; want capacity %d", subject, cfg, err, waitTimeout, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFrozenStore freezes PostgreSQL under a plan cache and looks up a
// subject cached before the freeze and past its TTL, and one never seen:
// both lookups return while the cluster is still frozen, the first with
// its cached plan, the second with the default plan. The cache's reads
// have no end but the cluster's thaw (a load timeout of an hour), which
// only a watchdog brings, after waitTimeout: a lookup that waited for its
// read would return what the read found after the thaw, pro at 200, not
// what the cache holds. After the thaw, the reads land and the cache
// serves what they found.
func TestFrozenStore(t *testing.T) {
	f := newFrozenFixture(t, plans.WithLoadTimeout(time.Hour))
	defer f.end()
	watchdog := time.AfterFunc(waitTimeout, f.thaw)
	defer watchdog.Stop()

	ctx := context.Background()
	cfg, err := f.cache.Config(ctx, "acme")
	if err != nil || cfg.Bandwidths[0].Capacity != 100 {
		t.Errorf("Config(acme), cached and past its TTL, PostgreSQL frozen: %+v, %v; want the cached pro at 100, while frozen", cfg, err)
	}
	cfg, err = f.cache.Config(ctx, "newcomer")
	if def := plans.DefaultPlan(); err != nil || cfg.Bandwidths[0].Capacity != def.Bandwidths[0].Capacity {
		t.Errorf("Config(newcomer), never seen, PostgreSQL frozen: %+v, %v; want the default plan, while frozen", cfg, err)
	}
	if !watchdog.Stop() {
		t.Fatalf("the lookups returned only after the watchdog thawed PostgreSQL, %v after the freeze", waitTimeout)
	}

	f.thaw()
	waitCapacity(t, f.cache, "acme", 200)
	waitCapacity(t, f.cache, "newcomer", 200)
}

// BenchmarkFrozenConfig measures Cache.Config with PostgreSQL frozen, as
// an open loop: a lookup is due every millisecond, each in a goroutine of
// its own, for frozenWindowLength, and each is timed from its call to its
// return. The cache has its defaults, but for a TTL of 10ms, so that the
// cached subject is past it at once. "cached" looks up a subject cached
// before the freeze; "cold" a new subject each time. It reports the p50,
// p99 and largest lookup time of the window in ms:
//
//	go test -run '^$' -bench FrozenConfig -benchtime 1x ./plans/postgres/
func BenchmarkFrozenConfig(b *testing.B) {
	for _, bc := range []struct {
		name    string
		subject func(i int) string
	}{
		{"cached", func(int) string { return "acme" }},
		{"cold", func(i int) string { return fmt.Sprint("cold-", i) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			f := newFrozenFixture(b)
			defer f.end()
			var lookups []time.Duration
			for b.Loop() {
				lookups = append(lookups, frozenWindow(b, f.cache, bc.subject)...)
			}
			slices.Sort(lookups)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			p50, p99, most := lookups[len(lookups)/2], lookups[len(lookups)*99/100], lookups[len(lookups)-1]
			b.ReportMetric(ms(p50), "p50-ms")
			b.ReportMetric(ms(p99), "p99-ms")
			b.ReportMetric(ms(most), "max-ms")
			b.ReportMetric(0, "ns/op")
			b.Logf("%s, PostgreSQL frozen: %d lookups over %v, p50 %v, p99 %v, max %v", bc.name, len(lookups), frozenWindowLength, p50, p99, most)
		})
	}
}

// frozenWindowLength is how long BenchmarkFrozenConfig looks up: two load
// timeouts and retry backoffs of the cache's defaults, and more.
const frozenWindowLength = 2*(plans.DefaultLoadTimeout+plans.DefaultRetryBackoff) + 3*time.Second

// frozenWindow starts a lookup of subject(i) every millisecond for
// frozenWindowLength and returns how long each took.
func frozenWindow(b *testing.B, c *plans.Cache, subject func(i int) string) []time.Duration {
	n := int(frozenWindowLength / time.Millisecond)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Millisecond)))
		wg.Go(func() {
			called := time.Now()
			if _, err := c.Config(context.Background(), subject(i)); err != nil {
				b.Error(err)
			}
			took[i] = time.Since(called)
		})
	}
	wg.Wait()
	return took
}
