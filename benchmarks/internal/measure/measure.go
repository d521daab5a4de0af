// Package measure reads what the benchmarks and cmd/scaleplan report of
// this process: its CPU time and its live heap.
package measure

import (
	"math"
	"runtime"
)

// LiveHeap returns the bytes of heap objects that survive collections. It
// collects until the heap stops shrinking: an object with a finalizer (the
// stores of an earlier op that stop a cleaning goroutine so) survives the
// first collection, and freed during a later measurement it would be taken
// off that one's bytes.
func LiveHeap() uint64 {
	var m runtime.MemStats
	last := uint64(math.MaxUint64)
	for range 10 {
		runtime.GC()
		runtime.ReadMemStats(&m)
		if m.HeapAlloc >= last {
			break
		}
		last = m.HeapAlloc
		runtime.Gosched() // let the finalizers run
	}
	return last
}
