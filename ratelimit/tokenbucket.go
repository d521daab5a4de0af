package ratelimit

import (
	"math"
	"math/bits"
	"time"
)

// State is a bucket's stored state: what a backend keeps between calls.
// The zero value is an absent bucket.
type State struct {
	// Fingerprint is the [Config.Fingerprint] of the config that built the
	// state.
	Fingerprint uint64
	// Algorithm is the algorithm that built the state. A state is only
	// carried over to a config of the same algorithm; a change of algorithm
	// starts the bucket afresh.
	Algorithm Algorithm
	// ExpiresAt is when, in µs, the state becomes the same as an absent
	// bucket's: when every bandwidth is full again if nothing is taken
	// meanwhile, plus, for a config with InitialTokens below Capacity, the
	// time a new bucket takes to fill (so a client that waited for a full
	// bucket finds it full rather than started afresh). [Apply] treats a
	// state as absent from then on, so a backend may drop it then (a Redis
	// key's TTL) and no backend's answer depends on when it does.
	ExpiresAt int64
	// Bands holds one entry per bandwidth of that config.
	Bands []BandState
	// Log holds, for [SlidingWindowLog], the times in µs of the tokens
	// taken within the longest RefillPeriod, oldest first, one entry per
	// token. It is nil for the other algorithms.
	Log []int64
	// Version is the [Config.Version] of the config that built the state,
	// or last converted it.
	Version uint64
	// Config is, for a Version above 0, a copy of that config: a call that
	// brings an older version is decided on it. It is nil for Version 0.
	Config   *Config
	configFP uint64 // the Fingerprint when Config was copied
}

// BandState is the state of one bandwidth. Besides the level and the time,
// it keeps what a config change needs to carry tokens over (the
// bandwidth's ID, capacity and scale) and, so that a decision needs no gcd
// and no division to refill, its rate. The fields' meanings above are a
// token bucket's; each other algorithm's file says how it uses them.
type BandState struct {
	ID       string // the bandwidth's ID
	Capacity int64  // the bandwidth's capacity, in tokens
	Scale    int64  // scaled units per token
	Rate     int64  // scaled units gained per µs (Greedy) or tokens per period (Interval kinds)
	Level    int64  // scaled units held; negative once reserved ahead
	Stamp    int64  // µs: last refill (Greedy) or start of the current period (Interval kinds)
	Prev     int64  // SlidingWindowCounter: the previous window's count
}

// Apply applies req to s under cfg at time now, in microseconds on the
// backend's clock, and returns the decision. cfg and req must have passed
// [CheckRequest], and now must lie between 0 and 2^52 µs since 1970 (the
// year 2112); Apply then never panics, and every value it computes or stores
// stays within ±2^53. A denied request, Estimate and Inspect take no
// tokens, but every op may rewrite s (refill, a new bucket, a config
// change, its expiry): a store must write s back after every call.
//
// Apply is the reference math that every backend computes. It is pure
// integer arithmetic: a greedy bandwidth of RefillTokens per RefillPeriod
// counts in scaled units, Scale = period/g of them to a token, and gains
// Rate = RefillTokens/g each microsecond, where g = gcd(RefillTokens,
// period in µs). Refill is then exact, and the wait for n tokens is
// ceil((n×Scale − Level)/Rate) µs. Interval kinds count whole tokens and add
// RefillTokens at each period boundary.
//
// The other algorithms have their own math, each in its file, called from
// here.
//
// A versioned config changes a bucket forward only (see [Config.Version]):
// a call whose config is older than the one the bucket holds, while the
// bucket has not expired, is decided on the bucket's own config, kept in
// [State.Config], as if the call had brought it. Only its Op, Tokens,
// MaxWait and Strategy are the caller's, and a Replace then changes nothing
// (it reports as Inspect does); the decision's Bandwidth names the caller's
// bandwidth that matches the binding one (by ID, or by position when
// neither has an ID), or else the caller's first. If the bucket's config is
// of another algorithm, or cannot apply the request (an Op it does not
// support, more Tokens than its smallest Capacity), the call changes
// nothing and is denied for [StaleRetry]: a stale replica picks up the new
// config within its cache's lifetime.
func Apply(s *State, cfg Config, req Request, now int64) Decision {
	if s.holdsNewer(cfg, now) {
		return s.applyStale(cfg, req, now)
	}
	d := applyAs(s, cfg, req, now)
	s.keepConfig(cfg)
	return d
}

// applyAs is Apply with cfg whatever its version.
func applyAs(s *State, cfg Config, req Request, now int64) Decision {
	switch cfg.Algorithm {
	case GCRA, LeakyBucket:
		return applyGCRA(s, cfg, req, now)
	case FixedWindow:
		return applyFixedWindow(s, cfg, req, now)
	case SlidingWindowLog:
		return applyLog(s, cfg, req, now)
	case SlidingWindowCounter:
		return applyCounter(s, cfg, req, now)
	}
	return applyBucket(s, cfg, req, now)
}

// applyBucket is Apply for [TokenBucket].
func applyBucket(s *State, cfg Config, req Request, now int64) (d Decision) {
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
		binding = decide(&d, req, m.wait, m.room, m.take, m.lend)
	}
	s.settle(&d, bws, binding, now)
	return d
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
func (s *State) init(cfg Config, fp uint64, now int64) {
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

// periodStart is the stamp of a bandwidth that is full at now: the
// IntervalAligned boundary at or before now, or now itself.
func periodStart(b *Bandwidth, now int64) int64 {
	if b.Refill != IntervalAligned {
		return now
	}
	start, period := b.AlignedStart.UnixMicro(), b.PeriodMicros()
	return start + floorDiv(now-start, period)*period
}

// convert rebuilds s for cfg, carrying tokens over with strategy.
func (s *State) convert(cfg Config, fp uint64, strategy Inheritance, now int64) {
	old := s.Bands
	s.Bands = make([]BandState, len(cfg.Bandwidths))
	for i := range cfg.Bandwidths {
		b := &cfg.Bandwidths[i]
		s.Bands[i] = fresh(b, now)
		j := match(old, b.ID, i)
		if strategy == ResetTokens || j < 0 {
			continue
		}
		o := &old[j]
		tokens := inherit(floorDiv(o.Level, o.Scale), o.Capacity, b.Capacity, strategy)
		nb := &s.Bands[i]
		nb.Level = max(tokens, ceilDiv(minLevel(b, nb), nb.Scale)) * nb.Scale
		nb.Stamp = periodStart(b, o.Stamp)
	}
	s.Fingerprint = fp
}

// match finds the old bandwidth a new one inherits from: the one with the
// same ID, or with no ID at the same position; -1 if none.
func match(old []BandState, id string, i int) int {
	if id == "" {
		if i < len(old) && old[i].ID == "" {
			return i
		}
		return -1
	}
	for j := range old {
		if old[j].ID == id {
			return j
		}
	}
	return -1
}

// inherit returns the whole tokens a bandwidth keeps when its capacity goes
// from oldCap to newCap.
func inherit(tokens, oldCap, newCap int64, strategy Inheritance) int64 {
	switch strategy {
	case Proportionally:
		return mulDivFloor(tokens, newCap, oldCap)
	case Additive:
		return min(tokens, newCap) + max(0, newCap-oldCap)
	}
	return min(tokens, newCap)
}

// mulDivFloor returns floor(a×b/c) for b, c ≥ 1 and b ≤ c×2^k, exactly,
// saturating at ±MaxInt64 where it does not fit.
func mulDivFloor(a, b, c int64) int64 {
	neg := a < 0
	ua := uint64(a)
	if neg {
		ua = -ua
	}
	hi, lo := bits.Mul64(ua, uint64(b))
	if hi >= uint64(c) {
		if neg {
			return math.MinInt64
		}
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		q = math.MaxInt64
	}
	if !neg {
		return int64(q)
	}
	if r != 0 {
		q++
	}
	return -int64(q)
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
		st := &s.Bands[i]
		if w := timeTo(&bws[i], st, n*st.Scale, now); w > wait {
			wait, slowest = w, i
		}
	}
	return wait, slowest
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

// settle completes d from the state as it now is: Limit, Remaining and
// Bandwidth of the binding bandwidth (the one with the fewest tokens left
// when binding is -1), and ResetAfter; and records when s expires.
func (s *State) settle(d *Decision, bws []Bandwidth, binding int, now int64) {
	var resetAfter int64
	least := int64(math.MaxInt64)
	for i := range bws {
		st := &s.Bands[i]
		if r := remaining(st); binding < 0 && r < least {
			least, d.Limit, d.Remaining, d.Bandwidth = r, st.Capacity, r, bandName(bws, i)
		}
		resetAfter = max(resetAfter, timeTo(&bws[i], st, st.Capacity*st.Scale, now))
	}
	if binding >= 0 {
		st := &s.Bands[binding]
		d.Limit, d.Remaining, d.Bandwidth = st.Capacity, remaining(st), bandName(bws, binding)
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

// indexNames name the bandwidths that have no ID.
var indexNames = [MaxBandwidths]string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15"}

// bandName is the bandwidth's ID, or its index when it has none.
func bandName(bws []Bandwidth, i int) string {
	if id := bws[i].ID; id != "" {
		return id
	}
	return indexNames[i]
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// floorDiv is a/b rounded toward minus infinity, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// ceilDiv is a/b rounded toward plus infinity, for b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b > 0 {
		q++
	}
	return q
}
