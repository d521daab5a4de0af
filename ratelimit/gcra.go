package ratelimit

import "math"

// GCRA and LeakyBucket share this file: the leaky bucket as a meter is the
// generic cell rate algorithm seen from the bucket's side, and decides the
// same. Only the State's Algorithm tells their buckets apart.
//
// A bandwidth has an emission interval T = Scale/Rate µs per token (whole
// or not) and a theoretical arrival time (TAT): when it is full again if
// nothing more is taken. A request of n tokens conforms at now when
//
//	max(TAT, now) + n×T − now ≤ Capacity×T
//
// and then moves the TAT to max(TAT, now) + n×T. Every bandwidth must
// conform; none moves otherwise.
//
// The TAT is kept in the token bucket's form, with the token bucket's
// meanings: Level scaled units at Stamp, so that
//
//	TAT = Stamp + (Capacity×Scale − Level)/Rate
//
// exactly, in scaled units, with ID, Capacity, Scale and Rate the
// bandwidth's. Stamp is the latest time the bucket has seen. The level
// form, rather than the TAT's whole µs and fraction, is what a config
// change needs: the tokens carry over as for a token bucket (the whole
// tokens held at Stamp, then the time since refills at the new rate), and
// the Redis scripts can store whole tokens in the old bandwidth's units,
// where reading tokens off a TAT would take the old rate too, which their
// layout has no room for.
//
// While the clock moves forward (Stamp ≤ now), the conformance test above
// is the token bucket's, so GCRA decides exactly as a TokenBucket with
// Greedy refill and leaves the same state. When the clock steps back
// behind Stamp, GCRA keeps to its TAT: the lag Stamp − now counts against
// every request, where the token bucket would let the tokens held at
// Stamp be taken at once; and Add moves the TAT back by n×T but not before
// Stamp.

// applyGCRA is [Apply] for [GCRA] and [LeakyBucket].
func applyGCRA(s *State, cfg Config, req Request, now int64) (d Decision) {
	fp := cfg.Fingerprint()
	switch {
	case len(s.Bands) == 0 || req.Op == Reset || now >= s.ExpiresAt || s.Algorithm != cfg.Algorithm:
		s.init(cfg, fp, now)
	case req.Op == Replace || s.Fingerprint != fp:
		s.convert(cfg, fp, req.Strategy, now)
	}
	bws := cfg.Bandwidths
	for i := range bws {
		refill(&bws[i], &s.Bands[i], now) // TAT = max(TAT, now)
	}

	d.Allowed = true
	binding := -1 // the bandwidth with the fewest tokens left
	switch req.Op {
	case Consume, Estimate, Reserve, Inspect:
		n := req.Tokens
		if req.Op == Inspect {
			n = 1
		}
		wait, slowest := s.conformWait(n, now)
		switch {
		case req.Op == Consume && wait == 0, req.Op == Reserve && s.canReserve(bws, n, wait, req.MaxWait):
			s.take(n)
			d.Consumed, d.RetryAfter = n, micros(wait)
		case wait > 0:
			d.Allowed, d.RetryAfter, binding = false, micros(wait), slowest
		}
	case ConsumeUpTo:
		if n := min(req.Tokens, s.conformable(now)); n > 0 {
			s.take(n)
			d.Consumed = n
		} else {
			wait, slowest := s.conformWait(1, now)
			d.Allowed, d.RetryAfter, binding = false, micros(wait), slowest
		}
	case Add:
		// The TAT moves back n×T, to Stamp at the earliest: the level
		// rises by n tokens, to full at most. Capping the count at what
		// fills the bandwidth keeps the product from overflowing.
		for i := range s.Bands {
			st := &s.Bands[i]
			full := st.Capacity * st.Scale
			st.Level = min(full, st.Level+min(req.Tokens, ceilDiv(full-st.Level, st.Scale))*st.Scale)
		}
	}
	s.settleTAT(&d, bws, binding, now)
	return d
}

// tatLag is how far the clock is behind the bandwidth's Stamp, in µs: 0 unless
// it stepped back. After refill, Stamp is never before now.
func tatLag(st *BandState, now int64) int64 { return st.Stamp - now }

// tatWait is the µs until st conforms n tokens:
// max(TAT, now) + n×T − now − Capacity×T, rounded up, or 0.
func tatWait(st *BandState, n, now int64) int64 {
	return max(0, tatLag(st, now)+ceilDiv(n*st.Scale-st.Level, st.Rate))
}

// tatRemaining is the whole tokens st conforms at now: ⌊Capacity − (TAT −
// now)/T⌋, or 0. The lag's product with the rate is formed only when it
// is at most the level, so it cannot overflow.
func tatRemaining(st *BandState, now int64) int64 {
	lagged := tatLag(st, now)
	if st.Level <= 0 || lagged > st.Level/st.Rate {
		return 0
	}
	return (st.Level - lagged*st.Rate) / st.Scale
}

// tatFull is the µs until st is full: TAT − now, rounded up.
func tatFull(st *BandState, now int64) int64 {
	return tatLag(st, now) + ceilDiv(st.Capacity*st.Scale-st.Level, st.Rate)
}

// conformWait returns the µs until every bandwidth conforms n tokens, and
// the index of the one that takes longest.
func (s *State) conformWait(n, now int64) (wait int64, slowest int) {
	for i := range s.Bands {
		if w := tatWait(&s.Bands[i], n, now); w > wait {
			wait, slowest = w, i
		}
	}
	return wait, slowest
}

// conformable is the whole tokens every bandwidth conforms now.
func (s *State) conformable(now int64) int64 {
	n := int64(math.MaxInt64)
	for i := range s.Bands {
		n = min(n, tatRemaining(&s.Bands[i], now))
	}
	return n
}

// settleTAT is settle for the TAT's conformance: it completes d with Limit,
// Remaining and Bandwidth of the binding bandwidth (the one with the fewest
// tokens left when binding is -1) and ResetAfter, the time until every TAT
// has passed; and records when s expires.
func (s *State) settleTAT(d *Decision, bws []Bandwidth, binding int, now int64) {
	var resetAfter int64
	least := int64(math.MaxInt64)
	for i := range s.Bands {
		st := &s.Bands[i]
		if r := tatRemaining(st, now); binding < 0 && r < least {
			least, d.Limit, d.Remaining, d.Bandwidth = r, st.Capacity, r, bandName(bws, i)
		}
		resetAfter = max(resetAfter, tatFull(st, now))
	}
	if binding >= 0 {
		st := &s.Bands[binding]
		d.Limit, d.Remaining, d.Bandwidth = st.Capacity, tatRemaining(st, now), bandName(bws, binding)
	}
	d.ResetAfter = micros(resetAfter)
	s.ExpiresAt = now + resetAfter + s.warmup(bws, now)
}
