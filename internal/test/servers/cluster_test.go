package servers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/test/servers"
)

// slotRanges are the slot ranges of a cluster's masters, in the order of
// its Nodes.
var slotRanges = [][2]int64{{0, 5460}, {5461, 10922}, {10923, 16383}}

func TestStartCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := servers.StartCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRedirects: -1})
	t.Cleanup(func() { cc.Close() })

	// MaxRedirects -1: a MOVED or CLUSTERDOWN would mean StartCluster
	// returned before the nodes agreed.
	for i := range 100 {
		k := fmt.Sprintf("key-%d", i)
		if err := cc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		if got, err := cc.Get(ctx, k).Int(); err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", k, got, err, i)
		}
	}
	for _, n := range cl.Nodes() {
		c := newClient(t, n.Addr())
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			t.Errorf("%s: CLUSTER INFO = %q, %v; want cluster_state:ok", n.Addr(), info, err)
		}
		if size, err := c.DBSize(ctx).Result(); err != nil || size == 0 {
			t.Errorf("%s: DBSIZE = %d, %v; want keys on every master", n.Addr(), size, err)
		}
	}
}

// TestStartReplicatedCluster: three masters and three replicas, every node
// ok, mapping each range to its master and knowing each replica as its
// master's, every replica in sync, and all slots served through a cluster
// client that follows no redirect.
func TestStartReplicatedCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := servers.StartReplicatedCluster(t)
	masters, replicas := cl.Nodes(), cl.Replicas()
	if len(masters) != 3 || len(replicas) != 3 {
		t.Fatalf("%d masters and %d replicas; want 3 and 3", len(masters), len(replicas))
	}
	cc := newClusterClient(t, cl.Addrs(), -1) // as in TestStartCluster
	for i := range 100 {
		k := fmt.Sprintf("key-%d", i)
		if err := cc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		if got, err := cc.Get(ctx, k).Int(); err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", k, got, err, i)
		}
	}

	ids := make([]string, len(masters))
	for i, m := range masters {
		id, err := dial(t, m.Addr()).ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatalf("%s: CLUSTER MYID: %v", m.Addr(), err)
		}
		ids[i] = id
	}
	for _, n := range slices.Concat(masters, replicas) {
		c := dial(t, n.Addr())
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			t.Errorf("%s: CLUSTER INFO = %q, %v; want cluster_state:ok", n.Addr(), info, err)
		}
		checkOwners(t, n, masters)
		nodes, err := c.ClusterNodes(ctx).Result()
		if err != nil {
			t.Fatalf("%s: CLUSTER NODES: %v", n.Addr(), err)
		}
		for i, r := range replicas {
			if !knowsReplica(nodes, r.Addr(), ids[i]) {
				t.Errorf("%s does not know %s as the replica of %s; CLUSTER NODES:\n%s", n.Addr(), r.Addr(), masters[i].Addr(), nodes)
			}
		}
	}
	for i, r := range replicas {
		checkReplicates(t, r, masters[i])
		if got := cl.Master(t, i); got != masters[i] {
			t.Errorf("Master(%d) = %s; want %s", i, got.Addr(), masters[i].Addr())
		}
		if size, err := dial(t, masters[i].Addr()).DBSize(ctx).Result(); err != nil || size == 0 {
			t.Errorf("master %d: DBSIZE = %d, %v; want keys on every master", i, size, err)
		}
	}
}

// TestClusterFailover fails over each slot range in turn and then the
// first back: each time, the promoted node is the range's master and the
// old one its replica, a key written before is read from the promoted
// master, a cluster client writes to it, and the other ranges keep their
// masters.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := servers.StartReplicatedCluster(t)
	masters, replicas := cl.Nodes(), cl.Replicas()
	// Redirects allowed: after a failover the client's slot map is stale
	// until a MOVED from the old master makes it reload.
	cc := newClusterClient(t, cl.Addrs(), 0)
	keys := make([]string, len(slotRanges))
	values := make([]string, len(slotRanges)) // what each key was last set to
	for i := range keys {
		keys[i], values[i] = keyInRange(t, dial(t, masters[0].Addr()), i), "before"
		if err := cc.Set(ctx, keys[i], values[i], 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", keys[i], err)
		}
	}

	now := slices.Clone(masters) // the master of each range
	began := time.Now()          // of the first failover, of masters[0]
	for step, i := range []int{0, 1, 2, 0} {
		old, promoted := now[i], replicas[i]
		if old == replicas[i] {
			promoted = masters[i]
		}
		cl.Failover(t, i)
		now[i] = promoted

		for j := range slotRanges {
			if got := cl.Master(t, j); got != now[j] {
				t.Errorf("step %d, after failing over range %d: Master(%d) = %s; want %s", step, i, j, got.Addr(), now[j].Addr())
			}
		}
		for _, n := range slices.Concat(masters, replicas) {
			checkOwners(t, n, now)
		}
		checkReplicates(t, old, promoted)
		if got, err := dial(t, promoted.Addr()).Get(ctx, keys[i]).Result(); err != nil || got != values[i] {
			t.Errorf("step %d: GET %s on the promoted master %s = %q, %v; want %q", step, keys[i], promoted.Addr(), got, err, values[i])
		}
		values[i] = fmt.Sprintf("after step %d", step)
		if err := cc.Set(ctx, keys[i], values[i], 0).Err(); err != nil {
			t.Fatalf("step %d: SET %s through the cluster client: %v", step, keys[i], err)
		}
		if got, err := dial(t, promoted.Addr()).Get(ctx, keys[i]).Result(); err != nil || got != values[i] {
			t.Errorf("step %d: GET %s on the promoted master %s = %q, %v; want %q", step, keys[i], promoted.Addr(), got, err, values[i])
		}
	}

	// Failing range 0 over once more would replace masters[0] again: if
	// the first failover did so less than 20s ago, the masters would not
	// vote for it, and Failover must say so rather than time out.
	if since := time.Since(began); since >= 20*time.Second {
		t.Logf("not checking a failover too soon: the ones above took %v", since)
		return
	}
	tb := outcome(t, func(tb testing.TB) { cl.Failover(tb, 0) })
	if tb.outcome != "failed" || !strings.Contains(tb.msg, "at most once in 20s") {
		t.Errorf("Failover of range 0 a third time %s: %q; want it failed for want of votes", tb.outcome, tb.msg)
	}
	if got := cl.Master(t, 0); got != masters[0] {
		t.Errorf("after the refused failover, Master(0) = %s; want %s", got.Addr(), masters[0].Addr())
	}
}

// TestFailoverWithoutReplicas: in a cluster without replicas Failover fails
// the test, and Master finds the masters as started.
func TestFailoverWithoutReplicas(t *testing.T) {
	t.Parallel()
	cl := servers.StartCluster(t)
	tb := outcome(t, func(tb testing.TB) { cl.Failover(tb, 0) })
	if tb.outcome != "failed" || !strings.Contains(tb.msg, "no replicas") {
		t.Errorf("Failover %s: %q; want it failed for want of replicas", tb.outcome, tb.msg)
	}
	if r := cl.Replicas(); len(r) != 0 {
		t.Errorf("Replicas() = %v; want none", r)
	}
	for i, n := range cl.Nodes() {
		if got := cl.Master(t, i); got != n {
			t.Errorf("Master(%d) = %s; want %s", i, got.Addr(), n.Addr())
		}
	}
}

// outcome runs f with an outcomeTB, to see how f ends the test.
func outcome(t *testing.T, f func(testing.TB)) *outcomeTB {
	tb := &outcomeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
		tb.outcome = "returned"
	}()
	<-done
	return tb
}

// checkOwners checks that n's CLUSTER SLOTS maps the i-th slot range to
// owners[i], master first.
func checkOwners(t *testing.T, n *servers.Redis, owners []*servers.Redis) {
	t.Helper()
	//lint:ignore SA1019 go-redis's ClusterClient maps slots with CLUSTER SLOTS, so that is the view that counts.
	slots, err := dial(t, n.Addr()).ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatalf("%s: CLUSTER SLOTS: %v", n.Addr(), err)
	}
	if len(slots) != len(slotRanges) {
		t.Errorf("%s: CLUSTER SLOTS = %v; want %d ranges", n.Addr(), slots, len(slotRanges))
	}
	for _, s := range slots {
		i := slices.Index(slotRanges, [2]int64{int64(s.Start), int64(s.End)})
		if i < 0 || len(s.Nodes) == 0 || s.Nodes[0].Addr != owners[i].Addr() {
			t.Errorf("%s: CLUSTER SLOTS has %v; want the ranges at %v", n.Addr(), s, addrs(owners))
		}
	}
}

// addrs returns the servers' addresses, in order.
func addrs(servers []*servers.Redis) []string {
	a := make([]string, len(servers))
	for i, s := range servers {
		a[i] = s.Addr()
	}
	return a
}

// checkReplicates checks that replica is linked to master and in sync.
func checkReplicates(t *testing.T, replica, master *servers.Redis) {
	t.Helper()
	info, err := dial(t, replica.Addr()).Info(context.Background(), "replication").Result()
	if err != nil {
		t.Fatalf("%s: INFO replication: %v", replica.Addr(), err)
	}
	_, port, _ := strings.Cut(master.Addr(), ":")
	for _, want := range []string{"role:slave", "master_port:" + port, "master_link_status:up"} {
		if !strings.Contains(info, want+"\r\n") {
			t.Errorf("%s: INFO replication has no %s:\n%s", replica.Addr(), want, info)
		}
	}
}

// keyInRange returns a key whose slot, as CLUSTER KEYSLOT on c has it, is
// in the i-th slot range.
func keyInRange(t *testing.T, c *redis.Client, i int) string {
	t.Helper()
	for n := range 1000 {
		k := fmt.Sprintf("key-%d", n)
		slot, err := c.ClusterKeySlot(context.Background(), k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
		}
		if slotRanges[i][0] <= slot && slot <= slotRanges[i][1] {
			return k
		}
	}
	t.Fatalf("no key-N with N < 1000 is in slots %d-%d", slotRanges[i][0], slotRanges[i][1])
	return ""
}

// knowsReplica reports whether a CLUSTER NODES reply lists the node at
// addr as a replica of the master whose ID is master.
func knowsReplica(nodes, addr, master string) bool {
	for line := range strings.Lines(nodes) {
		// <id> <ip:port@cport> <flags> <master> ...
		f := strings.Fields(line)
		if len(f) >= 4 && strings.HasPrefix(f[1], addr+"@") {
			return slices.Contains(strings.Split(f[2], ","), "slave") && f[3] == master
		}
	}
	return false
}

// newClusterClient returns a cluster client seeded with addrs;
// maxRedirects -1 makes a MOVED an error.
func newClusterClient(t *testing.T, addrs []string, maxRedirects int) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: maxRedirects})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// dial returns a client for checks on one node. Unlike newClient's, its
// timeouts are generous: these tests look at state, not at timeouts, and
// must not fail on a loaded machine.
func dial(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: 5 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}
