package ratelimit

import "time"

// decide applies a Consume, Estimate, Inspect, ConsumeUpTo or Reserve as
// every algorithm decides them, from the algorithm's own functions on its
// state brought up to now: waitFor(n), the µs until every bandwidth can
// give n tokens and the index of the one that takes longest; room(), the
// whole tokens every bandwidth can give now; take(n), which takes n from
// every bandwidth; and lend(n), whether n may be taken on credit (false
// for the algorithms that cannot reserve). Each algorithm's file keeps
// them as the methods of a small meter struct; passed as method values,
// only called, they cost no allocation.
//
// decide sets d's Allowed, Consumed and RetryAfter, and returns the index
// of the bandwidth a denial binds, or -1. d.Allowed must be true on entry.
func decide(d *Decision, req Request, waitFor func(n int64) (int64, int), room func() int64, take func(n int64), lend func(n int64) bool) (binding int) {
	n := req.Tokens
	switch req.Op {
	case Inspect:
		n = 1
	case ConsumeUpTo:
		if n = min(n, room()); n > 0 {
			take(n)
			d.Consumed = n
			return -1
		}
		n = 1 // none: denied as a Consume of 1 would be
	}
	wait, slowest := waitFor(n)
	switch {
	case req.Op == Consume && wait == 0, req.Op == Reserve && wait <= int64(req.MaxWait/time.Microsecond) && lend(n):
		take(n)
		d.Consumed, d.RetryAfter = n, micros(wait)
	case wait > 0:
		d.Allowed, d.RetryAfter = false, micros(wait)
		return slowest
	}
	return -1
}
