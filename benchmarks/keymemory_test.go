package benchmarks

import (
	"context"
	"runtime"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/benchmarks/internal/measure"
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
	before := measure.LiveHeap()
	allow := im.start(b, allowAll)
	for i := range manyKeys {
		if ok, err := allow(ctx, "user:"+strconv.Itoa(i)); err != nil || !ok {
			b.Fatalf("allow = %v, %v; want allowed", ok, err)
		}
	}
	after := measure.LiveHeap()
	runtime.KeepAlive(allow)
	return float64(int64(after)-int64(before)) / manyKeys
}
