package ratelimit

import (
	"math"
	"math/bits"
)

// applyBucket is Apply for [TokenBucket].
func applyBucket(d *Decision, s *State, cfg *Config, req *Request, now int64) {
	fp := cfg.Fingerprint()
	switch {
	case len(s.Bands) == 0 || req.Op == Reset || now >= s.ExpiresAt || s.Algorithm != cfg.Algorithm:
		s.init(cfg, fp, now)
	case req.Op == Replace || s.Fingerprint != fp:
		s.convert(cfg, fp, req.Strategy, now)
	}
	bws := cfg.Bandwidths
	for i := range bws {
		refill(&bws[i], &s.Bands[i], now)
	}

	d.Allowed = true
	binding := -1 // the bandwidth with the fewest tokens left
	switch req.Op {
	case Reset, Replace:
	case Add:
		for i := range s.Bands {
			st := &s.Bands[i]
			full := st.Capacity * st.Scale
			// Cap the count at what fills the bandwidth, debt included, so
			// that scaling it cannot overflow; capping at Capacity would
			// leave a bandwidth in debt short of full.
			st.Level = min(full, st.Level+min(req.Tokens, ceilDiv(full-st.Level, st.Scale))*st.Scale)
			if st.Level == full && now > st.Stamp {
				// As in refill: a full bandwidth has no current period; the
				// next starts when it is drawn again.
				st.Stamp = periodStart(&bws[i], now)
			}
		}
	default:
		m := bucketMeter{s, bws, now}
		binding = decide(d, req, m)
	}
	s.settle(d, bws, binding, now)
}

// bucketMeter is a token bucket's state as decide asks of it.
type bucketMeter struct {
	s   *State
	bws []Bandwidth
	now int64
}

func (m bucketMeter) wait(n int64) (int64, int) { return m.s.waitFor(m.bws, n, m.now) }
func (m bucketMeter) room() int64               { return m.s.available() }
func (m bucketMeter) take(n int64)              { m.s.take(n) }
func (m bucketMeter) lend(n int64) bool         { return m.s.canLend(m.bws, n) }

// init makes s the state of a new bucket for cfg.
func (s *State) init(cfg *Config, fp uint64, now int64) {
	if cap(s.Bands) < len(cfg.Bandwidths) {
		s.Bands = make([]BandState, len(cfg.Bandwidths))
	}
	s.Bands = s.Bands[:len(cfg.Bandwidths)]
	for i := range cfg.Bandwidths {
		s.Bands[i] = fresh(&cfg.Bandwidths[i], now)
	}
	s.Fingerprint, s.Algorithm, s.Log = fp, cfg.Algorithm, nil
}

func fresh(b *Bandwidth, now int64) BandState {
	scale, rate := b.Units()
	return BandState{ID: b.ID, Capacity: b.Capacity, Scale: scale, Rate: rate, Level: b.Initial() * scale, Stamp: periodStart(b, now)}
}

// convert rebuilds s for cfg, carrying tokens over with strategy.
func (s *State) convert(cfg *Config, fp uint64, strategy Inheritance, now int64) {
	old := s.Bands
	s.Bands = make([]BandState, len(cfg.Bandwidths))
	for i := range cfg.Bandwidths {
		b := &cfg.Bandwidths[i]
		s.Bands[i] = fresh(b, now)
		j := match(old, b.ID, i)
		if strategy == ResetTokens || j < 0 {
			continue
		}
		o, nb := &old[j], &s.Bands[i]
		nb.Level = inherit(o, nb, ceilDiv(minLevel(b, nb), nb.Scale), strategy)
		nb.Stamp = periodStart(b, o.Stamp)
	}
	s.Fingerprint = fp
}

// inherit returns the level, in nb's scaled units, that a bandwidth keeps
// when its state goes from o to nb's capacity and scale, and at least
// least tokens (its debt limit). Proportionally scales the exact level,
// fraction included, by the ratio of the capacities and rounds down once,
// to nb's scaled unit; the other strategies carry whole tokens.
func inherit(o, nb *BandState, least int64, strategy Inheritance) int64 {
	if strategy == Proportionally {
		return max(mulDivFloor(o.Level, nb.Capacity*nb.Scale, o.Capacity*o.Scale), least*nb.Scale)
	}
	tokens := min(floorDiv(o.Level, o.Scale), nb.Capacity)
	if strategy == Additive {
		tokens += max(0, nb.Capacity-o.Capacity)
	}
	return max(tokens, least) * nb.Scale
}

// refill brings st up to now.
func refill(b *Bandwidth, st *BandState, now int64) {
	elapsed := now - st.Stamp
	if elapsed <= 0 {
		return
	}
	full := st.Capacity * st.Scale
	if st.Level >= full {
		st.Stamp = periodStart(b, now)
		return
	}
	if b.Refill == Greedy {
		if hi, lo := bits.Mul64(uint64(elapsed), uint64(st.Rate)); hi != 0 || lo >= uint64(full-st.Level) {
			st.Level = full
		} else {
			st.Level += int64(lo)
		}
		st.Stamp = now
		return
	}
	period := b.PeriodMicros()
	periods := elapsed / period
	if periods == 0 {
		return
	}
	if periods >= ceilDiv(full-st.Level, st.Rate) {
		st.Level, st.Stamp = full, periodStart(b, now)
		return
	}
	st.Level += periods * st.Rate
	st.Stamp += periods * period
}

// timeTo returns the µs from now until st holds level scaled units,
// assuming nothing is taken meanwhile; 0 if it already does.
func timeTo(b *Bandwidth, st *BandState, level, now int64) int64 {
	short := level - st.Level
	if short <= 0 {
		return 0
	}
	if b.Refill == Greedy {
		return ceilDiv(short, st.Rate) + max(0, st.Stamp-now)
	}
	return st.Stamp + ceilDiv(short, st.Rate)*b.PeriodMicros() - now
}

// minLevel is the lowest level a bandwidth may reach by reservations: it
// must refill to full within maxHorizon µs and stay within MaxScaled units of
// debt.
func minLevel(b *Bandwidth, st *BandState) int64 {
	full := st.Capacity * st.Scale
	if b.Refill != Greedy {
		return max(-MaxScaled, full-maxHorizon/b.PeriodMicros()*st.Rate)
	}
	hi, lo := bits.Mul64(maxHorizon, uint64(st.Rate))
	if hi != 0 || lo >= uint64(full+MaxScaled) {
		return -MaxScaled
	}
	return full - int64(lo)
}

// waitFor returns the µs until every bandwidth holds n tokens, and the index
// of the bandwidth that takes longest.
func (s *State) waitFor(bws []Bandwidth, n, now int64) (wait int64, slowest int) {
	for i := range bws {
		if w := s.bandWait(bws, i, n, now); w > wait {
			wait, slowest = w, i
		}
	}
	return wait, slowest
}

// bandWait returns the µs until bandwidth i holds n tokens.
func (s *State) bandWait(bws []Bandwidth, i int, n, now int64) int64 {
	st := &s.Bands[i]
	return timeTo(&bws[i], st, n*st.Scale, now)
}

// canLend reports whether n tokens may be taken on credit: within every
// bandwidth's debt limit.
func (s *State) canLend(bws []Bandwidth, n int64) bool {
	for i := range bws {
		st := &s.Bands[i]
		if st.Level-n*st.Scale < minLevel(&bws[i], st) {
			return false
		}
	}
	return true
}

func (s *State) take(n int64) {
	for i := range s.Bands {
		s.Bands[i].Level -= n * s.Bands[i].Scale
	}
}

// available is the whole tokens every bandwidth can give now.
func (s *State) available() int64 {
	n := int64(math.MaxInt64)
	for i := range s.Bands {
		n = min(n, remaining(&s.Bands[i]))
	}
	return n
}

func remaining(st *BandState) int64 {
	if st.Level <= 0 {
		return 0
	}
	return st.Level / st.Scale
}

// settle completes d from the state as it now is: Limit, Remaining,
// Bandwidth and RefillAfter of the binding bandwidth (the one with the
// fewest tokens left when binding is -1), and ResetAfter; and records when
// s expires.
func (s *State) settle(d *Decision, bws []Bandwidth, binding int, now int64) {
	var resetAfter int64
	b, least := binding, int64(math.MaxInt64)
	for i := range bws {
		st := &s.Bands[i]
		if r := remaining(st); binding < 0 && r < least {
			b, least = i, r
		}
		resetAfter = max(resetAfter, timeTo(&bws[i], st, st.Capacity*st.Scale, now))
	}
	st := &s.Bands[b]
	d.Limit, d.Remaining, d.Bandwidth = st.Capacity, remaining(st), bandName(bws, b)
	if d.Remaining < d.Limit {
		d.RefillAfter = micros(s.bandWait(bws, b, d.Remaining+1, now))
	}
	d.ResetAfter = micros(resetAfter)
	s.ExpiresAt = now + resetAfter + s.warmup(bws, now)
}

// warmup is how long a bucket created at now takes to fill: 0 unless some
// bandwidth starts below capacity. s was built for bws, so its scales and
// rates are a new bucket's, and no gcd is computed per call.
func (s *State) warmup(bws []Bandwidth, now int64) int64 {
	var w int64
	for i := range bws {
		b := &bws[i]
		if b.Initial() == b.Capacity {
			continue
		}
		st := s.Bands[i]
		st.Level, st.Stamp = b.Initial()*st.Scale, periodStart(b, now)
		w = max(w, timeTo(b, &st, st.Capacity*st.Scale, now))
	}
	return w
}
