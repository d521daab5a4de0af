package ratelimit

import "time"

// meter is an algorithm's state brought up to now, as decide asks of it:
// wait(n), the µs until every bandwidth can give n tokens and the index of
// the one that takes longest; room(), the whole tokens every bandwidth can
// give now; take(n), which takes n from every bandwidth; and lend(n),
// whether n may be taken on credit (false for the algorithms that cannot
// reserve). Each algorithm's file implements it on a small struct, and
// decide is generic over it: each algorithm gets its own copy of decide,
// which calls the methods directly, with nothing allocated per call (an
// interface value would escape to the heap, method values are built on
// every call).
type meter interface {
	wait(n int64) (wait int64, slowest int)
	room() int64
	take(n int64)
	lend(n int64) bool
}

// decide applies a Consume, Estimate, Inspect, ConsumeUpTo or Reserve as
// every algorithm decides them, on m.
//
// decide sets d's Allowed, Consumed and RetryAfter, and returns the index
// of the bandwidth a denial binds, or -1. d.Allowed must be true on entry.
func decide[M meter](d *Decision, req *Request, m M) (binding int) {
	n := req.Tokens
	switch req.Op {
	case Inspect:
		n = 1
	case ConsumeUpTo:
		if n = min(n, m.room()); n > 0 {
			m.take(n)
			d.Consumed = n
			return -1
		}
		n = 1 // none: denied as a Consume of 1 would be
	}
	wait, slowest := m.wait(n)
	switch {
	case req.Op == Consume && wait == 0, req.Op == Reserve && wait <= int64(req.MaxWait/time.Microsecond) && m.lend(n):
		m.take(n)
		d.Consumed, d.RetryAfter = n, micros(wait)
	case wait > 0:
		d.Allowed, d.RetryAfter = false, micros(wait)
		return slowest
	}
	return -1
}
