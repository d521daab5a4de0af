package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// refBucket is a deliberately naive token bucket, the reference that Apply
// is checked against. It shares no arithmetic with Apply: it keeps each
// bandwidth's tokens as an exact fraction over the refill period (no gcd,
// no scaled units), moves its clock one microsecond at a time adding
// RefillTokens/RefillPeriod of a token (Greedy) or RefillTokens at each
// period boundary (Interval kinds), and finds every wait by stepping a copy
// forward until the tokens are there. It is slow, and only meant for the
// small configs of the property test.
type refBucket struct {
	cfg   Config
	now   int64
	bands []refBand
	// expires is when the bucket becomes a new one: full again, plus the
	// time a new bucket takes to fill when it starts below capacity.
	expires int64
}

// refBand is one bandwidth of a refBucket. It holds num/period tokens,
// where period is RefillPeriod in µs: one microsecond of greedy refill adds
// RefillTokens/period, so the fraction is always exact.
type refBand struct {
	bw     Bandwidth
	period int64
	num    int64
	// start is, for Interval kinds below capacity, when the current period
	// began.
	start int64
	// touched, touchedNum and anchor are what a config change inherits:
	// the whole tokens left by the last request, the exact tokens then (as
	// num), and the instant from which the new config refills (the last
	// request, or the start of the period then running).
	touched    int64
	touchedNum int64
	anchor     int64
}

func newRefBand(b Bandwidth, now int64) refBand {
	r := refBand{bw: b, period: int64(b.RefillPeriod / time.Microsecond)}
	r.num = r.bw.Capacity * r.period
	if b.InitialTokens != nil {
		r.num = *b.InitialTokens * r.period
	}
	r.start = r.boundary(now)
	return r
}

func (r *refBand) full() bool { return r.num >= r.bw.Capacity*r.period }

// whole is the whole tokens held, rounded toward minus infinity.
func (r *refBand) whole() int64 {
	w := r.num / r.period
	if r.num < 0 && r.num%r.period != 0 {
		w--
	}
	return w
}

// boundary is when a period drawn at t begins: t itself, or for
// IntervalAligned the last boundary of the aligned grid at or before t.
func (r *refBand) boundary(t int64) int64 {
	if r.bw.Refill != IntervalAligned {
		return t
	}
	off := (t - r.bw.AlignedStart.UnixMicro()) % r.period
	if off < 0 {
		off += r.period
	}
	return t - off
}

// tick moves the band from microsecond t to t+1.
func (r *refBand) tick(t int64) {
	limit := r.bw.Capacity * r.period
	if r.bw.Refill == Greedy {
		r.num = min(limit, r.num+r.bw.RefillTokens)
		return
	}
	if !r.full() && t+1 == r.start+r.period {
		r.num = min(limit, r.num+r.bw.RefillTokens*r.period)
		r.start = t + 1
	}
}

// unit is the smallest part of a token the band counts, in num: whole
// tokens for Interval kinds, and for Greedy the largest that both a
// microsecond's refill and a token are whole numbers of (found by search,
// not by Euclid's algorithm, to share nothing with Apply).
func (r *refBand) unit() int64 {
	if r.bw.Refill != Greedy {
		return r.period
	}
	u := r.bw.RefillTokens
	for r.period%u != 0 || r.bw.RefillTokens%u != 0 {
		u--
	}
	return u
}

// take removes n tokens; a period starts if the band was full.
func (r *refBand) take(n, now int64) {
	if r.full() {
		r.start = r.boundary(now)
	}
	r.num -= n * r.period
}

// timeTo steps a copy of r from now until it holds n tokens.
func (r refBand) timeTo(n, now int64) int64 {
	var wait int64
	for r.num < n*r.period {
		r.tick(now + wait)
		wait++
	}
	return wait
}

// touch records what a config change would inherit after a request at now.
func (r *refBand) touch(now int64) {
	r.touched, r.touchedNum = r.whole(), r.num
	switch {
	case r.bw.Refill == Greedy:
		r.anchor = now
	case r.full():
		r.anchor = r.boundary(now)
	default:
		r.anchor = r.start
	}
}

// apply is Apply for the reference model.
func (m *refBucket) apply(cfg Config, req Request, now int64) Decision {
	switch {
	case len(m.bands) == 0 || req.Op == Reset || now >= m.expires:
		m.bands = m.bands[:0]
		for _, b := range cfg.Bandwidths {
			m.bands = append(m.bands, newRefBand(b, now))
		}
	case req.Op == Replace || !sameConfig(m.cfg, cfg):
		m.convert(cfg, req.Strategy, now)
	default:
		for t := m.now; t < now; t++ {
			for i := range m.bands {
				m.bands[i].tick(t)
			}
		}
	}
	m.cfg, m.now = cfg, now
	d := m.do(req)
	for i := range m.bands {
		m.bands[i].touch(now)
	}
	m.expires = now + int64(d.ResetAfter/time.Microsecond)
	var warmup int64
	for _, b := range cfg.Bandwidths {
		warmup = max(warmup, newRefBand(b, now).timeTo(b.Capacity, now))
	}
	m.expires += warmup
	return d
}

func (m *refBucket) do(req Request) Decision {
	switch req.Op {
	case Consume, Estimate, Reserve, Inspect:
		n := req.Tokens
		if req.Op == Inspect {
			n = 1
		}
		wait, slowest := m.waitFor(n)
		// MaxWait counts whole microseconds.
		canWait := req.Op == Reserve && wait*int64(time.Microsecond) <= int64(req.MaxWait)
		switch {
		case (req.Op == Consume && wait == 0) || canWait:
			m.take(n)
			d := m.decision(true)
			d.Consumed, d.RetryAfter = n, time.Duration(wait)*time.Microsecond
			return d
		case wait == 0:
			return m.decision(true)
		default:
			return m.denial(wait, slowest)
		}
	case ConsumeUpTo:
		n := req.Tokens
		for i := range m.bands {
			n = min(n, max(0, m.bands[i].whole()))
		}
		if n == 0 {
			d := m.denial(m.waitFor(1))
			d.Remaining = 0
			return d
		}
		m.take(n)
		d := m.decision(true)
		d.Consumed = n
		return d
	case Add:
		// The model's tokens are tiny: counting past 2^20 changes nothing.
		n := min(req.Tokens, 1<<20)
		for i := range m.bands {
			b := &m.bands[i]
			b.num = min(b.bw.Capacity*b.period, b.num+n*b.period)
		}
	}
	return m.decision(true)
}

// waitFor is the µs until every band holds n tokens, and the first band
// that takes that long.
func (m *refBucket) waitFor(n int64) (wait int64, slowest int) {
	for i := range m.bands {
		if w := m.bands[i].timeTo(n, m.now); w > wait {
			wait, slowest = w, i
		}
	}
	return wait, slowest
}

func (m *refBucket) take(n int64) {
	for i := range m.bands {
		m.bands[i].take(n, m.now)
	}
}

// decision is an allowed decision: bound to the first band with the fewest
// whole tokens.
func (m *refBucket) decision(allowed bool) Decision {
	d := Decision{Allowed: allowed}
	var reset int64
	binding := 0
	for i := range m.bands {
		b := &m.bands[i]
		if max(0, b.whole()) < max(0, m.bands[binding].whole()) {
			binding = i
		}
		reset = max(reset, b.timeTo(b.bw.Capacity, m.now))
	}
	m.bind(&d, binding)
	d.ResetAfter = time.Duration(reset) * time.Microsecond
	return d
}

// denial is a denied decision bound to band i, wait µs from passing.
func (m *refBucket) denial(wait int64, i int) Decision {
	d := m.decision(false)
	d.RetryAfter = time.Duration(wait) * time.Microsecond
	m.bind(&d, i)
	return d
}

// bind makes band i the binding one of d: its capacity, whole tokens left,
// name, and the wait until it holds one more.
func (m *refBucket) bind(d *Decision, i int) {
	b := &m.bands[i]
	d.Limit, d.Remaining, d.Bandwidth, d.RefillAfter = b.bw.Capacity, max(0, b.whole()), m.name(i), 0
	if d.Remaining < d.Limit {
		d.RefillAfter = time.Duration(b.timeTo(d.Remaining+1, m.now)) * time.Microsecond
	}
}

func (m *refBucket) name(i int) string {
	if id := m.bands[i].bw.ID; id != "" {
		return id
	}
	return fmt.Sprint(i)
}

// convert rebuilds the bucket for cfg from what the last request left:
// whole tokens carried over by strategy, refilled at the new rate from the
// old band's anchor.
func (m *refBucket) convert(cfg Config, strategy Inheritance, now int64) {
	old := m.bands
	m.bands = nil
	for i, b := range cfg.Bandwidths {
		j := -1
		for k := range old {
			if b.ID != "" && old[k].bw.ID == b.ID || b.ID == "" && k == i && old[k].bw.ID == "" {
				j = k
			}
		}
		if strategy == ResetTokens || j < 0 {
			m.bands = append(m.bands, newRefBand(b, now))
			continue
		}
		o := old[j]
		oldCap, newCap, tokens := o.bw.Capacity, b.Capacity, o.touched
		r := newRefBand(b, now)
		switch strategy {
		case AsIs:
			r.num = min(tokens, newCap) * r.period
		case Proportionally:
			// The exact tokens times newCap/oldCap, rounded down once, to
			// the smallest part of a token the new band counts.
			unit := r.unit()
			p := o.touchedNum * newCap * r.period // tiny in the model: no overflow
			q := oldCap * o.period * unit
			r.num = p / q
			if p < 0 && p%q != 0 {
				r.num--
			}
			r.num *= unit
		case Additive:
			r.num = (min(tokens, newCap) + max(0, newCap-oldCap)) * r.period
		}
		r.start = r.boundary(o.anchor)
		for t := r.start; t < now; t++ {
			r.tick(t)
		}
		m.bands = append(m.bands, r)
	}
}

// sameConfig reports whether a and b describe the same bucket, field by
// field: the model's stand-in for comparing fingerprints.
func sameConfig(a, b Config) bool {
	if a.Algorithm != b.Algorithm || len(a.Bandwidths) != len(b.Bandwidths) {
		return false
	}
	for i := range a.Bandwidths {
		x, y := a.Bandwidths[i], b.Bandwidths[i]
		if x.ID != y.ID || x.Capacity != y.Capacity || x.RefillTokens != y.RefillTokens ||
			x.RefillPeriod != y.RefillPeriod || x.Refill != y.Refill || x.Initial() != y.Initial() ||
			x.AlignedStart.UnixMicro() != y.AlignedStart.UnixMicro() {
			return false
		}
	}
	return true
}

// randConfig returns a small valid config: 1 to 3 bandwidths of every kind,
// periods short enough that stepping the model µs by µs is cheap.
func randConfig(r *rand.Rand) Config {
	var cfg Config
	ids := []string{"", "", "a", "b", "c"}
	for range 1 + r.IntN(3) {
		id := ids[r.IntN(len(ids))]
		for _, b := range cfg.Bandwidths {
			if b.ID == id {
				id = ""
			}
		}
		period := 1 + r.Int64N(40)
		b := Bandwidth{
			ID:           id,
			Capacity:     1 + r.Int64N(8),
			RefillTokens: 1 + r.Int64N(period),
			RefillPeriod: time.Duration(period) * time.Microsecond,
			Refill:       RefillKind(r.IntN(3)),
		}
		if b.Refill == IntervalAligned {
			b.AlignedStart = time.UnixMicro(r.Int64N(100))
		}
		if r.IntN(3) == 0 {
			b = b.WithInitialTokens(r.Int64N(b.Capacity + 1))
		}
		cfg.Bandwidths = append(cfg.Bandwidths, b)
	}
	return cfg
}

// replan returns cfg with new numbers for the same bandwidths, as a plan
// change does, so that every bandwidth has one to inherit from.
func replan(r *rand.Rand, cfg Config) Config {
	out := Config{Bandwidths: slices.Clone(cfg.Bandwidths)}
	for i := range out.Bandwidths {
		b := &out.Bandwidths[i]
		b.Capacity = 1 + r.Int64N(8)
		if r.IntN(2) == 0 {
			period := 1 + r.Int64N(40)
			b.RefillPeriod = time.Duration(period) * time.Microsecond
			b.RefillTokens = 1 + r.Int64N(period)
		}
		if b.InitialTokens != nil {
			b.InitialTokens = ptr(min(*b.InitialTokens, b.Capacity))
		}
	}
	return out
}

// randRequest returns a valid request for cfg, mostly ones that take.
func randRequest(r *rand.Rand, cfg Config) Request {
	limit := cfg.MinCapacity()
	req := Request{Tokens: 1 + r.Int64N(limit), Strategy: Inheritance(r.IntN(4))}
	switch k := r.IntN(20); {
	case k < 6:
		req.Op = Consume
	case k < 8:
		req.Op = Estimate
	case k < 11:
		req.Op = Reserve
		req.MaxWait = time.Duration(r.Int64N(200)) * time.Microsecond
		switch r.IntN(10) {
		case 0:
			req.MaxWait = time.Duration(math.MaxInt64)
		case 1:
			req.MaxWait += time.Duration(r.Int64N(1000)) // sub-µs parts count for nothing
		}
	case k < 13:
		req.Op = ConsumeUpTo
		if r.IntN(4) == 0 {
			req.Tokens = math.MaxInt64
		}
	case k < 15:
		req.Op = Add
		if r.IntN(4) == 0 {
			req.Tokens = math.MaxInt64
		}
	case k < 16:
		req.Op = Reset
	case k < 17:
		req.Op = Replace
	default:
		req.Op = Inspect
	}
	return req
}

// TestApplyMatchesReference runs seeded random sequences of requests and
// clock advances on random small configs, switching between two configs
// now and then, and checks every decision of Apply against the naive
// model, field by field, and the whole tokens of every bandwidth and the
// expiry after each step.
func TestApplyMatchesReference(t *testing.T) {
	const (
		sequences = 1000
		steps     = 60
	)
	for seed := range uint64(sequences) {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		cfgs := [2]Config{randConfig(r), randConfig(r)}
		if r.IntN(2) == 0 {
			cfgs[1] = replan(r, cfgs[0])
		}
		var (
			s   State
			ref refBucket
			now = r.Int64N(1000)
			cur = 0
			log []string
		)
		for i := range steps {
			switch k := r.IntN(10); {
			case k < 4:
				now += r.Int64N(60)
			case k < 5:
				now += r.Int64N(400)
			}
			if r.IntN(6) == 0 {
				cur = 1 - cur
			}
			cfg := cfgs[cur]
			req := randRequest(r, cfg)
			if err := CheckRequest("key", cfg, req); err != nil {
				t.Fatalf("seed %d: generated a bad call: %v", seed, err)
			}
			got := Apply(&s, cfg, req, now)
			want := ref.apply(cfg, req, now)
			log = append(log, fmt.Sprintf("  %2d at %dµs cfg %d: %+v -> %+v", i, now, cur, req, got))
			gotTokens := tokensOf(&s)
			var wantTokens []int64
			for _, b := range ref.bands {
				wantTokens = append(wantTokens, b.whole())
			}
			if got != want || !slices.Equal(gotTokens, wantTokens) || s.ExpiresAt != ref.expires {
				t.Fatalf("seed %d, step %d: %+v at %dµs\ncfg 0: %s\ncfg 1: %s\nsteps:\n%s\n got %+v, tokens %v, expires %d\nwant %+v, tokens %v, expires %d",
					seed, i, req, now, describe(cfgs[0]), describe(cfgs[1]), strings.Join(log, "\n"), got, gotTokens, s.ExpiresAt, want, wantTokens, ref.expires)
			}
		}
	}
}

// describe prints a config compactly for failure messages.
func describe(cfg Config) string {
	var parts []string
	for _, b := range cfg.Bandwidths {
		p := fmt.Sprintf("{%q cap %d, %d per %dµs %v", b.ID, b.Capacity, b.RefillTokens, b.RefillPeriod/time.Microsecond, b.Refill)
		if b.InitialTokens != nil {
			p += fmt.Sprintf(" initial %d", *b.InitialTokens)
		}
		if b.Refill == IntervalAligned {
			p += fmt.Sprintf(" from %dµs", b.AlignedStart.UnixMicro())
		}
		parts = append(parts, p+"}")
	}
	return strings.Join(parts, " ")
}

// TestApplyFullAfterResetAfter checks what makes dropping a state at
// ExpiresAt invisible, for random configs with and without InitialTokens:
// ExpiresAt is now + ResetAfter + the time a new bucket takes to fill; every
// bandwidth is full from ResetAfter on; without InitialTokens the state is,
// by ExpiresAt, that of a new bucket; with them it is kept, full, until
// ExpiresAt-1, and at ExpiresAt a new bucket takes its place.
func TestApplyFullAfterResetAfter(t *testing.T) {
	for seed := range uint64(600) {
		r := rand.New(rand.NewPCG(seed, 0xf011))
		cfg := randConfig(r)
		if seed%2 == 0 {
			for i := range cfg.Bandwidths {
				cfg.Bandwidths[i].InitialTokens = nil
			}
		}
		var s State
		now := r.Int64N(1000)
		for range 30 {
			now += r.Int64N(50)
			req := randRequest(r, cfg)
			d := Apply(&s, cfg, req, now)
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d: %s: %+v at %d = %+v, state %+v: %s", seed, describe(cfg), req, now, d, s, fmt.Sprintf(format, args...))
			}
			full := now + int64(d.ResetAfter/time.Microsecond)
			warmup := int64(Apply(&State{}, cfg, inspect(), now).ResetAfter / time.Microsecond)
			if s.ExpiresAt != full+warmup {
				fail("ExpiresAt = %d, want %d + warm-up %d", s.ExpiresAt, full, warmup)
			}
			for _, at := range []int64{full, full + r.Int64N(warmup+1), s.ExpiresAt, s.ExpiresAt + r.Int64N(3)} {
				got := refilledPastExpiry(&s, cfg, at)
				for i, b := range got.Bands {
					if b.Level != b.Capacity*b.Scale {
						fail("at %d, Bands[%d] = %+v, want full", at, i, b)
					}
				}
				if fresh := newBucket(cfg, at); warmup == 0 && at >= s.ExpiresAt && !equalStates(got, fresh) {
					fail("at %d: %+v, want a new bucket's %+v", at, got, fresh)
				}
			}
			if n := cfg.MinCapacity(); warmup > 0 {
				late := cloneState(&s)
				if got := Apply(&late, cfg, estimate(n), s.ExpiresAt-1); !got.Allowed || got.ResetAfter != 0 {
					fail("at ExpiresAt-1: Estimate(%d) = %+v, want the full bucket", n, got)
				}
			}
			probe := randRequest(r, cfg)
			expired, fresh := cloneState(&s), State{}
			got, want := Apply(&expired, cfg, probe, s.ExpiresAt), Apply(&fresh, cfg, probe, s.ExpiresAt)
			if got != want || !equalStates(expired, fresh) {
				fail("at ExpiresAt, %+v = %+v, state %+v; want a new bucket's %+v, state %+v", probe, got, expired, want, fresh)
			}
		}
	}
}
