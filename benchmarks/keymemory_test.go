package benchmarks

import (
	"context"
	"math"
	"runtime"
	"strconv"
	"testing"
)

// BenchmarkKeyMemory measures the heap one key costs in each in-memory
// implementation of BenchmarkAllow: one op builds a fresh limiter on
// [allowAll], makes one decision on each of [manyKeys] new keys, and
// reports the live heap it then holds, after a collection, per key (B/key).
// Every key is a new string, as a request's key is, so an implementation
// that keeps the caller's key pays for its bytes.
func BenchmarkKeyMemory(b *testing.B) {
	for _, im := range impls {
		b.Run("impl="+im.name, func(b *testing.B) {
			var perKey float64
			for range b.N {
				perKey += keyMemory(b, im)
			}
			b.ReportMetric(perKey/float64(b.N), "B/key")
		})
	}
}

// keyMemory returns the live heap per key of a limiter of im that has
// decided on manyKeys keys.
func keyMemory(b *testing.B, im impl) float64 {
	ctx := context.Background()
	before := liveHeap()
	allow := im.start(b, allowAll)
	for i := range manyKeys {
		if ok, err := allow(ctx, "user:"+strconv.Itoa(i)); err != nil || !ok {
			b.Fatalf("allow = %v, %v; want allowed", ok, err)
		}
	}
	after := liveHeap()
	runtime.KeepAlive(allow)
	return float64(int64(after)-int64(before)) / manyKeys
}

// liveHeap returns the bytes of heap objects that survive collections. It
// collects until the heap stops shrinking: an object with a finalizer (the
// stores of an earlier op that stop a cleaning goroutine so) survives the
// first collection, and freed during a later measurement it would be taken
// off that limiter's bytes.
func liveHeap() uint64 {
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
