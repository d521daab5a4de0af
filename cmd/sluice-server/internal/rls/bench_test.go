package rls_test

import (
	"context"
	"strconv"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rls"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlsconfig"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlstest"
	"github.com/sluicehq/sluice/httplimit"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
)

// BenchmarkShouldRateLimit is the server's own cost of a decision, without
// gRPC: the lookup, the memory store behind sluice's otel layer (with no
// providers set, as the global ones are), the status and the headers, on
// 10,000 keys.
func BenchmarkShouldRateLimit(b *testing.B) {
	cfg, err := rlsconfig.Parse(rlsconfig.Source{Name: "b.yaml", Data: []byte(
		"domain: b\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n")})
	if err != nil {
		b.Fatal(err)
	}
	m := memory.New()
	b.Cleanup(func() { _ = m.Close() })
	var s *rls.Server
	backend := sluiceotel.Wrap(m, sluiceotel.WithKeyClass(func(key string) string { return s.Config().ClassOf(key) }))
	s, err = rls.New(cfg, rls.Options{
		Backend:         func(string, int) ratelimit.Backend { return backend },
		FailModes:       rlsconfig.FailModes,
		DefaultFailMode: "error",
		Headers:         httplimit.IETFHeaders,
	})
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*rlspb.RateLimitRequest, 10000)
	for i := range reqs {
		reqs[i] = rlstest.Request("b", []string{"client", "k" + strconv.Itoa(i)})
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if _, err := s.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
