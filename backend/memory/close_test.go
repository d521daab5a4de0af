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
	// ...when Close runs to the end.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	var d ratelimit.Decision
	err := m.decide(&d, key, found{}, &cfg, &ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}, now)
	if err != ErrClosed || d.Allowed {
		t.Errorf("the call after Close: %+v, %v; want ErrClosed", d, err)
	}
	if n, held := m.Len(), m.buckets.Size(); n != 0 || held != 0 {
		t.Errorf("Len %d and %d buckets in the map after Close and every call returned; want 0", n, held)
	}
}

// TestDroppedBucketIsNotDecided: a call that looked a bucket up before
// another call dropped it (its bucket was full again) does not decide on
// it, which no later call would see, but looks the key up again. The
// interleaving is made by hand, so it always happens.
func TestDroppedBucketIsNotDecided(t *testing.T) {
	m := New(WithClock(fixedClock{time.Unix(1e9, 0)}), WithSweepInterval(0))
	defer m.Close()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3)}}
	consume := &ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	const key = "k"
	now := m.now()
	var d ratelimit.Decision
	if err := m.decide(&d, key, found{}, &cfg, consume, now); err != nil || !d.Allowed {
		t.Fatalf("first Consume: %+v, %v", d, err)
	}
	// One call has looked the bucket up, and read its word...
	b, ok := m.buckets.Load(key)
	if !ok {
		t.Fatal("no bucket after a Consume")
	}
	l, v := b.publishedFor(&cfg)
	if l == nil {
		t.Fatal("the bucket is not published after a Consume")
	}
	// ...when another fills it again, which drops it.
	if err := m.decide(&d, key, found{}, &cfg, &ratelimit.Request{Op: ratelimit.Add, Tokens: 1}, now); err != nil {
		t.Fatal(err)
	}
	if _, held := m.buckets.Load(key); held || m.Len() != 0 {
		t.Fatalf("a bucket filled again is still held (Len %d)", m.Len())
	}
	// The first call goes on: it must not decide on the dropped bucket,
	// under its lock or without.
	d = ratelimit.Decision{}
	if m.decideOn(&d, key, b, &cfg, consume, now) {
		t.Fatalf("decided %+v on a dropped bucket", d)
	}
	if r := decideFast(&d, b, l, v, 1, now); r != gone {
		t.Fatalf("decideFast on a dropped bucket = %d, want gone", r)
	}
	if d != (ratelimit.Decision{}) {
		t.Fatalf("decision %+v written by a call that did not decide", d)
	}
	// Its next lookup finds no bucket and starts a full one.
	if err := m.decide(&d, key, found{}, &cfg, consume, now); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("Consume after the drop: %+v, %v; want allowed with 2 left", d, err)
	}
}
