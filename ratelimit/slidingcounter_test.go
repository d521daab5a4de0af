package ratelimit

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func counterCfg(bws ...Bandwidth) Config {
	return Config{Algorithm: SlidingWindowCounter, Bandwidths: bws}
}

// TestCounterApply steps sliding window counters through tables of
// hand-computed decisions. Windows are aligned to the epoch: with a period
// of 10µs they are [0, 10), [10, 20), ...
func TestCounterApply(t *testing.T) {
	const s = 1_000_000 // µs
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{{
		// The classic example: 10 a minute; 8 taken in the previous
		// minute weigh 8 × 30/60 = 4 at its half, so with 3 of this
		// minute's the estimate is 7 and 3 more pass. The next waits
		// until the 8 weigh 3: at 37.5s, 8 × 22.5/60.
		name: "10 a minute",
		cfg:  counterCfg(PerMinute(10)),
		steps: []step{
			{at: 10 * s, req: consume(8), want: allowed(10, 2, 8, 110*s, "0")},
			{at: 90 * s, req: estimate(6), want: allowed(10, 6, 0, 30*s, "0")},
			{at: 90 * s, req: consume(3), want: allowed(10, 3, 3, 90*s, "0")},
			{at: 90 * s, req: consume(4), want: denied(10, 3, 7_500_000, 90*s, "0")},
			{at: 90 * s, req: consume(3), want: allowed(10, 0, 3, 90*s, "0")},
			{at: 90 * s, req: consume(1), want: denied(10, 0, 7_500_000, 90*s, "0")},
			{at: 97_499_999, req: consume(1), want: denied(10, 0, 1, 82_500_001, "0")},
			{at: 97_500_000, req: consume(1), want: allowed(10, 0, 1, 82_500_000, "0")},
			// 7 now, so one more once the 8 weigh 2: at 45s.
			{at: 97_500_000, req: inspect(), want: denied(10, 0, 7_500_000, 82_500_000, "0")},
			{at: 100 * s, req: estimate(1), want: denied(10, 0, 5*s, 80*s, "0")},
			{at: 105 * s, req: estimate(1), want: allowed(10, 1, 0, 75*s, "0")},
			// The next minute: the 7 weigh 7 at its start; all 10 pass
			// only once they weigh nothing.
			{at: 120 * s, req: consume(10), want: denied(10, 3, 60*s, 60*s, "0")},
			{at: 150 * s, req: estimate(6), want: allowed(10, 6, 0, 30*s, "0")},
			{at: 180 * s, req: consume(10), want: allowed(10, 0, 10, 120*s, "0")},
			{at: 300 * s, req: inspect(), want: allowed(10, 10, 0, 0, "0")},
		},
	}, {
		// With the current window full, the next has room once its count
		// weighs little enough: 4 × (10−3)/10 + 1 ≤ 4 at 3µs into it.
		name: "a full window waits into the next",
		cfg:  counterCfg(Every(10*us, 4)),
		steps: []step{
			{at: 3, req: consume(4), want: allowed(4, 0, 4, 17, "0")},
			{at: 5, req: consume(1), want: denied(4, 0, 8, 15, "0")},
			{at: 12, req: estimate(1), want: denied(4, 0, 1, 8, "0")},
			{at: 13, req: consume(1), want: allowed(4, 0, 1, 17, "0")},
			// 4 at once: only once the window of 1 has rolled out too.
			{at: 13, req: consume(4), want: denied(4, 0, 17, 17, "0")},
			{at: 30, req: consume(4), want: allowed(4, 0, 4, 20, "0")},
		},
	}, {
		// A clock that steps back (a store failing over to a replica)
		// reads as the window's start and moves no due time.
		name: "clock stepping back",
		cfg:  counterCfg(Every(10*us, 4)),
		steps: []step{
			{at: 15, req: consume(4), want: allowed(4, 0, 4, 15, "0")},
			{at: 5, req: inspect(), want: denied(4, 0, 18, 25, "0")},
			{at: 23, req: inspect(), want: allowed(4, 1, 0, 7, "0")},
			{at: 23, req: consume(1), want: allowed(4, 0, 1, 17, "0")},
			{at: 15, req: consume(1), want: denied(4, 0, 10, 25, "0")},
			{at: 25, req: consume(1), want: allowed(4, 0, 1, 15, "0")},
		},
	}, {
		// Behind the window's start, the previous window weighs in whole,
		// no more.
		name: "clock stepping back before the window",
		cfg:  counterCfg(Every(10*us, 4)),
		steps: []step{
			{at: 5, req: consume(2), want: allowed(4, 2, 2, 15, "0")},
			{at: 12, req: inspect(), want: allowed(4, 2, 0, 8, "0")},
			{at: 8, req: estimate(2), want: allowed(4, 2, 0, 12, "0")},
			{at: 8, req: estimate(3), want: denied(4, 2, 7, 12, "0")},
		},
	}, {
		name: "ops",
		cfg:  counterCfg(Every(10*us, 4)),
		steps: []step{
			{at: 0, req: consumeUpTo(9), want: allowed(4, 0, 4, 20, "0")},
			{at: 1, req: consumeUpTo(9), want: denied(4, 0, 12, 19, "0")},
			{at: 2, req: add(1), want: allowed(4, 1, 0, 18, "0")},
			{at: 2, req: add(1 << 62), want: allowed(4, 4, 0, 0, "0")},
			{at: 3, req: consume(2), want: allowed(4, 2, 2, 17, "0")},
			{at: 12, req: inspect(), want: allowed(4, 2, 0, 8, "0")},
			{at: 12, req: consumeUpTo(3), want: allowed(4, 0, 2, 18, "0")},
			{at: 12, req: Request{Op: Reset}, want: allowed(4, 4, 0, 0, "0")},
			{at: 12, req: estimate(4), want: allowed(4, 4, 0, 0, "0")},
			{at: 12, req: Request{Op: Replace}, want: allowed(4, 4, 0, 0, "0")},
		},
	}, {
		// A request passes only if both allow it; a denial names the
		// bandwidth that needs longest.
		name: "several bandwidths",
		cfg:  counterCfg(Every(10*us, 4).WithID("fast"), Every(100*us, 6).WithID("slow")),
		steps: []step{
			{at: 0, req: consume(3), want: allowed(4, 1, 3, 200, "fast")},
			{at: 5, req: consume(2), want: denied(4, 1, 9, 195, "fast")},
			{at: 10, req: consume(1), want: allowed(4, 0, 1, 190, "fast")},
			{at: 100, req: consume(3), want: denied(6, 2, 25, 100, "slow")},
			{at: 125, req: consume(3), want: allowed(6, 0, 3, 175, "slow")},
			{at: 125, req: consumeUpTo(3), want: denied(6, 0, 25, 175, "slow")},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

// TestCounterState checks what the state holds: the counts, the window's
// start and the period, and an expiry when both counts have rolled out.
func TestCounterState(t *testing.T) {
	cfg := counterCfg(Every(10*us, 4).WithID("a"))
	var s State
	Apply(&s, cfg, consume(3), 17)
	want := []BandState{{ID: "a", Capacity: 4, Scale: 10, Level: 3, Stamp: 10}}
	if !slices.Equal(s.Bands, want) || s.ExpiresAt != 30 || s.Algorithm != SlidingWindowCounter || s.Fingerprint != cfg.Fingerprint() {
		t.Fatalf("got %+v; want bands %+v expiring at 30", s, want)
	}
	Apply(&s, cfg, consume(1), 25)
	want = []BandState{{ID: "a", Capacity: 4, Scale: 10, Level: 1, Prev: 3, Stamp: 20}}
	if !slices.Equal(s.Bands, want) || s.ExpiresAt != 40 {
		t.Fatalf("got %+v; want bands %+v expiring at 40", s, want)
	}
	Apply(&s, cfg, inspect(), 30)
	want = []BandState{{ID: "a", Capacity: 4, Scale: 10, Prev: 1, Stamp: 30}}
	if !slices.Equal(s.Bands, want) || s.ExpiresAt != 40 {
		t.Fatalf("got %+v; want bands %+v expiring at 40", s, want)
	}
	if d := Apply(&s, cfg, inspect(), 40); s.ExpiresAt != 40 || d.Remaining != 4 {
		t.Fatalf("at 40: %+v, state %+v; want a new bucket's, expired at once", d, s)
	}
}

// TestCounterConfigChange: a matched bandwidth keeps its counts, trimmed to
// the new capacity; with a new period only the current window's; with
// ResetTokens none; an unmatched one starts empty.
func TestCounterConfigChange(t *testing.T) {
	const s = 1_000_000
	ten := counterCfg(PerMinute(10).WithID("m"))
	five := counterCfg(PerMinute(5).WithID("m"))
	halfMinute := counterCfg(Every(30*time.Second, 10).WithID("m"))
	withSecond := counterCfg(Every(time.Second, 3).WithID("s"), PerMinute(10).WithID("m"))
	noIDs := counterCfg(PerMinute(10), PerSecond(2))
	noIDsSwapped := counterCfg(PerSecond(2), PerMinute(10))
	tb := Config{Bandwidths: []Bandwidth{PerMinute(10).WithID("m")}}
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{{
		// The previous minute's 8 become 5: at 10s into this minute they
		// weigh 5 × 50/60, leaving no room; 1 fits once they weigh 4.
		name: "capacity lowered",
		cfg:  ten,
		steps: []step{
			{at: 10 * s, req: consume(8), want: allowed(10, 2, 8, 110*s, "m")},
			{at: 70 * s, cfg: &five, req: estimate(1), want: denied(5, 0, 2*s, 50*s, "m")},
			{at: 72 * s, cfg: &five, req: consume(1), want: allowed(5, 0, 1, 108*s, "m")},
		},
	}, {
		name: "ResetTokens",
		cfg:  ten,
		steps: []step{
			{at: 10 * s, req: consume(8), want: allowed(10, 2, 8, 110*s, "m")},
			{at: 70 * s, cfg: &five, req: Request{Op: Estimate, Tokens: 5, Strategy: ResetTokens}, want: allowed(5, 5, 0, 0, "m")},
		},
	}, {
		// The period halves: the current minute's 2 go into the current
		// half minute, the previous minute's 8 are dropped.
		name: "period changed",
		cfg:  ten,
		steps: []step{
			{at: 10 * s, req: consume(8), want: allowed(10, 2, 8, 110*s, "m")},
			{at: 70 * s, req: consume(2), want: allowed(10, 1, 2, 110*s, "m")},
			{at: 80 * s, cfg: &halfMinute, req: estimate(9), want: denied(10, 8, 25*s, 40*s, "m")},
			{at: 80 * s, cfg: &halfMinute, req: consume(8), want: allowed(10, 0, 8, 40*s, "m")},
		},
	}, {
		// The old current window has ended: its count is the previous
		// one's, and so dropped.
		name: "period changed after the window ended",
		cfg:  ten,
		steps: []step{
			{at: 10 * s, req: consume(8), want: allowed(10, 2, 8, 110*s, "m")},
			{at: 70 * s, cfg: &halfMinute, req: estimate(10), want: allowed(10, 10, 0, 0, "m")},
		},
	}, {
		name: "a new bandwidth starts empty, matched by ID",
		cfg:  ten,
		steps: []step{
			{at: 10 * s, req: consume(8), want: allowed(10, 2, 8, 110*s, "m")},
			{at: 40 * s, cfg: &withSecond, req: consume(2), want: allowed(10, 0, 2, 80*s, "m")},
			{at: 40 * s, cfg: &withSecond, req: consume(1), want: denied(10, 0, 26*s, 80*s, "m")},
		},
	}, {
		// Without IDs, bandwidths match by position: swapped, each takes
		// the other's current count, in a window of its own period, the
		// second's trimmed to its capacity of 2.
		name: "matched by position",
		cfg:  noIDs,
		steps: []step{
			{at: 10 * s, req: consume(2), want: allowed(2, 0, 2, 110*s, "1")},
			{at: 10*s + 1, cfg: &noIDsSwapped, req: estimate(1), want: denied(2, 0, 1_499_999, 110*s-1, "0")},
		},
	}, {
		name: "Replace keeps the counts of the same config",
		cfg:  ten,
		steps: []step{
			{at: 10 * s, req: consume(8), want: allowed(10, 2, 8, 110*s, "m")},
			{at: 10 * s, req: Request{Op: Replace}, want: allowed(10, 2, 0, 110*s, "m")},
			{at: 10 * s, req: Request{Op: Replace, Strategy: ResetTokens}, want: allowed(10, 10, 0, 0, "m")},
		},
	}, {
		name: "another algorithm's state starts afresh",
		cfg:  tb,
		steps: []step{
			{at: 10 * s, req: consume(8), want: allowed(10, 2, 8, 48*s, "m")},
			{at: 10 * s, cfg: &ten, req: estimate(10), want: allowed(10, 10, 0, 0, "m")},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

// counterModel is a naive sliding window counter: per bandwidth a map from
// window index to the requests counted in it, and waits found by trying
// every microsecond. The clock must not go back.
type counterModel struct {
	cfg    Config
	counts []map[int64]int64
}

func newCounterModel(cfg Config) *counterModel {
	m := &counterModel{cfg: cfg}
	for range cfg.Bandwidths {
		m.counts = append(m.counts, map[int64]int64{})
	}
	return m
}

// fits reports whether bandwidth i admits n more at t: cur + n +
// prev·(W−e)/W ≤ C, times W.
func (m *counterModel) fits(i int, n, t int64) bool {
	w := m.cfg.Bandwidths[i].PeriodMicros()
	k, e := t/w, t%w
	return (m.counts[i][k]+n)*w+m.counts[i][k-1]*(w-e) <= m.cfg.Bandwidths[i].Capacity*w
}

func (m *counterModel) room(i int, t int64) int64 {
	var n int64
	for n < m.cfg.Bandwidths[i].Capacity && m.fits(i, n+1, t) {
		n++
	}
	return n
}

// due is the first time from t on when bandwidth i admits n.
func (m *counterModel) due(i int, n, t int64) int64 {
	for !m.fits(i, n, t) {
		t++
	}
	return t
}

func (m *counterModel) take(n, t int64) {
	for i, b := range m.cfg.Bandwidths {
		m.counts[i][t/b.PeriodMicros()] += n
	}
}

func (m *counterModel) apply(req Request, t int64) Decision {
	d := Decision{Allowed: true}
	binding := -1
	deny := func(n int64) {
		var wait int64
		for i := range m.cfg.Bandwidths {
			if w := m.due(i, n, t) - t; w > wait {
				wait, binding = w, i
			}
		}
		d.Allowed, d.RetryAfter = false, time.Duration(wait)*us
	}
	minRoom := func() int64 {
		r := m.room(0, t)
		for i := range m.cfg.Bandwidths {
			r = min(r, m.room(i, t))
		}
		return r
	}
	switch req.Op {
	case Consume, Estimate, Inspect:
		n := req.Tokens
		if req.Op == Inspect {
			n = 1
		}
		if n > minRoom() {
			deny(n)
		} else if req.Op == Consume {
			m.take(n, t)
			d.Consumed = n
		}
	case ConsumeUpTo:
		if n := min(req.Tokens, minRoom()); n > 0 {
			m.take(n, t)
			d.Consumed = n
		} else {
			deny(1)
		}
	case Add:
		for i, b := range m.cfg.Bandwidths {
			k := t / b.PeriodMicros()
			m.counts[i][k] = max(0, m.counts[i][k]-req.Tokens)
		}
	case Reset, Replace:
		for i := range m.counts {
			if req.Op == Replace && req.Strategy != ResetTokens {
				break // the same config: the counts stay
			}
			m.counts[i] = map[int64]int64{}
		}
	}
	if binding < 0 {
		least := int64(1 << 62)
		for i := range m.cfg.Bandwidths {
			if r := m.room(i, t); r < least {
				least, binding = r, i
			}
		}
	}
	d.Limit, d.Remaining, d.Bandwidth = m.cfg.Bandwidths[binding].Capacity, m.room(binding, t), bandName(m.cfg.Bandwidths, binding)
	if d.Remaining < d.Limit {
		d.RefillAfter = time.Duration(m.due(binding, d.Remaining+1, t)-t) * us
	}
	full := t
	for !m.full(full) {
		full++
	}
	d.ResetAfter = time.Duration(full-t) * us
	return d
}

func (m *counterModel) full(t int64) bool {
	for i, b := range m.cfg.Bandwidths {
		if !m.fits(i, b.Capacity, t) {
			return false
		}
	}
	return true
}

// TestCounterMatchesModel runs random sequences on small configs through
// Apply and the naive model: every decision must be equal, so Remaining,
// RetryAfter and ResetAfter are those a brute-force search finds, and the
// state expires when ResetAfter says.
func TestCounterMatchesModel(t *testing.T) {
	for seed := range uint64(400) {
		r := rand.New(rand.NewPCG(seed, 7))
		cfg := counterSmallConfig(r)
		m := newCounterModel(cfg)
		var s State
		now := r.Int64N(1000)
		for i := range 60 {
			now += []int64{0, 1, r.Int64N(10), r.Int64N(100)}[r.IntN(4)]
			req := counterRandRequest(r, cfg)
			want := m.apply(req, now)
			got := Apply(&s, cfg, req, now)
			if got != want {
				t.Fatalf("seed %d, step %d: %+v at %d on %+v:\n got %+v\nwant %+v", seed, i, req, now, cfg.Bandwidths, got, want)
			}
			if s.ExpiresAt != now+int64(got.ResetAfter/us) {
				t.Fatalf("seed %d, step %d: expires at %d, want now %d + ResetAfter %v", seed, i, s.ExpiresAt, now, got.ResetAfter)
			}
		}
	}
}

// counterSmallConfig is 1 to 3 bandwidths of up to 8 per up to 40µs.
func counterSmallConfig(r *rand.Rand) Config {
	cfg := counterCfg()
	for i := range 1 + r.IntN(3) {
		w := 1 + r.Int64N(40)
		b := Every(time.Duration(w)*us, 1+r.Int64N(min(8, w)))
		if r.IntN(2) == 0 {
			b = b.WithID(string(rune('a' + i)))
		}
		cfg.Bandwidths = append(cfg.Bandwidths, b)
	}
	return cfg
}

func counterRandRequest(r *rand.Rand, cfg Config) Request {
	ops := []Op{Consume, Consume, Consume, Estimate, ConsumeUpTo, Add, Reset, Replace, Inspect}
	req := Request{Op: ops[r.IntN(len(ops))], Tokens: 1 + r.Int64N(cfg.MinCapacity()), Strategy: Inheritance(r.IntN(4))}
	if req.Op == ConsumeUpTo || req.Op == Add {
		req.Tokens = 1 + r.Int64N(2*cfg.MinCapacity())
	}
	return req
}

// TestCounterExactAtTheLimits runs random sequences on configs at the
// edge of the accepted range (Capacity × period up to 2^53), with config
// changes and the clock jumping and stepping back, checking every
// decision's contract with counterCheckStep.
func TestCounterExactAtTheLimits(t *testing.T) {
	for seed := range uint64(1000) {
		r := rand.New(rand.NewPCG(seed, 11))
		var in [2048]byte
		for i := range in {
			in[i] = byte(r.Uint32())
		}
		counterRun(t, in[:])
	}
}

// counterInput reads a fuzz input as numbers; past its end, as zeros.
type counterInput []byte

func (in *counterInput) next() uint64 {
	var b [8]byte
	n := copy(b[:], *in)
	*in = (*in)[n:]
	return binary.LittleEndian.Uint64(b[:])
}

// in returns a number in [lo, hi].
func (in *counterInput) in(lo, hi int64) int64 {
	return lo + int64(in.next()%uint64(hi-lo+1))
}

// counterBandwidth is a valid bandwidth of any size, often at the limits.
func (in *counterInput) counterBandwidth(id string) Bandwidth {
	const maxPeriod = int64(MaxRefillPeriod / time.Microsecond)
	w := max(1, in.in(1, maxPeriod)>>in.in(0, 45))
	c := min(w, MaxCapacity, maxWeighted/w) // RefillTokens = Capacity ≤ period
	if in.in(0, 1) == 0 {
		c = in.in(1, c)
	}
	return Every(time.Duration(w)*us, c).WithID(id)
}

func (in *counterInput) counterConfig() Config {
	cfg := counterCfg()
	ids := []string{"", "a", "b"}
	for i := range in.in(1, 3) {
		id := ids[in.in(0, 2)]
		if i > 0 && id != "" && slices.ContainsFunc(cfg.Bandwidths, func(b Bandwidth) bool { return b.ID == id }) {
			id = ""
		}
		cfg.Bandwidths = append(cfg.Bandwidths, in.counterBandwidth(id))
	}
	return cfg
}

// counterRun applies a sequence of requests read from in, on two configs,
// checking each with counterCheckStep.
func counterRun(t *testing.T, data []byte) {
	in := counterInput(data)
	cfgs := [2]Config{in.counterConfig(), in.counterConfig()}
	now := in.in(0, maxClock-1)
	var s State
	for len(in) > 0 {
		cfg := cfgs[in.in(0, 1)]
		if err := cfg.Validate(); err != nil {
			t.Fatalf("bad config: %v", err)
		}
		ops := []Op{Consume, Estimate, ConsumeUpTo, Add, Reset, Replace, Inspect}
		req := Request{Op: ops[in.in(0, int64(len(ops)-1))], Strategy: Inheritance(in.in(0, 3))}
		limit := cfg.MinCapacity()
		switch req.Op {
		case Consume, Estimate:
			req.Tokens = in.in(1, limit) >> in.in(0, 50)
			req.Tokens = max(1, req.Tokens)
		case ConsumeUpTo, Add:
			req.Tokens = max(1, in.in(1, 1<<62)>>in.in(0, 62))
		}
		switch in.in(0, 3) {
		case 0:
			now += in.in(0, 100)
		case 1:
			now += in.in(0, 1<<50) >> in.in(0, 50)
		case 2:
			now -= in.in(0, 1<<40) >> in.in(0, 40)
		}
		now = min(max(now, 0), maxClock-1)
		counterCheckStep(t, &s, cfg, req, now)
	}
}

// counterCheckStep applies req and checks the contract: the same decision
// on a copy; decision and state in range; a denial, Estimate and Inspect
// change no count, and every other op only as it reports; Remaining,
// RetryAfter and ResetAfter exact, by asking the state again at the edges.
func counterCheckStep(t *testing.T, s *State, cfg Config, req Request, now int64) {
	t.Helper()
	if err := CheckRequest("key", cfg, req); err != nil {
		t.Fatalf("bad call: %v", err)
	}
	before := cloneState(s)
	again := cloneState(s)
	want := Apply(&again, cfg, req, now)
	d := Apply(s, cfg, req, now)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%+v at %d on %+v, state %+v: got %+v, leaving %+v: "+format,
			append([]any{req, now, cfg.Bandwidths, before, d, *s}, args...)...)
	}
	if d != want || !equalStates(*s, again) {
		fail("on a copy: %+v, leaving %+v", want, again)
	}
	counterCheckState(t, cfg, s, fail)

	// The decision's range.
	bind := -1
	for i := range cfg.Bandwidths {
		if bandName(cfg.Bandwidths, i) == d.Bandwidth {
			bind = i
		}
	}
	if bind < 0 || d.Limit != cfg.Bandwidths[bind].Capacity || d.Remaining < 0 || d.Remaining > d.Limit ||
		d.Consumed < 0 || d.Allowed != (d.RetryAfter == 0) || d.ResetAfter < 0 || d.Degraded {
		fail("out of range")
	}
	if s.ExpiresAt != now+int64(d.ResetAfter/us) {
		fail("expires at %d, not now + ResetAfter", s.ExpiresAt)
	}

	// Counts change only as the decision says.
	base := cloneState(&before)
	if req.Op != Reset && req.Op != Replace {
		Apply(&base, cfg, Request{Op: Inspect, Strategy: req.Strategy}, now)
		for i := range base.Bands {
			switch {
			case req.Op == Add:
				base.Bands[i].Level = max(0, base.Bands[i].Level-req.Tokens)
			case d.Consumed > 0:
				base.Bands[i].Level += d.Consumed
			}
		}
		if !slices.Equal(base.Bands, s.Bands) {
			fail("want bands %+v", base.Bands)
		}
		if (req.Op == Estimate || req.Op == Inspect || !d.Allowed) && d.Consumed != 0 {
			fail("took tokens")
		}
		if req.Op == Consume && d.Allowed && d.Consumed != req.Tokens {
			fail("took %d", d.Consumed)
		}
	}

	// Remaining: the binding bandwidth admits that many and not one more;
	// when allowed, it is the one with the fewest left.
	admits := func(at, n int64) bool {
		c := cloneState(s)
		return Apply(&c, cfg, estimate(n), at).Allowed
	}
	limit := cfg.MinCapacity()
	if d.Allowed {
		if d.Remaining > 0 && !admits(now, min(d.Remaining, limit)) || d.Remaining < limit && admits(now, d.Remaining+1) {
			fail("Remaining %d is not what the bucket admits", d.Remaining)
		}
	}
	if r := counterRoom(&s.Bands[bind], now); r != d.Remaining {
		fail("Remaining %d, but bandwidth %d has room for %d", d.Remaining, bind, r)
	}

	// RetryAfter: denied one µs before, allowed at.
	if !d.Allowed {
		n := req.Tokens
		if req.Op == Inspect || req.Op == ConsumeUpTo {
			n = 1
		}
		at := now + int64(d.RetryAfter/us)
		if at < maxClock && (admits(at-1, n) || !admits(at, n)) {
			fail("RetryAfter is not the first time %d pass", n)
		}
		if due := counterDue(&s.Bands[bind], n, now); due != at {
			fail("the binding bandwidth admits %d at %d, not after RetryAfter", n, due)
		}
	}

	// ResetAfter: every bandwidth full at, not one µs before.
	at := s.ExpiresAt
	if at > now && at < maxClock {
		c := cloneState(s)
		Apply(&c, cfg, inspect(), at-1)
		full := true
		for i := range c.Bands {
			full = full && counterRoom(&c.Bands[i], at-1) == c.Bands[i].Capacity
		}
		if full {
			fail("full at %d, before the expiry", at-1)
		}
	}
}

// counterCheckState checks the state's range: counts within capacity,
// windows aligned, every value within 2^53.
func counterCheckState(t *testing.T, cfg Config, s *State, fail func(string, ...any)) {
	t.Helper()
	if s.Algorithm != SlidingWindowCounter || s.Fingerprint != cfg.Fingerprint() || len(s.Bands) != len(cfg.Bandwidths) || s.Log != nil {
		fail("state not of the config")
	}
	for i, b := range cfg.Bandwidths {
		st := s.Bands[i]
		w := b.PeriodMicros()
		if st.ID != b.ID || st.Capacity != b.Capacity || st.Scale != w || st.Rate != 0 || st.Level < 0 || st.Level > b.Capacity ||
			st.Prev < 0 || st.Prev > b.Capacity || st.Stamp < 0 || st.Stamp%w != 0 || st.Stamp+2*w >= exact {
			fail("bandwidth %d out of range", i)
		}
	}
}

// FuzzSlidingCounter runs sequences of requests on sliding window
// counters read from the input, checking each with counterCheckStep.
func FuzzSlidingCounter(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\x0f\x00"))
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 3))
		in := make([]byte, 512)
		for i := range in {
			in[i] = byte(r.Uint32())
		}
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		counterRun(t, data)
	})
}
