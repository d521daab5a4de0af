package ratelimit

import "context"

// Optional capabilities: what only some backends can do is an interface of
// its own, found by type assertion, as in database/sql/driver. The Redis
// backends implement all three; the memory backend none. A decorator
// implements them by asking the Backend it wraps, and says "unknown" when
// that one cannot tell.

// NumSlots is the number of Redis Cluster hash slots.
const NumSlots = 16384

// SlotMapper is implemented by a [Backend] that keeps each bucket on one
// Redis Cluster hash slot.
type SlotMapper interface {
	// Slot returns the hash slot (0 to [NumSlots]-1) that the bucket at key
	// lives on, and true; or false when the backend cannot tell (a
	// decorator over a backend without slots). It does no I/O, and for a
	// given backend it is the same in every process: it depends on the key
	// and the key layout, never on the cluster's topology.
	Slot(key string) (slot int, ok bool)
}

// NodeLocator is implemented by a [Backend] that can tell which store
// node serves a key, so that a decorator can keep per-node state (a
// circuit breaker per Redis Cluster master, say).
type NodeLocator interface {
	// Node names the node that serves the bucket at key, as far as the
	// backend knows now: for a Redis Cluster, the address of the master
	// that owns the key's slot. It returns "" when the backend cannot
	// tell (a standalone server, or a topology not yet loaded). It does no
	// I/O and must be fast: decorators call it on every decision.
	Node(key string) string
}

// TopologyReporter is implemented by a [Backend] whose store is a Redis
// Cluster and that can report its masters.
type TopologyReporter interface {
	// Masters asks the store for its masters and the slots each serves,
	// sorted by address. It returns an error wrapping
	// [errors.ErrUnsupported] when the store is not a cluster, and the
	// store sentinels ([ErrBackendUnavailable], [ErrTimeout]) or the
	// context's error as [Backend.Do] does.
	Masters(ctx context.Context) ([]Master, error)
}

// Master is one master of a Redis Cluster, as a [TopologyReporter] sees it.
type Master struct {
	// Addr is the master's address as the client knows it.
	Addr string
	// Slots are the slot ranges the master serves, in order.
	Slots []SlotRange
}

// SlotRange is the hash slots First to Last, both included.
type SlotRange struct {
	First, Last int
}

// Owner returns the index in masters of the one that serves slot, or -1.
func Owner(masters []Master, slot int) int {
	for i, m := range masters {
		for _, r := range m.Slots {
			if r.First <= slot && slot <= r.Last {
				return i
			}
		}
	}
	return -1
}
