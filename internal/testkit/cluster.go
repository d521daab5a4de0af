package testkit

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// formTimeout bounds the wait for a new cluster to converge; gossip usually
// gets there in one or two seconds.
const formTimeout = 20 * time.Second

// slotRanges splits the 16384 hash slots between the masters, one range each.
var slotRanges = [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// Cluster is a Redis Cluster of three masters without replicas, started by
// [StartCluster].
type Cluster struct {
	nodes []*Redis
}

// StartCluster starts a Redis Cluster of three masters without replicas on
// free 127.0.0.1 ports, with the same defaults as [StartRedis] plus a
// --cluster-node-timeout of 10s. args are config options appended to every
// node's command line.
//
// It returns once every node reports cluster_state:ok and maps all slots to
// their owners, so a client sees neither CLUSTERDOWN nor a stale MOVED.
// t.Cleanup kills the nodes.
func StartCluster(t testing.TB, args ...string) *Cluster {
	t.Helper()
	c := startNodes(t, args)
	if err := c.form(c.Addrs(), nil); err != nil {
		t.Fatalf("testkit: form cluster %v: %v", c.Addrs(), err)
	}
	return c
}

// StartProxiedCluster is [StartCluster] with a [Proxy] in front of each
// node, which the node announces as its address, so that a cluster client
// given the proxies' addresses reaches every node through them. The
// proxies are in the order of [Cluster.Nodes].
func StartProxiedCluster(t testing.TB, args ...string) (*Cluster, []*Proxy) {
	t.Helper()
	c := startNodes(t, args)
	var (
		proxies []*Proxy
		owners  []string
		ports   []int
	)
	for _, n := range c.nodes {
		p := StartProxy(t, n.Addr())
		proxies, owners, ports = append(proxies, p), append(owners, p.Addr()), append(ports, p.Port())
	}
	if err := c.form(owners, ports); err != nil {
		t.Fatalf("testkit: form cluster %v behind proxies %v: %v", c.Addrs(), owners, err)
	}
	return c, proxies
}

// startNodes starts the nodes of a cluster, not yet formed.
func startNodes(t testing.TB, args []string) *Cluster {
	t.Helper()
	c := &Cluster{}
	for range slotRanges {
		c.nodes = append(c.nodes, start(t, true, args))
	}
	return c
}

// Addrs returns the nodes' addresses, in the order of [Cluster.Nodes].
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the masters; the i-th owns the i-th third of the slots. Each
// may be paused, resumed or killed to inject faults. With no replica to take
// over, a master that stays down past the 10s node timeout makes the others
// report cluster_state:fail. See [Redis.Restart] for what restarting a node
// does.
func (c *Cluster) Nodes() []*Redis {
	return slices.Clone(c.nodes)
}

// form gives each node its slots, introduces the nodes to each other and
// waits until they all agree that the i-th range is owners[i]'s. With
// announce, the i-th node first announces port announce[i] as its own.
func (c *Cluster) form(owners []string, announce []int) error {
	ctx, cancel := context.WithTimeout(context.Background(), formTimeout)
	defer cancel()
	clients := make([]*redis.Client, len(c.nodes))
	for i, n := range c.nodes {
		clients[i] = adminClient(n.Addr())
		defer clients[i].Close()
	}

	for i, port := range announce {
		if err := clients[i].ConfigSet(ctx, "cluster-announce-port", strconv.Itoa(port)).Err(); err != nil {
			return fmt.Errorf("%s: CONFIG SET cluster-announce-port %d: %w", c.nodes[i].Addr(), port, err)
		}
	}
	for i, cl := range clients {
		lo, hi := slotRanges[i][0], slotRanges[i][1]
		if err := cl.Do(ctx, "cluster", "addslotsrange", lo, hi).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE %d %d: %w", c.nodes[i].Addr(), lo, hi, err)
		}
	}
	// The bus port is passed explicitly because it is not port+10000.
	for _, n := range c.nodes[1:] {
		if err := clients[0].Do(ctx, "cluster", "meet", "127.0.0.1", n.port, n.busPort).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER MEET %s: %w", c.nodes[0].Addr(), n.Addr(), err)
		}
	}
	return c.converge(ctx, clients, owners)
}

// converge waits until every node sees the whole cluster, with the i-th
// slot range owned by owners[i].
func (c *Cluster) converge(ctx context.Context, clients []*redis.Client, owners []string) error {
	for {
		pending, err := c.pending(ctx, clients, owners)
		if err != nil || pending == "" {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not converged within %v: %s", formTimeout, pending)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pending describes the first node that does not yet see the whole cluster,
// or returns "" when none is left. A node must report cluster_state:ok and
// map every range to its owner's address: before it does, a client may get
// CLUSTERDOWN from it or be sent to the wrong node.
func (c *Cluster) pending(ctx context.Context, clients []*redis.Client, owners []string) (string, error) {
	for i, cl := range clients {
		addr := c.nodes[i].Addr()
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			return "", fmt.Errorf("%s: CLUSTER INFO: %w", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return addr + " is not cluster_state:ok", nil
		}
		//lint:ignore SA1019 go-redis's ClusterClient maps slots with CLUSTER SLOTS, so that is the view that must be settled.
		slots, err := cl.ClusterSlots(ctx).Result()
		if err != nil {
			return "", fmt.Errorf("%s: CLUSTER SLOTS: %w", addr, err)
		}
		if !ownsAll(slots, owners) {
			return fmt.Sprintf("%s has CLUSTER SLOTS %v", addr, slots), nil
		}
	}
	return "", nil
}

// ownsAll reports whether slots maps exactly the slot ranges, the i-th to
// owners[i].
func ownsAll(slots []redis.ClusterSlot, owners []string) bool {
	if len(slots) != len(slotRanges) {
		return false
	}
	for _, s := range slots {
		i := slices.Index(slotRanges, [2]int{s.Start, s.End})
		if i < 0 || len(s.Nodes) == 0 || s.Nodes[0].Addr != owners[i] {
			return false
		}
	}
	return true
}

// adminClient returns a client for the setup commands. It must only be used
// once the server answers (see probe for why).
func adminClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr,
		// RESP2 and no CLIENT SETINFO: redis-server 7.0 predates the
		// handshake extras newer go-redis tries and then ignores.
		Protocol:        2,
		DisableIdentity: true,
		MaxRetries:      -1,
		PoolSize:        1,
		DialTimeout:     time.Second,
		ReadTimeout:     2 * time.Second,
		WriteTimeout:    2 * time.Second,
	})
}
