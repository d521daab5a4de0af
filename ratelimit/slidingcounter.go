package ratelimit

import "math"

// applyCounter is [Apply] for the [SlidingWindowCounter]. A bandwidth of
// Capacity C per period W µs counts requests in windows of W aligned to
// the Unix epoch, [kW, (k+1)W), and keeps, in its [BandState]:
//
//   - Level: cur, the requests counted in the current window;
//   - Prev: prev, those counted in the window before it;
//   - Stamp: the current window's start, a multiple of W;
//   - Scale: W, the period in µs, the weight of one request in the weighted
//     count below; a config change compares it to see the period change;
//   - ID and Capacity, as in a token bucket. Rate is unused.
//
// When the clock reaches the next window, cur becomes prev and the count
// starts at 0; two windows on, both are 0. e = now − Stamp µs into the
// window, the sliding window is estimated as cur + prev·(W−e)/W, and n
// requests pass iff on every bandwidth prev·(W−e) + (cur+n)·W ≤ C·W, that
// is, n ≤ ⌊((C−cur)·W − prev·(W−e))/W⌋, the requests it has room for.
// Validate keeps C·W within 2^53 and cur and prev stay within C, so both
// products are exact, in Go and in Lua's doubles. A clock behind Stamp (a
// store failing over to a replica) reads as the window's start, e = 0, and
// waits and expiry are measured to the same instants as before: it moves
// no request's due time.
//
// The weighted count only falls as time passes (at a window boundary it is
// cur·W on both sides), so the wait for n is exact: the first e at which
// prev·(W−e) ≤ (C−cur−n)·W, in this window when cur+n ≤ C, else in the
// next, where cur weighs in as prev. A bandwidth is full again, and the
// state the same as an absent bucket's, once both counts have rolled out:
// two windows after Stamp if cur > 0, one if only prev > 0.
func applyCounter(d *Decision, s *State, cfg *Config, req *Request, now int64) {
	fp := cfg.Fingerprint()
	switch {
	case len(s.Bands) == 0 || req.Op == Reset || now >= s.ExpiresAt || s.Algorithm != cfg.Algorithm:
		counterInit(s, cfg, fp, now)
	case req.Op == Replace || s.Fingerprint != fp || len(s.Bands) != len(cfg.Bandwidths):
		counterConvert(s, cfg, fp, req.Strategy, now)
	}
	bands := s.Bands
	for i := range bands {
		counterRoll(&bands[i], now)
	}

	d.Allowed = true
	binding := -1 // the bandwidth with the fewest requests left
	switch req.Op {
	case Add:
		for i := range bands {
			bands[i].Level = max(0, bands[i].Level-req.Tokens)
		}
	case Reset, Replace:
	default:
		m := counterMeter{bands, now}
		binding = decide(d, req, m)
	}
	counterSettle(s, d, cfg.Bandwidths, binding, now)
}

// counterInit makes s the state of a new bucket for cfg: nothing counted.
func counterInit(s *State, cfg *Config, fp uint64, now int64) {
	if cap(s.Bands) < len(cfg.Bandwidths) {
		s.Bands = make([]BandState, len(cfg.Bandwidths))
	}
	s.Bands = s.Bands[:len(cfg.Bandwidths)]
	for i := range cfg.Bandwidths {
		s.Bands[i] = counterFresh(&cfg.Bandwidths[i], now)
	}
	s.Fingerprint, s.Algorithm, s.Log = fp, cfg.Algorithm, nil
}

func counterFresh(b *Bandwidth, now int64) BandState {
	w := b.PeriodMicros()
	return BandState{ID: b.ID, Capacity: b.Capacity, Scale: w, Stamp: now - now%w}
}

// counterConvert rebuilds s for cfg. A bandwidth matched in the old state
// keeps its counts as of now, each trimmed to the new Capacity, unless the
// strategy is ResetTokens. If its period changed, the old windows do not
// line up with the new: the old current window's count goes into the new
// current window, and the previous window's is dropped.
func counterConvert(s *State, cfg *Config, fp uint64, strategy Inheritance, now int64) {
	old := s.Bands
	s.Bands = make([]BandState, len(cfg.Bandwidths))
	for i := range cfg.Bandwidths {
		b := &cfg.Bandwidths[i]
		nb := &s.Bands[i]
		*nb = counterFresh(b, now)
		j := match(old, b.ID, i)
		if strategy == ResetTokens || j < 0 {
			continue
		}
		o := old[j]
		counterRoll(&o, now)
		nb.Level = min(o.Level, b.Capacity)
		if o.Scale == nb.Scale {
			nb.Prev, nb.Stamp = min(o.Prev, b.Capacity), o.Stamp
		}
	}
	s.Fingerprint = fp
}

// counterRoll moves st to the window that holds now, if now is past its
// current one.
func counterRoll(st *BandState, now int64) {
	w := st.Scale
	if now < st.Stamp+w {
		return
	}
	if now < st.Stamp+2*w {
		st.Prev = st.Level
	} else {
		st.Prev = 0
	}
	st.Level, st.Stamp = 0, now-now%w
}

// counterRoom is how many requests st admits now: the whole part of
// C − cur − prev·(W−e)/W, at least 0.
func counterRoom(st *BandState, now int64) int64 {
	w := st.Scale
	e := max(0, now-st.Stamp)
	x := (st.Capacity-st.Level)*w - st.Prev*(w-e)
	if x <= 0 {
		return 0
	}
	return x / w
}

// counterDue is when st first admits n requests if nothing is taken
// meanwhile; now if it does now. n is at most Capacity.
func counterDue(st *BandState, n, now int64) int64 {
	if n <= counterRoom(st, now) {
		return now
	}
	c, w := st.Capacity, st.Scale
	if st.Level+n <= c {
		// In this window, once prev·(W−e) ≤ (C−cur−n)·W; prev > 0, or n
		// would fit.
		return st.Stamp + w - (c-st.Level-n)*w/st.Prev
	}
	// In the next, where cur weighs in as prev: once
	// cur·(W−e) ≤ (C−n)·W; cur > C−n ≥ 0.
	return st.Stamp + 2*w - (c-n)*w/st.Level
}

// counterMeter is a SlidingWindowCounter bucket's state as decide asks of
// it.
type counterMeter struct {
	bands []BandState
	now   int64
}

// wait returns the µs until every bandwidth admits n requests, and the
// index of the bandwidth that takes longest.
func (m counterMeter) wait(n int64) (wait int64, slowest int) {
	for i := range m.bands {
		if w := counterDue(&m.bands[i], n, m.now) - m.now; w > wait {
			wait, slowest = w, i
		}
	}
	return wait, slowest
}

func (m counterMeter) room() int64 {
	n := int64(math.MaxInt64)
	for i := range m.bands {
		n = min(n, counterRoom(&m.bands[i], m.now))
	}
	return n
}

func (m counterMeter) take(n int64) {
	for i := range m.bands {
		m.bands[i].Level += n
	}
}

func (counterMeter) lend(int64) bool { return false }

// counterEmptyAt is when st's counts have both rolled out; 0 if they have.
func counterEmptyAt(st *BandState) int64 {
	switch {
	case st.Level > 0:
		return st.Stamp + 2*st.Scale
	case st.Prev > 0:
		return st.Stamp + st.Scale
	}
	return 0
}

// counterSettle completes d from the state as it now is: Limit,
// Remaining, Bandwidth and RefillAfter of the binding bandwidth (the one
// with the fewest requests left when binding is -1), and ResetAfter; and
// records when s expires.
func counterSettle(s *State, d *Decision, bws []Bandwidth, binding int, now int64) {
	expires := now
	b, least := binding, int64(math.MaxInt64)
	for i := range s.Bands {
		st := &s.Bands[i]
		if r := counterRoom(st, now); binding < 0 && r < least {
			b, least = i, r
		}
		expires = max(expires, counterEmptyAt(st))
	}
	st := &s.Bands[b]
	d.Limit, d.Remaining, d.Bandwidth = st.Capacity, counterRoom(st, now), bandName(bws, b)
	if d.Remaining < d.Limit {
		d.RefillAfter = micros(counterDue(st, d.Remaining+1, now) - now)
	}
	d.ResetAfter = micros(expires - now)
	s.ExpiresAt = expires
}
