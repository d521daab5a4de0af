package redisscript

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Shard is one entry of a CLUSTER SHARDS reply, as an adapter read it from
// its client's own decoding.
type Shard struct {
	// Slots are the shard's ranges, as pairs of first and last slot.
	Slots [][2]int64
	Nodes []ShardNode
}

// ShardNode is one node of a [Shard].
type ShardNode struct {
	Endpoint, IP  string
	Port, TLSPort int64
	Role, Health  string
}

// Masters turns a CLUSTER SHARDS reply into the cluster's masters, sorted
// by address: of each shard that serves slots, its node whose role is
// master (an online one, if there are two), addressed as clients address
// it (see nodeAddr). A shard with slots but no master (mid-failover) is an
// error, as is a slot range out of bounds.
func Masters(shards []Shard) ([]ratelimit.Master, error) {
	var masters []ratelimit.Master
	for _, s := range shards {
		if len(s.Slots) == 0 {
			continue
		}
		m := ratelimit.Master{}
		for _, n := range s.Nodes {
			// A master that is not online may be the one just failed
			// over from: the online one wins.
			if n.Role == "master" && (m.Addr == "" || n.Health == "online") {
				m.Addr = nodeAddr(n)
			}
		}
		if m.Addr == "" {
			return nil, fmt.Errorf("CLUSTER SHARDS: a shard serving slots %v has no master", s.Slots)
		}
		for _, r := range s.Slots {
			if r[0] < 0 || r[0] > r[1] || r[1] >= ratelimit.NumSlots {
				return nil, fmt.Errorf("CLUSTER SHARDS: slot range %d-%d is out of bounds", r[0], r[1])
			}
			m.Slots = append(m.Slots, ratelimit.SlotRange{First: int(r[0]), Last: int(r[1])})
		}
		slices.SortFunc(m.Slots, func(a, b ratelimit.SlotRange) int { return cmp.Compare(a.First, b.First) })
		masters = append(masters, m)
	}
	slices.SortFunc(masters, func(a, b ratelimit.Master) int { return cmp.Compare(a.Addr, b.Addr) })
	return masters, nil
}

// nodeAddr is the address clients use for n: its endpoint (what the node
// announces), or its IP when it announces none, and its port, or its TLS
// port when it has no plain one.
func nodeAddr(n ShardNode) string {
	host := n.Endpoint
	if host == "" || host == "?" {
		host = n.IP
	}
	port := n.Port
	if port == 0 {
		port = n.TLSPort
	}
	return net.JoinHostPort(host, strconv.FormatInt(port, 10))
}

// topologyRefresh is how old a [Topology]'s slot map may grow, counted
// from the end of the load that made it, before a call to Node starts
// loading it again; a failed load is tried again as long after it ended.
const topologyRefresh = time.Second

// topologyTimeout bounds one load of a [Topology]'s slot map.
const topologyTimeout = 2 * time.Second

// Topology is a cluster's slot map, as a backend's Node reads it: loaded
// with CLUSTER SHARDS through the user's client, in the background, and
// again once it is older than a second, so that Node never waits for I/O
// and a failover shows within about a second of the cluster agreeing on
// it. It is safe for concurrent use. At most one background load runs at
// a time, and fetch is given a context that ends it within two seconds;
// nothing else outlives a call. Its zero value is not usable; make one
// with [NewTopology].
type Topology struct {
	fetch   func(context.Context) ([]ratelimit.Master, error)
	table   atomic.Pointer[slotTable]
	loading atomic.Bool  // a background load is running
	due     atomic.Int64 // ns since 1970 from which Node loads the map again
}

// slotTable maps each slot to the index in addrs of its master, plus one;
// 0 for a slot no master serves.
type slotTable struct {
	owner [ratelimit.NumSlots]uint16
	addrs []string
}

// newSlotTable maps the slots of masters. It skips slots out of bounds,
// which [Masters] lets none through, rather than panic in a load.
func newSlotTable(masters []ratelimit.Master) *slotTable {
	tab := &slotTable{}
	for i, m := range masters {
		tab.addrs = append(tab.addrs, m.Addr)
		for _, r := range m.Slots {
			for s := max(r.First, 0); s <= min(r.Last, ratelimit.NumSlots-1); s++ {
				tab.owner[s] = uint16(i + 1)
			}
		}
	}
	return tab
}

// node returns the address of slot's master, or "".
func (tab *slotTable) node(slot int) string {
	if tab == nil || slot < 0 || slot >= ratelimit.NumSlots || tab.owner[slot] == 0 {
		return ""
	}
	return tab.addrs[tab.owner[slot]-1]
}

// NewTopology returns a Topology that loads the masters with fetch.
func NewTopology(fetch func(context.Context) ([]ratelimit.Master, error)) *Topology {
	return &Topology{fetch: fetch}
}

// Node returns the address of the master that serves slot, by the map as
// it is when Node is called: "" until the map has loaded (or if no master
// serves the slot). It starts a load in the background when the map is
// due one, and never waits for it.
func (t *Topology) Node(slot int) string {
	addr := t.table.Load().node(slot)
	if time.Now().UnixNano() >= t.due.Load() && t.loading.CompareAndSwap(false, true) {
		go t.load()
	}
	return addr
}

// load reads the masters once, in the background, and keeps the map if
// it loaded; a failed load leaves the last map, to be tried again when due.
func (t *Topology) load() {
	defer t.loading.Store(false) // after due is set, so no Node loads again at once
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	if _, err := t.Masters(ctx); err != nil {
		t.postpone()
	}
}

// Masters reads the masters with fetch and, if that succeeds, keeps them
// as the map Node reads, which is then not due for a reload for a second.
func (t *Topology) Masters(ctx context.Context) ([]ratelimit.Master, error) {
	masters, err := t.fetch(ctx)
	if err != nil {
		return nil, err
	}
	t.table.Store(newSlotTable(masters))
	t.postpone()
	return masters, nil
}

// postpone makes the next load due topologyRefresh from now.
func (t *Topology) postpone() {
	t.due.Store(time.Now().Add(topologyRefresh).UnixNano())
}
