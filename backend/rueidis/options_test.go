package rueidisbackend_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/redis/rueidis"

	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// A limiter whose decisions give up after 5ms, on a client that finds a
// stalled connection within a quarter of a second. The example needs a
// Redis server on 127.0.0.1:6379, so it is compiled but not run.
func ExampleLowLatency() {
	opt := rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}}
	rueidisbackend.LowLatency(&opt)
	client, err := rueidis.NewClient(opt)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	backend, err := rueidisbackend.New(client)
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

// TestLowLatency: LowLatency overwrites its fields, whatever the caller
// set, and leaves the others alone.
func TestLowLatency(t *testing.T) {
	t.Parallel()
	// fields are the settings LowLatency may touch, and some it must not.
	type fields struct {
		ConnWriteTimeout, KeepAlive, DialTimeout time.Duration
		SentinelDialTimeout, SentinelKeepAlive   time.Duration
		DisableRetry                             bool
		PipelineMultiplex                        int
		MasterSet                                string
	}
	get := func(o rueidis.ClientOption) fields {
		return fields{o.ConnWriteTimeout, o.Dialer.KeepAlive, o.Dialer.Timeout, o.Sentinel.Dialer.Timeout, o.Sentinel.Dialer.KeepAlive, o.DisableRetry, o.PipelineMultiplex, o.Sentinel.MasterSet}
	}
	const ms = time.Millisecond
	for _, tc := range []struct {
		name string
		opt  rueidis.ClientOption
		want fields
	}{
		{"zero", rueidis.ClientOption{}, fields{50 * ms, 100 * ms, 100 * ms, 100 * ms, 0, true, 0, ""}},
		{"set", rueidis.ClientOption{
			ConnWriteTimeout:  time.Minute,
			Dialer:            net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second},
			Sentinel:          rueidis.SentinelOption{Dialer: net.Dialer{Timeout: time.Second, KeepAlive: 5 * time.Second}, MasterSet: "m"},
			PipelineMultiplex: 3,
		}, fields{50 * ms, 100 * ms, 100 * ms, 100 * ms, 5 * time.Second, true, 3, "m"}},
	} {
		o := tc.opt
		rueidisbackend.LowLatency(&o)
		if got := get(o); got != tc.want {
			t.Errorf("LowLatency on %s options set\n%+v, want\n%+v", tc.name, got, tc.want)
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

// lowLatencyKinds are the clients the integration tests build. "Client"
// runs a lone call on its connection with a socket deadline; "Pipelined"
// always pipelines, with none.
var lowLatencyKinds = []string{"Client", "Pipelined", "Sentinel", "Cluster"}

// lowLatencyBackend returns a backend on a new LowLatency client of kind,
// and the servers that hold its buckets, to pause. The client is closed by
// t.Cleanup, before the servers are killed.
func lowLatencyBackend(t *testing.T, kind string) (*rueidisbackend.Backend, []*testkit.Redis) {
	t.Helper()
	opt := rueidis.ClientOption{DisableCache: true}
	var servers []*testkit.Redis
	switch kind {
	case "Client", "Pipelined":
		r := testkit.StartRedis(t, debugCommand...)
		opt.InitAddress, opt.ForceSingleClient, servers = []string{r.Addr()}, true, []*testkit.Redis{r}
		opt.AlwaysPipelining = kind == "Pipelined"
	case "Sentinel":
		r := testkit.StartRedis(t, debugCommand...)
		s := testkit.StartSentinel(t, r)
		opt.InitAddress, servers = []string{s.Addr()}, []*testkit.Redis{r}
		opt.Sentinel.MasterSet = testkit.SentinelMaster
	case "Cluster":
		cl := testkit.StartCluster(t, debugCommand...)
		opt.InitAddress, servers = cl.Addrs(), cl.Nodes()
		t.Cleanup(waitDelayedRefresh) // runs after the client's Close
	default:
		t.Fatalf("unknown client kind %q", kind)
	}
	rueidisbackend.LowLatency(&opt)
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	b, err := rueidisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b, servers
}

// waitDelayedRefresh waits, for up to 3s, until no goroutine of rueidis's
// delayed cluster refresh is left. A cluster client that lost a connection
// refreshes its slots after a random delay of up to a second, in a
// goroutine that outlives Close, which goleak would report.
func waitDelayedRefresh() {
	buf := make([]byte, 4<<20)
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("rueidis.(*call).DelayDo")) {
			return
		}
	}
}

// timed calls b.Do with take on key and reports how long it took.
func timed(ctx context.Context, b *rueidisbackend.Backend, key string) (ratelimit.Decision, time.Duration, error) {
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
// these tests: far above the 5ms deadline and the 250ms it takes at most to
// find a stalled pipelining connection, and below rueidis's defaults (up to
// 12s), so it still shows that no call waits seconds. It is a second longer
// than backend/redis's because rueidis v1.0.79 can hold a call for a
// second past its deadline when the call opens a connection to a stalled
// server: the handshake fails, and pipe.Close may wait for its one-second
// escape timer (about 1 in 100 decisions on a paused server, 1 in 20 under
// the race detector; see docs/operations.md).
const stallBound = 1500 * time.Millisecond

// TestLowLatencyDeadlineIntegration: on a paused server a decision with a
// 5ms deadline returns ErrTimeout at about the deadline, and once the
// server resumes the next decision succeeds, on a new connection if the
// old one was closed.
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
				t.Errorf("Do on a paused server returned after %v; want about the 5ms deadline, or a second more while connecting", elapsed)
			}
			if _, err := within(2*time.Second, func() (ratelimit.Decision, error) { return b.Do(ctx, "k", lowCfg, take) }); err != nil {
				t.Errorf("Do after the server resumed: %v", err)
			}
		})
	}
}

// TestLowLatencyBackstopIntegration: on a paused server a call whose
// context has no deadline returns ErrTimeout after about the 50ms
// ConnWriteTimeout on a connection serving it alone, and within 250ms on a
// pipelining one, when the PING finds the stall; not after rueidis's
// default of up to 12s.
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
				t.Errorf("Do on a paused server returned after %v; want at most 250ms, or a second more while connecting", elapsed)
			}
			if _, err := within(2*time.Second, func() (ratelimit.Decision, error) { return b.Do(ctx, "k", lowCfg, take) }); err != nil {
				t.Errorf("Do after the server resumed: %v", err)
			}
		})
	}
}

// TestLowLatencyNoRetryIntegration: a server that stalls for 100ms (DEBUG
// SLEEP) runs a decision sent meanwhile once it wakes. The call either gave
// up after the 50ms ConnWriteTimeout, or, on a pipelining connection, may
// have waited the stall out before a PING found it; either way it was sent
// once, so the bucket is charged once.
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
			if err != nil && !errors.Is(err, ratelimit.ErrTimeout) {
				t.Fatalf("Do on a stalled server: %v; want success or ErrTimeout", err)
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
