package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

func TestConformance(t *testing.T) {
	ratelimittest.Run(t, ratelimittest.Harness{
		Permits: true,
		New: func(t *testing.T, c ratelimit.Clock) ratelimit.Backend {
			b := memory.New(memory.WithClock(c))
			t.Cleanup(func() { b.Close() })
			return b
		},
	})
}

// TestConformanceRealClock runs the suite as the Redis backends do on the
// server's clock: the memory backend keeps its own monotonic clock, and the
// suite moves time by sleeping and checks durations against bounds. It keeps
// that mode of the suite honest without a Redis server.
func TestConformanceRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps about half a second")
	}
	ratelimittest.Run(t, ratelimittest.Harness{
		Permits:     true,
		ServerClock: true,
		New: func(t *testing.T, _ ratelimit.Clock) ratelimit.Backend {
			b := memory.New()
			t.Cleanup(func() { b.Close() })
			return b
		},
	})
}
