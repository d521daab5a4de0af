// Package servers starts throwaway redis-server and PostgreSQL processes
// for the tests of sluice's Redis backends and Postgres plan store, so
// those tests are hermetic and may run in parallel, each against servers
// (or databases) of its own. It runs local binaries only, never containers.
//
// [StartRedis] starts a standalone server and [StartCluster] a Redis Cluster
// of three masters. Every server listens on a free 127.0.0.1 port, keeps its
// files in t.TempDir(), persists nothing and is killed by t.Cleanup. A
// [Redis] can also be paused, killed and restarted to inject faults; Pause
// and Resume return only once the fault is in place or over, so a test
// never races them. A [Proxy] in front of a server (or, from
// [StartProxiedCluster], of each cluster node) stalls the replies to
// chosen requests. [StandaloneAddr] lets a test run against an existing
// server instead.
//
// [StartInstances] runs the other side of a distributed test: separate
// processes of the instance program ([BuildInstance]), each calling one
// backend from many goroutines on one bucket, reporting every call's start,
// end and decision, and holding between phases of the run
// ([harness.Spec].Holds) so that a fault strikes at a point the calls
// cannot run past. The run itself is [harness.Start]'s, which the
// sluice-verify command shares; StartInstances fails the test where the
// harness returns an error.
//
// [Postgres] gives a test a database of its own, on an existing server
// when one answers, else on a throwaway cluster; [StartPostgres] always
// starts a cluster, which a test can stop and start again to cut off its
// clients.
//
// # Requirements
//
// redis-server 7.0 or later (for --cluster-port and CLUSTER ADDSLOTSRANGE)
// must be on PATH; [RequireRedisServer] says what happens when it is not.
// PostgreSQL's initdb and postgres (13 or later, for DROP DATABASE ...
// WITH (FORCE)) must be on PATH or in Debian's /usr/lib/postgresql, unless
// a server answers; [RequirePostgres] and [Postgres] say what happens when
// they are not.
//
// # Concurrency
//
// A [Redis] or [Cluster] belongs to the test that started it and its methods
// must not be called concurrently. Separate servers are independent.
package servers

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EnvRedisAddr names the variable that points [StandaloneAddr] at an existing
// server.
const EnvRedisAddr = "SLUICE_REDIS_ADDR"

// startAttempts bounds the retries with fresh ports: a port found free may be
// taken by a parallel test before redis-server binds it.
const startAttempts = 5

// Redis is a redis-server process started by [StartRedis] or [StartCluster].
type Redis struct {
	bin     string
	dir     string
	args    []string // the caller's, reapplied by Restart
	port    int
	busPort int    // cluster bus port; 0 for a standalone server
	master  string // the address a Sentinel monitors; "" for a server

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been reaped
}

// StartRedis starts a standalone redis-server on a free 127.0.0.1 port and
// waits until it answers. It persists nothing (--save "" --appendonly
// no) and keeps its working directory and log in t.TempDir(). args are
// config options appended to the command line, so they override the
// defaults, e.g. "--maxmemory-policy", "allkeys-lru".
//
// t.Cleanup kills the server and, if the test failed, logs the tail of the
// server's log.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	return start(t, false, args)
}

// start launches a server, retrying with fresh ports while the ones it picked
// turn out to be taken.
func start(t testing.TB, cluster bool, args []string) *Redis {
	t.Helper()
	return startWith(t, func(r *Redis) {
		r.args = slices.Clone(args)
		if cluster {
			r.busPort = -1 // picked below
		}
	})
}

// startWith launches a server that set has configured, retrying with fresh
// ports while the ones it picked turn out to be taken.
func startWith(t testing.TB, set func(*Redis)) *Redis {
	t.Helper()
	r := &Redis{bin: RequireRedisServer(t), dir: t.TempDir()}
	set(r)
	cluster := r.busPort != 0
	nports := 1
	if cluster {
		nports = 2
	}
	for attempt := 1; ; attempt++ {
		ports := FreePorts(t, nports)
		r.port = ports[0]
		if cluster {
			r.busPort = ports[1]
		}
		err := r.launch()
		if err == nil {
			break
		}
		if !errors.Is(err, errPortInUse) || attempt == startAttempts {
			t.Fatalf("servers: start redis-server (attempt %d): %v", attempt, err)
		}
	}
	t.Cleanup(func() {
		r.kill()
		if t.Failed() {
			t.Logf("servers: redis-server %s log tail:\n%s", r.Addr(), r.logTail(0))
		}
	})
	return r
}

// FreePorts returns n distinct 127.0.0.1 ports that were free a moment
// ago. They are held open until all n are picked, or the kernel could
// return one twice.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("servers: find a free port: %v", err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// Addr returns the server's "127.0.0.1:port" address, which Restart keeps.
func (r *Redis) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))
}

// Pause stops the process with SIGSTOP and returns once the kernel reports
// every thread of it stopped, so that a call sent after Pause returns is
// sure to meet a paused server. Its sockets stay open, so clients connect
// and send but never get a reply: the way a hung or partitioned server
// looks to them.
func (r *Redis) Pause(t testing.TB) {
	t.Helper()
	r.signal(t, syscall.SIGSTOP)
	if err := r.waitFor(r.stopped); err != nil {
		t.Fatalf("servers: redis-server %s not stopped after SIGSTOP: %v", r.Addr(), err)
	}
}

// Resume continues a paused process with SIGCONT and returns once it
// answers on a new connection; it then answers the commands that queued
// up meanwhile.
func (r *Redis) Resume(t testing.TB) {
	t.Helper()
	r.signal(t, syscall.SIGCONT)
	if err := r.waitReady(); err != nil {
		t.Fatalf("servers: redis-server %s not answering after SIGCONT: %v", r.Addr(), err)
	}
}

// waitFor polls cond until it holds, fails, the server exits, or
// readyTimeout passes: waitReady's loop, for a condition other than an
// answer.
func (r *Redis) waitFor(cond func() (bool, error)) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		ok, err := cond()
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("still not so after %v", readyTimeout)
		}
		select {
		case <-r.exited:
			return fmt.Errorf("it exited: %v", r.cmd.ProcessState)
		case <-time.After(time.Millisecond):
		}
	}
}

func (r *Redis) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("servers: send %v to redis-server %s: %v", sig, r.Addr(), err)
	}
}

// Kill kills the process with SIGKILL and reaps it; Addr then refuses
// connections. Killing a server that is not running does nothing.
func (r *Redis) Kill(t testing.TB) {
	t.Helper()
	r.kill()
}

func (r *Redis) kill() {
	// Kill fails only when the process is gone already, which is the goal.
	_ = r.cmd.Process.Kill()
	<-r.exited
}

// Restart kills the server if it is running and starts a new, empty one on
// the same address with the same args, waiting until it answers.
//
// A restarted cluster node reads the nodes.conf its predecessor wrote, so it
// keeps its node ID and slots and reconnects to its peers, but it has no
// data, and Restart does not wait for the cluster to be ok again.
func (r *Redis) Restart(t testing.TB) {
	t.Helper()
	r.kill()
	if err := r.launch(); err != nil {
		t.Fatalf("servers: restart redis-server on %s: %v", r.Addr(), err)
	}
}

// SentinelMaster is the name under which a Sentinel from [StartSentinel]
// knows its master.
const SentinelMaster = "sluice"

// StartSentinel starts a Sentinel (redis-server --sentinel) on a free
// 127.0.0.1 port that monitors the server at master (a [Redis]'s Addr, or
// a [Proxy]'s in front of it) as [SentinelMaster], with a quorum of one,
// and waits until it answers. Failover clients (go-redis's
// NewFailoverClient, rueidis's Sentinel option) find master through it.
// t.Cleanup kills it.
func StartSentinel(t testing.TB, master string) *Redis {
	t.Helper()
	return startWith(t, func(r *Redis) { r.master = master })
}

// StandaloneAddr returns the address of a standalone server for the test.
//
// When $SLUICE_REDIS_ADDR is set, it returns that address with external
// true: the server is shared with other tests and runs, so the caller must
// use keys unique to the test and must not flush it. Otherwise it returns
// the Addr of a fresh [StartRedis] with external false, and the caller may do
// as it likes.
func StandaloneAddr(t testing.TB) (addr string, external bool) {
	t.Helper()
	if addr := os.Getenv(EnvRedisAddr); addr != "" {
		return addr, true
	}
	return StartRedis(t).Addr(), false
}

// EnvRedisClusterAddrs names the variable that points [ClusterAddrs] at an
// existing Redis Cluster of three masters: their addresses, separated by
// commas.
const EnvRedisClusterAddrs = "SLUICE_REDIS_CLUSTER_ADDRS"

// ClusterAddrs returns the masters' addresses of a 3-master Redis Cluster
// for the test: those $SLUICE_REDIS_CLUSTER_ADDRS lists, with external
// true (shared with other tests and runs, as [StandaloneAddr]'s), else
// those of a fresh [StartCluster], with external false.
func ClusterAddrs(t testing.TB) (addrs []string, external bool) {
	t.Helper()
	if v := os.Getenv(EnvRedisClusterAddrs); v != "" {
		return strings.Split(v, ","), true
	}
	return StartCluster(t).Addrs(), false
}

// RequireRedisServer returns the path of redis-server on PATH. Without one
// it skips the test, unless $CI is set: CI must run the Redis backends'
// tests, so there it fails the test instead.
func RequireRedisServer(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err == nil {
		return path
	}
	const msg = "redis-server not found; .ci/run installs it (apt-get install redis-server redis-tools)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
