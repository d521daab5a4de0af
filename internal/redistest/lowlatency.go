package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// DebugCommand are the server arguments that let clients on 127.0.0.1
// send DEBUG, for DEBUG SLEEP: [LowLatencyAdapter.Backend] starts its
// servers with them.
var DebugCommand = []string{"--enable-debug-command", "local"}

// LowLatencyAdapter is what [LowLatency] needs to know about one client
// library and its LowLatency helpers.
type LowLatencyAdapter struct {
	// Kinds are the clients the tests build, such as "Client" or
	// "Cluster"; each names a subtest.
	Kinds []string
	// Standalone is the kind, one of Kinds, whose client talks to one
	// server, which the Killed group kills and restarts.
	Standalone string
	// Backend returns a backend on a new client of kind, set up with the
	// library's LowLatency helper, and the servers that hold its buckets,
	// started with [DebugCommand], to pause, stall and kill. The client
	// must be closed by t.Cleanup, so before the servers are killed.
	Backend func(t *testing.T, kind string) (ratelimit.Backend, []*testkit.Redis)
	// StallBound is how long a call on a stalled or dead server may take.
	StallBound time.Duration
	// WantDeadline says, for failure messages, how soon a decision with a
	// 5ms deadline on a paused server should return within StallBound,
	// such as "about the 5ms deadline".
	WantDeadline string
	// WantBackstop says, for failure messages, how soon a call without a
	// deadline on a paused server should return within StallBound, such
	// as "about the 50ms read timeout".
	WantBackstop string
	// StalledMaySucceed is whether a call without a deadline on a server
	// stalled for 100ms may succeed once the server wakes, rather than
	// return ErrTimeout. Either way it must have been sent once.
	StalledMaySucceed bool
}

// LowLatency tests a client set up with a library's LowLatency helpers on
// servers that stall and die: calls return within a.StallBound, with or
// without a deadline, are never sent twice, and succeed again once the
// server is back. It runs four groups as parallel subtests: Deadline,
// Backstop and NoRetry for each of a.Kinds, and Killed for a.Standalone.
func LowLatency(t *testing.T, a LowLatencyAdapter) {
	if a.Backend == nil || len(a.Kinds) == 0 || a.Standalone == "" || a.StallBound <= 0 || a.WantDeadline == "" || a.WantBackstop == "" {
		t.Fatal("redistest: LowLatencyAdapter.Backend, Kinds, Standalone, StallBound, WantDeadline or WantBackstop is unset")
	}
	t.Run("Deadline", func(t *testing.T) {
		t.Parallel()
		testPaused(t, a, 5*time.Millisecond, "a decision with a 5ms deadline", a.WantDeadline)
	})
	t.Run("Backstop", func(t *testing.T) {
		t.Parallel()
		testPaused(t, a, 0, "a call without a deadline", a.WantBackstop)
	})
	t.Run("NoRetry", func(t *testing.T) {
		t.Parallel()
		testNoRetry(t, a)
	})
	t.Run("Killed", func(t *testing.T) {
		t.Parallel()
		testKilled(t, a)
	})
}

// lowCfg is a bucket of 10 that refills one token in 6 minutes: during a
// test, Remaining counts down the calls that took a token.
var lowCfg = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}

// takeOne is one Consume of one token.
var takeOne = ratelimit.Request{Tokens: 1}

// testPaused: on a paused server a call with the given timeout (0: none),
// described by call, returns ErrTimeout within a.StallBound, as want says,
// and once the server resumes the next call succeeds, on a new connection
// if the old one was closed.
func testPaused(t *testing.T, a LowLatencyAdapter, timeout time.Duration, call, want string) {
	for _, kind := range a.Kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b, servers := connected(t, a, kind)
			pause(t, servers)
			ctx, cancel := withTimeout(context.Background(), timeout)
			_, elapsed, err := timed(ctx, b, "k")
			cancel()
			resume(t, servers)
			t.Logf("%s on a paused server returned after %v: %v", call, elapsed, err)
			if !errors.Is(err, ratelimit.ErrTimeout) {
				t.Errorf("Do on a paused server: %v; want ErrTimeout", err)
			}
			if elapsed > a.StallBound {
				t.Errorf("Do on a paused server returned after %v; want %s", elapsed, want)
			}
			if _, err := retake(context.Background(), b); err != nil {
				t.Errorf("Do after the server resumed: %v", err)
			}
		})
	}
}

// testNoRetry: a server that stalls for 100ms (DEBUG SLEEP) runs a
// decision sent meanwhile once it wakes. The call gives up after the
// client's timeout (or, if a.StalledMaySucceed, may wait the stall out)
// and is not sent again, so the bucket is charged once.
func testNoRetry(t *testing.T, a LowLatencyAdapter) {
	for _, kind := range a.Kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b, servers := connected(t, a, kind)
			ctx := context.Background()
			wake := stall(t, servers, 100*time.Millisecond)
			_, elapsed, err := timed(ctx, b, "k")
			wake()
			t.Logf("a call without a deadline on a stalled server returned after %v: %v", elapsed, err)
			if a.StalledMaySucceed {
				if err != nil && !errors.Is(err, ratelimit.ErrTimeout) {
					t.Fatalf("Do on a stalled server: %v; want success or ErrTimeout", err)
				}
			} else if !errors.Is(err, ratelimit.ErrTimeout) {
				t.Fatalf("Do on a stalled server: %v; want ErrTimeout", err)
			}
			d, err := retake(ctx, b)
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

// testKilled: while the server is down a call fails at once, with or
// without a deadline, and once it is back on the same port the next call
// succeeds.
func testKilled(t *testing.T, a LowLatencyAdapter) {
	b, servers := connected(t, a, a.Standalone)
	r := servers[0]
	ctx := context.Background()
	r.Kill(t)
	// A few calls only: after PoolSize failed dials go-redis redials from
	// a goroutine that outlives Close by up to a second.
	for _, tc := range []struct {
		name    string
		timeout time.Duration // 0: no deadline
	}{{"no deadline", 0}, {"5ms deadline", 5 * time.Millisecond}, {"no deadline again", 0}} {
		cctx, cancel := withTimeout(ctx, tc.timeout)
		_, elapsed, err := timed(cctx, b, "k")
		cancel()
		t.Logf("%s: a call on a killed server returned after %v: %v", tc.name, elapsed, err)
		if !errors.Is(err, ratelimit.ErrBackendUnavailable) && !errors.Is(err, ratelimit.ErrTimeout) {
			t.Errorf("%s: Do on a killed server: %v; want ErrBackendUnavailable or ErrTimeout", tc.name, err)
		}
		if elapsed > a.StallBound {
			t.Errorf("%s: Do on a killed server returned after %v; want at once", tc.name, elapsed)
		}
	}
	r.Restart(t)
	if _, err := retake(ctx, b); err != nil {
		t.Errorf("Do after the server restarted: %v", err)
	}
}

// connected returns a.Backend(t, kind) once a first call on it has taken a
// token at "k".
func connected(t *testing.T, a LowLatencyAdapter, kind string) (ratelimit.Backend, []*testkit.Redis) {
	t.Helper()
	b, servers := a.Backend(t, kind)
	if _, err := b.Do(context.Background(), "k", lowCfg, takeOne); err != nil {
		t.Fatal(err)
	}
	return b, servers
}

// withTimeout is [context.WithTimeout], or ctx itself when timeout is 0.
func withTimeout(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout == 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, timeout)
}

// timed calls b.Do with takeOne on key and reports how long it took.
func timed(ctx context.Context, b ratelimit.Backend, key string) (ratelimit.Decision, time.Duration, error) {
	start := time.Now()
	d, err := b.Do(ctx, key, lowCfg, takeOne)
	return d, time.Since(start), err
}

// retake takes a token at "k", retrying for up to 2s until a call
// succeeds, and returns the last result.
func retake(ctx context.Context, b ratelimit.Backend) (ratelimit.Decision, error) {
	return within(2*time.Second, func() (ratelimit.Decision, error) { return b.Do(ctx, "k", lowCfg, takeOne) })
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

// pause stops each server with SIGSTOP.
func pause(t *testing.T, servers []*testkit.Redis) {
	t.Helper()
	for _, r := range servers {
		r.Pause(t)
	}
}

// resume continues each server paused by pause.
func resume(t *testing.T, servers []*testkit.Redis) {
	t.Helper()
	for _, r := range servers {
		r.Resume(t)
	}
}
