package sharding_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// BenchmarkPassThrough measures what the decorator adds to a key no rule
// matches, in one run: the memory backend bare, and behind a sharding
// decorator with a Keys rule and a Prefix rule that the key misses, on one
// goroutine (two on one key would measure the key's lock). The
// memory backend's own decision is a few hundred ns, so it shows the
// decorator's cost as plainly as any store can; internal/test/distributed's
// BenchmarkHotKey measures it on a Redis cluster.
//
//	go test -run '^$' -bench PassThrough -count 6 ./sharding | benchstat -col /backend -
func BenchmarkPassThrough(b *testing.B) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6).WithBurst(1 << 40)}}
	m := memory.New()
	b.Cleanup(func() { m.Close() })
	split, err := sharding.New(m, sharding.Keys(6, "global"), sharding.Prefix(3, "tenant:big:"))
	if err != nil {
		b.Fatal(err)
	}
	req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	for _, bc := range []struct {
		name    string
		backend ratelimit.Backend
	}{{"bare", m}, {"sharding", split}} {
		b.Run("backend="+bc.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.backend.Do(ctx, "tenant:small:42", cfg, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
