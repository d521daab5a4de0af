package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
)

// BenchmarkMiddleware is the cost the middleware adds to a request, on the
// in-memory backend: "bare" is the handler alone, the baseline; "allowed"
// and "rejected" go through the middleware (a bucket that never runs out,
// and one that is always empty); "decision" is the limiter call alone,
// which the middleware's own share is the rest of.
func BenchmarkMiddleware(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	roomy := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(1_000_000).WithBurst(1 << 40).WithID("burst"),
		ratelimit.PerHour(1_000_000_000).WithID("hourly"),
	}}
	empty := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerHour(1).WithID("burst").WithInitialTokens(0),
	}}
	run := func(b *testing.B, h http.Handler) {
		b.ReportAllocs()
		r := httptest.NewRequest("GET", "/v1/items/1", nil)
		w := &discard{h: http.Header{}}
		for b.Loop() {
			clear(w.h)
			h.ServeHTTP(w, r)
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, ok) })
	for _, tc := range []struct {
		name string
		cfg  ratelimit.Config
	}{{"allowed", roomy}, {"rejected", empty}} {
		b.Run(tc.name, func(b *testing.B) {
			mw, err := httplimit.New(ratelimit.New(memory.New()), httplimit.WithConfig(tc.cfg))
			if err != nil {
				b.Fatal(err)
			}
			run(b, mw(ok))
		})
	}
	b.Run("decision", func(b *testing.B) {
		b.ReportAllocs()
		l := ratelimit.New(memory.New())
		for b.Loop() {
			if _, err := l.Allow(b.Context(), "rl:-:default:-:ip:192.0.2.1", roomy); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// discard is a ResponseWriter that keeps nothing but its headers.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}
