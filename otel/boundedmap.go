package otel

import (
	"maps"
	"sync"
	"sync/atomic"
)

// boundedMap is a map of at most max entries that decisions read with one
// atomic load and no lock: a write copies it, under mu. Its entries are
// made once per key and never dropped, so it suits a few hundred keys
// read on every decision.
type boundedMap[K comparable, V any] struct {
	m   atomic.Pointer[map[K]V]
	mu  sync.Mutex
	max int
}

func newBoundedMap[K comparable, V any](max int) *boundedMap[K, V] {
	b := &boundedMap[K, V]{max: max}
	b.m.Store(&map[K]V{})
	return b
}

// load returns k's value, made with make and kept if k is new; false if k
// is new and the map is full, without calling make.
func (b *boundedMap[K, V]) load(k K, make func() V) (V, bool) {
	if v, ok := (*b.m.Load())[k]; ok {
		return v, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old := *b.m.Load()
	if v, ok := old[k]; ok {
		return v, true
	}
	if len(old) >= b.max {
		var zero V
		return zero, false
	}
	v := make()
	m := maps.Clone(old)
	m[k] = v
	b.m.Store(&m)
	return v, true
}

// all returns the entries; the map is not to be written.
func (b *boundedMap[K, V]) all() map[K]V { return *b.m.Load() }
