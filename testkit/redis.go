package testkit

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/sluicehq/sluice/internal/test/servers"
)

// SentinelMaster is the name under which a Sentinel from [StartSentinel]
// knows its master.
const SentinelMaster = servers.SentinelMaster

// hostAttempts bounds the retries of a container on free host ports with
// fresh ports: a port found free may be taken before the server binds it.
const hostAttempts = 5

// Redis is a standalone Redis server of one test.
type Redis struct {
	addr string
}

// Addr returns the server's host:port.
func (r *Redis) Addr() string { return r.addr }

// StartRedis starts a standalone Redis server that persists nothing and
// returns once it answers; t.Cleanup removes it. In a container it is
// [DefaultRedisImage] (or $SLUICE_REDIS_IMAGE's) on a published port.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	if ModeOf(t) == Binaries {
		return &Redis{addr: servers.StartRedis(t).Addr()}
	}
	ctx, cancel := startContext(t)
	defer cancel()
	c, err := tcredis.Run(ctx, image(EnvRedisImage, DefaultRedisImage),
		testcontainers.WithCmdArgs("--save", "", "--appendonly", "no"))
	testcontainers.CleanupContainer(t, c)
	if err != nil {
		t.Fatalf("testkit: start Redis container: %v", err)
	}
	host, err := c.Host(ctx)
	if err != nil {
		t.Fatalf("testkit: Redis container's host: %v", err)
	}
	port, err := c.MappedPort(ctx, "6379/tcp")
	if err != nil {
		t.Fatalf("testkit: Redis container's port: %v", err)
	}
	return &Redis{addr: net.JoinHostPort(host, port.Port())}
}

// Cluster is a Redis Cluster of three masters, without replicas, each
// owning a third of the hash slots.
type Cluster struct {
	addrs []string
}

// Addrs returns the masters' host:port addresses.
func (c *Cluster) Addrs() []string { return c.addrs }

// EnvClusterLayout chooses how [StartCluster] runs its nodes in
// containers: "host", a container each on the host's network, or
// "single", one container holding the three nodes, each on a port
// published as the same port of the host's 127.0.0.1. Unset, host on
// Linux, where the engine shares the test's network, and single elsewhere
// (Docker Desktop's engine runs in a VM).
const EnvClusterLayout = "SLUICE_TESTKIT_CLUSTER"

// StartCluster starts a Redis Cluster of three masters on free 127.0.0.1
// ports and returns once every node reports cluster_state:ok and maps all
// slots to their owners, so a client sees neither CLUSTERDOWN nor a stale
// MOVED; t.Cleanup removes the nodes. In containers the nodes announce
// 127.0.0.1 and the ports the test dials: see [EnvClusterLayout].
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, os.Getenv(EnvClusterLayout))
}

// startCluster is StartCluster with the containers' layout given.
func startCluster(t testing.TB, layout string) *Cluster {
	t.Helper()
	if ModeOf(t) == Binaries {
		return &Cluster{addrs: servers.StartCluster(t).Addrs()}
	}
	var ports, busPorts []int
	switch {
	case layout == "host" || layout == "" && runtime.GOOS == "linux":
		for range 3 {
			p := startOnHost(t, redisReady, 2, func(p []int) []string {
				return append([]string{"redis-server"}, clusterNodeArgs(p[0], p[1], "127.0.0.1")...)
			})
			ports, busPorts = append(ports, p[0]), append(busPorts, p[1])
		}
	case layout == "single" || layout == "":
		ports, busPorts = startSingleCluster(t)
	default:
		t.Fatalf("testkit: %s=%q: want host or single (or unset)", EnvClusterLayout, layout)
	}
	c := &Cluster{}
	for _, p := range ports {
		c.addrs = append(c.addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	}
	if err := servers.FormCluster(ports, busPorts); err != nil {
		t.Fatalf("testkit: form a cluster of the containers at %v: %v", c.addrs, err)
	}
	return c
}

// serverArgs are the options of a server on port that persists nothing,
// listening on bind and answering any client there.
func serverArgs(port int, bind string) []string {
	return []string{"--port", strconv.Itoa(port), "--bind", bind, "--protected-mode", "no", "--save", "", "--appendonly", "no"}
}

// clusterNodeArgs are the options of a cluster node on port, with its
// cluster bus on busPort, listening on bind and announcing 127.0.0.1.
func clusterNodeArgs(port, busPort int, bind string) []string {
	return append(serverArgs(port, bind),
		"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(busPort),
		"--cluster-config-file", "nodes-"+strconv.Itoa(port)+".conf", "--cluster-node-timeout", "10000",
		"--cluster-announce-ip", "127.0.0.1",
	)
}

// startSingleCluster starts one container of the Redis image holding three
// cluster nodes, each on a free port of the host's 127.0.0.1 published as
// the same port, so that the addresses the nodes announce are the ones
// the test dials; their cluster buses stay inside the container. It
// retries with fresh ports while the container does not come up, and
// returns the nodes' ports and bus ports. t.Cleanup removes it.
func startSingleCluster(t testing.TB) (ports, busPorts []int) {
	t.Helper()
	free := runRetrying(t, "a Redis Cluster container", 6, func(free []int) []testcontainers.ContainerCustomizer {
		ports, busPorts := free[:3], free[3:]
		var script, exposed []string
		bindings := network.PortMap{}
		for i, p := range ports {
			line := "redis-server '" + strings.Join(clusterNodeArgs(p, busPorts[i], "0.0.0.0"), "' '") + "'"
			if i < len(ports)-1 {
				line += " &"
			} else {
				line = "exec " + line
			}
			script = append(script, line)
			port := strconv.Itoa(p) + "/tcp"
			exposed = append(exposed, port)
			bindings[network.MustParsePort(port)] = []network.PortBinding{{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(p)}}
		}
		return []testcontainers.ContainerCustomizer{
			testcontainers.WithCmd("sh", "-c", strings.Join(script, "\n")),
			testcontainers.WithExposedPorts(exposed...),
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.PortBindings = bindings }),
			testcontainers.WithWaitStrategy(wait.ForLog(redisReady).WithOccurrence(len(ports))),
		}
	})
	return free[:3], free[3:]
}

// Sentinel is a Sentinel and the standalone server it monitors as
// [SentinelMaster].
type Sentinel struct {
	addr   string
	master *Redis
}

// Addr returns the Sentinel's host:port, for failover clients (go-redis's
// NewFailoverClient, rueidis's Sentinel option).
func (s *Sentinel) Addr() string { return s.addr }

// Master returns the server the Sentinel monitors.
func (s *Sentinel) Master() *Redis { return s.master }

// StartSentinel starts a standalone server and a Sentinel that monitors it
// as [SentinelMaster], with a quorum of one, both on free 127.0.0.1 ports,
// and returns once both answer; t.Cleanup removes them. In containers both
// use the host's network.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	if ModeOf(t) == Binaries {
		master := servers.StartRedis(t)
		return &Sentinel{addr: servers.StartSentinel(t, master.Addr()).Addr(), master: &Redis{addr: master.Addr()}}
	}
	mp := startOnHost(t, redisReady, 1, func(p []int) []string {
		return append([]string{"redis-server"}, serverArgs(p[0], "127.0.0.1")...)
	})
	master := &Redis{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(mp[0]))}
	conf := servers.SentinelConfig(master.addr)
	sp := startOnHost(t, sentinelReady, 1, func(p []int) []string {
		return []string{"sh", "-c", `printf '%s' "$1" > /tmp/sentinel.conf && exec redis-server /tmp/sentinel.conf --sentinel --port "$2" --bind 127.0.0.1 --protected-mode no`,
			"sentinel", conf, strconv.Itoa(p[0])}
	})
	return &Sentinel{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(sp[0])), master: master}
}

// What a server and a Sentinel log once they serve.
const (
	redisReady    = "Ready to accept connections"
	sentinelReady = "+monitor master"
)

// startOnHost starts a container of the Redis image on the host's network
// with the command cmd gives for nports free ports, waits until it logs
// ready, and returns the ports. t.Cleanup removes it.
func startOnHost(t testing.TB, ready string, nports int, cmd func(ports []int) []string) []int {
	t.Helper()
	return runRetrying(t, "a Redis container on the host's network", nports, func(ports []int) []testcontainers.ContainerCustomizer {
		return []testcontainers.ContainerCustomizer{
			testcontainers.WithCmd(cmd(ports)...),
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
			// Podman refuses host networking beside the network
			// testcontainers-go attaches by default.
			testcontainers.WithEndpointSettingsModifier(func(m map[string]*network.EndpointSettings) { clear(m) }),
			testcontainers.WithWaitStrategy(wait.ForLog(ready)),
		}
	})
}

// runRetrying starts a container of the Redis image with the options opts
// gives for nports free 127.0.0.1 ports, retrying with fresh ports while
// it does not come up (a port found free may be taken before the server
// binds it), and returns the ports; what names the container in the
// failure. t.Cleanup removes it.
func runRetrying(t testing.TB, what string, nports int, opts func(ports []int) []testcontainers.ContainerCustomizer) []int {
	t.Helper()
	ctx, cancel := startContext(t)
	defer cancel()
	var last error
	for range hostAttempts {
		ports := servers.FreePorts(t, nports)
		c, err := testcontainers.Run(ctx, image(EnvRedisImage, DefaultRedisImage), opts(ports)...)
		testcontainers.CleanupContainer(t, c)
		if err == nil {
			return ports
		}
		last = err
	}
	t.Fatalf("testkit: start %s (%d attempts): %v", what, hostAttempts, last)
	return nil
}
