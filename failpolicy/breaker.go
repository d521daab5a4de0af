package failpolicy

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// BreakerState is the state of a [Backend]'s circuit breaker.
type BreakerState int32

const (
	// BreakerClosed: every decision goes to the store. It is the initial
	// state.
	BreakerClosed BreakerState = iota
	// BreakerOpen: after [WithBreaker]'s count of consecutive failures, no
	// decision goes to the store until the cool-down has passed; the mode
	// decides them all.
	BreakerOpen
	// BreakerHalfOpen: the cool-down has passed and one decision, the
	// probe, has gone to the store; the mode decides the others until it
	// answers. An answer closes the breaker; a failure opens it again for
	// another cool-down.
	BreakerHalfOpen
)

var breakerStateNames = [...]string{"BreakerClosed", "BreakerOpen", "BreakerHalfOpen"}

// String returns the state's Go name.
func (s BreakerState) String() string {
	if s >= 0 && int(s) < len(breakerStateNames) {
		return breakerStateNames[s]
	}
	return fmt.Sprintf("BreakerState(%d)", int32(s))
}

// breaker counts consecutive failures and decides which calls may go to
// the store, for one node of it or for the store as a whole (see
// breakers). Its fast path, a closed breaker without failures, is two
// atomic loads; the rest takes the mutex.
type breaker struct {
	node      string // the node it is kept for; "" for the shared one
	threshold int32
	coolDown  int64 // ns

	state    atomic.Int32 // a BreakerState
	failures atomic.Int32 // consecutive, while closed

	mu       sync.Mutex
	openedAt int64 // ns, on the Backend's clock
	probing  bool  // a probe is out
}

// transition is a change of state that the caller reports once it has
// let go of the mutex.
type transition struct {
	from, to BreakerState
}

// allow reports whether a call may go to the store, and whether it is the
// half-open breaker's probe. now reads the clock, in ns; a closed breaker
// does not ask it.
func (b *breaker) allow(now func() int64) (ok, probe bool, t transition) {
	if BreakerState(b.state.Load()) == BreakerClosed {
		return true, false, t
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch BreakerState(b.state.Load()) {
	case BreakerClosed:
		return true, false, t
	case BreakerOpen:
		if now()-b.openedAt < b.coolDown {
			return false, false, t
		}
		t = b.set(BreakerHalfOpen)
	}
	if b.probing {
		return false, false, t
	}
	b.probing = true
	return true, true, t
}

// succeeded records that the store answered a call.
func (b *breaker) succeeded(probe bool) (t transition) {
	if !probe && b.failures.Load() == 0 && BreakerState(b.state.Load()) == BreakerClosed {
		return t
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures.Store(0)
	if probe {
		b.probing = false
		t = b.set(BreakerClosed)
	}
	return t
}

// failed records that a call failed at now (ns).
func (b *breaker) failed(probe bool, now int64) (t transition) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case probe:
		b.probing = false
		b.openedAt = now
		t = b.set(BreakerOpen)
	case BreakerState(b.state.Load()) == BreakerClosed:
		// Calls that were out when the breaker opened count for nothing.
		if b.failures.Add(1) >= b.threshold {
			b.failures.Store(0)
			b.openedAt = now
			t = b.set(BreakerOpen)
		}
	}
	return t
}

// abandoned records that a probe ended without a verdict (its caller gave
// up), so that the next call may probe.
func (b *breaker) abandoned(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// current returns the breaker's state.
func (b *breaker) current() BreakerState {
	return BreakerState(b.state.Load())
}

// idle reports whether the breaker holds nothing worth keeping at now
// (ns): it is closed with no failure counted, or it is open and no call
// has come for it since its cool-down ended (the next would have made it
// half-open), as when a failover gave its node's slots to another.
func (b *breaker) idle(now int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch BreakerState(b.state.Load()) {
	case BreakerClosed:
		return b.failures.Load() == 0
	case BreakerOpen:
		return now-b.openedAt >= b.coolDown
	}
	return false // a probe is out
}

// set changes the state, with b.mu held.
func (b *breaker) set(to BreakerState) transition {
	from := BreakerState(b.state.Swap(int32(to)))
	return transition{from, to}
}
