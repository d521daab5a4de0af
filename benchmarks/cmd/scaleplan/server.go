package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// startAttempts bounds the tries with fresh ports: a port found free may be
// taken by another process before redis-server binds it.
const startAttempts = 5

// readyTimeout bounds the wait for a server to answer, for a cluster node
// to hold its slots and for a replica to be in sync (which a master delays
// 5 s by default, repl-diskless-sync-delay, for more replicas to join).
const readyTimeout = 30 * time.Second

// deployment is the redis-servers of a -topology, and the address of the
// one measured.
type deployment struct {
	addr    string
	servers []*redisServer
}

// startDeployment starts the servers of topology: standalone, cluster or
// replica.
func startDeployment(ctx context.Context, bin, topology string) (*deployment, error) {
	primary, err := startRedis(ctx, bin, topology == "cluster")
	if err != nil {
		return nil, err
	}
	d := &deployment{addr: primary.addr, servers: []*redisServer{primary}}
	switch topology {
	case "cluster":
		err = holdEverySlot(ctx, primary.addr)
	case "replica":
		err = d.addReplica(ctx, bin)
	}
	if err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

// addReplica starts a replica of d's server and waits until it is in sync.
func (d *deployment) addReplica(ctx context.Context, bin string) error {
	host, port, err := net.SplitHostPort(d.addr)
	if err != nil {
		return err
	}
	replica, err := startRedis(ctx, bin, false, "--replicaof", host, port)
	if err != nil {
		return err
	}
	d.servers = append(d.servers, replica)
	return poll(ctx, d.addr, "a replica in sync", func(ctx context.Context, c *redis.Client) (bool, error) {
		info, err := c.Info(ctx, "replication").Result()
		return strings.Contains(info, "state=online"), err
	})
}

// holdEverySlot makes the cluster node at addr the master of every slot,
// alone, and waits until it reports cluster_state:ok.
func holdEverySlot(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	if err := c.ClusterAddSlotsRange(ctx, 0, 16383).Err(); err != nil {
		return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE: %w", addr, err)
	}
	return poll(ctx, addr, "cluster_state:ok", func(ctx context.Context, c *redis.Client) (bool, error) {
		info, err := c.ClusterInfo(ctx).Result()
		return strings.Contains(info, "cluster_state:ok"), err
	})
}

// clusterMode reports whether the server runs in cluster mode. It fails on
// a node of a cluster of more than one master: the counters this command
// reads are one server's, and must count every decision.
func clusterMode(ctx context.Context, rdb *redis.Client) (bool, error) {
	in, err := readInfo(ctx, rdb, "cluster")
	if err != nil || in["cluster_enabled"] != "1" {
		return false, err
	}
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return false, fmt.Errorf("CLUSTER SHARDS: %w", err)
	}
	var ranges []redis.SlotRange
	for _, s := range shards {
		ranges = append(ranges, s.Slots...)
	}
	if len(ranges) != 1 || ranges[0] != (redis.SlotRange{Start: 0, End: 16383}) {
		return false, fmt.Errorf("a node of a cluster whose slots are not all in one range of one master (%v): measure one server", ranges)
	}
	return true, nil
}

// stop stops d's servers.
func (d *deployment) stop() {
	for _, s := range d.servers {
		s.stop()
	}
}

// redisServer is a redis-server this command started: on a free port of
// 127.0.0.1, persisting nothing, with its files in a directory of its own.
type redisServer struct {
	cmd    *exec.Cmd
	dir    string
	addr   string
	exited chan struct{} // closed once cmd has been reaped
}

// startRedis starts redis-server (bin), a cluster node if cluster, with args
// after the defaults, and waits until it answers.
func startRedis(ctx context.Context, bin string, cluster bool, args ...string) (*redisServer, error) {
	var err error
	for range startAttempts {
		var s *redisServer
		if s, err = tryRedis(ctx, bin, cluster, args); err == nil || ctx.Err() != nil {
			return s, err
		}
	}
	return nil, err
}

// tryRedis starts redis-server on ports free a moment ago; it fails if
// another process took one first.
func tryRedis(ctx context.Context, bin string, cluster bool, args []string) (*redisServer, error) {
	nports := 1
	if cluster {
		nports = 2 // and the cluster bus
	}
	ports, err := freePorts(nports)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "scaleplan-redis-")
	if err != nil {
		return nil, err
	}
	argv := []string{"--port", strconv.Itoa(ports[0]), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log")}
	if cluster {
		argv = append(argv, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(ports[1]),
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"))
	}
	s := &redisServer{
		cmd:    exec.Command(bin, append(argv, args...)...),
		dir:    dir,
		addr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		exited: make(chan struct{}),
	}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() {
		s.cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(ctx); err != nil {
		err = fmt.Errorf("redis-server on %s: %w; its log ends:\n%s", s.addr, err, s.logTail())
		s.stop()
		return nil, err
	}
	return s, nil
}

// waitReady waits until the server answers with its own pid: a server that
// answers with another's did not get the port.
func (s *redisServer) waitReady(ctx context.Context) error {
	want := "process_id:" + strconv.Itoa(s.cmd.Process.Pid) + "\r\n"
	return poll(ctx, s.addr, "an answer", func(ctx context.Context, c *redis.Client) (bool, error) {
		select {
		case <-s.exited:
			return false, fmt.Errorf("exited: %v", s.cmd.ProcessState)
		default:
		}
		info, err := c.Info(ctx, "server").Result()
		return err == nil && strings.Contains(info, want), nil
	})
}

// logTail is the last lines of the server's log.
func (s *redisServer) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return string(bytes.Join(lines[max(0, len(lines)-5):], []byte("\n")))
}

// stop stops the server, killing it if it has not exited within 5 s, and
// removes its directory.
func (s *redisServer) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
	os.RemoveAll(s.dir)
}

// freePorts returns n distinct ports of 127.0.0.1 that were free a moment
// ago. Each is held open until all are picked, or the kernel could give
// one twice.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// poll calls ready with a client of addr every 50 ms until it reports true
// or an error, or readyTimeout has passed; what names the wait in the
// error.
func poll(ctx context.Context, addr, what string, ready func(context.Context, *redis.Client) (bool, error)) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		ok, err := ready(ctx, c)
		if ok || err != nil {
			return err
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
	}
}
