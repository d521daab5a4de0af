package ratelimit

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func gcraOf(bws ...Bandwidth) Config { return Config{Algorithm: GCRA, Bandwidths: bws} }

// gcraAs returns cfg for another algorithm, with the same bandwidths.
func gcraAs(cfg Config, alg Algorithm) Config {
	cfg.Algorithm = alg
	return cfg
}

// thirds is 3 tokens per 10µs: an emission interval of 10/3µs, 10 scaled
// units to a token, 3 gained a microsecond.
var thirds = Every(10*us, 3)

func TestGCRASteps(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			// TATs: 30 after the burst, then 13⅓, 16⅔, 20 as the interval
			// of 10/3µs allows; a retry is the wait rounded up.
			"3 per 10µs: a TAT between microseconds",
			gcraOf(thirds),
			[]step{
				{at: 0, req: consume(3), want: allowed(3, 0, 3, 10, "0")},
				{at: 0, req: consume(1), want: denied(3, 0, 4, 10, "0")},
				{at: 3, req: consume(1), want: denied(3, 0, 1, 7, "0")},
				{at: 4, req: consume(1), want: allowed(3, 0, 1, 10, "0")},
				{at: 7, req: consume(1), want: allowed(3, 0, 1, 10, "0")},
				{at: 10, req: consume(1), want: allowed(3, 0, 1, 10, "0")},
				{at: 13, req: estimate(1), want: denied(3, 0, 1, 7, "0")},
				{at: 14, req: inspect(), want: allowed(3, 1, 0, 6, "0")},
				{at: 20, req: consumeUpTo(5), want: allowed(3, 0, 3, 10, "0")},
				// Reserve: the TAT goes to 36⅔; the 2 tokens conform at 26⅔.
				{at: 20, req: reserve(2, 7*us), want: reserved(3, 0, 2, 7, 17, "0")},
				{at: 20, req: reserve(1, 9*us), want: denied(3, 0, 10, 17, "0")},
				// Add moves the TAT back 10/3µs, to 33⅓.
				{at: 21, req: add(1), want: allowed(3, 0, 0, 13, "0")},
				{at: 40, req: inspect(), want: allowed(3, 3, 0, 0, "0")},
			},
		},
		{
			"two bandwidths: the one with fewest tokens, or the slowest, binds",
			gcraOf(thirds.WithID("a"), Every(100*us, 1).WithBurst(5).WithID("b")),
			[]step{
				{at: 0, req: consume(3), want: allowed(3, 0, 3, 300, "a")},
				{at: 4, req: consume(1), want: allowed(3, 0, 1, 396, "a")},
				{at: 10, req: consume(2), want: denied(5, 1, 90, 390, "b")},
				{at: 100, req: consume(2), want: allowed(5, 0, 2, 500, "b")},
			},
		},
		{
			// At 95 the TAT, 103⅓, is 8⅓µs ahead: one more interval
			// would pass the tolerance of 10µs until 97. A token bucket
			// would hand out the 2 tokens it held at 100 at once.
			"clock stepped back: the TAT counts from the clock",
			gcraOf(thirds),
			[]step{
				{at: 100, req: consume(1), want: allowed(3, 2, 1, 4, "0")},
				{at: 95, req: consume(1), want: denied(3, 0, 2, 9, "0")},
				{at: 97, req: consume(1), want: allowed(3, 0, 1, 10, "0")},
				// Add moves the TAT back from 106⅔ to 103⅓, then to 95,
				// the clock, and not before.
				{at: 95, req: add(1), want: allowed(3, 0, 0, 9, "0")},
				{at: 95, req: add(5), want: allowed(3, 3, 0, 0, "0")},
				// A TAT of 105 is 11µs ahead of a clock at 94.
				{at: 95, req: consume(3), want: allowed(3, 0, 3, 10, "0")},
				{at: 94, req: inspect(), want: denied(3, 0, 5, 11, "0")},
				{at: 100, req: inspect(), want: allowed(3, 1, 0, 5, "0")},
			},
		},
		{
			// A new bucket holds 1 token, its TAT 6⅔µs ahead. A state
			// lasts until full plus the time a new bucket takes (7µs): the
			// one Inspect leaves at 13 until 20.
			"initial tokens",
			gcraOf(thirds.WithInitialTokens(1)),
			[]step{
				{at: 0, req: inspect(), want: allowed(3, 1, 0, 7, "0")},
				{at: 13, req: inspect(), want: allowed(3, 3, 0, 0, "0")},
				{at: 20, req: inspect(), want: allowed(3, 1, 0, 7, "0")},
			},
		},
		{
			"a leaky bucket admits no burst above its capacity",
			gcraAs(gcraOf(thirds), LeakyBucket),
			[]step{
				{at: 0, req: consume(3), want: allowed(3, 0, 3, 10, "0")},
				{at: 0, req: consume(1), want: denied(3, 0, 4, 10, "0")},
				{at: 1000, req: consume(3), want: allowed(3, 0, 3, 10, "0")},
				{at: 1004, req: consumeUpTo(3), want: allowed(3, 0, 1, 10, "0")},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

// TestGCRAConfigChange: a config change keeps each matched bandwidth's
// TAT, whatever the strategy but ResetTokens, rounded up to a whole µs and
// within the new bandwidth's debt limits; others start afresh.
func TestGCRAConfigChange(t *testing.T) {
	old := gcraOf(oneMs.WithBurst(10).WithID("a"))
	// The TAT, 6000, is 5500µs ahead at 500: 11 of the new 500µs
	// intervals, so 9 of 20 tokens conform, where a token bucket would
	// keep 4 tokens and refill 1 since: 5.
	faster := gcraOf(Every(1000*us, 2).WithBurst(20).WithID("a"))
	const year = 366 * 24 * time.Hour
	tests := []struct {
		name  string
		steps []step
	}{
		{"the time until full carries over", []step{
			{at: 0, req: consume(6), want: allowed(10, 4, 6, 6000, "a")},
			{at: 500, cfg: &faster, req: inspect(), want: allowed(20, 9, 0, 5500, "a")},
		}},
		{"whatever the strategy", []step{
			{at: 0, req: consume(6), want: allowed(10, 4, 6, 6000, "a")},
			{at: 500, cfg: &faster, req: Request{Op: Inspect, Strategy: Proportionally}, want: allowed(20, 9, 0, 5500, "a")},
			{at: 500, cfg: &faster, req: Request{Op: Replace, Strategy: Additive}, want: allowed(20, 9, 0, 5500, "a")},
		}},
		{"but ResetTokens", []step{
			{at: 0, req: consume(6), want: allowed(10, 4, 6, 6000, "a")},
			{at: 500, cfg: &faster, req: Request{Op: Replace, Strategy: ResetTokens}, want: allowed(20, 20, 0, 0, "a")},
		}},
		{"an unmatched bandwidth starts afresh", []step{
			{at: 0, req: consume(6), want: allowed(10, 4, 6, 6000, "a")},
			{at: 500, cfg: ptr(gcraOf(Every(1000*us, 2).WithBurst(20).WithID("b"), oneMs.WithBurst(10).WithInitialTokens(3))), req: inspect(), want: allowed(10, 3, 0, 7000, "1")},
		}},
		{
			// A TAT of 3⅓ becomes 4: 12 scaled units ahead of 0, not 10,
			// which leaves 2 whole tokens of 4, not 3.
			"the fraction rounds up",
			[]step{
				{at: 0, cfg: ptr(gcraOf(thirds.WithID("a"))), req: consume(1), want: allowed(3, 2, 1, 4, "a")},
				{at: 0, cfg: ptr(gcraOf(thirds.WithBurst(4).WithID("a"))), req: inspect(), want: allowed(4, 2, 0, 4, "a")},
			},
		},
		{
			// A token a year, reserved a year ahead: a TAT two years off.
			// The new bandwidth gains 2^20 - 1 units a µs and may be
			// 2^51 + 2^20 units ahead: 2147485697µs, about 36 minutes.
			"within the new debt limits",
			[]step{
				{at: 0, cfg: ptr(gcraOf(Every(year, 1).WithID("a"))), req: consume(1), want: allowed(1, 0, 1, int64(year/us), "a")},
				{at: 0, cfg: ptr(gcraOf(Every(year, 1).WithID("a"))), req: reserve(1, time.Duration(math.MaxInt64)), want: reserved(1, 0, 1, int64(year/us), 2*int64(year/us), "a")},
				{at: 0, cfg: ptr(gcraOf(Every(1<<20*us, 1<<20-1).WithBurst(1).WithID("a"))), req: inspect(), want: denied(1, 0, 2147485697, 2147485697, "a")},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, old, tt.steps) })
	}
}

// TestGCRAState: the state is one TAT per bandwidth, its whole µs in
// Stamp and its fraction, in 1/Rate µs, in Level.
func TestGCRAState(t *testing.T) {
	cfg := gcraOf(thirds.WithID("a"), PerSecond(10))
	var s State
	Apply(&s, cfg, consume(1), 1000)
	want := []BandState{
		{ID: "a", Capacity: 3, Scale: 10, Rate: 3, Level: 1, Stamp: 1003}, // 1003⅓
		{Capacity: 10, Scale: 100000, Rate: 1, Stamp: 101000},
	}
	if !slices.Equal(s.Bands, want) || s.ExpiresAt != 101000 || s.Algorithm != GCRA {
		t.Fatalf("state %+v; want bands %+v expiring at 101000", s, want)
	}
}

// TestGCRAStateAlgorithm: a GCRA state is another algorithm's to a leaky
// bucket, and the other way round, so it starts afresh.
func TestGCRAStateAlgorithm(t *testing.T) {
	g := gcraOf(thirds)
	var s State
	Apply(&s, g, consume(3), 0)
	if d := Apply(&s, gcraAs(g, LeakyBucket), consume(3), 1); !d.Allowed || s.Algorithm != LeakyBucket {
		t.Fatalf("LeakyBucket on a GCRA state = %+v, state %+v; want a new bucket", d, s)
	}
	if d := Apply(&s, g, consume(3), 2); !d.Allowed || s.Algorithm != GCRA {
		t.Fatalf("GCRA on a LeakyBucket state = %+v, state %+v; want a new bucket", d, s)
	}
}

// TestGCRARetryAfterExact: for intervals that are not whole microseconds,
// the tokens a denial lacked conform exactly at RetryAfter, not 1µs before
// (gcraChecked checks that).
func TestGCRARetryAfterExact(t *testing.T) {
	for period := int64(1); period <= 40; period++ {
		for tokens := int64(1); tokens <= period; tokens++ {
			cfg := gcraOf(Every(time.Duration(period)*us, tokens).WithBurst(5))
			var s State
			now := int64(1000)
			gcraChecked(t, &s, cfg, consume(5), now)
			for n := int64(1); n <= 5; n++ {
				d := gcraChecked(t, &s, cfg, estimate(n), now)
				c := cloneState(&s)
				if got := gcraChecked(t, &c, cfg, consume(n), now+int64(d.RetryAfter/us)); !got.Allowed {
					t.Fatalf("%d per %dµs: %d tokens denied at RetryAfter %v", tokens, period, n, d.RetryAfter)
				}
			}
		}
	}
}

// TestGCRAAddFarBehind: Add on a clock far behind the TAT moves it back
// exactly n×T even where n×Scale passes 2^64, and to the clock at most
// (gcraChecked checks the TATs).
func TestGCRAAddFarBehind(t *testing.T) {
	const year = 366 * 24 * time.Hour
	for _, bw := range []Bandwidth{
		Every(1<<40*us, 1<<40-1).WithBurst(1000),
		Every(year, int64(year/us)-7).WithBurst(3),
		Every(year-us, 1<<44+1).WithBurst(9),
		Every(year, 1),
	} {
		cfg := gcraOf(bw)
		var s State
		now := int64(1 << 51)
		gcraChecked(t, &s, cfg, reserve(bw.Capacity, math.MaxInt64), now)
		gcraChecked(t, &s, cfg, reserve(bw.Capacity, math.MaxInt64), now)
		for _, n := range []int64{1, 100000, 1 << 20, 3<<21 + 5, 1 << 30, 1 << 40, math.MaxInt64} {
			gcraChecked(t, &s, cfg, add(n), now-1<<32)
			gcraChecked(t, &s, cfg, reserve(bw.Capacity, math.MaxInt64), now)
		}
	}
}

// gcraTAT is st's TAT in µs, exactly.
func gcraTAT(st *BandState) *big.Rat {
	return gcraAdd(gcraRat(st.Stamp), big.NewRat(st.Level, st.Rate))
}

// gcraChecked is Apply on a GCRA or LeakyBucket state, checking its
// contract: the decision and the state stay in range, and a copy of the
// state gets the same; a state that is absent, expired, reset or another
// algorithm's decides as a new bucket; a denial's RetryAfter is exact;
// every op records when the state expires; and but for Reset and Replace,
// every TAT is where the state as it was, brought to cfg, puts it: moved
// to max(TAT, now) + Consumed×T by what takes, to max(TAT − Tokens×T, now)
// by Add, and not at all by Estimate, Inspect or a denial.
func gcraChecked(t *testing.T, s *State, cfg Config, req Request, now int64) Decision {
	t.Helper()
	if err := CheckRequest("key", cfg, req); err != nil {
		t.Fatalf("bad call: %v", err)
	}
	stored, again := cloneState(s), cloneState(s)
	want := Apply(&again, cfg, req, now)
	d := Apply(s, cfg, req, now)
	checkDecision(t, cfg, req, d)
	if d != want || !equalStates(*s, again) {
		t.Fatalf("%+v at %d = %+v, leaving %+v; on a copy = %+v, leaving %+v", req, now, d, *s, want, again)
	}
	if len(stored.Bands) == 0 || now >= stored.ExpiresAt || req.Op == Reset || stored.Algorithm != cfg.Algorithm {
		var fresh State
		if want := Apply(&fresh, cfg, req, now); d != want || !equalStates(*s, fresh) {
			t.Fatalf("%+v at %d on %+v (absent, expired, reset or another algorithm's) = %+v, leaving %+v; want a new bucket's %+v, leaving %+v",
				req, now, stored, d, *s, want, fresh)
		}
	}
	checkRetryAfter(t, s, cfg, req, d, now)
	checkExpiresAt(t, cfg, s, d, now)
	gcraCheckState(t, cfg, s)
	if req.Op == Reset || req.Op == Replace {
		return d
	}
	base := refilledWith(&stored, cfg, req.Strategy, now)
	clock := gcraRat(now)
	for i := range base.Bands {
		b := &base.Bands[i]
		tat, interval := gcraTAT(b), big.NewRat(b.Scale, b.Rate)
		switch {
		case req.Op == Add:
			tat = gcraMax(gcraSub(tat, gcraMul(gcraRat(req.Tokens), interval)), clock)
		case d.Consumed > 0:
			tat = gcraAdd(gcraMax(tat, clock), gcraMul(gcraRat(d.Consumed), interval))
		}
		if got := gcraTAT(&s.Bands[i]); got.Cmp(tat) != 0 {
			t.Fatalf("%+v at %d (%+v) on %+v: Bands[%d]'s TAT is %v, want %v", req, now, d, stored, i, got.RatString(), tat.RatString())
		}
	}
	return d
}

// gcraCheckState checks that s is a state of cfg within range: each
// bandwidth's numbers, a fraction below its rate, and a TAT from 0 to the
// expiry.
func gcraCheckState(t *testing.T, cfg Config, s *State) {
	t.Helper()
	if s.Fingerprint != cfg.Fingerprint() || s.Algorithm != cfg.Algorithm || len(s.Bands) != len(cfg.Bandwidths) || s.Log != nil {
		t.Fatalf("state %+v was not built for config %s", *s, describe(cfg))
	}
	for i := range s.Bands {
		b, st := &cfg.Bandwidths[i], &s.Bands[i]
		scale, rate := b.Units()
		switch {
		case *st != BandState{ID: b.ID, Capacity: b.Capacity, Scale: scale, Rate: rate, Level: st.Level, Stamp: st.Stamp}:
			t.Fatalf("Bands[%d] = %+v, want ID %q, Capacity %d, Scale %d, Rate %d", i, *st, b.ID, b.Capacity, scale, rate)
		case st.Level < 0 || st.Level >= st.Rate:
			t.Fatalf("Bands[%d] = %+v: fraction beyond 0 to Rate", i, *st)
		case st.Stamp < 0 || gcraCeil(gcraTAT(st)) > s.ExpiresAt:
			t.Fatalf("Bands[%d] = %+v: TAT before 0 or after the expiry %d", i, *st, s.ExpiresAt)
		}
	}
}

// gcraRandConfig returns a valid GCRA config of 1 to 3 bandwidths: small
// numbers whose intervals are seldom whole microseconds, or (huge) numbers
// near the limits of the accepted range.
func gcraRandConfig(r *rand.Rand, huge bool) Config {
	for {
		cfg := Config{Algorithm: GCRA}
		ids := []string{"", "", "a", "b", "c"}
		for range 1 + r.IntN(3) {
			id := ids[r.IntN(len(ids))]
			for _, b := range cfg.Bandwidths {
				if b.ID == id {
					id = ""
				}
			}
			period, capacity := 1+r.Int64N(40), 1+r.Int64N(8)
			tokens := 1 + r.Int64N(period)
			if huge {
				period = 1 + r.Int64N(int64(MaxRefillPeriod/us))
				capacity = 1 + r.Int64N(MaxCapacity)>>r.IntN(50)
				tokens = 1 + r.Int64N(period)>>r.IntN(40)
			}
			b := Bandwidth{ID: id, Capacity: capacity, RefillTokens: tokens, RefillPeriod: time.Duration(period) * us}
			if r.IntN(3) == 0 {
				b = b.WithInitialTokens(r.Int64N(capacity + 1))
			}
			cfg.Bandwidths = append(cfg.Bandwidths, b)
		}
		if cfg.Validate() == nil {
			return cfg
		}
	}
}

// gcraForward moves the clock ahead: mostly a little, with huge sometimes
// far.
func gcraForward(r *rand.Rand, now int64, huge bool) int64 {
	switch k := r.IntN(10); {
	case k < 4:
		now += r.Int64N(60)
	case k < 5:
		now += r.Int64N(400)
	case k < 6 && huge:
		now += r.Int64N(1 << 50)
	}
	return min(now, maxClock-1)
}

// gcraStep is one request of a random sequence, for failure messages.
type gcraStep struct {
	at  int64
	cfg int
	req Request
	got Decision
}

func gcraHistory(steps []gcraStep) string {
	var b strings.Builder
	for i, s := range steps {
		fmt.Fprintf(&b, "  %2d at %dµs cfg %d: %+v -> %+v\n", i, s.at, s.cfg, s.req, s.got)
	}
	return b.String()
}

// gcraSameAsTokenBucket compares a GCRA state with a token bucket's of the
// same bandwidths at now, both just used: the token bucket, refilled to
// now, holds Capacity×Scale less what the TAT is ahead, max(TAT, now) − now,
// in scaled units.
func gcraSameAsTokenBucket(gcra, tb *State, now int64) error {
	if gcra.ExpiresAt != tb.ExpiresAt || len(gcra.Bands) != len(tb.Bands) {
		return fmt.Errorf("expiring at %d, not %d; or not as many bandwidths", gcra.ExpiresAt, tb.ExpiresAt)
	}
	for i := range gcra.Bands {
		g, b := &gcra.Bands[i], &tb.Bands[i]
		ahead := gcraMul(gcraSub(gcraMax(gcraTAT(g), gcraRat(now)), gcraRat(now)), gcraRat(g.Rate))
		if b.Stamp != now || ahead.Cmp(gcraRat(b.Capacity*b.Scale-b.Level)) != 0 {
			return fmt.Errorf("Bands[%d]: TAT %v ahead of %d by %v units; the token bucket's %+v", i, gcraTAT(g).RatString(), now, ahead.RatString(), *b)
		}
	}
	return nil
}

// TestGCRAMatchesTokenBucket runs seeded random sequences on a clock that
// never goes back, switching between two configs now and then, through a
// GCRA, a TokenBucket and (in a third of them, with no Reserve) a
// LeakyBucket of the same bandwidths. Every request's Strategy is
// ResetTokens: a config change then starts each afresh, while any other
// keeps tokens in a token bucket and arrival times in GCRA. Every decision
// must be the same, the token bucket must hold what each TAT leaves, and
// the leaky bucket's state must be GCRA's.
func TestGCRAMatchesTokenBucket(t *testing.T) {
	sequences, steps := 4000, 40
	if testing.Short() {
		sequences = 600
	}
	for seed := range uint64(sequences) {
		r := rand.New(rand.NewPCG(seed, 0x6c7a))
		huge := r.IntN(3) == 0
		leaky := r.IntN(3) == 0
		cfgs := [2]Config{gcraRandConfig(r, huge), gcraRandConfig(r, huge)}
		if !huge && r.IntN(2) == 0 {
			cfgs[1] = gcraAs(replan(r, cfgs[0]), GCRA)
		}
		var gcra, tb, lb State
		now := r.Int64N(1 << 51)
		cur := 0
		var log []gcraStep
		for i := range steps {
			now = gcraForward(r, now, huge)
			if r.IntN(6) == 0 {
				cur = 1 - cur
			}
			cfg := cfgs[cur]
			req := randRequest(r, cfg)
			req.Strategy = ResetTokens
			if leaky && req.Op == Reserve {
				req.Op, req.MaxWait = Consume, 0
			}
			got := Apply(&gcra, cfg, req, now)
			want := Apply(&tb, gcraAs(cfg, TokenBucket), req, now)
			log = append(log, gcraStep{now, cur, req, got})
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d, step %d: %+v at %dµs\ncfg 0: %s\ncfg 1: %s\nsteps:\n%s%s", seed, i, req, now,
					describe(cfgs[0]), describe(cfgs[1]), gcraHistory(log), fmt.Sprintf(format, args...))
			}
			if err := gcraSameAsTokenBucket(&gcra, &tb, now); got != want || err != nil {
				fail("GCRA %+v, state %+v\nTokenBucket %+v, state %+v\n%v", got, gcra, want, tb, err)
			}
			if !leaky {
				continue
			}
			if d := Apply(&lb, gcraAs(cfg, LeakyBucket), req, now); d != got || !slices.Equal(lb.Bands, gcra.Bands) || lb.ExpiresAt != gcra.ExpiresAt {
				fail("LeakyBucket %+v, state %+v\nGCRA %+v, state %+v", d, lb, got, gcra)
			}
		}
	}
}

// gcraModel is a naive GCRA, the reference for the clock that steps back
// and the config that changes: it keeps each bandwidth's TAT as an exact
// fraction of a microsecond and decides by the rules as gcra.go states
// them, with no scaled units but for the debt limit, which is defined in
// them.
type gcraModel struct {
	alg     Algorithm
	fp      uint64
	bands   []gcraModelBand
	expires int64
}

type gcraModelBand struct {
	bw  Bandwidth
	t   *big.Rat // the emission interval, µs per token
	tat *big.Rat
}

func gcraRat(n int64) *big.Rat { return new(big.Rat).SetInt64(n) }

func gcraAdd(a, b *big.Rat) *big.Rat { return new(big.Rat).Add(a, b) }
func gcraSub(a, b *big.Rat) *big.Rat { return new(big.Rat).Sub(a, b) }
func gcraMul(a, b *big.Rat) *big.Rat { return new(big.Rat).Mul(a, b) }
func gcraQuo(a, b *big.Rat) *big.Rat { return new(big.Rat).Quo(a, b) }

func gcraFloor(x *big.Rat) int64 { return new(big.Int).Div(x.Num(), x.Denom()).Int64() }
func gcraCeil(x *big.Rat) int64  { return -gcraFloor(new(big.Rat).Neg(x)) }

func gcraMax(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) >= 0 {
		return a
	}
	return b
}

func gcraMin(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) <= 0 {
		return a
	}
	return b
}

// horizon is how far, in µs, a TAT may be ahead of the clock after a
// reservation or a config change: 2^51µs, and 2^51 scaled units beyond
// empty.
func (b *gcraModelBand) horizon() *big.Rat {
	_, rate := b.bw.Units()
	return gcraMin(gcraAdd(gcraMul(gcraRat(b.bw.Capacity), b.t), big.NewRat(MaxScaled, rate)), gcraRat(maxHorizon))
}

func gcraNewModelBand(bw Bandwidth, now int64) gcraModelBand {
	b := gcraModelBand{bw: bw, t: big.NewRat(bw.PeriodMicros(), bw.RefillTokens)}
	b.tat = gcraAdd(gcraRat(now), gcraMul(gcraRat(bw.Capacity-bw.Initial()), b.t))
	return b
}

// ahead is max(TAT − now, 0) in µs.
func (b *gcraModelBand) ahead(now int64) *big.Rat {
	return gcraSub(gcraMax(b.tat, gcraRat(now)), gcraRat(now))
}

func (b *gcraModelBand) remaining(now int64) int64 {
	return max(0, gcraFloor(gcraSub(gcraRat(b.bw.Capacity), gcraQuo(b.ahead(now), b.t))))
}

func (m *gcraModel) apply(cfg Config, req Request, now int64) Decision {
	fp := cfg.Fingerprint()
	switch {
	case len(m.bands) == 0 || req.Op == Reset || now >= m.expires || m.alg != cfg.Algorithm:
		m.bands = m.bands[:0]
		for _, bw := range cfg.Bandwidths {
			m.bands = append(m.bands, gcraNewModelBand(bw, now))
		}
	case req.Op == Replace || m.fp != fp:
		m.convert(cfg, req.Strategy, now)
	}
	m.alg, m.fp = cfg.Algorithm, fp
	d := Decision{Allowed: true}
	binding := -1
	switch req.Op {
	case Consume, Estimate, Reserve, Inspect:
		n := req.Tokens
		if req.Op == Inspect {
			n = 1
		}
		wait, slowest := m.wait(n, now)
		switch {
		case req.Op == Consume && wait == 0, req.Op == Reserve && wait <= int64(req.MaxWait/us) && m.withinHorizon(n, now):
			m.take(n, now)
			d.Consumed, d.RetryAfter = n, micros(wait)
		case wait > 0:
			d.Allowed, d.RetryAfter, binding = false, micros(wait), slowest
		}
	case ConsumeUpTo:
		n := req.Tokens
		for i := range m.bands {
			n = min(n, m.bands[i].remaining(now))
		}
		if n > 0 {
			m.take(n, now)
			d.Consumed = n
		} else {
			wait, slowest := m.wait(1, now)
			d.Allowed, d.RetryAfter, binding = false, micros(wait), slowest
		}
	case Add:
		for i := range m.bands {
			b := &m.bands[i]
			b.tat = gcraMax(gcraSub(b.tat, gcraMul(gcraRat(req.Tokens), b.t)), gcraRat(now))
		}
	}
	var reset, warmup int64
	fewest, least := binding < 0, int64(math.MaxInt64)
	for i := range m.bands {
		b := &m.bands[i]
		if r := b.remaining(now); fewest && r < least {
			least, binding = r, i
		}
		reset = max(reset, gcraCeil(b.ahead(now)))
		warmup = max(warmup, gcraCeil(gcraMul(gcraRat(b.bw.Capacity-b.bw.Initial()), b.t)))
	}
	b := &m.bands[binding]
	d.Limit, d.Remaining, d.Bandwidth = b.bw.Capacity, b.remaining(now), cfg.BandwidthName(binding)
	if d.Remaining < d.Limit {
		d.RefillAfter = micros(b.wait(d.Remaining+1, now))
	}
	d.ResetAfter = micros(reset)
	m.expires = now + reset + warmup
	return d
}

// convert keeps each matched bandwidth's TAT, rounded up to a whole µs and
// at most the new horizon ahead of now, rounded down; ResetTokens, or no
// match, starts a bandwidth afresh.
func (m *gcraModel) convert(cfg Config, strategy Inheritance, now int64) {
	old := m.bands
	m.bands = nil
	for i, bw := range cfg.Bandwidths {
		nb := gcraNewModelBand(bw, now)
		j := slices.IndexFunc(old, func(o gcraModelBand) bool { return bw.ID != "" && o.bw.ID == bw.ID })
		if bw.ID == "" && i < len(old) && old[i].bw.ID == "" {
			j = i
		}
		if strategy != ResetTokens && j >= 0 {
			last := gcraFloor(gcraAdd(gcraRat(now), nb.horizon()))
			nb.tat = gcraRat(min(gcraCeil(old[j].tat), last))
		}
		m.bands = append(m.bands, nb)
	}
}

// wait is the µs until every bandwidth conforms n tokens, and the slowest.
func (m *gcraModel) wait(n, now int64) (wait int64, slowest int) {
	for i := range m.bands {
		if w := m.bands[i].wait(n, now); w > wait {
			wait, slowest = w, i
		}
	}
	return wait, slowest
}

// wait is the µs until b conforms n tokens; 0 if it does.
func (b *gcraModelBand) wait(n, now int64) int64 {
	return max(0, gcraCeil(gcraAdd(b.ahead(now), gcraMul(gcraRat(n-b.bw.Capacity), b.t))))
}

func (m *gcraModel) withinHorizon(n, now int64) bool {
	for i := range m.bands {
		b := &m.bands[i]
		if gcraAdd(b.ahead(now), gcraMul(gcraRat(n), b.t)).Cmp(b.horizon()) > 0 {
			return false
		}
	}
	return true
}

func (m *gcraModel) take(n, now int64) {
	for i := range m.bands {
		b := &m.bands[i]
		b.tat = gcraAdd(gcraMax(b.tat, gcraRat(now)), gcraMul(gcraRat(n), b.t))
	}
}

// gcraCheckModel compares s with the model's state: each bandwidth's TAT,
// and the expiry.
func gcraCheckModel(s *State, m *gcraModel) error {
	if len(s.Bands) != len(m.bands) || s.ExpiresAt != m.expires {
		return fmt.Errorf("%d bandwidths expiring at %d, want %d at %d", len(s.Bands), s.ExpiresAt, len(m.bands), m.expires)
	}
	for i := range s.Bands {
		if tat := gcraTAT(&s.Bands[i]); tat.Cmp(m.bands[i].tat) != 0 {
			return fmt.Errorf("Bands[%d] = %+v: TAT %v, want %v", i, s.Bands[i], tat.RatString(), m.bands[i].tat.RatString())
		}
	}
	return nil
}

// TestGCRAMatchesModel runs seeded random sequences with the clock moving
// ahead and stepping back, on two configs in turn, with every strategy,
// through Apply (checked by gcraChecked) and the naive model: decisions,
// TATs and expiries must be equal.
func TestGCRAMatchesModel(t *testing.T) {
	sequences, steps := 1000, 40
	if testing.Short() {
		sequences = 100
	}
	for seed := range uint64(sequences) {
		r := rand.New(rand.NewPCG(seed, 0x7a7))
		huge := r.IntN(3) == 0
		alg := GCRA
		if r.IntN(3) == 0 {
			alg = LeakyBucket
		}
		cfgs := [2]Config{gcraAs(gcraRandConfig(r, huge), alg), gcraAs(gcraRandConfig(r, huge), alg)}
		if !huge && r.IntN(2) == 0 {
			cfgs[1] = gcraAs(replan(r, cfgs[0]), alg)
		}
		var (
			s   State
			m   gcraModel
			cur int
			log []gcraStep
		)
		now := r.Int64N(1 << 51)
		for i := range steps {
			now = gcraForward(r, now, huge)
			if r.IntN(5) == 0 {
				now = max(0, now-r.Int64N(50))
				if huge && r.IntN(2) == 0 {
					now = max(0, now-r.Int64N(1<<32))
				}
			}
			if r.IntN(6) == 0 {
				cur = 1 - cur
			}
			cfg := cfgs[cur]
			req := randRequest(r, cfg)
			if !alg.Supports(req.Op) {
				req.Op, req.MaxWait = Consume, 0
			}
			got := gcraChecked(t, &s, cfg, req, now)
			want := m.apply(cfg, req, now)
			log = append(log, gcraStep{now, cur, req, got})
			err := gcraCheckModel(&s, &m)
			if got != want || err != nil {
				t.Fatalf("seed %d, step %d: %+v at %dµs\ncfg 0: %s\ncfg 1: %s\nsteps:\n%s got %+v\nwant %+v\nstate: %v",
					seed, i, req, now, describe(cfgs[0]), describe(cfgs[1]), gcraHistory(log), got, want, err)
			}
		}
	}
}

// gcraFuzzConfig reads a config from the fuzzer's bytes and makes it one
// alg takes: Greedy refill.
func gcraFuzzConfig(in *fuzzInput, alg Algorithm) Config {
	cfg := in.config()
	cfg.Algorithm = alg
	for i := range cfg.Bandwidths {
		cfg.Bandwidths[i].Refill, cfg.Bandwidths[i].AlignedStart = Greedy, time.Time{}
	}
	return cfg
}

// FuzzGCRA decodes two configs and a run of requests and clock moves from
// the input, and checks after every request Apply's contract (gcraChecked:
// bounds, no TAT moved by a denial, exact RetryAfter and expiry), the
// naive model's decision and TATs, the bound on the expiry, and, until the
// clock first steps back or the config changes with a strategy other than
// ResetTokens, the token bucket's decision.
func FuzzGCRA(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x00\x00\x05\x00\x05\x00\x05\x01"))
	f.Add([]byte("\x00\x02\x01\x02\x01\x00\x10\x00\x08\x02\x30\x00\x01\x03\x01\x05\x02\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x08\x08\x02\x06\x02\x03\x00\x01"))
	f.Add([]byte("\x01\x01\x00\x01\x02\x30\x00\x01\x02\x33\x00\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x02\x00\x00\x02\x00\x00\x09\x01\x40\x00\x07\x0d\x00\x02\x00"))
	f.Add([]byte("\x00\x00\x02\x01\x03\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00\x03\x01\x00\x01\x00\x01\x00\x03\x00\x00\x01\x01\x01\x0a\x0b\x03\x02\x00\x00\x04\x02\x05\x00\x06\x03\x0d\x03\x0f\x02\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := fuzzInput(data)
		alg := GCRA
		if in.byte()%2 == 1 {
			alg = LeakyBucket
		}
		cfgs := [2]Config{gcraFuzzConfig(&in, alg), gcraFuzzConfig(&in, alg)}
		if cfgs[0].Validate() != nil {
			return
		}
		if cfgs[1].Validate() != nil {
			cfgs[1] = cfgs[0]
		}
		var s, tb State
		var m gcraModel
		cur := 0
		now := in.in(0, maxClock-1)
		latest, asTokenBucket := now, true
		for len(in) > 0 {
			switch k := in.byte() % 16; {
			case k < 10:
				cfg := cfgs[cur]
				req := in.request(cfg)
				if !alg.Supports(req.Op) {
					req.Op, req.MaxWait = Consume, 0
				}
				if (req.Op == Replace || len(s.Bands) > 0 && s.Fingerprint != cfg.Fingerprint()) && req.Strategy != ResetTokens {
					asTokenBucket = false
				}
				d := gcraChecked(t, &s, cfg, req, now)
				if want := m.apply(cfg, req, now); d != want {
					t.Fatalf("%+v at %d = %+v; the model decides %+v", req, now, d, want)
				}
				if err := gcraCheckModel(&s, &m); err != nil {
					t.Fatalf("%+v at %d: %v", req, now, err)
				}
				if s.ExpiresAt-latest > 1<<52 {
					t.Fatalf("ExpiresAt = %d, more than 2^52µs after the latest clock, %d", s.ExpiresAt, latest)
				}
				if asTokenBucket {
					if want := Apply(&tb, gcraAs(cfg, TokenBucket), req, now); d != want {
						t.Fatalf("%+v at %d = %+v; a token bucket decides %+v", req, now, d, want)
					}
				}
			case k < 13:
				now = min(now+in.in(0, 1<<51), maxClock-1)
				latest = max(latest, now)
			case k < 14:
				now = max(0, now-in.in(0, 1<<32))
				asTokenBucket = false
			default:
				cur = 1 - cur
			}
		}
	})
}
