package redisbackend_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// A limiter whose decisions give up after 5ms, on a client that honours
// the deadline and never retries. The example needs a Redis server on
// 127.0.0.1:6379, so it is compiled but not run.
func ExampleLowLatency() {
	opts := &redis.Options{Addr: "127.0.0.1:6379"}
	redisbackend.LowLatency(opts)
	client := redis.NewClient(opts)
	defer client.Close()

	backend, err := redisbackend.New(client)
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(backend)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(100)}}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	d, err := limiter.Allow(ctx, "user:12345", cfg)
	if errors.Is(err, ratelimit.ErrTimeout) {
		log.Print("no decision within 5ms: the fail policy decides")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Allowed)
}

// TestLowLatency: each helper overwrites its fields, whatever the caller
// set, and leaves the others alone.
func TestLowLatency(t *testing.T) {
	t.Parallel()
	// fields are the settings a helper may touch, and two it must not.
	type fields struct {
		ContextTimeoutEnabled                               bool
		MaxRetries, MaxRedirects, DialerRetries             int
		DialTimeout, ReadTimeout, WriteTimeout, PoolTimeout time.Duration
		PoolSize, MinIdleConns                              int
	}
	const ms = time.Millisecond
	for _, tc := range []struct {
		name string
		set  func() fields
		want fields
	}{
		{"LowLatency", func() fields {
			o := &redis.Options{MaxRetries: 5, DialerRetries: 3, DialTimeout: time.Second, ReadTimeout: time.Hour, WriteTimeout: -1, PoolTimeout: 2 * time.Second, PoolSize: 7, MinIdleConns: 3}
			redisbackend.LowLatency(o)
			return fields{o.ContextTimeoutEnabled, o.MaxRetries, 0, o.DialerRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.PoolSize, o.MinIdleConns}
		}, fields{true, -1, 0, 1, 100 * ms, 50 * ms, 50 * ms, 50 * ms, 7, 3}},
		{"LowLatencyCluster", func() fields {
			o := &redis.ClusterOptions{MaxRetries: 5, MaxRedirects: 8, ReadTimeout: time.Hour, PoolSize: 7, MinIdleConns: 3}
			redisbackend.LowLatencyCluster(o)
			return fields{o.ContextTimeoutEnabled, o.MaxRetries, o.MaxRedirects, o.DialerRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.PoolSize, o.MinIdleConns}
		}, fields{true, -1, -1, 1, 100 * ms, 50 * ms, 50 * ms, 50 * ms, 7, 3}},
		{"LowLatencyFailover", func() fields {
			o := &redis.FailoverOptions{MaxRetries: 5, ReadTimeout: time.Hour, ContextTimeoutEnabled: false, PoolSize: 7, MinIdleConns: 3}
			redisbackend.LowLatencyFailover(o)
			return fields{o.ContextTimeoutEnabled, o.MaxRetries, 0, o.DialerRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.PoolSize, o.MinIdleConns}
		}, fields{true, -1, 0, 1, 100 * ms, 50 * ms, 50 * ms, 50 * ms, 7, 3}},
	} {
		if got := tc.set(); got != tc.want {
			t.Errorf("%s set\n%+v, want\n%+v", tc.name, got, tc.want)
		}
	}
}

// lowCfg is a bucket of 10 that refills one token in 6 minutes: during a
// test, Remaining counts down the calls that took a token.
var lowCfg = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}

// take is one Consume of one token.
var take = ratelimit.Request{Tokens: 1}

// debugCommand lets clients on 127.0.0.1 send DEBUG, for DEBUG SLEEP.
var debugCommand = []string{"--enable-debug-command", "local"}

// lowLatencyKinds are the clients the integration tests build.
var lowLatencyKinds = []string{"Client", "Failover", "Cluster"}

// lowLatencyBackend returns a backend on a new client of kind, set up with
// the matching helper, and the servers that hold its buckets, to pause.
// The client is closed by t.Cleanup, before the servers are killed.
func lowLatencyBackend(t *testing.T, kind string) (*redisbackend.Backend, []*testkit.Redis) {
	t.Helper()
	var (
		c       redis.UniversalClient
		servers []*testkit.Redis
	)
	switch kind {
	case "Client":
		r := testkit.StartRedis(t, debugCommand...)
		o := &redis.Options{Addr: r.Addr()}
		redisbackend.LowLatency(o)
		c, servers = redis.NewClient(o), []*testkit.Redis{r}
	case "Failover":
		r := testkit.StartRedis(t, debugCommand...)
		s := testkit.StartSentinel(t, r)
		o := &redis.FailoverOptions{MasterName: testkit.SentinelMaster, SentinelAddrs: []string{s.Addr()}}
		redisbackend.LowLatencyFailover(o)
		c, servers = redis.NewFailoverClient(o), []*testkit.Redis{r}
	case "Cluster":
		cl := testkit.StartCluster(t, debugCommand...)
		o := &redis.ClusterOptions{Addrs: cl.Addrs()}
		redisbackend.LowLatencyCluster(o)
		c, servers = redis.NewClusterClient(o), cl.Nodes()
	default:
		t.Fatalf("unknown client kind %q", kind)
	}
	t.Cleanup(func() { c.Close() })
	b, err := redisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b, servers
}

// timed calls b.Do with take on key and reports how long it took.
func timed(ctx context.Context, b *redisbackend.Backend, key string) (ratelimit.Decision, time.Duration, error) {
	start := time.Now()
	d, err := b.Do(ctx, key, lowCfg, take)
	return d, time.Since(start), err
}

// within retries f until it succeeds or d has passed, and returns its
// last result.
func within(d time.Duration, f func() (ratelimit.Decision, error)) (ratelimit.Decision, error) {
	deadline := time.Now().Add(d)
	for {
		dec, err := f()
		if err == nil || time.Now().After(deadline) {
			return dec, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stallBound is how long a call on a stalled or dead server may take in
// these tests: far above the 5ms deadline and the 50ms timeouts, to allow
// for a loaded machine and the race detector, and far below go-redis's
// 5s defaults, so it still shows that no call waits seconds.
const stallBound = 500 * time.Millisecond

// TestLowLatencyDeadlineIntegration: on a paused server a decision with a
// 5ms deadline returns ErrTimeout at about the deadline, and once the
// server resumes the next decision succeeds.
func TestLowLatencyDeadlineIntegration(t *testing.T) {
	t.Parallel()
	for _, kind := range lowLatencyKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b, servers := lowLatencyBackend(t, kind)
			ctx := context.Background()
			if _, err := b.Do(ctx, "k", lowCfg, take); err != nil {
				t.Fatal(err)
			}
			pause(t, servers)
			dctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
			_, elapsed, err := timed(dctx, b, "k")
			cancel()
			resume(t, servers)
			t.Logf("a decision with a 5ms deadline on a paused server returned after %v: %v", elapsed, err)
			if !errors.Is(err, ratelimit.ErrTimeout) {
				t.Errorf("Do on a paused server: %v; want ErrTimeout", err)
			}
			if elapsed > stallBound {
				t.Errorf("Do on a paused server returned after %v; want about the 5ms deadline", elapsed)
			}
			if _, err := within(2*time.Second, func() (ratelimit.Decision, error) { return b.Do(ctx, "k", lowCfg, take) }); err != nil {
				t.Errorf("Do after the server resumed: %v", err)
			}
		})
	}
}

// TestLowLatencyBackstopIntegration: on a paused server a call whose
// context has no deadline returns ErrTimeout after about the 50ms read
// timeout, not go-redis's 5s.
func TestLowLatencyBackstopIntegration(t *testing.T) {
	t.Parallel()
	for _, kind := range lowLatencyKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b, servers := lowLatencyBackend(t, kind)
			ctx := context.Background()
			if _, err := b.Do(ctx, "k", lowCfg, take); err != nil {
				t.Fatal(err)
			}
			pause(t, servers)
			_, elapsed, err := timed(ctx, b, "k")
			resume(t, servers)
			t.Logf("a call without a deadline on a paused server returned after %v: %v", elapsed, err)
			if !errors.Is(err, ratelimit.ErrTimeout) {
				t.Errorf("Do on a paused server: %v; want ErrTimeout", err)
			}
			if elapsed > stallBound {
				t.Errorf("Do on a paused server returned after %v; want about the 50ms read timeout", elapsed)
			}
			if _, err := within(2*time.Second, func() (ratelimit.Decision, error) { return b.Do(ctx, "k", lowCfg, take) }); err != nil {
				t.Errorf("Do after the server resumed: %v", err)
			}
		})
	}
}

// TestLowLatencyNoRetryIntegration: a server that stalls for 100ms (DEBUG
// SLEEP) runs a decision sent meanwhile once it wakes; the call has given
// up after its 50ms read timeout and is not sent again, so the bucket is
// charged once. (A client that retries, standalone with MaxRetries 3 or
// cluster with MaxRedirects 3, gets its retry through once the server
// wakes: the call succeeds and is charged twice.)
func TestLowLatencyNoRetryIntegration(t *testing.T) {
	t.Parallel()
	for _, kind := range lowLatencyKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b, servers := lowLatencyBackend(t, kind)
			ctx := context.Background()
			if _, err := b.Do(ctx, "k", lowCfg, take); err != nil {
				t.Fatal(err)
			}
			wake := stall(t, servers, 100*time.Millisecond)
			_, elapsed, err := timed(ctx, b, "k")
			wake()
			t.Logf("a call without a deadline on a stalled server returned after %v: %v", elapsed, err)
			if !errors.Is(err, ratelimit.ErrTimeout) {
				t.Fatalf("Do on a stalled server: %v; want ErrTimeout", err)
			}
			d, err := within(2*time.Second, func() (ratelimit.Decision, error) { return b.Do(ctx, "k", lowCfg, take) })
			if err != nil {
				t.Fatalf("Do after the stall: %v", err)
			}
			// 10 tokens, less the first call, the last, and each run of the
			// timed-out one.
			runs := 10 - 2 - d.Remaining
			t.Logf("the timed-out call ran %d times", runs)
			if runs > 1 {
				t.Errorf("the timed-out call ran %d times; want at most once (Remaining %d after the last call)", runs, d.Remaining)
			}
		})
	}
}

// TestLowLatencyKilledIntegration: while the server is down a call fails at
// once, with or without a deadline, and once it is back on the same port
// the next call succeeds.
func TestLowLatencyKilledIntegration(t *testing.T) {
	t.Parallel()
	b, servers := lowLatencyBackend(t, "Client")
	r := servers[0]
	ctx := context.Background()
	if _, err := b.Do(ctx, "k", lowCfg, take); err != nil {
		t.Fatal(err)
	}
	r.Kill(t)
	// A few calls only: after PoolSize failed dials go-redis redials from
	// a goroutine that outlives Close by up to a second.
	for _, tc := range []struct {
		name    string
		timeout time.Duration // 0: no deadline
	}{{"no deadline", 0}, {"5ms deadline", 5 * time.Millisecond}, {"no deadline again", 0}} {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if tc.timeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, tc.timeout)
		}
		_, elapsed, err := timed(cctx, b, "k")
		cancel()
		t.Logf("%s: a call on a killed server returned after %v: %v", tc.name, elapsed, err)
		if !errors.Is(err, ratelimit.ErrBackendUnavailable) && !errors.Is(err, ratelimit.ErrTimeout) {
			t.Errorf("%s: Do on a killed server: %v; want ErrBackendUnavailable or ErrTimeout", tc.name, err)
		}
		if elapsed > stallBound {
			t.Errorf("%s: Do on a killed server returned after %v; want at once", tc.name, elapsed)
		}
	}
	r.Restart(t)
	if _, err := within(2*time.Second, func() (ratelimit.Decision, error) { return b.Do(ctx, "k", lowCfg, take) }); err != nil {
		t.Errorf("Do after the server restarted: %v", err)
	}
}

// stall makes each server sleep for d with DEBUG SLEEP, sent on a
// connection of its own, and returns once they all sleep; the function it
// returns waits until they have woken.
func stall(t *testing.T, servers []*testkit.Redis, d time.Duration) (wake func()) {
	t.Helper()
	var conns []net.Conn
	for _, r := range servers {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := fmt.Fprintf(c, "DEBUG SLEEP %g\r\n", d.Seconds()); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// An idle server takes the command within a millisecond.
	time.Sleep(20 * time.Millisecond)
	return func() {
		t.Helper()
		for _, c := range conns {
			if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			reply, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || reply != "+OK\r\n" {
				t.Fatalf("DEBUG SLEEP: %q, %v", reply, err)
			}
		}
	}
}

func pause(t *testing.T, servers []*testkit.Redis) {
	t.Helper()
	for _, r := range servers {
		r.Pause(t)
	}
}

func resume(t *testing.T, servers []*testkit.Redis) {
	t.Helper()
	for _, r := range servers {
		r.Resume(t)
	}
}
