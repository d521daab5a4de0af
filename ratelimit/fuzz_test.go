package ratelimit

import (
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"
)

// exact is the largest magnitude an IEEE double holds every integer up to:
// every number a Lua script sees must stay within it.
const exact = 1 << 53

// refilledWith returns s as a request with strategy that takes nothing
// leaves it at now: built anew, converted or refilled, its expiry
// recomputed. Inspect is exactly that.
func refilledWith(s *State, cfg Config, strategy Inheritance, now int64) State {
	c := cloneState(s)
	Apply(&c, cfg, Request{Op: Inspect, Strategy: strategy}, now)
	return c
}

// applyChecked is Apply, checking its contract: the decision and the state
// stay in range, and a copy of the state gets the same; a state that is
// absent or expired, or reset, decides and ends as a new bucket; a
// denial's RetryAfter is exact for the state left; every op records when
// the state expires; Add returns exactly its tokens; and every other op
// but Reset and Replace leaves the state as refilling does, less the
// tokens the decision reports taken: Estimate, Inspect and a denial leave
// it exactly as refilling does, expiry included.
func applyChecked(t *testing.T, s *State, cfg Config, req Request, now int64) Decision {
	t.Helper()
	if err := CheckRequest("key", cfg, req); err != nil {
		t.Fatalf("bad call: %v", err)
	}
	stored := cloneState(s)
	again := cloneState(s)
	want := Apply(&again, cfg, req, now)
	d := Apply(s, cfg, req, now)
	if stored.holdsNewer(&cfg, now) {
		checkStale(t, &stored, s, cfg, req, d, now)
		return d
	}
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
	checkState(t, cfg, s)
	checkExpiresAt(t, cfg, s, d, now)
	base := refilledWith(&stored, cfg, req.Strategy, now)
	switch req.Op {
	case Reset, Replace:
		return d
	case Add:
		// Exactly min(full, level + Tokens×Scale), computed without
		// overflow.
		for i, st := range base.Bands {
			want := new(big.Int).Mul(big.NewInt(req.Tokens), big.NewInt(st.Scale))
			want.Add(want, big.NewInt(st.Level))
			if full := big.NewInt(st.Capacity * st.Scale); want.Cmp(full) > 0 {
				want = full
			}
			if got := s.Bands[i].Level; got != want.Int64() {
				t.Fatalf("Add(%d) to %+v left Level %d, want %v", req.Tokens, st, got, want)
			}
		}
		return d
	}
	// Everything else takes exactly what it reports, from every bandwidth.
	if d.Consumed != 0 {
		for i := range base.Bands {
			base.Bands[i].Level -= d.Consumed * base.Bands[i].Scale
		}
		base.ExpiresAt = s.ExpiresAt // checked above
	}
	if !equalStates(*s, base) {
		t.Fatalf("%+v at %d (%+v) changed more than it took:\n got %+v\nwant %+v", req, now, d, *s, base)
	}
	return d
}

// checkExpiresAt checks that s, just changed at now with decision d,
// expires as documented, within the range doubles hold exactly: at now +
// ResetAfter + the time a bucket created at now takes to fill.
func checkExpiresAt(t *testing.T, cfg Config, s *State, d Decision, now int64) {
	t.Helper()
	warmup := Apply(&State{}, cfg, inspect(), now).ResetAfter
	want := now + int64((d.ResetAfter+warmup)/us)
	switch {
	case s.ExpiresAt != want:
		t.Fatalf("ExpiresAt = %d at %d, want %d: ResetAfter %v + warm-up %v", s.ExpiresAt, now, want, d.ResetAfter, warmup)
	case s.ExpiresAt < now || s.ExpiresAt-now > exact:
		t.Fatalf("ExpiresAt = %d at %d: want 0 to 2^53µs ahead", s.ExpiresAt, now)
	case s.ExpiresAt > exact || s.ExpiresAt < -exact:
		t.Fatalf("ExpiresAt = %d at %d (ResetAfter %v + warm-up %v): beyond 2^53", s.ExpiresAt, now, d.ResetAfter, warmup)
	}
}

// checkStale checks a call whose config is older than the bucket's: it
// must be decided as the bucket's own config decides it (checked as any
// call is), naming the caller's bandwidth, or else be denied for
// StaleRetry, changing nothing.
func checkStale(t *testing.T, stored, s *State, cfg Config, req Request, d Decision, now int64) {
	t.Helper()
	newer := *stored.Config
	if !newer.accepts(&cfg, req) {
		if d != staleDenial(&cfg) || !equalStates(*s, *stored) {
			t.Fatalf("%+v at %d on %+v, a bucket of another algorithm or too small = %+v, leaving %+v; want a denial for StaleRetry, leaving it", req, now, *stored, d, *s)
		}
		return
	}
	if req.Op == Replace {
		req.Op = Inspect
	}
	want := applyChecked(t, stored, newer, req, now)
	want.Bandwidth = bandName(cfg.Bandwidths, callerBand(&cfg, &newer, want.Bandwidth))
	if d != want || !equalStates(*s, *stored) {
		t.Fatalf("%+v at %d on an older config = %+v, leaving %+v; want as the bucket's config decides, %+v, leaving %+v", req, now, d, *s, want, *stored)
	}
}

// checkRetryAfter checks that a denial's RetryAfter is exact: if nothing
// else happens to kept, the state the request leaves, the tokens it lacked
// can be taken then and not 1µs before.
func checkRetryAfter(t *testing.T, kept *State, cfg Config, req Request, d Decision, now int64) {
	t.Helper()
	if d.Allowed {
		return
	}
	n := req.Tokens
	if req.Op == Inspect || req.Op == ConsumeUpTo {
		n = 1
	}
	retry := Request{Op: Consume, Tokens: n, Strategy: req.Strategy}
	wait := int64(d.RetryAfter / us)
	early, due := cloneState(kept), cloneState(kept)
	if got := Apply(&early, cfg, retry, now+wait-1); got.Allowed {
		t.Fatalf("%+v at %d = %+v, yet %+v 1µs before RetryAfter = %+v", req, now, d, retry, got)
	}
	if got := Apply(&due, cfg, retry, now+wait); !got.Allowed {
		t.Fatalf("%+v at %d = %+v, yet %+v at RetryAfter = %+v", req, now, d, retry, got)
	}
}

func checkDecision(t *testing.T, cfg Config, req Request, d Decision) {
	t.Helper()
	fail := func(why string) { t.Fatalf("%+v: %s: %+v", req, why, d) }
	if d.Limit < 1 || d.Remaining < 0 || d.Remaining > d.Limit {
		fail("want 0 ≤ Remaining ≤ Limit, 1 ≤ Limit")
	}
	if d.RetryAfter < 0 || d.ResetAfter < 0 || d.RetryAfter%us != 0 || d.ResetAfter%us != 0 {
		fail("want RetryAfter and ResetAfter whole, non-negative µs")
	}
	if d.RetryAfter/us > exact || d.ResetAfter/us > exact {
		fail("wait beyond 2^53µs")
	}
	if d.Bandwidth == "" || d.Degraded {
		fail("want a Bandwidth, not Degraded")
	}
	switch {
	case d.Consumed < 0:
		fail("negative Consumed")
	case !d.Allowed && (d.Consumed != 0 || d.RetryAfter == 0):
		fail("denied: want Consumed 0 and a RetryAfter")
	case req.Op == Consume && d.Allowed && (d.Consumed != req.Tokens || d.RetryAfter != 0):
		fail("allowed Consume: want Consumed = Tokens, RetryAfter 0")
	case req.Op == Reserve && d.Allowed && d.Consumed != req.Tokens:
		fail("allowed Reserve: want Consumed = Tokens")
	case req.Op == Reserve && d.RetryAfter > req.MaxWait && d.Allowed:
		fail("Reserve allowed beyond MaxWait")
	case req.Op == ConsumeUpTo && d.Allowed && (d.Consumed < 1 || d.Consumed > req.Tokens):
		fail("allowed ConsumeUpTo: want 1 ≤ Consumed ≤ Tokens")
	case req.Op != Consume && req.Op != Reserve && req.Op != ConsumeUpTo && d.Consumed != 0:
		fail("took tokens")
	case (req.Op == Add || req.Op == Reset || req.Op == Replace) && !d.Allowed:
		fail("denied")
	}
	// Validate accepts an ID such as "0" that is also the name of a
	// bandwidth without one, so a name may stand for two bandwidths.
	for i := range cfg.Bandwidths {
		if bandName(cfg.Bandwidths, i) == d.Bandwidth && cfg.Bandwidths[i].Capacity == d.Limit {
			return
		}
	}
	fail("Bandwidth and Limit name none of the config's bandwidths")
}

func checkState(t *testing.T, cfg Config, s *State) {
	t.Helper()
	if s.Fingerprint != cfg.Fingerprint() || len(s.Bands) != len(cfg.Bandwidths) {
		t.Fatalf("state %+v was not built for config %s", *s, describe(cfg))
	}
	for i := range s.Bands {
		b, st := &cfg.Bandwidths[i], &s.Bands[i]
		scale, rate := b.Units()
		switch {
		case st.ID != b.ID || st.Capacity != b.Capacity || st.Scale != scale || st.Rate != rate:
			t.Fatalf("Bands[%d] = %+v, want ID %q, Capacity %d, Scale %d, Rate %d", i, *st, b.ID, b.Capacity, scale, rate)
		case st.Capacity*st.Scale > MaxScaled:
			t.Fatalf("Bands[%d] = %+v: capacity beyond MaxScaled units", i, *st)
		case st.Level > st.Capacity*st.Scale:
			t.Fatalf("Bands[%d] = %+v: Level above Capacity×Scale", i, *st)
		case st.Level < minLevel(b, st) || st.Level < -MaxScaled:
			t.Fatalf("Bands[%d] = %+v: Level below the debt limit %d", i, *st, minLevel(b, st))
		case st.Stamp > exact || st.Stamp < -exact:
			t.Fatalf("Bands[%d] = %+v: Stamp beyond 2^53", i, *st)
		}
	}
}

// fuzzInput reads a fuzzer's bytes as numbers; past the end it reads zeros.
type fuzzInput []byte

func (in *fuzzInput) byte() byte {
	if len(*in) == 0 {
		return 0
	}
	c := (*in)[0]
	*in = (*in)[1:]
	return c
}

func (in *fuzzInput) uint64() uint64 {
	var buf [8]byte
	n := copy(buf[:], *in)
	*in = (*in)[n:]
	return binary.BigEndian.Uint64(buf[:])
}

// in returns a number from lo to hi (hi < MaxInt64), drawn so that the
// fuzzer reaches the small ones, those near hi and the powers of two
// between as easily as any other.
func (in *fuzzInput) in(lo, hi int64) int64 {
	span := uint64(hi - lo + 1)
	var v uint64
	switch in.byte() % 4 {
	case 0:
		v = uint64(in.byte())
	case 1:
		v = span - 1 - min(span-1, uint64(in.byte()))
	case 2:
		v = 1<<(in.byte()%63) + uint64(int8(in.byte()))
	default:
		v = in.uint64()
	}
	return lo + int64(v%span)
}

func (in *fuzzInput) bandwidth() Bandwidth {
	ids := [...]string{"", "a", "b", ""}
	period := in.in(1, int64(MaxRefillPeriod/us))
	b := Bandwidth{
		ID:           ids[in.byte()%4],
		Refill:       RefillKind(in.byte() % 3),
		RefillPeriod: time.Duration(period) * us,
		RefillTokens: in.in(1, period),
		Capacity:     in.in(1, MaxCapacity),
	}
	if b.Refill == IntervalAligned {
		b.AlignedStart = time.UnixMicro(in.in(0, maxClock-1))
	}
	if in.byte()%2 == 0 {
		b = b.WithInitialTokens(in.in(0, b.Capacity))
	}
	return b
}

func (in *fuzzInput) config() Config {
	var cfg Config
	for range 1 + in.byte()%3 {
		cfg.Bandwidths = append(cfg.Bandwidths, in.bandwidth())
	}
	return cfg
}

func (in *fuzzInput) request(cfg Config) Request {
	req := Request{Op: Op(in.byte() % 8), Strategy: Inheritance(in.byte() % 4)}
	switch req.Op {
	case Consume, Estimate, Reserve:
		req.Tokens = in.in(1, cfg.MinCapacity())
		if req.Op == Reserve {
			req.MaxWait = time.Duration(in.in(0, math.MaxInt64-1))
		}
	case ConsumeUpTo, Add:
		req.Tokens = in.in(1, math.MaxInt64-1)
	}
	return req
}

// windowRequest reads a valid request for cfg from the input, for an
// algorithm that cannot reserve: any op but Reserve.
func (in *fuzzInput) windowRequest(cfg Config) Request {
	ops := [...]Op{Consume, Estimate, ConsumeUpTo, Add, Reset, Replace, Inspect}
	req := Request{Op: ops[in.byte()%byte(len(ops))], Strategy: Inheritance(in.byte() % 4)}
	switch req.Op {
	case Consume, Estimate:
		req.Tokens = in.in(1, cfg.MinCapacity())
	case ConsumeUpTo, Add:
		req.Tokens = in.in(1, math.MaxInt64-1)
	}
	return req
}

// FuzzApply decodes two configs and a run of requests and clock moves from
// the input, and checks Apply's contract after every request.
func FuzzApply(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x00\x00\x05\x00\x05\x00\x05\x01"))
	f.Add([]byte("\x02\x01\x02\x01\x00\x10\x00\x08\x02\x30\x00\x01\x03\x01\x05\x02\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x08\x08\x02\x06\x02\x03\x00\x01"))
	f.Add([]byte("\x01\x00\x01\x02\x30\x00\x01\x02\x33\x00\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x02\x00\x00\x02\x00\x00\x09\x01\x40\x00\x07"))
	f.Add([]byte("\x00\x02\x01\x03\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00\x03\x01\x00\x01\x00\x01\x00\x03\x00\x00\x01\x01\x01\x0a\x0b\x03\x02\x00\x00\x04\x02\x05\x00\x06\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := fuzzInput(data)
		cfgs := [2]Config{in.config(), in.config()}
		if cfgs[0].Validate() != nil {
			return
		}
		if cfgs[1].Validate() != nil {
			cfgs[1] = cfgs[0]
		}
		// Versions 0 to 2, so that calls meet buckets of a later version.
		cfgs[0].Version, cfgs[1].Version = uint64(in.byte()%3), uint64(in.byte()%3)
		var s State
		cur := 0
		// The clock stays where Apply accepts it, from 0 to maxClock;
		// latest is the furthest it has been.
		now := in.in(0, maxClock)
		latest := now
		for len(in) > 0 {
			switch k := in.byte() % 16; {
			case k < 10:
				applyChecked(t, &s, cfgs[cur], in.request(cfgs[cur]), now)
				// Every bandwidth is full within 2^51µs of the latest
				// clock, and a new bucket fills in at most 2^51µs, however
				// far the clock has stepped back since.
				if s.ExpiresAt-latest > 1<<52 {
					t.Fatalf("ExpiresAt = %d, more than 2^52µs after the latest clock, %d", s.ExpiresAt, latest)
				}
			case k < 13:
				now = min(now+in.in(0, 1<<51), maxClock)
				latest = max(latest, now)
			case k < 14:
				// Stores' clocks step back now and then, by a little.
				now = max(0, now-in.in(0, 1<<32))
			default:
				cur = 1 - cur
			}
		}
	})
}

// FuzzConfigValidate builds a config from arbitrary field values. Validate
// must never panic and must name the field it rejects; a config it accepts
// must then keep every number of a bucket within exact range through
// requests that push it to its limits.
func FuzzConfigValidate(f *testing.F) {
	f.Add(uint8(0), "burst", int64(10), int64(10), int64(time.Second), uint8(0), int64(0), false, int64(0), uint8(0), "", int64(5), int64(1), int64(time.Millisecond), uint8(1))
	f.Add(uint8(0), "", int64(MaxCapacity), int64(1), int64(2*us), uint8(0), int64(MaxCapacity), true, int64(0), uint8(1), "x", int64(1<<31), int64(1), int64(1<<20*us), uint8(1))
	f.Add(uint8(0), "a", int64(71), int64(1), int64(MaxRefillPeriod), uint8(0), int64(3), true, int64(0), uint8(1), "b", int64(1), int64(1), int64(MaxRefillPeriod), uint8(1))
	f.Add(uint8(0), "d", int64(1000), int64(7), int64(24*time.Hour), uint8(2), int64(0), true, int64(maxClock-1), uint8(2), "d", int64(3), int64(3), int64(us), uint8(2))
	f.Add(uint8(1), "", int64(0), int64(0), int64(0), uint8(3), int64(-1), true, int64(-1), uint8(0), "", int64(-1), int64(-1), int64(-1), uint8(9))
	f.Add(uint8(0), "a b", int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), uint8(0), int64(math.MinInt64), true, int64(math.MinInt64), uint8(1), strings.Repeat("x", 65), int64(math.MinInt64), int64(1500), int64(1500), uint8(0))
	f.Fuzz(func(t *testing.T, alg uint8, id0 string, cap0, tokens0, period0 int64, kind0 uint8, initial0 int64, hasInitial bool, aligned int64,
		more uint8, id1 string, cap1, tokens1, period1 int64, kind1 uint8) {
		b0 := Bandwidth{ID: id0, Capacity: cap0, RefillTokens: tokens0, RefillPeriod: time.Duration(period0), Refill: RefillKind(kind0)}
		if hasInitial {
			b0.InitialTokens = &initial0
		}
		if aligned != 0 || RefillKind(kind0) == IntervalAligned {
			b0.AlignedStart = time.UnixMicro(aligned)
		}
		b1 := Bandwidth{ID: id1, Capacity: cap1, RefillTokens: tokens1, RefillPeriod: time.Duration(period1), Refill: RefillKind(kind1)}
		if RefillKind(kind1) == IntervalAligned {
			b1.AlignedStart = time.UnixMicro(aligned / 3)
		}
		cfg := Config{Algorithm: Algorithm(alg), Bandwidths: []Bandwidth{b0}}
		switch more % 4 {
		case 1:
			cfg.Bandwidths = append(cfg.Bandwidths, b1)
		case 2:
			cfg.Bandwidths = append(cfg.Bandwidths, b1, b0)
		case 3:
			cfg.Bandwidths = nil
		}

		err := cfg.Validate()
		if err != nil {
			msg := err.Error()
			if !errors.Is(err, ErrInvalidConfig) || !strings.HasPrefix(msg, "ratelimit: invalid config: Algorithm ") && !strings.HasPrefix(msg, "ratelimit: invalid config: Bandwidths") {
				t.Fatalf("Validate() = %q, want ErrInvalidConfig naming a field", msg)
			}
			if err := CheckRequest("key", cfg, consume(1)); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("CheckRequest() = %v after Validate() = %v", err, msg)
			}
			return
		}
		if cfg.Algorithm != TokenBucket {
			return // each algorithm's own fuzz target runs its math
		}

		limit := cfg.MinCapacity()
		forever := time.Duration(math.MaxInt64)
		var s State
		now := int64(1) << 50
		run := func(req Request) { applyChecked(t, &s, cfg, req, now) }
		// expire checks, on copies, that s decides until it expires and a
		// new bucket from then on.
		expire := func() {
			if s.ExpiresAt > maxClock {
				return // beyond the clocks Apply accepts
			}
			for _, at := range []int64{s.ExpiresAt - 1, s.ExpiresAt} {
				c := cloneState(&s)
				applyChecked(t, &c, cfg, estimate(limit), at)
				applyChecked(t, &c, cfg, consume(limit), at)
			}
		}
		run(inspect())
		run(consume(limit))
		expire()
		for range 3 {
			run(reserve(limit, forever))
		}
		expire()
		run(estimate(1))
		run(consumeUpTo(math.MaxInt64))
		now += int64(MaxRefillPeriod / us)
		run(inspect())
		run(add(math.MaxInt64))
		expire()
		run(reserve(limit, forever))
		for _, strategy := range []Inheritance{AsIs, ResetTokens, Proportionally, Additive} {
			run(Request{Op: Replace, Strategy: strategy})
			run(reserve(limit, forever))
		}
		now += MaxScaled
		run(consume(1))
		run(Request{Op: Reset})
		now -= 1 << 32
		run(reserve(limit, forever))
		run(inspect())
	})
}
