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

func fixedCfg(bws ...Bandwidth) Config { return Config{Algorithm: FixedWindow, Bandwidths: bws} }

// TestFixedWindowCounts steps buckets through windows and checks every
// decision field against values worked out by hand.
func TestFixedWindowCounts(t *testing.T) {
	three := Every(1000*us, 3)
	tests := []struct {
		name    string
		cfg     Config
		steps   []step
		expires int64 // ExpiresAt after the steps
	}{{
		// The window opens with the first request taken, not with the
		// Estimate before it, and ends 1000µs later, whatever the clock
		// says when the next request comes.
		name: "a window opens on the first request taken",
		cfg:  fixedCfg(three),
		steps: []step{
			{at: 100, req: estimate(3), want: allowed(3, 3, 0, 0, "0")},
			{at: 200, req: consume(1), want: allowed(3, 2, 1, 1000, "0")},
			{at: 700, req: consume(2), want: allowed(3, 0, 2, 500, "0")},
			{at: 700, req: consume(1), want: denied(3, 0, 500, 500, "0")},
			{at: 1199, req: inspect(), want: denied(3, 0, 1, 1, "0")},
			{at: 1200, req: inspect(), want: allowed(3, 3, 0, 0, "0")},
			{at: 1500, req: consume(3), want: allowed(3, 0, 3, 1000, "0")},
			{at: 1600, req: estimate(1), want: denied(3, 0, 900, 900, "0")},
		},
		expires: 2500,
	}, {
		name: "ConsumeUpTo and Add",
		cfg:  fixedCfg(three),
		steps: []step{
			{at: 1500, req: consume(3), want: allowed(3, 0, 3, 1000, "0")},
			{at: 2000, req: consumeUpTo(5), want: denied(3, 0, 500, 500, "0")},
			{at: 2500, req: consumeUpTo(5), want: allowed(3, 0, 3, 1000, "0")},
			{at: 2600, req: add(1), want: allowed(3, 1, 0, 900, "0")},
			{at: 2600, req: consumeUpTo(math.MaxInt64), want: allowed(3, 0, 1, 900, "0")},
			{at: 2700, req: add(2), want: allowed(3, 2, 0, 800, "0")},
			// A refund of more than was counted empties the window: the
			// bucket is as absent, and the next request opens a new one.
			{at: 2700, req: add(math.MaxInt64), want: allowed(3, 3, 0, 0, "0")},
			{at: 2800, req: consume(1), want: allowed(3, 2, 1, 1000, "0")},
		},
		expires: 3800,
	}, {
		name: "Reset",
		cfg:  fixedCfg(three),
		steps: []step{
			{at: 0, req: consume(3), want: allowed(3, 0, 3, 1000, "0")},
			{at: 10, req: Request{Op: Reset}, want: allowed(3, 3, 0, 0, "0")},
			{at: 20, req: consume(1), want: allowed(3, 2, 1, 1000, "0")},
		},
		expires: 1020,
	}, {
		// Windows [250, 1250), [1250, 2250), ... whenever the requests
		// come.
		name: "aligned windows",
		cfg:  fixedCfg(three.AlignedTo(time.UnixMicro(250))),
		steps: []step{
			{at: 900, req: consume(1), want: allowed(3, 2, 1, 350, "0")},
			{at: 1000, req: consume(2), want: allowed(3, 0, 2, 250, "0")},
			{at: 1249, req: consume(1), want: denied(3, 0, 1, 1, "0")},
			{at: 1250, req: consume(3), want: allowed(3, 0, 3, 1000, "0")},
			{at: 3000, req: inspect(), want: allowed(3, 3, 0, 0, "0")},
			{at: 3100, req: consume(1), want: allowed(3, 2, 1, 150, "0")},
		},
		expires: 3250,
	}, {
		name:    "aligned to a later start",
		cfg:     fixedCfg(three.AlignedTo(time.UnixMicro(10_000))),
		steps:   []step{{at: 9500, req: consume(1), want: allowed(3, 2, 1, 500, "0")}},
		expires: 10_000,
	}, {
		// a: 3 per 1000µs, b: 5 per 10000µs. A request passes only if both
		// have room, and a denial names the one that frees up last.
		name: "several bandwidths",
		cfg:  fixedCfg(three.WithID("a"), Every(10000*us, 5).WithID("b")),
		steps: []step{
			{at: 0, req: consume(2), want: allowed(3, 1, 2, 10000, "a")},
			{at: 10, req: consume(2), want: denied(3, 1, 990, 9990, "a")},
			{at: 10, req: consume(1), want: allowed(3, 0, 1, 9990, "a")},
			{at: 1000, req: consume(3), want: denied(5, 2, 9000, 9000, "b")},
			{at: 1000, req: consume(2), want: allowed(5, 0, 2, 9000, "b")},
			{at: 1500, req: consume(2), want: denied(5, 0, 8500, 8500, "b")},
			{at: 1500, req: consumeUpTo(9), want: denied(5, 0, 8500, 8500, "b")},
			{at: 10000, req: consumeUpTo(9), want: allowed(3, 0, 3, 10000, "a")},
			{at: 10000, req: add(1), want: allowed(3, 1, 0, 10000, "a")},
			{at: 10000, req: add(2), want: allowed(3, 3, 0, 0, "a")},
		},
		expires: 10000,
	}, {
		// a: 1 per 2000µs, b: 3 per 1000µs. b's window is over at 1000;
		// the denials at 1500 and 1700 open no new one, so it opens at 2000.
		name: "a denial opens no window",
		cfg:  fixedCfg(Every(2000*us, 1).WithID("a"), three.WithID("b")),
		steps: []step{
			{at: 0, req: consume(1), want: allowed(1, 0, 1, 2000, "a")},
			{at: 1500, req: consume(1), want: denied(1, 0, 500, 500, "a")},
			{at: 1700, req: consumeUpTo(2), want: denied(1, 0, 300, 300, "a")},
			{at: 2000, req: consume(1), want: allowed(1, 0, 1, 2000, "a")},
		},
		expires: 4000,
	}, {
		// The window [5000, 6000) stands while the clock is back before
		// its start; requests then still count in it.
		name: "a clock stepping back",
		cfg:  fixedCfg(Every(1000*us, 2)),
		steps: []step{
			{at: 5000, req: consume(1), want: allowed(2, 1, 1, 1000, "0")},
			{at: 4000, req: consume(1), want: allowed(2, 0, 1, 2000, "0")},
			{at: 4500, req: consume(1), want: denied(2, 0, 1500, 1500, "0")},
			{at: 5999, req: inspect(), want: denied(2, 0, 1, 1, "0")},
			{at: 6000, req: consume(1), want: allowed(2, 1, 1, 1000, "0")},
		},
		expires: 7000,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if s := runSteps(t, tt.cfg, tt.steps); s.ExpiresAt != tt.expires {
				t.Errorf("ExpiresAt = %d, want %d", s.ExpiresAt, tt.expires)
			}
		})
	}
}

// TestFixedWindowState checks what the state holds: per bandwidth its ID,
// the count and the window's start; nothing for a bandwidth with no count.
func TestFixedWindowState(t *testing.T) {
	cfg := fixedCfg(Every(1000*us, 3).WithID("a"), Every(100*us, 5).AlignedTo(time.UnixMicro(30)))
	var s State
	Apply(&s, cfg, inspect(), 10)
	if s.ExpiresAt != 10 || s.Algorithm != FixedWindow || s.Fingerprint != cfg.Fingerprint() {
		t.Fatalf("after Inspect on an absent bucket: %+v, want it absent (ExpiresAt 10)", s)
	}
	Apply(&s, cfg, consume(2), 250)
	want := []BandState{{ID: "a", Level: 2, Stamp: 250}, {Level: 2, Stamp: 230}}
	if !slices.Equal(s.Bands, want) || s.ExpiresAt != 1250 {
		t.Fatalf("after Consume(2) at 250: %+v, want Bands %+v, ExpiresAt 1250", s, want)
	}
	Apply(&s, cfg, consume(1), 330)
	want = []BandState{{ID: "a", Level: 3, Stamp: 250}, {Level: 1, Stamp: 330}}
	if !slices.Equal(s.Bands, want) || s.ExpiresAt != 1250 {
		t.Fatalf("after Consume(1) at 330: %+v, want Bands %+v, ExpiresAt 1250", s, want)
	}
	Apply(&s, cfg, consume(1), 500)
	want = []BandState{{ID: "a", Level: 3, Stamp: 250}, {}}
	if !slices.Equal(s.Bands, want) || s.ExpiresAt != 1250 {
		t.Fatalf("after a denied Consume(1) at 500: %+v, want Bands %+v, ExpiresAt 1250", s, want)
	}
}

// TestFixedWindowBoundaryBurst shows the burst a fixed window lets through
// at a window boundary. With windows opened by the first request, the
// request that opens one is its first, so at most Capacity - 1 of its
// requests come in its last microsecond, followed by Capacity in the first
// of the next: 2C - 1 within 2µs. Aligned windows allow 2C.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	const c = 5
	passed := func(cfg Config, bursts [][2]int64) int64 {
		var s State
		n := int64(0)
		for _, b := range bursts {
			for range b[1] + 1 { // one more than should pass
				if Apply(&s, cfg, consume(1), b[0]).Allowed {
					n++
				}
			}
		}
		return n
	}
	firstHit := fixedCfg(Every(1000*us, c))
	if got := passed(firstHit, [][2]int64{{0, 1}, {999, c - 1}, {1000, c}}); got != 1+2*c-1 {
		t.Errorf("first-hit windows: %d passed, want 1 at 0, then %d within 999 and 1000", got, 2*c-1)
	}
	aligned := fixedCfg(Every(1000*us, c).AlignedTo(time.UnixMicro(0)))
	if got := passed(aligned, [][2]int64{{999, c}, {1000, c}}); got != 2*c {
		t.Errorf("aligned windows: %d passed within 999 and 1000, want %d", got, 2*c)
	}

	// No sequence of requests gets more than 2C - 1 through in 2µs, for
	// windows of 2µs or more; random ones reach it.
	most := 0
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 0xb0))
		cfg := fixedCfg(Every(time.Duration(2+r.Int64N(6))*us, c))
		var s State
		now := int64(0)
		counts := map[int64]int{}
		for range 200 {
			now += r.Int64N(3)
			req := consume(1 + r.Int64N(2))
			if r.IntN(4) == 0 {
				req = consumeUpTo(1 + r.Int64N(2*c))
			}
			counts[now] += int(Apply(&s, cfg, req, now).Consumed)
			if pair := counts[now-1] + counts[now]; pair > most {
				most = pair
				if most > 2*c-1 {
					t.Fatalf("seed %d: %d requests passed at %d and %d, over 2C - 1 = %d", seed, most, now-1, now, 2*c-1)
				}
			}
		}
	}
	if most != 2*c-1 {
		t.Errorf("random sequences got at most %d requests through in 2µs, want them to reach %d", most, 2*c-1)
	}
}

// TestFixedWindowConfigChange checks the inheritance of window algorithms:
// a matched bandwidth keeps its count, up to the new Capacity, and its
// window's start, whatever the strategy but ResetTokens.
func TestFixedWindowConfigChange(t *testing.T) {
	old := fixedCfg(Every(1000*us, 10).WithID("a"))
	up := fixedCfg(Every(1000*us, 20).WithID("a"))
	with := func(s Inheritance) Request { return Request{Op: Inspect, Strategy: s} }
	used6 := step{at: 0, req: consume(6), want: allowed(10, 4, 6, 1000, "a")}
	tests := []struct {
		name  string
		steps []step
	}{
		{"AsIs, capacity up", []step{used6, {at: 100, cfg: &up, req: with(AsIs), want: allowed(20, 14, 0, 900, "a")}}},
		{"Proportionally keeps the count", []step{used6, {at: 100, cfg: &up, req: with(Proportionally), want: allowed(20, 14, 0, 900, "a")}}},
		{"Additive keeps the count", []step{used6, {at: 100, cfg: &up, req: with(Additive), want: allowed(20, 14, 0, 900, "a")}}},
		{"ResetTokens forgets it", []step{used6, {at: 100, cfg: &up, req: with(ResetTokens), want: allowed(20, 20, 0, 0, "a")}}},
		{"capacity down trims it", []step{
			used6,
			{at: 100, cfg: ptr(fixedCfg(Every(1000*us, 4).WithID("a"))), req: with(Proportionally), want: denied(4, 0, 900, 900, "a")},
			{at: 1000, cfg: ptr(fixedCfg(Every(1000*us, 4).WithID("a"))), req: inspect(), want: allowed(4, 4, 0, 0, "a")},
		}},
		{"a longer period: the window keeps its start", []step{
			used6, {at: 100, cfg: ptr(fixedCfg(Every(5000*us, 10).WithID("a"))), req: with(AsIs), want: allowed(10, 4, 0, 4900, "a")},
		}},
		{"a shorter period ends the window sooner", []step{
			used6,
			{at: 99, cfg: ptr(fixedCfg(Every(100*us, 10).WithID("a"))), req: with(AsIs), want: allowed(10, 4, 0, 1, "a")},
			{at: 100, cfg: ptr(fixedCfg(Every(100*us, 10).WithID("a"))), req: with(AsIs), want: allowed(10, 10, 0, 0, "a")},
		}},
		{"a window the old period ended stands if the new one is longer", []step{
			// b keeps the state; a's window [0, 1000) becomes [0, 5000).
			{at: 0, cfg: ptr(fixedCfg(Every(1000*us, 10).WithID("a"), Every(10000*us, 10).WithID("b"))), req: consume(6), want: allowed(10, 4, 6, 10000, "a")},
			{at: 1500, cfg: ptr(fixedCfg(Every(5000*us, 10).WithID("a"), Every(10000*us, 10).WithID("b"))), req: with(AsIs), want: allowed(10, 4, 0, 8500, "a")},
		}},
		{"aligned: the start moves back to its boundary", []step{
			// [0, 1000) becomes [-700, 300).
			used6,
			{at: 100, cfg: ptr(fixedCfg(Every(1000*us, 10).WithID("a").AlignedTo(time.UnixMicro(300)))), req: with(AsIs), want: allowed(10, 4, 0, 200, "a")},
			{at: 300, cfg: ptr(fixedCfg(Every(1000*us, 10).WithID("a").AlignedTo(time.UnixMicro(300)))), req: consume(10), want: allowed(10, 0, 10, 1000, "a")},
		}},
		{"aligned to a new anchor: the window of the old start", []step{
			// [0, 1000) becomes [-700, 300), over at 500.
			{at: 500, cfg: ptr(fixedCfg(Every(1000*us, 10).WithID("a").AlignedTo(time.UnixMicro(0)))), req: consume(6), want: allowed(10, 4, 6, 500, "a")},
			{at: 500, cfg: ptr(fixedCfg(Every(1000*us, 10).WithID("a").AlignedTo(time.UnixMicro(300)))), req: with(AsIs), want: allowed(10, 10, 0, 0, "a")},
		}},
		{"any op converts", []step{used6, {at: 100, cfg: &up, req: Request{Op: Consume, Tokens: 1, Strategy: AsIs}, want: allowed(20, 13, 1, 900, "a")}}},
		{"Replace with the same config keeps the window", []step{
			used6,
			{at: 100, req: Request{Op: Replace, Strategy: Additive}, want: allowed(10, 4, 0, 900, "a")},
			{at: 100, req: Request{Op: Replace, Strategy: ResetTokens}, want: allowed(10, 10, 0, 0, "a")},
		}},
		{"a new bandwidth starts empty", []step{
			used6,
			{at: 100, cfg: ptr(fixedCfg(Every(1000*us, 10).WithID("a"), Every(2000*us, 8).WithID("b"))), req: with(AsIs), want: allowed(10, 4, 0, 900, "a")},
			{at: 200, cfg: ptr(fixedCfg(Every(1000*us, 10).WithID("a"), Every(2000*us, 8).WithID("b"))), req: consume(1), want: allowed(10, 3, 1, 2000, "a")},
		}},
		{"matched by position when without ID", []step{
			{at: 0, cfg: ptr(fixedCfg(Every(1000*us, 10), Every(1000*us, 8))), req: consume(5), want: allowed(8, 3, 5, 1000, "1")},
			{at: 0, cfg: ptr(fixedCfg(Every(1000*us, 10).WithID("x"), Every(1000*us, 8))), req: with(AsIs), want: allowed(8, 3, 0, 1000, "1")},
			{at: 0, cfg: ptr(fixedCfg(Every(1000*us, 10).WithID("x"), Every(1000*us, 8))), req: consume(1), want: allowed(8, 2, 1, 1000, "1")},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, old, tt.steps) })
	}
}

// fixedAsTokenBucket is the TokenBucket that cfg, a FixedWindow config,
// decides as while the clock moves forward: Interval refill of Capacity
// per period, aligned where cfg is.
func fixedAsTokenBucket(cfg Config) Config {
	out := Config{Bandwidths: slices.Clone(cfg.Bandwidths)}
	for i := range out.Bandwidths {
		if b := &out.Bandwidths[i]; b.Refill == Greedy {
			b.Refill = Interval
		}
	}
	return out
}

// fixedRandConfig returns a small FixedWindow config of 1 to 3 bandwidths,
// first-hit or aligned.
func fixedRandConfig(r *rand.Rand) Config {
	cfg := fixedCfg()
	ids := []string{"", "", "a", "b", "c"}
	for range 1 + r.IntN(3) {
		id := ids[r.IntN(len(ids))]
		for _, b := range cfg.Bandwidths {
			if b.ID == id {
				id = ""
			}
		}
		b := Every(time.Duration(1+r.Int64N(40))*us, 1).WithID(id)
		cfg.Bandwidths = append(cfg.Bandwidths, fixedReplan(r, b, 1+r.Int64N(8)))
	}
	return cfg
}

// fixedReplan returns b with the given capacity and, at random, a new
// period and a new alignment.
func fixedReplan(r *rand.Rand, b Bandwidth, capacity int64) Bandwidth {
	period := b.PeriodMicros()
	if r.IntN(2) == 0 {
		period = 1 + r.Int64N(40)
	}
	b.RefillPeriod = time.Duration(max(period, capacity)) * us
	b.Capacity, b.RefillTokens = capacity, capacity
	b.Refill, b.AlignedStart = Greedy, time.Time{}
	if r.IntN(2) == 0 {
		b = b.AlignedTo(time.UnixMicro(r.Int64N(100)))
	}
	return b
}

// TestFixedWindowMatchesTokenBucket runs seeded random sequences of every
// op FixedWindow supports, on the clock moving forward, through a
// FixedWindow config and its token-bucket twin, which must decide alike,
// count alike (a count is the capacity less the tokens) and expire alike.
// The configs change between two with the same capacities, whose counts
// the two inherit alike: otherwise a token bucket keeps tokens where a
// window keeps its count.
func TestFixedWindowMatchesTokenBucket(t *testing.T) {
	for seed := range uint64(2000) {
		r := rand.New(rand.NewPCG(seed, 0xf1))
		var cfgs [2]Config
		cfgs[0] = fixedRandConfig(r)
		cfgs[1] = fixedCfg()
		for _, b := range cfgs[0].Bandwidths {
			cfgs[1].Bandwidths = append(cfgs[1].Bandwidths, fixedReplan(r, b, b.Capacity))
		}
		twins := [2]Config{fixedAsTokenBucket(cfgs[0]), fixedAsTokenBucket(cfgs[1])}
		var fw, tb State
		now := r.Int64N(1000)
		cur := 0
		var log []string
		for i := range 60 {
			switch k := r.IntN(10); {
			case k < 5:
				now += r.Int64N(30)
			case k < 6:
				now += r.Int64N(200)
			}
			if r.IntN(8) == 0 {
				cur = 1 - cur
			}
			req := randRequest(r, cfgs[cur])
			if req.Op == Reserve {
				req.Op, req.MaxWait = Consume, 0
			}
			got := Apply(&fw, cfgs[cur], req, now)
			want := Apply(&tb, twins[cur], req, now)
			log = append(log, fmt.Sprintf("  %2d at %dµs cfg %d: %+v -> %+v", i, now, cur, req, got))
			counts, tbCounts := make([]int64, len(fw.Bands)), make([]int64, len(tb.Bands))
			for j := range fw.Bands {
				counts[j], tbCounts[j] = fw.Bands[j].Level, tb.Bands[j].Capacity-tb.Bands[j].Level
			}
			if got != want || fw.ExpiresAt != tb.ExpiresAt || !slices.Equal(counts, tbCounts) {
				t.Fatalf("seed %d, step %d: %+v at %dµs\ncfg 0: %s\ncfg 1: %s\nsteps:\n%s\n got %+v, counts %v, expires %d\nwant %+v, counts %v, expires %d",
					seed, i, req, now, describe(cfgs[0]), describe(cfgs[1]), strings.Join(log, "\n"), got, counts, fw.ExpiresAt, want, tbCounts, tb.ExpiresAt)
			}
		}
	}
}

// fixedChecked is Apply on a FixedWindow bucket, checking its contract: the
// decision and the state stay in range, and a copy of the state gets the
// same; an absent, expired or reset state decides as a new bucket; a
// denial's RetryAfter is exact; Estimate, Inspect and a denial count
// nothing and open no window; an allowed request counts exactly its
// Consumed in every bandwidth; Add takes its Tokens off every count;
// Replace with the config that built the state changes nothing, but with
// ResetTokens, which empties it.
func fixedChecked(t *testing.T, s *State, cfg Config, req Request, now int64) Decision {
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
	if len(stored.Bands) == 0 || now >= stored.ExpiresAt || req.Op == Reset {
		var fresh State
		if want := Apply(&fresh, cfg, req, now); d != want || !equalStates(*s, fresh) {
			t.Fatalf("%+v at %d on %+v (absent, expired or reset) = %+v, leaving %+v; want a new bucket's %+v, leaving %+v",
				req, now, stored, d, *s, want, fresh)
		}
	}
	checkRetryAfter(t, s, cfg, req, d, now)
	fixedCheckState(t, cfg, s, d, now)

	// base is the state as it was, brought to now and to cfg.
	base := refilledWith(&stored, cfg, req.Strategy, now)
	base.ExpiresAt = s.ExpiresAt // checked above
	switch {
	case req.Op == Reset:
		return d
	case req.Op == Replace && (req.Strategy == ResetTokens || stored.Fingerprint != cfg.Fingerprint()):
		if req.Strategy == ResetTokens {
			for i := range base.Bands {
				base.Bands[i].Level, base.Bands[i].Stamp = 0, 0
			}
		}
	case req.Op == Add:
		for i := range base.Bands {
			if b := &base.Bands[i]; b.Level <= req.Tokens {
				b.Level, b.Stamp = 0, 0
			} else {
				b.Level -= req.Tokens
			}
		}
	case d.Consumed > 0:
		for i := range base.Bands {
			b := &base.Bands[i]
			if b.Level == 0 {
				b.Stamp = periodStart(&cfg.Bandwidths[i], now)
			}
			b.Level += d.Consumed
		}
	}
	if !equalStates(*s, base) {
		t.Fatalf("%+v at %d (%+v) on %+v:\n got %+v\nwant %+v", req, now, d, stored, *s, base)
	}
	return d
}

// fixedCheckState checks that s, left at now by a request decided d, is a
// FixedWindow state of cfg within range: every count within its capacity,
// every window with a count still running and no other, and an expiry
// when the last ends, that ResetAfter reports; and that d reports the
// binding bandwidth's count.
func fixedCheckState(t *testing.T, cfg Config, s *State, d Decision, now int64) {
	t.Helper()
	if s.Fingerprint != cfg.Fingerprint() || s.Algorithm != FixedWindow || len(s.Bands) != len(cfg.Bandwidths) || s.Log != nil {
		t.Fatalf("state %+v was not built for config %s", *s, describe(cfg))
	}
	last := now
	least, binding := int64(math.MaxInt64), -1
	for i := range s.Bands {
		b, st := &cfg.Bandwidths[i], &s.Bands[i]
		end := st.Stamp + b.PeriodMicros()
		switch {
		case *st != BandState{ID: b.ID, Level: st.Level, Stamp: st.Stamp}:
			t.Fatalf("Bands[%d] = %+v, want ID %q and only Level and Stamp besides", i, *st, b.ID)
		case st.Level < 0 || st.Level > b.Capacity:
			t.Fatalf("Bands[%d] = %+v: count beyond 0 to Capacity %d", i, *st, b.Capacity)
		case st.Level == 0 && st.Stamp != 0:
			t.Fatalf("Bands[%d] = %+v: a window without a count", i, *st)
		case st.Level > 0 && (end <= now || st.Stamp > exact || st.Stamp < -exact):
			t.Fatalf("Bands[%d] = %+v at %d: a window over, or beyond 2^53", i, *st, now)
		}
		if st.Level > 0 {
			last = max(last, end)
		}
		if left := b.Capacity - st.Level; left < least {
			least, binding = left, i
		}
	}
	if s.ExpiresAt != last || d.ResetAfter != micros(last-now) || last >= 1<<52+1<<45 {
		t.Fatalf("ExpiresAt %d, ResetAfter %v at %d; want both at the last window's end, %d, before 2^52 + 2^45", s.ExpiresAt, d.ResetAfter, now, last)
	}
	if !d.Allowed {
		return // the slowest binds, as checkRetryAfter checks
	}
	if b := &cfg.Bandwidths[binding]; d.Limit != b.Capacity || d.Remaining != least || d.Bandwidth != bandName(cfg.Bandwidths, binding) {
		t.Fatalf("%+v: want the first bandwidth with the fewest requests left, %d of %d, %q", d, least, b.Capacity, bandName(cfg.Bandwidths, binding))
	}
}

// fixedBandwidth decodes a FixedWindow bandwidth: Capacity requests per
// RefillPeriod, first-hit or aligned.
func (in *fuzzInput) fixedBandwidth() Bandwidth {
	ids := [...]string{"", "a", "b", ""}
	period := in.in(1, int64(MaxRefillPeriod/us))
	b := Every(time.Duration(period)*us, in.in(1, min(period, MaxCapacity))).WithID(ids[in.byte()%4])
	if in.byte()%2 == 0 {
		b = b.AlignedTo(time.UnixMicro(in.in(0, maxClock-1)))
	}
	return b
}

func (in *fuzzInput) fixedConfig() Config {
	cfg := fixedCfg()
	for range 1 + in.byte()%3 {
		b := in.fixedBandwidth()
		for _, o := range cfg.Bandwidths {
			if o.ID == b.ID {
				b.ID = ""
			}
		}
		cfg.Bandwidths = append(cfg.Bandwidths, b)
	}
	return cfg
}

// FuzzFixedWindow decodes two FixedWindow configs and a run of requests
// and clock moves, forward and back, from the input, and checks Apply's
// contract after every request. Until the clock first steps back or the
// config first changes, a token-bucket twin must decide alike.
func FuzzFixedWindow(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x05\x00\x01\x00\x03\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x01\x00\x00\x01\x0b\x00\x01\x00\x00\x02\x05\x00\x03\x00\x0c\x00\x06\x00\x00\x06\x00"))
	f.Add([]byte("\x02\x01\x01\x30\x02\x00\x00\x01\x01\x02\x0a\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x01\x00\x00\x01\x02\x00\x00\x00\x05\x00\x0a\x03\x03\x00\x0d\x00\x02\x00\x02\x01\x00\x0f\x05\x00"))
	f.Add([]byte("\x01\x01\x00\xff\x01\x00\xff\x01\x01\x00\x01\x02\x00\x03\x00\x00\x00\x00\x01\x01\x00\x00\x0a\x01\x00\x01\x00\x00\x02\x01\x00\x01\x0d\x00\x05\x01\x02\x02\xff\xff\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := fuzzInput(data)
		cfgs := [2]Config{in.fixedConfig(), in.fixedConfig()}
		for i, cfg := range cfgs {
			if err := cfg.Validate(); err != nil {
				t.Fatalf("config %d: %v", i, err)
			}
		}
		twin := fixedAsTokenBucket(cfgs[0])
		var s, tb State
		same := true // the clock has only moved forward, on config 0
		cur := 0
		now := in.in(0, maxClock-1)
		for len(in) > 0 {
			switch k := in.byte() % 16; {
			case k < 10:
				req := in.windowRequest(cfgs[cur])
				d := fixedChecked(t, &s, cfgs[cur], req, now)
				if !same {
					continue
				}
				if want := Apply(&tb, twin, req, now); d != want || s.ExpiresAt != tb.ExpiresAt {
					t.Fatalf("%+v at %d = %+v, expiring at %d; the token bucket's %+v, expiring at %d", req, now, d, s.ExpiresAt, want, tb.ExpiresAt)
				}
			case k < 13:
				now = min(now+in.in(0, int64(MaxRefillPeriod/us)), maxClock-1)
			case k < 14:
				now = max(0, now-in.in(0, int64(MaxRefillPeriod/us)))
				same = false
			default:
				cur = 1 - cur
				same = false
			}
		}
	})
}
