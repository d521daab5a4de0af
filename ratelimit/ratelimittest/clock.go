package ratelimittest

import (
	"sync"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Clock is a fake clock that the suite moves by hand. It implements
// [ratelimit.Clock] and is safe for concurrent use. Its time has no
// monotonic reading, so backends that convert it with [time.Time.UnixMicro]
// see exactly what the suite set.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that reads start until it is advanced.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start.Round(0)}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (backward if d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var _ ratelimit.Clock = (*Clock)(nil)

// wallClock reads the real time; the suite hands it to ServerClock harnesses,
// which may ignore it.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }
