package testkit

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/ratelimit"
)

// goRedisBackend is a service's constructor: sluice's go-redis backend
// under a prefix of the service's own, on a client of its own without
// retries, a cluster client when there are several addresses.
func goRedisBackend(_ context.Context, addrs []string) (ratelimit.Backend, func(), error) {
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs, MaxRetries: -1, ContextTimeoutEnabled: true})
	b, err := redisbackend.New(c, redisbackend.WithPrefix("svc:"))
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return b, func() { c.Close() }, nil
}

// TestCheckInstances: sluice's go-redis backend passes the check on a
// standalone server with every default bucket, and on a cluster with one
// refilling token bucket under a key of the test's choosing; the check
// leaves no key behind. The instances' own output on stdout, as a test's
// prints, is no trouble, even when it does not end its line.
func TestCheckInstances(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) {
		t.Parallel()
		if os.Getenv(EnvInstance) != "" {
			fmt.Print("=== an instance's own output, without a newline: ")
		}
		var addr string
		CheckInstances(t, InstanceCheck{
			Redis: func(t testing.TB) []string {
				addr = StartRedis(t).Addr()
				return []string{addr}
			},
			Backend: goRedisBackend,
			Calls:   2000,
		})
		checkNoKeys(t, []string{addr})
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		var addrs []string
		CheckInstances(t, InstanceCheck{
			Redis: func(t testing.TB) []string {
				addrs = StartCluster(t).Addrs()
				return addrs
			},
			Backend: goRedisBackend,
			Config:  ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(10*time.Millisecond, 1).WithBurst(500)}},
			Key:     "customer:42",
			Calls:   2000,
		})
		checkNoKeys(t, addrs)
	})
}

// checkNoKeys fails t if the servers at addrs hold a key.
func checkNoKeys(t *testing.T, addrs []string) {
	t.Helper()
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs})
	defer c.Close()
	keys, err := harness.Keys(context.Background(), c, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Errorf("the check left %d keys, such as %q; want none", len(keys), keys[0])
	}
}

// pairs holds each caller of meet until another one arrives, and lets
// the two go on together; a caller left alone goes on after patience.
type pairs struct {
	mu       sync.Mutex
	waiting  chan struct{} // closed when the waiting caller's partner arrives
	patience time.Duration
}

func (p *pairs) meet() {
	p.mu.Lock()
	if w := p.waiting; w != nil {
		p.waiting = nil
		p.mu.Unlock()
		close(w)
		return
	}
	w := make(chan struct{})
	p.waiting = w
	p.mu.Unlock()
	select {
	case <-w:
	case <-time.After(p.patience):
		p.mu.Lock()
		if p.waiting == w {
			p.waiting = nil
		}
		p.mu.Unlock()
	}
}

// racyBackend is the harness's racy store, which reads the bucket, decides
// in Go and writes it back, with each call held between its read and its
// write until another call of the process has read too. Every two calls
// overlap, so the later write loses the earlier's charge: with tokens
// left, two calls are admitted for each token taken.
func racyBackend(_ context.Context, addrs []string) (ratelimit.Backend, func(), error) {
	c := redis.NewClient(&redis.Options{Addr: addrs[0], MaxRetries: -1})
	p := &pairs{patience: 100 * time.Millisecond}
	return harness.Racy{Client: c, Prefix: "svc:", Between: p.meet}, func() { c.Close() }, nil
}

// recorder records the failures of a check instead of failing the test.
// Its Fatal and Fatalf end the goroutine, as a test's do.
type recorder struct {
	testing.TB

	mu             sync.Mutex
	errors, fatals []string
	logs           []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) { r.add(&r.errors, fmt.Sprintf(format, args...)) }
func (r *recorder) Error(args ...any)                 { r.add(&r.errors, fmt.Sprint(args...)) }
func (r *recorder) Logf(format string, args ...any)   { r.add(&r.logs, fmt.Sprintf(format, args...)) }

func (r *recorder) Fatalf(format string, args ...any) {
	r.add(&r.fatals, fmt.Sprintf(format, args...))
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) {
	r.add(&r.fatals, fmt.Sprint(args...))
	runtime.Goexit()
}

func (r *recorder) add(to *[]string, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*to = append(*to, msg)
}

// record runs f on a recorder of t, in a goroutine of its own, and returns
// the recorder once f returns or ends its goroutine.
func record(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

// TestCheckInstancesCatchesRacy: a store that reads, decides and writes
// back, whose calls overlap in pairs by construction, fails the check:
// admitted + remaining over the bound, in the report sluice-verify
// prints. Each of the two processes admits about two calls for each of
// the 100 tokens.
func TestCheckInstancesCatchesRacy(t *testing.T) {
	r := record(t, func(tb testing.TB) {
		CheckInstances(tb, InstanceCheck{
			Redis:      func(t testing.TB) []string { return []string{StartRedis(t).Addr()} },
			Backend:    racyBackend,
			Config:     ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{harness.NoRefill(100)}},
			Goroutines: 8,
			Calls:      1000,
		})
	})
	if len(r.fatals) > 0 {
		t.Fatalf("the check could not run: %s", r.fatals[0])
	}
	if len(r.errors) != 1 {
		t.Fatalf("the check failed the test %d times (%q); want once, with the report. It logged:\n%s", len(r.errors), r.errors, strings.Join(r.logs, "\n"))
	}
	report := r.errors[0]
	t.Logf("the check's failure:\n%s", report)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^testkit\.CheckInstances: standalone 127\.0\.0\.1:\d+, prefix "sluice-testkit:\w+"$`),
		regexp.MustCompile(`(?m)^2 processes × 8 goroutines, 1000 calls on each bucket of capacity 100$`),
		regexp.MustCompile(`(?m)^adapter +bucket +admitted +remaining +bound +calls .* result$`),
		regexp.MustCompile(`(?m)^harness\.Racy +TokenBucket +\d+ +\d+ +100 +1000 .* BROKEN$`),
		regexp.MustCompile(`(?m)^harness\.Racy TokenBucket: BROKEN: admitted \d+.* over the bound`),
		regexp.MustCompile(`(?m)^NOT VERIFIED: harness\.Racy TokenBucket: BROKEN\.$`),
	} {
		if !want.MatchString(report) {
			t.Errorf("the report does not match %s", want)
		}
	}
}

// TestCheckInstancesRejects: a check it cannot make fails the test at
// once, naming the field, before it starts anything.
func TestCheckInstancesRejects(t *testing.T) {
	noRedis := func(t testing.TB) []string {
		t.Fatal("Redis called")
		return nil
	}
	tests := []struct {
		name string
		c    InstanceCheck
		want string
	}{
		{"NoRedis", InstanceCheck{Backend: goRedisBackend}, "InstanceCheck.Redis is nil"},
		{"NoBackend", InstanceCheck{Redis: noRedis}, "InstanceCheck.Backend is nil"},
		{"KeyTag", InstanceCheck{Redis: noRedis, Backend: goRedisBackend, Key: "a{b}"}, `InstanceCheck.Key "a{b}"`},
		{"Negative", InstanceCheck{Redis: noRedis, Backend: goRedisBackend, Goroutines: -1}, "Goroutines -1"},
		{"FewCalls", InstanceCheck{Redis: noRedis, Backend: goRedisBackend, Processes: 3, Calls: 2}, "Calls 2: want at least one for each of the 3 processes"},
		{"Config", InstanceCheck{Redis: noRedis, Backend: goRedisBackend, Config: ratelimit.Config{Algorithm: ratelimit.GCRA}}, "InstanceCheck.Config: ratelimit: invalid config"},
		{"Bandwidths", InstanceCheck{Redis: noRedis, Backend: goRedisBackend, Config: ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(5), ratelimit.PerSecond(1)}}}, "has 2 bandwidths"},
		{"NoAddrs", InstanceCheck{Redis: func(testing.TB) []string { return nil }, Backend: goRedisBackend}, "returned no address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := record(t, func(tb testing.TB) { CheckInstances(tb, tt.c) })
			if len(r.fatals) != 1 || !strings.Contains(r.fatals[0], tt.want) {
				t.Errorf("fatals %q; want one with %q", r.fatals, tt.want)
			}
		})
	}
}

// TestInstanceArgs: the instances run the test alone, once, by a pattern
// that matches each element of its name exactly.
func TestInstanceArgs(t *testing.T) {
	for _, tt := range []struct{ name, want string }{
		{"TestX", "-test.run=^TestX$"},
		{"TestX/sub_test", "-test.run=^TestX$/^sub_test$"},
		{"TestX/a.b(c)#01/[d]", `-test.run=^TestX$/^a\.b\(c\)#01$/^\[d\]$`},
	} {
		args := instanceArgs(tt.name)
		if len(args) < 2 || args[0] != tt.want || args[1] != "-test.count=1" {
			t.Errorf("instanceArgs(%q) = %q; want %q, -test.count=1", tt.name, args, tt.want)
		}
	}
}

// TestNextCheck: a test's checks are counted from 0, apart from another
// test's, and forgotten once the test ends, so that its next run (-count)
// counts from 0 again.
func TestNextCheck(t *testing.T) {
	var ids []string
	t.Run("A", func(t *testing.T) { ids = append(ids, nextCheck(t), nextCheck(t)) })
	t.Run("B", func(t *testing.T) { ids = append(ids, nextCheck(t)) })
	want := []string{"TestNextCheck/A#0", "TestNextCheck/A#1", "TestNextCheck/B#0"}
	if strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Errorf("ids %q; want %q", ids, want)
	}
	checks.mu.Lock()
	n, kept := checks.n["TestNextCheck/A"]
	checks.mu.Unlock()
	if kept {
		t.Errorf("TestNextCheck/A's count (%d) kept after it ended; want it forgotten", n)
	}
}
