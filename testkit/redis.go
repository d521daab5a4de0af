package testkit

import (
	"net"
	"strconv"
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

// hostAttempts bounds the retries of a container on the host's network
// with fresh ports: a port found free may be taken before the server binds
// it.
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

// StartCluster starts a Redis Cluster of three masters on free 127.0.0.1
// ports and returns once every node reports cluster_state:ok and maps all
// slots to their owners, so a client sees neither CLUSTERDOWN nor a stale
// MOVED; t.Cleanup removes the nodes. In containers the nodes use the
// host's network.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	if ModeOf(t) == Binaries {
		return &Cluster{addrs: servers.StartCluster(t).Addrs()}
	}
	ports, busPorts := make([]int, 3), make([]int, 3)
	c := &Cluster{}
	for i := range ports {
		ports[i], busPorts[i] = startOnHost(t, redisReady, 2, func(p []int) []string {
			return []string{
				"redis-server", "--port", strconv.Itoa(p[0]), "--bind", "127.0.0.1",
				"--protected-mode", "no", "--save", "", "--appendonly", "no",
				"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(p[1]),
				"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "10000",
			}
		})
		c.addrs = append(c.addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i])))
	}
	if err := servers.FormCluster(ports, busPorts); err != nil {
		t.Fatalf("testkit: form a cluster of the containers at %v: %v", c.addrs, err)
	}
	return c
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
	mp, _ := startOnHost(t, redisReady, 1, func(p []int) []string {
		return []string{"redis-server", "--port", strconv.Itoa(p[0]), "--bind", "127.0.0.1",
			"--protected-mode", "no", "--save", "", "--appendonly", "no"}
	})
	master := &Redis{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(mp))}
	conf := servers.SentinelConfig(master.addr)
	sp, _ := startOnHost(t, sentinelReady, 1, func(p []int) []string {
		return []string{"sh", "-c", `printf '%s' "$1" > /tmp/sentinel.conf && exec redis-server /tmp/sentinel.conf --sentinel --port "$2" --bind 127.0.0.1 --protected-mode no`,
			"sentinel", conf, strconv.Itoa(p[0])}
	})
	return &Sentinel{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(sp)), master: master}
}

// What a server and a Sentinel log once they serve.
const (
	redisReady    = "Ready to accept connections"
	sentinelReady = "+monitor master"
)

// startOnHost starts a container of the Redis image on the host's network
// with the command cmd gives for nports free ports, and waits until it
// logs ready; it retries with fresh ports while the server does not come
// up, and returns the first two ports (the second 0 when nports is 1).
// t.Cleanup removes it.
func startOnHost(t testing.TB, ready string, nports int, cmd func(ports []int) []string) (int, int) {
	t.Helper()
	ctx, cancel := startContext(t)
	defer cancel()
	var last error
	for range hostAttempts {
		ports := append(servers.FreePorts(t, nports), 0)
		c, err := testcontainers.Run(ctx, image(EnvRedisImage, DefaultRedisImage),
			testcontainers.WithCmd(cmd(ports)...),
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
			// Podman refuses host networking beside the network
			// testcontainers-go attaches by default.
			testcontainers.WithEndpointSettingsModifier(func(m map[string]*network.EndpointSettings) { clear(m) }),
			testcontainers.WithWaitStrategy(wait.ForLog(ready)),
		)
		testcontainers.CleanupContainer(t, c)
		if err == nil {
			return ports[0], ports[1]
		}
		last = err
	}
	t.Fatalf("testkit: start a Redis container on the host's network (%d attempts): %v", hostAttempts, last)
	return 0, 0
}
