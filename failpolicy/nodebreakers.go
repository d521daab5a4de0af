package failpolicy

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/ratelimit"
)

// MaxNodeBreakers is how many store nodes a [Backend] keeps a breaker of
// their own for. It is above Redis Cluster's recommended limit of 1000
// nodes, so that every master of a cluster has one, with room for the new
// addresses failovers bring; each takes about 150 bytes with its node's
// name. See the package doc for what happens beyond it.
const MaxNodeBreakers = 1024

// breakers are a Backend's circuit breakers: one per node that the next
// Backend's [ratelimit.NodeLocator] names, and a shared one for the keys
// whose node it cannot name, and for every key when it has no locator.
//
// The per-node breakers are in an immutable map that a call reads with
// one atomic load; a node not yet in it is added under mu, to a copy.
// New nodes are rare (a cluster has its masters, and a failover brings
// one new address), so the copies are too.
type breakers struct {
	shared    breaker
	locator   ratelimit.NodeLocator // nil: the shared breaker alone
	threshold int32
	coolDown  int64        // ns
	now       func() int64 // the Backend's clock, in ns

	nodes atomic.Pointer[map[string]*breaker] // never nil; replaced, never changed
	// sharedUsed is set once a call has used the shared breaker while
	// there is a locator, so that Breakers reports it.
	sharedUsed atomic.Bool
	// nextPurge is a time (ns) before which a new node that finds
	// MaxNodeBreakers breakers shares the shared breaker, without trying
	// to make room: room is made at most once a cool-down, so that a
	// locator naming more nodes than that cannot make every call copy the
	// map.
	nextPurge atomic.Int64

	mu sync.Mutex // for adding a node
}

// init sets up bs, in place: it holds atomics and a mutex.
func (bs *breakers) init(locator ratelimit.NodeLocator, threshold int32, coolDown int64, now func() int64) {
	bs.shared.threshold, bs.shared.coolDown = threshold, coolDown
	bs.locator, bs.threshold, bs.coolDown, bs.now = locator, threshold, coolDown, now
	bs.nodes.Store(&map[string]*breaker{})
}

// forKey returns the breaker for the node that serves key. It inlines,
// so that without a locator it costs a comparison.
func (bs *breakers) forKey(key string) *breaker {
	if bs.locator == nil {
		return &bs.shared
	}
	return bs.located(key)
}

// located returns the breaker of the node the locator names for key,
// adding one if there is room.
func (bs *breakers) located(key string) *breaker {
	node := bs.locator.Node(key)
	if node == "" {
		return bs.useShared()
	}
	nodes := *bs.nodes.Load()
	if br := nodes[node]; br != nil {
		return br
	}
	if len(nodes) >= MaxNodeBreakers && bs.now() < bs.nextPurge.Load() {
		return bs.useShared()
	}
	return bs.add(node)
}

// useShared returns the shared breaker, noting that it is in use.
func (bs *breakers) useShared() *breaker {
	if !bs.sharedUsed.Load() {
		bs.sharedUsed.Store(true)
	}
	return &bs.shared
}

// add adds a breaker for node and returns it. At [MaxNodeBreakers], it
// first drops the idle ones, if it has not tried within a cool-down; if
// it may not try, or none is idle, it returns the shared breaker.
func (bs *breakers) add(node string) *breaker {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	old := *bs.nodes.Load()
	if br := old[node]; br != nil {
		return br // added meanwhile
	}
	var m map[string]*breaker
	if len(old) < MaxNodeBreakers {
		m = make(map[string]*breaker, len(old)+1)
		maps.Copy(m, old)
	} else {
		// A call that took a dropped breaker before it was dropped may
		// still record on it; it was idle, so what it counts is at most
		// what that call saw.
		now := bs.now()
		if now < bs.nextPurge.Load() {
			return bs.useShared()
		}
		bs.nextPurge.Store(now + bs.coolDown)
		m = make(map[string]*breaker, len(old))
		for n, br := range old {
			if !br.idle(now) {
				m[n] = br
			}
		}
		if len(m) >= MaxNodeBreakers {
			return bs.useShared()
		}
	}
	br := &breaker{node: node, threshold: bs.threshold, coolDown: bs.coolDown}
	m[node] = br
	bs.nodes.Store(&m)
	return br
}

// states returns the state of each breaker, by node; the shared one, as
// "", only if it has been used or there is no locator.
func (bs *breakers) states() map[string]BreakerState {
	nodes := *bs.nodes.Load()
	states := make(map[string]BreakerState, len(nodes)+1)
	for n, br := range nodes {
		states[n] = br.current()
	}
	if bs.locator == nil || bs.sharedUsed.Load() {
		states[""] = bs.shared.current()
	}
	return states
}

// worst returns the most open state among the breakers: BreakerOpen over
// BreakerHalfOpen over BreakerClosed.
func (bs *breakers) worst() BreakerState {
	worst := bs.shared.current()
	for _, br := range *bs.nodes.Load() {
		if s := br.current(); openness(s) > openness(worst) {
			worst = s
		}
	}
	return worst
}

// openness ranks a state by how much of the store it keeps decisions
// from.
func openness(s BreakerState) int {
	switch s {
	case BreakerOpen:
		return 2
	case BreakerHalfOpen:
		return 1
	}
	return 0
}
