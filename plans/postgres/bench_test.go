package postgres

import (
	"context"
	"testing"
)

// BenchmarkLookup measures one Lookup, a single query round trip, of a
// subject on a plan with two bandwidths.
func BenchmarkLookup(b *testing.B) {
	s, _ := newStore(b)
	putPlan(b, s, proPlan())
	assign(b, s, "tenant-42", "pro")
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Lookup(ctx, "tenant-42"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Lookup(ctx, "tenant-42"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
