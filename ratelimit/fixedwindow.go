package ratelimit

import "math"

// applyFixedWindow is [Apply] for [FixedWindow]. A bucket counts, per
// bandwidth, the requests taken in its current window: in each BandState,
// ID is the bandwidth's, Level the count and Stamp the window's start in
// µs; the other fields stay zero.
//
// A bandwidth with a count of 0 has no window, and a Stamp of 0: the next
// request that takes tokens opens one, starting at now, or with
// IntervalAligned refill at the boundary at or before now. Estimate,
// Inspect and denials open none. A window of RefillPeriod W is over, its
// count 0, once now ≥ Stamp + W; a clock that steps back before Stamp
// leaves it standing. The state expires when the last window ends, at
// now + ResetAfter: with every count 0 it is the same as an absent bucket.
//
// While the clock moves forward, this decides exactly as a TokenBucket
// whose bandwidths have Interval refill (IntervalAligned for aligned
// windows) of RefillTokens = Capacity: its Interval periods start when a
// full bandwidth is first drawn, as these windows do.
func applyFixedWindow(d *Decision, s *State, cfg *Config, req *Request, now int64) {
	fp := cfg.Fingerprint()
	switch {
	case len(s.Bands) == 0 || req.Op == Reset || now >= s.ExpiresAt || s.Algorithm != FixedWindow:
		s.emptyWindows(cfg, fp)
	case req.Op == Replace || s.Fingerprint != fp:
		s.carryWindows(cfg, fp, req.Strategy)
	}
	bws := cfg.Bandwidths
	for i := range bws {
		if st := &s.Bands[i]; st.Level > 0 && now >= windowEnd(&bws[i], st) {
			st.Level, st.Stamp = 0, 0
		}
	}

	d.Allowed = true
	binding := -1 // the bandwidth with the fewest requests left
	switch req.Op {
	case Add:
		// A refund: the requests counted drop by Tokens. A count that
		// reaches 0 closes its window, as if it had never opened.
		for i := range s.Bands {
			st := &s.Bands[i]
			st.Level = max(0, st.Level-req.Tokens)
			if st.Level == 0 {
				st.Stamp = 0
			}
		}
	case Reset, Replace:
	default:
		m := windowMeter{s, bws, now}
		binding = decide(d, req, m)
	}
	s.settleWindows(d, bws, binding, now)
}

// emptyWindows makes s the state of a new FixedWindow bucket for cfg:
// nothing counted.
func (s *State) emptyWindows(cfg *Config, fp uint64) {
	if cap(s.Bands) < len(cfg.Bandwidths) {
		s.Bands = make([]BandState, len(cfg.Bandwidths))
	}
	s.Bands = s.Bands[:len(cfg.Bandwidths)]
	for i := range cfg.Bandwidths {
		s.Bands[i] = BandState{ID: cfg.Bandwidths[i].ID}
	}
	s.Fingerprint, s.Algorithm, s.Log = fp, FixedWindow, nil
}

// carryWindows rebuilds s for cfg as the Inheritance doc says of window
// algorithms: a matched bandwidth keeps its count, trimmed to the new
// Capacity, and its window's start, so that the window now ends a new
// RefillPeriod after it; an IntervalAligned bandwidth moves the start back
// to its own boundary at or before it, as a token bucket's Interval period
// does. A window that so ends by now is over, and one that so ends later
// stands, even if the old period had ended it: as a token bucket refills
// at the new rate since it was last touched, the state keeps no old
// period. ResetTokens, or no match, leaves a bandwidth empty.
func (s *State) carryWindows(cfg *Config, fp uint64, strategy Inheritance) {
	old := s.Bands
	s.Bands = make([]BandState, len(cfg.Bandwidths))
	for i := range cfg.Bandwidths {
		b := &cfg.Bandwidths[i]
		s.Bands[i] = BandState{ID: b.ID}
		j := match(old, b.ID, i)
		if strategy == ResetTokens || j < 0 || old[j].Level == 0 {
			continue
		}
		s.Bands[i].Level, s.Bands[i].Stamp = min(old[j].Level, b.Capacity), periodStart(b, old[j].Stamp)
	}
	s.Fingerprint = fp
}

// windowEnd is when the window of st, which has one, is over.
func windowEnd(b *Bandwidth, st *BandState) int64 { return st.Stamp + b.PeriodMicros() }

// windowMeter is a FixedWindow bucket's state as decide asks of it.
type windowMeter struct {
	s   *State
	bws []Bandwidth
	now int64
}

// wait is the µs until every bandwidth has room for n more requests. A
// bandwidth without room has a window (n is at most its capacity), and it
// empties when that window ends.
func (m windowMeter) wait(n int64) (wait int64, slowest int) {
	for i := range m.bws {
		if w := windowWait(&m.bws[i], &m.s.Bands[i], n, m.now); w > wait {
			wait, slowest = w, i
		}
	}
	return wait, slowest
}

// windowWait is the µs until st has room for n more requests: 0 if it has,
// else the end of its window (n is at most its capacity).
func windowWait(b *Bandwidth, st *BandState, n, now int64) int64 {
	if st.Level+n <= b.Capacity {
		return 0
	}
	return windowEnd(b, st) - now
}

// room is how many more requests every bandwidth admits now.
func (m windowMeter) room() int64 {
	n := int64(math.MaxInt64)
	for i := range m.bws {
		n = min(n, m.bws[i].Capacity-m.s.Bands[i].Level)
	}
	return n
}

// take counts n requests in every bandwidth, opening the windows of those
// that have none.
func (m windowMeter) take(n int64) {
	for i := range m.bws {
		st := &m.s.Bands[i]
		if st.Level == 0 {
			st.Stamp = periodStart(&m.bws[i], m.now)
		}
		st.Level += n
	}
}

func (windowMeter) lend(int64) bool { return false }

// settleWindows completes d as settle does for a token bucket: Limit,
// Remaining, Bandwidth and RefillAfter of the binding bandwidth (the one
// with the fewest requests left when binding is -1), ResetAfter (when the
// last window ends); and records when s expires.
func (s *State) settleWindows(d *Decision, bws []Bandwidth, binding int, now int64) {
	var resetAfter int64
	b, least := binding, int64(math.MaxInt64)
	for i := range bws {
		st := &s.Bands[i]
		if left := bws[i].Capacity - st.Level; binding < 0 && left < least {
			b, least = i, left
		}
		if st.Level > 0 {
			resetAfter = max(resetAfter, windowEnd(&bws[i], st)-now)
		}
	}
	d.Limit, d.Remaining, d.Bandwidth = bws[b].Capacity, bws[b].Capacity-s.Bands[b].Level, bandName(bws, b)
	if d.Remaining < d.Limit {
		d.RefillAfter = micros(windowWait(&bws[b], &s.Bands[b], d.Remaining+1, now))
	}
	d.ResetAfter = micros(resetAfter)
	s.ExpiresAt = now + resetAfter
}
