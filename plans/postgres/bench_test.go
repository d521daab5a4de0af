package postgres

import (
	"context"
	"strconv"
	"sync/atomic"
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

// BenchmarkAssign measures one Assign, a write that draws a version and
// notifies, committed: serially, and from parallel goroutines, each moving
// a subject of its own, so that they contend only where the store makes
// writers wait for one another.
func BenchmarkAssign(b *testing.B) {
	s, _ := newStore(b)
	putPlan(b, s, proPlan())
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Assign(ctx, "tenant-42", "pro"); err != nil {
				b.Fatal(err)
			}
		}
	})
	var next atomic.Int64
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			subject := "tenant-" + strconv.FormatInt(next.Add(1), 10)
			for pb.Next() {
				if _, err := s.Assign(ctx, subject, "pro"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
