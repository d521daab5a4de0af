package servers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// formTimeout bounds the wait for a new cluster, or one failing over, to
// converge; gossip usually gets there within a few seconds.
const formTimeout = 20 * time.Second

// slotRanges splits the 16384 hash slots between the masters, one range each.
var slotRanges = [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// replicatedDefaults are the config options of a replicated cluster's nodes
// on top of [StartCluster]'s, before the caller's args: by default a master
// waits 5s for more replicas to share a replica's first, diskless, sync.
var replicatedDefaults = []string{"--repl-diskless-sync-delay", "0"}

// Cluster is a Redis Cluster of three masters, each owning a third of the
// hash slots: without replicas when started by [StartCluster] or
// [StartProxiedCluster], with one replica per master when started by
// [StartReplicatedCluster], which [Cluster.Failover] can promote.
type Cluster struct {
	masters  []*Redis // as started; the i-th was given the i-th slot range
	replicas []*Redis // the i-th replicated masters[i] at start; none without replicas

	// proxies are in front of the nodes of a proxied cluster, which
	// announce their proxy's address as their own.
	proxies map[*Redis]*Proxy

	// replaced is when Failover last replaced each master; see mayReplace.
	replaced map[*Redis]time.Time
}

// shard is the nodes of one slot range: the master that owns it and, in a
// replicated cluster, the replica that follows it.
type shard struct {
	master, replica *Redis
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
	c := startNodes(t, false, args)
	if err := c.form(); err != nil {
		t.Fatalf("servers: form cluster %v: %v", c.Addrs(), err)
	}
	return c
}

// StartProxiedCluster is [StartCluster] with a [Proxy] in front of each
// node, which the node announces as its address, so that a cluster client
// given the proxies' addresses reaches every node through them. The
// proxies are in the order of [Cluster.Nodes].
func StartProxiedCluster(t testing.TB, args ...string) (*Cluster, []*Proxy) {
	t.Helper()
	c := startNodes(t, false, args)
	c.proxies = map[*Redis]*Proxy{}
	var (
		proxies []*Proxy
		addrs   []string
	)
	for _, n := range c.masters {
		p := StartProxy(t, n.Addr())
		c.proxies[n] = p
		proxies, addrs = append(proxies, p), append(addrs, p.Addr())
	}
	if err := c.form(); err != nil {
		t.Fatalf("servers: form cluster %v behind proxies %v: %v", c.Addrs(), addrs, err)
	}
	return c, proxies
}

// StartReplicatedCluster is [StartCluster] with one replica per master,
// also on free 127.0.0.1 ports: [Cluster.Replicas] are in the order of
// [Cluster.Nodes], the i-th replicating the i-th master. Its nodes also
// start with --repl-diskless-sync-delay 0, so that a replica's first sync
// starts at once; args come after it.
//
// It returns once, besides what StartCluster waits for, every replica is
// linked to its master and in sync (INFO replication: role:slave,
// master_link_status:up) and every node knows it as its master's replica
// (CLUSTER NODES), so that [Cluster.Failover] may promote it. CLUSTER
// SLOTS lists a replica only once its replication offset is past 0, after
// its master's first write or first ping to replicas (every 10s), so a
// client that reads from replicas may not find them at first.
//
// A master that stays down past the 10s node timeout is failed over to its
// replica by the cluster itself. t.Cleanup kills the nodes.
func StartReplicatedCluster(t testing.TB, args ...string) *Cluster {
	t.Helper()
	c := startNodes(t, true, args)
	if err := c.form(); err != nil {
		t.Fatalf("servers: form cluster of masters %v and replicas %v: %v", c.Addrs(), addrsOf(c.replicas), err)
	}
	return c
}

// FormCluster makes three redis-servers that something else started on
// 127.0.0.1, with cluster mode on and no slots yet, a cluster as
// [StartCluster] makes its own: the i-th at ports[i] (its cluster bus at
// busPorts[i]) owns the i-th third of the slots. It returns once every node
// reports cluster_state:ok and maps all slots to their owners. The test
// kit's containers use it.
func FormCluster(ports, busPorts []int) error {
	if len(ports) != len(slotRanges) || len(busPorts) != len(slotRanges) {
		return fmt.Errorf("servers: FormCluster needs %d nodes, got %d ports and %d bus ports", len(slotRanges), len(ports), len(busPorts))
	}
	c := &Cluster{}
	for i := range ports {
		c.masters = append(c.masters, &Redis{port: ports[i], busPort: busPorts[i]})
	}
	return c.form()
}

// startNodes starts the masters of a cluster and, if replicated, their
// replicas: nodes not yet formed into a cluster.
func startNodes(t testing.TB, replicated bool, args []string) *Cluster {
	t.Helper()
	c := &Cluster{}
	if replicated {
		args = append(slices.Clone(replicatedDefaults), args...)
	}
	for range slotRanges {
		c.masters = append(c.masters, start(t, true, args))
	}
	if replicated {
		for range slotRanges {
			c.replicas = append(c.replicas, start(t, true, args))
		}
	}
	return c
}

// Addrs returns the masters' addresses, in the order of [Cluster.Nodes]; a
// cluster client finds the replicas from them.
func (c *Cluster) Addrs() []string {
	return addrsOf(c.masters)
}

// Nodes returns the masters as started; the i-th was given the i-th third
// of the slots. Each may be paused, resumed or killed to inject faults.
// With no replica to take over, a master that stays down past the 10s node
// timeout makes the others report cluster_state:fail. See [Redis.Restart]
// for what restarting a node does.
//
// After a failover of the i-th range, by [Cluster.Failover] or by the
// cluster itself, the i-th node may be a replica: [Cluster.Master] finds
// the range's master now.
func (c *Cluster) Nodes() []*Redis {
	return slices.Clone(c.masters)
}

// Replicas returns the replicas of a cluster from [StartReplicatedCluster],
// the i-th of which replicated the i-th of [Cluster.Nodes] at start; after a
// failover of the i-th range it is that range's master. A cluster without
// replicas has none.
func (c *Cluster) Replicas() []*Redis {
	return slices.Clone(c.replicas)
}

// Master returns the master of the i-th slot range now: the node of the
// range (the i-th of [Cluster.Nodes] or of [Cluster.Replicas]) that says it
// is a master (ROLE). It fails t unless they all answer and exactly one of
// them says so, which may not be the case while a failover is under way.
func (c *Cluster) Master(t testing.TB, i int) *Redis {
	t.Helper()
	checkRange(t, i)
	ctx, cancel := context.WithTimeout(context.Background(), formTimeout)
	defer cancel()
	admins := openAdmins(c.rangeNodes(i))
	defer admins.close()
	s, err := c.shard(ctx, admins, i)
	if err != nil {
		t.Fatalf("servers: master of slot range %d: %v", i, err)
	}
	return s.master
}

// Failover promotes the replica of the i-th slot range to its master with
// a coordinated CLUSTER FAILOVER, run on the replica: the master stops
// taking writes until the replica has caught up with it, so no write it
// acknowledged is lost. The old master becomes the promoted one's replica,
// so a second Failover of the range turns it back.
//
// Failover first waits until the cluster is settled, as
// [StartReplicatedCluster] returns it, and returns once it is settled
// again: the promoted node is master of the range in every node's CLUSTER
// SLOTS, every node reports cluster_state:ok, and the old master is linked
// to the promoted one and in sync (role:slave, master_link_status:up) and
// known to every node as its replica. That last takes gossip up to half the
// node timeout, 5s.
//
// It fails t, saying which node is not there, if that takes longer than
// 20s. It fails t at once in a cluster without replicas, and when it would
// replace a master that an earlier Failover replaced less than twice the
// node timeout (20s) before: the masters would not vote for it. So a range
// may be failed over and straight back, but not over once more within 20s
// of the first.
func (c *Cluster) Failover(t testing.TB, i int) {
	t.Helper()
	if len(c.replicas) == 0 {
		t.Fatalf("servers: fail over slot range %d: the cluster has no replicas; start it with StartReplicatedCluster", i)
	}
	checkRange(t, i)
	if err := c.failover(i); err != nil {
		t.Fatalf("servers: fail over slot range %d (slots %d-%d): %v", i, slotRanges[i][0], slotRanges[i][1], err)
	}
}

func (c *Cluster) failover(i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), formTimeout)
	defer cancel()
	admins := openAdmins(c.all())
	defer admins.close()

	shards, err := c.shards(ctx, admins)
	if err != nil {
		return err
	}
	from, to := shards[i].master, shards[i].replica
	if err := c.mayReplace(ctx, admins[from], from); err != nil {
		return err
	}
	// The failover would time out in the replica, and nothing would say
	// so, if the replica lagged behind the paused master or a master did
	// not know it as a replica of from and so did not vote for it.
	if err := c.converge(ctx, admins, shards); err != nil {
		return fmt.Errorf("before the failover: %w", err)
	}
	if err := admins[to].Do(ctx, "cluster", "failover").Err(); err != nil {
		return fmt.Errorf("%s: CLUSTER FAILOVER: %w", to.Addr(), err)
	}
	shards[i] = shard{master: to, replica: from}
	if err := c.converge(ctx, admins, shards); err != nil {
		return fmt.Errorf("from %s to %s: %w", from.Addr(), to.Addr(), err)
	}
	if c.replaced == nil {
		c.replaced = map[*Redis]time.Time{}
	}
	c.replaced[from] = time.Now()
	return nil
}

// mayReplace returns an error if Failover replaced master too recently for
// the masters to vote for replacing it again: each votes to replace a given
// master at most once in twice the node timeout, which cl, master's client,
// reports.
func (c *Cluster) mayReplace(ctx context.Context, cl *redis.Client, master *Redis) error {
	last, ok := c.replaced[master]
	if !ok {
		return nil
	}
	conf, err := cl.ConfigGet(ctx, "cluster-node-timeout").Result()
	if err != nil {
		return fmt.Errorf("%s: CONFIG GET cluster-node-timeout: %w", master.Addr(), err)
	}
	ms, err := strconv.Atoi(conf["cluster-node-timeout"])
	if err != nil {
		return fmt.Errorf("%s: CONFIG GET cluster-node-timeout = %v: %w", master.Addr(), conf, err)
	}
	interval := 2 * time.Duration(ms) * time.Millisecond
	if since := time.Since(last); since < interval {
		return fmt.Errorf("%s was replaced as master %v ago; the masters vote to replace a master at most once in %v (twice cluster-node-timeout)",
			master.Addr(), since.Round(time.Millisecond), interval)
	}
	return nil
}

// checkRange fails t unless i is the index of a slot range.
func checkRange(t testing.TB, i int) {
	t.Helper()
	if i < 0 || i >= len(slotRanges) {
		t.Fatalf("servers: slot range %d: the cluster has ranges 0 to %d", i, len(slotRanges)-1)
	}
}

// all returns every node, the masters as started first.
func (c *Cluster) all() []*Redis {
	return slices.Concat(c.masters, c.replicas)
}

// rangeNodes returns the nodes of the i-th slot range, the master as
// started first.
func (c *Cluster) rangeNodes(i int) []*Redis {
	nodes := []*Redis{c.masters[i]}
	if len(c.replicas) > 0 {
		nodes = append(nodes, c.replicas[i])
	}
	return nodes
}

// initial returns the shards as started, the i-th serving the i-th range.
func (c *Cluster) initial() []shard {
	shards := make([]shard, len(c.masters))
	for i, m := range c.masters {
		shards[i].master = m
		if len(c.replicas) > 0 {
			shards[i].replica = c.replicas[i]
		}
	}
	return shards
}

// addr returns the address n announces to clients and to the other nodes:
// its proxy's in a proxied cluster, its own otherwise.
func (c *Cluster) addr(n *Redis) string {
	if p, ok := c.proxies[n]; ok {
		return p.Addr()
	}
	return n.Addr()
}

// form gives each master its slots, introduces the nodes to each other,
// makes each replica follow its master and waits until they all agree on
// the shards as started. In a proxied cluster each node first announces its
// proxy's port as its own.
func (c *Cluster) form() error {
	ctx, cancel := context.WithTimeout(context.Background(), formTimeout)
	defer cancel()
	nodes := c.all()
	admins := openAdmins(nodes)
	defer admins.close()

	for n, p := range c.proxies {
		if err := admins[n].ConfigSet(ctx, "cluster-announce-port", strconv.Itoa(p.Port())).Err(); err != nil {
			return fmt.Errorf("%s: CONFIG SET cluster-announce-port %d: %w", n.Addr(), p.Port(), err)
		}
	}
	for i, m := range c.masters {
		lo, hi := slotRanges[i][0], slotRanges[i][1]
		if err := admins[m].Do(ctx, "cluster", "addslotsrange", lo, hi).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE %d %d: %w", m.Addr(), lo, hi, err)
		}
	}
	// The bus port is passed explicitly because it is not port+10000.
	for _, n := range nodes[1:] {
		if err := admins[nodes[0]].Do(ctx, "cluster", "meet", "127.0.0.1", n.port, n.busPort).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER MEET %s: %w", nodes[0].Addr(), n.Addr(), err)
		}
	}
	for i, r := range c.replicas {
		if err := replicate(ctx, admins, r, c.masters[i]); err != nil {
			return err
		}
	}
	return c.converge(ctx, admins, c.initial())
}

// replicate makes replica follow master. CLUSTER REPLICATE names the master
// by its node ID, which replica knows only once gossip has brought it, so
// it waits until then.
func replicate(ctx context.Context, admins adminClients, replica, master *Redis) error {
	id, err := admins[master].Do(ctx, "cluster", "myid").Text()
	if err != nil {
		return fmt.Errorf("%s: CLUSTER MYID: %w", master.Addr(), err)
	}
	return poll(ctx, func() (string, error) {
		err := admins[replica].Do(ctx, "cluster", "replicate", id).Err()
		switch {
		case err == nil:
			return "", nil
		case strings.HasPrefix(err.Error(), "ERR Unknown node"):
			return fmt.Sprintf("%s does not know %s (node %s)", replica.Addr(), master.Addr(), id), nil
		default:
			return "", fmt.Errorf("%s: CLUSTER REPLICATE %s (%s): %w", replica.Addr(), id, master.Addr(), err)
		}
	})
}

// converge waits until every node agrees on shards, the i-th of which
// serves the i-th slot range.
func (c *Cluster) converge(ctx context.Context, admins adminClients, shards []shard) error {
	return poll(ctx, func() (string, error) { return c.pending(ctx, admins, shards) })
}

// pending describes the first node that does not yet agree on shards, or
// returns "" when none is left. A node must report cluster_state:ok and map
// every range to its shard's master: before it does, a client may get
// CLUSTERDOWN from it or be sent to the wrong node. It must also know each
// replica as its master's: the masters vote on a failover to a replica by
// what they know of it. A replica must be linked to its master and in
// sync: before it is, it would time out a coordinated failover to it.
func (c *Cluster) pending(ctx context.Context, admins adminClients, shards []shard) (string, error) {
	owners := make([]string, len(shards))
	for i, s := range shards {
		owners[i] = c.addr(s.master)
	}
	for _, n := range c.all() {
		cl, addr := admins[n], n.Addr()
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
		if pending, err := c.knowsReplicas(ctx, n, cl, shards); pending != "" || err != nil {
			return pending, err
		}
	}
	for _, s := range shards {
		if s.replica == nil {
			continue
		}
		if pending, err := c.following(ctx, admins[s.replica], s); pending != "" || err != nil {
			return pending, err
		}
	}
	return "", nil
}

// knowsReplicas describes the first of shards' replicas that node n, whose
// client cl is, does not know as a replica of its shard's master, or
// returns "" if it knows them all.
func (c *Cluster) knowsReplicas(ctx context.Context, n *Redis, cl *redis.Client, shards []shard) (string, error) {
	if len(c.replicas) == 0 {
		return "", nil
	}
	nodes, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("%s: CLUSTER NODES: %w", n.Addr(), err)
	}
	view := parseClusterNodes(nodes)
	for _, s := range shards {
		if s.replica == nil {
			continue
		}
		r, m := view[c.addr(s.replica)], view[c.addr(s.master)]
		if !slices.Contains(r.flags, "slave") || r.master != m.id {
			return fmt.Sprintf("%s does not know %s as a replica of %s: CLUSTER NODES\n%s", n.Addr(), s.replica.Addr(), s.master.Addr(), nodes), nil
		}
	}
	return "", nil
}

// following describes how s.replica falls short of being linked to
// s.master and in sync, or returns "" if it does not.
func (c *Cluster) following(ctx context.Context, cl *redis.Client, s shard) (string, error) {
	addr := s.replica.Addr()
	info, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return "", fmt.Errorf("%s: INFO replication: %w", addr, err)
	}
	fields := infoFields(info)
	master := fields["master_host"] + ":" + fields["master_port"]
	if fields["role"] != "slave" || master != c.addr(s.master) || fields["master_link_status"] != "up" {
		return fmt.Sprintf("%s has role:%s, master %s, master_link_status:%s; want role:slave, master %s, master_link_status:up",
			addr, fields["role"], master, fields["master_link_status"], c.addr(s.master)), nil
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

// clusterNode is what a line of CLUSTER NODES says about a node.
type clusterNode struct {
	id     string
	flags  []string // such as myself, master, slave, fail?
	master string   // the ID of the node's master; "" for a master
}

// parseClusterNodes returns the nodes a CLUSTER NODES reply lists, by the
// address they announce.
func parseClusterNodes(reply string) map[string]clusterNode {
	nodes := map[string]clusterNode{}
	for line := range strings.Lines(reply) {
		// <id> <ip:port@cport[,hostname]> <flags> <master> ...
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := clusterNode{id: f[0], flags: strings.Split(f[2], ",")}
		if f[3] != "-" {
			n.master = f[3]
		}
		nodes[addr] = n
	}
	return nodes
}

// shards asks the nodes of each slot range which of them is its master now.
func (c *Cluster) shards(ctx context.Context, admins adminClients) ([]shard, error) {
	shards := make([]shard, len(slotRanges))
	for i := range shards {
		s, err := c.shard(ctx, admins, i)
		if err != nil {
			return nil, fmt.Errorf("slot range %d: %w", i, err)
		}
		shards[i] = s
	}
	return shards, nil
}

// shard asks the nodes of the i-th slot range which of them is its master
// now; it is an error unless exactly one says so.
func (c *Cluster) shard(ctx context.Context, admins adminClients, i int) (shard, error) {
	var (
		s       shard
		masters []string
	)
	for _, n := range c.rangeNodes(i) {
		role, err := role(ctx, admins[n])
		if err != nil {
			return shard{}, fmt.Errorf("%s: ROLE: %w", n.Addr(), err)
		}
		if role == "master" {
			s.master, masters = n, append(masters, n.Addr())
		} else {
			s.replica = n
		}
	}
	if len(masters) != 1 {
		return shard{}, fmt.Errorf("want one master among %v, have %d: %v", addrsOf(c.rangeNodes(i)), len(masters), masters)
	}
	return s, nil
}

// role returns the role the server says it has: master, slave or sentinel.
func role(ctx context.Context, cl *redis.Client) (string, error) {
	reply, err := cl.Do(ctx, "role").Slice()
	if err != nil {
		return "", err
	}
	if len(reply) == 0 {
		return "", errors.New("empty reply")
	}
	role, ok := reply[0].(string)
	if !ok {
		return "", fmt.Errorf("reply %v does not start with a role", reply)
	}
	return role, nil
}

// poll calls check every 50ms until it reports nothing pending, fails, or
// ctx ends; the error then says what was still pending.
func poll(ctx context.Context, check func() (pending string, err error)) error {
	var last string
	for {
		pending, err := check()
		switch {
		case err != nil && ctx.Err() != nil && last != "":
			// The deadline cut a check short; say what the last one found.
			return fmt.Errorf("not converged within %v: %s", formTimeout, last)
		case err != nil || pending == "":
			return err
		}
		last = pending
		select {
		case <-ctx.Done():
			return fmt.Errorf("not converged within %v: %s", formTimeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// infoFields returns the "field:value" lines of an INFO reply as a map.
func infoFields(info string) map[string]string {
	fields := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields
}

// addrsOf returns the nodes' addresses, in order.
func addrsOf(nodes []*Redis) []string {
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// adminClients are admin clients, one per node, for one setup step.
type adminClients map[*Redis]*redis.Client

// openAdmins returns an admin client for each node.
func openAdmins(nodes []*Redis) adminClients {
	a := adminClients{}
	for _, n := range nodes {
		a[n] = adminClient(n.Addr())
	}
	return a
}

func (a adminClients) close() {
	for _, cl := range a {
		cl.Close()
	}
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
