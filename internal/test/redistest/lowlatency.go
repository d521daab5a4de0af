package redistest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// Topology is what a client kind connects to.
type Topology uint8

const (
	// Standalone is one server; [Servers].Addrs is its address.
	Standalone Topology = iota
	// Sentinel is one server and a Sentinel that monitors it as
	// [servers.SentinelMaster]; [Servers].Addrs is the Sentinel's address.
	Sentinel
	// Cluster is a 3-master cluster from [servers.StartCluster];
	// [Servers].Addrs are its nodes' addresses.
	Cluster
)

// LowLatencyKind is one client kind that [LowLatency] tests.
type LowLatencyKind struct {
	// Name names the kind's subtests, such as "Client" or "Cluster".
	Name string
	// Topology is what the kind's client connects to.
	Topology Topology
}

// Servers are what [LowLatency] starts for a client kind to connect to.
type Servers struct {
	// Addrs are the addresses to give the client; see [Topology]. They
	// may be those of proxies in front of the servers.
	Addrs []string

	nodes   []*servers.Redis // hold the buckets: to pause and kill
	proxies []*servers.Proxy // in front of nodes, to stall; or none
}

// LowLatencyAdapter is what [LowLatency] needs to know about one client
// library and its LowLatency helpers.
type LowLatencyAdapter struct {
	// Kinds are the clients the tests build; the first of Topology
	// Standalone is the one the Killed group kills the server of.
	Kinds []LowLatencyKind
	// Backend returns a backend on a new client of kind, set up with the
	// library's LowLatency helper, connected to s. The client must be
	// closed by t.Cleanup, so before the servers are killed.
	Backend func(t *testing.T, kind string, s Servers) ratelimit.Backend
	// StallBound is how long a call on a stalled or dead server may take.
	StallBound time.Duration
	// WantDeadline says, for failure messages, how soon a decision with a
	// 5ms deadline on a paused server should return within StallBound,
	// such as "about the 5ms deadline".
	WantDeadline string
	// WantBackstop says, for failure messages, how soon a call without a
	// deadline on a paused or stalled server should return within
	// StallBound, such as "about the 50ms read timeout".
	WantBackstop string
}

// LowLatency tests a client set up with a library's LowLatency helpers on
// servers that stall and die: calls return within a.StallBound, with or
// without a deadline, are never sent twice, end with the caller's error
// when the caller cancels, and succeed again once the server is back. It
// runs five groups as parallel subtests: Deadline, Backstop, NoRetry and
// Cancelled for each of a.Kinds, and Killed for the first standalone
// kind.
func LowLatency(t *testing.T, a LowLatencyAdapter) {
	i := slices.IndexFunc(a.Kinds, func(k LowLatencyKind) bool { return k.Topology == Standalone })
	if a.Backend == nil || i < 0 || a.StallBound <= 0 || a.WantDeadline == "" || a.WantBackstop == "" {
		t.Fatal("redistest: LowLatencyAdapter.Backend, StallBound, WantDeadline or WantBackstop is unset, or no kind is Standalone")
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
	t.Run("Cancelled", func(t *testing.T) {
		t.Parallel()
		testCancelled(t, a)
	})
	t.Run("Killed", func(t *testing.T) {
		t.Parallel()
		testKilled(t, a, a.Kinds[i])
	})
}

// startServers starts the servers of top, with proxies in front of those
// that hold buckets if proxied.
func startServers(t *testing.T, top Topology, proxied bool) Servers {
	t.Helper()
	var s Servers
	if top == Cluster && !proxied {
		c := servers.StartCluster(t)
		s.nodes, s.Addrs = c.Nodes(), c.Addrs()
		return s
	}
	if top == Cluster {
		c, proxies := servers.StartProxiedCluster(t)
		s.nodes, s.proxies = c.Nodes(), proxies
		for _, p := range proxies {
			s.Addrs = append(s.Addrs, p.Addr())
		}
		return s
	}
	r := servers.StartRedis(t)
	addr := r.Addr()
	s.nodes = []*servers.Redis{r}
	if proxied {
		p := servers.StartProxy(t, addr)
		addr, s.proxies = p.Addr(), []*servers.Proxy{p}
	}
	if top == Sentinel {
		addr = servers.StartSentinel(t, addr).Addr()
	}
	s.Addrs = []string{addr}
	return s
}

// lowCfg is a bucket of 10 that refills one token in 6 minutes, more
// than the few calls of a test take.
var lowCfg = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}

// takeOne is one Consume of one token.
var takeOne = ratelimit.Request{Tokens: 1}

// testPaused: on a paused server a call with the given timeout (0: none),
// described by call, returns within a.StallBound, as want says: with a
// timeout, the caller's, an error wrapping context.DeadlineExceeded and
// not ErrTimeout (the caller's deadline is not the store's failure);
// without one, the client's own timeout, ErrTimeout.
// Once the server resumes, it runs the call, which queued up, and the
// next call succeeds, on a new connection if the old one was closed. The
// server is paused before the call is sent, and stays paused until the
// call has returned, so the call cannot race the server.
func testPaused(t *testing.T, a LowLatencyAdapter, timeout time.Duration, call, want string) {
	for _, kind := range a.Kinds {
		t.Run(kind.Name, func(t *testing.T) {
			t.Parallel()
			b, s := connected(t, a, kind, false)
			pause(t, s.nodes)
			ctx, cancel := withTimeout(context.Background(), timeout)
			_, elapsed, err := timed(ctx, b, "k")
			cancel()
			resume(t, s.nodes)
			t.Logf("%s on a paused server returned after %v: %v", call, elapsed, err)
			switch {
			case timeout > 0 && (!errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ratelimit.ErrTimeout)):
				t.Errorf("Do on a paused server: %v; want the caller's context.DeadlineExceeded, not ErrTimeout", err)
			case timeout == 0 && !errors.Is(err, ratelimit.ErrTimeout):
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

// testCancelled: a call whose caller cancels its context (one without a
// deadline) while the script's reply is held back returns an error
// wrapping context.Canceled and neither store sentinel, within
// a.StallBound. The cancel comes once the proxy has seen the script, so
// the call is in flight, whoever is faster.
func testCancelled(t *testing.T, a LowLatencyAdapter) {
	for _, kind := range a.Kinds {
		t.Run(kind.Name, func(t *testing.T) {
			t.Parallel()
			b, s := connected(t, a, kind, true)
			s.stallScripts()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type outcome struct {
				err     error
				elapsed time.Duration
			}
			done := make(chan outcome, 1)
			go func() {
				_, elapsed, err := timed(ctx, b, "k")
				done <- outcome{err, elapsed}
			}()
			for deadline := time.Now().Add(10 * time.Second); s.scriptsSent() == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the call's script did not reach the proxy within 10s")
				}
			}
			cancelled := time.Now()
			cancel()
			o := <-done
			s.releaseScripts()
			t.Logf("a call cancelled while its script's reply was held back returned %v after the cancel: %v", time.Since(cancelled), o.err)
			if !errors.Is(o.err, context.Canceled) || errors.Is(o.err, ratelimit.ErrTimeout) || errors.Is(o.err, ratelimit.ErrBackendUnavailable) {
				t.Errorf("Do cancelled in flight: %v; want context.Canceled, and no store sentinel", o.err)
			}
			if o.elapsed > a.StallBound {
				t.Errorf("Do cancelled in flight returned after %v; want within %v", o.elapsed, a.StallBound)
			}
			if _, err := retake(context.Background(), b); err != nil {
				t.Errorf("Do after the stall: %v", err)
			}
		})
	}
}

// stallScripts makes every proxy of s hold back the replies to scripts
// from the next one sent on; see [servers.Proxy.StallAfter].
func (s Servers) stallScripts() {
	for _, p := range s.proxies {
		p.StallAfter("EVAL", "FCALL")
	}
}

// scriptsSent is how many scripts the proxies of s have passed on since
// stallScripts.
func (s Servers) scriptsSent() int {
	n := 0
	for _, p := range s.proxies {
		n += p.Marked()
	}
	return n
}

// releaseScripts sends the replies the proxies of s hold back, and lets
// the next ones through.
func (s Servers) releaseScripts() {
	for _, p := range s.proxies {
		p.Release()
	}
}

// testNoRetry: when scripts stall (a proxy passes the call to the server,
// which runs it, but holds its reply back), a call without a deadline
// gives up with ErrTimeout within a.StallBound, and is sent once: the
// proxies count the scripts that went through them. A connection made
// during the stall gets through its handshake and stalls only at its
// first script, so a client that retried, on the old connection or a new
// one, would send it again: no timing decides the outcome. Once the stall
// is over, the next call succeeds.
func testNoRetry(t *testing.T, a LowLatencyAdapter) {
	for _, kind := range a.Kinds {
		t.Run(kind.Name, func(t *testing.T) {
			t.Parallel()
			b, s := connected(t, a, kind, true)
			s.stallScripts()
			_, elapsed, err := timed(context.Background(), b, "k")
			sent := s.scriptsSent()
			s.releaseScripts()
			t.Logf("a call without a deadline, its script's reply held back, returned after %v: %v; sent %d times", elapsed, err, sent)
			if !errors.Is(err, ratelimit.ErrTimeout) {
				t.Errorf("Do with its script's reply held back: %v; want ErrTimeout", err)
			}
			if elapsed > a.StallBound {
				t.Errorf("Do with its script's reply held back returned after %v; want %s", elapsed, a.WantBackstop)
			}
			if sent != 1 {
				t.Errorf("the call's script was sent %d times; want once", sent)
			}
			if _, err := retake(context.Background(), b); err != nil {
				t.Errorf("Do after the stall: %v", err)
			}
		})
	}
}

// testKilled: while the server is down a call fails at once, with or
// without a deadline (with the store's error, or with the caller's once
// its deadline has passed), and once it is back on the same port the next
// call succeeds.
func testKilled(t *testing.T, a LowLatencyAdapter, kind LowLatencyKind) {
	b, s := connected(t, a, kind, false)
	r := s.nodes[0]
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
		// On a busy machine the caller's deadline can pass before the
		// refused dial comes back, or before the call even starts: the
		// call then ends with the caller's error, which is right, as its
		// deadline was the caller's (ctxerr.Ended, checked after the fact:
		// only later, never earlier, than the backend checked it).
		deadline, ok := cctx.Deadline()
		late := ok && errors.Is(err, context.DeadlineExceeded) && time.Until(deadline) <= ctxerr.Slack
		cancel()
		t.Logf("%s: a call on a killed server returned after %v: %v", tc.name, elapsed, err)
		if !late && !errors.Is(err, ratelimit.ErrBackendUnavailable) && !errors.Is(err, ratelimit.ErrTimeout) {
			t.Errorf("%s: Do on a killed server: %v; want ErrBackendUnavailable or ErrTimeout, or the caller's error once its deadline passed", tc.name, err)
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

// connected returns a backend of kind on new servers (through proxies if
// proxied) once a call on it has succeeded. It retries, as retake does: a
// new client dials, and on a loaded machine a dial can miss the
// LowLatency helpers' 100ms, which is not what the tests are about.
func connected(t *testing.T, a LowLatencyAdapter, kind LowLatencyKind, proxied bool) (ratelimit.Backend, Servers) {
	t.Helper()
	s := startServers(t, kind.Topology, proxied)
	b := a.Backend(t, kind.Name, s)
	if _, err := retake(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return b, s
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

// retake takes a token at "k", retrying for up to 10s until a call
// succeeds, and returns the last result. The server answers by then, but
// the client may first have to notice that a connection broke, and make
// another.
func retake(ctx context.Context, b ratelimit.Backend) (ratelimit.Decision, error) {
	return within(10*time.Second, func() (ratelimit.Decision, error) { return b.Do(ctx, "k", lowCfg, takeOne) })
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

// pause stops each server with SIGSTOP, and returns once each is stopped.
func pause(t *testing.T, servers []*servers.Redis) {
	t.Helper()
	for _, r := range servers {
		r.Pause(t)
	}
}

// resume continues each server paused by pause, and returns once each
// answers.
func resume(t *testing.T, servers []*servers.Redis) {
	t.Helper()
	for _, r := range servers {
		r.Resume(t)
	}
}
