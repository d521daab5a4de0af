package memory

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// TestCallRacingClose: a call that passed Do's check for Close before
// Close ran stores no bucket after it. The call is stopped at that point
// by hand, so the race always goes the losing way.
func TestCallRacingClose(t *testing.T) {
	m := New(WithClock(fixedClock{time.Unix(1e9, 0)}))
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}}
	const key = "k"
	// Do has checked m.closed and read the clock...
	now := m.now()
	sh := &m.shards[0]
	// ...when Close runs to the end.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	var d ratelimit.Decision
	sh.mu.Lock()
	err := m.apply(&d, sh, key, cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}, now)
	sh.mu.Unlock()
	if err != ErrClosed || d.Allowed {
		t.Errorf("the call after Close: %+v, %v; want ErrClosed", d, err)
	}
	if n, held := m.Len(), len(sh.buckets); n != 0 || held != 0 {
		t.Errorf("Len %d and %d buckets in the shard after Close and every call returned; want 0", n, held)
	}
}
