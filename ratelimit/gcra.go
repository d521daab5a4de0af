package ratelimit

import (
	"math"
	"math/bits"
	"slices"
)

// GCRA and LeakyBucket share this file: the leaky bucket as a meter is the
// generic cell rate algorithm seen from the bucket's side, and decides the
// same. Only the State's Algorithm tells their buckets apart.
//
// A bandwidth emits a token every T = Scale/Rate µs, whole or not, and its
// state is one theoretical arrival time (TAT): when it is full again if
// nothing more is taken. In its BandState, Stamp is the TAT's whole µs and
// Level its fraction f, 0 ≤ f < Rate, in 1/Rate µs, so that TAT = Stamp +
// f/Rate exactly; ID, Capacity, Scale and Rate are the bandwidth's. A new
// bucket's TAT is now + (Capacity − InitialTokens)×T: it holds
// InitialTokens.
//
// At now a bandwidth is ahead = max(TAT − now, 0)×Rate scaled units short
// of full; a clock that steps back finds its TAT further ahead, and that
// counts (GCRA's own rule, no special case). With Capacity×Scale the burst
// in scaled units:
//
//   - n tokens conform iff ahead + n×Scale ≤ Capacity×Scale, and otherwise
//     after ⌈(ahead + n×Scale − Capacity×Scale)/Rate⌉ µs;
//   - taking them moves the TAT to max(TAT, now) + n×T;
//   - Remaining is ⌊(Capacity×Scale − ahead)/Scale⌋, at least 0, and
//     ConsumeUpTo takes the least Remaining of the bandwidths;
//   - the bandwidth is full after ⌈ahead/Rate⌉ µs (ResetAfter), and the
//     state expires as [State.ExpiresAt] says;
//   - Add moves the TAT back n×T, but not before now: a refund;
//   - Reserve takes on credit if, once taken, every TAT is at most
//     maxHorizon µs ahead of now and ahead ≤ Capacity×Scale + MaxScaled:
//     the token bucket's debt limits.
//
// A request that takes nothing leaves the TATs as they are. While the clock
// moves forward and the config does not change, a token bucket with Greedy
// refill that holds Capacity×Scale − ahead scaled units decides by the same
// rules, so GCRA decides exactly as a TokenBucket with Greedy refill,
// reservations included.
//
// A config change (or Replace) keeps each bandwidth's arrival time, as
// redis_rate and redis-cell do: a bandwidth matched by ID, or by position
// when neither has one, is full again when it would have been, whatever
// the Strategy but ResetTokens, which starts it afresh. The TAT is rounded
// up to a whole µs (its fraction counts in the old rate) and brought back,
// if need be, within the new bandwidth's debt limits. A bandwidth with no
// match starts as in a new bucket.

// applyGCRA is [Apply] for [GCRA] and [LeakyBucket].
func applyGCRA(d *Decision, s *State, cfg *Config, req *Request, now int64) {
	fp := cfg.Fingerprint()
	switch {
	case len(s.Bands) == 0 || req.Op == Reset || now >= s.ExpiresAt || s.Algorithm != cfg.Algorithm:
		s.newTATs(cfg, fp, now)
	case req.Op == Replace || s.Fingerprint != fp:
		s.carryTATs(cfg, fp, req.Strategy, now)
	}
	bws := cfg.Bandwidths

	d.Allowed = true
	binding := -1 // the bandwidth with the fewest tokens left
	switch req.Op {
	case Add:
		for i := range s.Bands {
			tatRefund(&s.Bands[i], req.Tokens, now)
		}
	case Reset, Replace:
	default:
		m := tatMeter{s, bws, now}
		binding = decide(d, req, m)
	}
	s.settleTATs(d, bws, binding, now)
}

// newTATs makes s the state of a new bucket for cfg.
func (s *State) newTATs(cfg *Config, fp uint64, now int64) {
	n := len(cfg.Bandwidths)
	s.Bands = slices.Grow(s.Bands[:0], n)[:n]
	for i := range cfg.Bandwidths {
		s.Bands[i] = newTAT(&cfg.Bandwidths[i], now)
	}
	s.Fingerprint, s.Algorithm, s.Log = fp, cfg.Algorithm, nil
}

// newTAT is b in a new bucket: its TAT (Capacity − InitialTokens)×T after
// now.
func newTAT(b *Bandwidth, now int64) BandState {
	scale, rate := b.Units()
	ahead := (b.Capacity - b.Initial()) * scale
	return BandState{ID: b.ID, Capacity: b.Capacity, Scale: scale, Rate: rate, Level: ahead % rate, Stamp: now + ahead/rate}
}

// carryTATs rebuilds s for cfg, keeping each matched bandwidth's TAT as
// the file comment says.
func (s *State) carryTATs(cfg *Config, fp uint64, strategy Inheritance, now int64) {
	old := s.Bands
	s.Bands = make([]BandState, len(cfg.Bandwidths))
	for i := range cfg.Bandwidths {
		b := &cfg.Bandwidths[i]
		st := newTAT(b, now)
		if j := match(old, b.ID, i); j >= 0 && strategy != ResetTokens {
			tat := old[j].Stamp
			if old[j].Level > 0 {
				tat++ // a fraction in the old rate's units, rounded up
			}
			st.Stamp, st.Level = min(tat, now+maxAhead(b, &st)/st.Rate), 0
		}
		s.Bands[i] = st
	}
	s.Fingerprint = fp
}

// maxAhead is how far ahead of now, in scaled units, a reservation or a
// config change may leave st's TAT: as far below full as the token
// bucket's debt limit, minLevel, lets a level go.
func maxAhead(b *Bandwidth, st *BandState) int64 {
	return st.Capacity*st.Scale - minLevel(b, st)
}

// tatAhead is max(TAT − now, 0)×Rate, how far st is from full in scaled
// units; math.MaxInt64 where that passes 2^62, beyond every limit it is
// compared with (only a clock far behind the TAT gets there).
func tatAhead(st *BandState, now int64) int64 {
	if st.Stamp < now {
		return 0 // the TAT, before Stamp + 1, has passed
	}
	hi, lo := bits.Mul64(uint64(st.Stamp-now), uint64(st.Rate))
	if hi != 0 || lo > 1<<62 {
		return math.MaxInt64
	}
	return int64(lo) + st.Level
}

// tatWait is the µs until st conforms n tokens, ⌈(ahead + n×Scale −
// Capacity×Scale)/Rate⌉ or 0, summed from the TAT's whole µs ahead and
// the rest so that no lag is multiplied by the rate. A TAT that has passed
// leaves a sum of at most 0.
func tatWait(st *BandState, n, now int64) int64 {
	return max(0, st.Stamp-now+ceilDiv(st.Level+(n-st.Capacity)*st.Scale, st.Rate))
}

// tatRemaining is the whole tokens st conforms at now.
func tatRemaining(st *BandState, now int64) int64 {
	if left := st.Capacity*st.Scale - tatAhead(st, now); left > 0 {
		return left / st.Scale
	}
	return 0
}

// tatTake moves st's TAT to max(TAT, now) + n×T, for n×Scale up to
// Capacity×Scale.
func tatTake(st *BandState, n, now int64) {
	if st.Stamp < now {
		st.Stamp, st.Level = now, 0
	}
	f := st.Level + n*st.Scale
	st.Stamp, st.Level = st.Stamp+f/st.Rate, f%st.Rate
}

// tatRefund moves st's TAT back n×T, but not before now, for any n ≥ 1:
// n×Scale is divided by Rate in 128 bits.
func tatRefund(st *BandState, n, now int64) {
	lag := st.Stamp - now
	hi, lo := bits.Mul64(uint64(n), uint64(st.Scale))
	if lag < 0 || hi >= uint64(st.Rate) {
		st.Stamp, st.Level = now, 0 // passed already, or n×T is 2^64µs or more
		return
	}
	a, b := bits.Div64(hi, lo, uint64(st.Rate)) // n×T = a + b/Rate µs
	if a > uint64(lag) {
		st.Stamp, st.Level = now, 0
		return
	}
	st.Stamp, st.Level = st.Stamp-int64(a), st.Level-int64(b)
	if st.Level < 0 {
		st.Stamp, st.Level = st.Stamp-1, st.Level+st.Rate
	}
	if st.Stamp < now {
		st.Stamp, st.Level = now, 0
	}
}

// tatMeter is a GCRA bucket's state as decide asks of it: a bandwidth can
// give the tokens that conform.
type tatMeter struct {
	s   *State
	bws []Bandwidth
	now int64
}

func (m tatMeter) wait(n int64) (wait int64, slowest int) {
	for i := range m.s.Bands {
		if w := tatWait(&m.s.Bands[i], n, m.now); w > wait {
			wait, slowest = w, i
		}
	}
	return wait, slowest
}

func (m tatMeter) room() int64 {
	n := int64(math.MaxInt64)
	for i := range m.s.Bands {
		n = min(n, tatRemaining(&m.s.Bands[i], m.now))
	}
	return n
}

func (m tatMeter) take(n int64) {
	for i := range m.s.Bands {
		tatTake(&m.s.Bands[i], n, m.now)
	}
}

// lend reports whether n tokens may be taken on credit: leaving every TAT
// within its debt limits.
func (m tatMeter) lend(n int64) bool {
	for i := range m.s.Bands {
		st := m.s.Bands[i]
		tatTake(&st, n, m.now)
		if tatAhead(&st, m.now) > maxAhead(&m.bws[i], &st) {
			return false
		}
	}
	return true
}

// settleTATs completes d with Limit, Remaining, Bandwidth and RefillAfter
// of the binding bandwidth (the one with the fewest tokens left when
// binding is -1) and ResetAfter, the time until every bandwidth is full;
// and records when s expires: then, plus the time a new bucket takes to
// fill (ExpiresAt's warm-up).
func (s *State) settleTATs(d *Decision, bws []Bandwidth, binding int, now int64) {
	var resetAfter, warmup int64
	b, least := binding, int64(math.MaxInt64)
	for i := range s.Bands {
		st := &s.Bands[i]
		if r := tatRemaining(st, now); binding < 0 && r < least {
			b, least = i, r
		}
		resetAfter = max(resetAfter, tatWait(st, st.Capacity, now))
		warmup = max(warmup, ceilDiv((st.Capacity-bws[i].Initial())*st.Scale, st.Rate))
	}
	st := &s.Bands[b]
	d.Limit, d.Remaining, d.Bandwidth = st.Capacity, tatRemaining(st, now), bandName(bws, b)
	if d.Remaining < d.Limit {
		d.RefillAfter = micros(tatWait(st, d.Remaining+1, now))
	}
	d.ResetAfter = micros(resetAfter)
	s.ExpiresAt = now + resetAfter + warmup
}
