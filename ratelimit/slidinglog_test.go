package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// logConfig is a SlidingWindowLog config of bws.
func logConfig(bws ...Bandwidth) Config {
	return Config{Algorithm: SlidingWindowLog, Bandwidths: bws}
}

// logClone returns a copy of s that shares nothing with it, the log
// included: Apply edits the log in place.
func logClone(s *State) State {
	c := *s
	c.Bands = slices.Clone(s.Bands)
	c.Log = slices.Clone(s.Log)
	return c
}

// logRun applies steps as runSteps does, then checks the log left.
func logRun(t *testing.T, cfg Config, steps []step, wantLog []int64) {
	t.Helper()
	if s := runSteps(t, cfg, steps); !slices.Equal(s.Log, wantLog) {
		t.Errorf("log %v, want %v", s.Log, wantLog)
	}
}

// TestLogCounts follows one bandwidth of 3 per 10µs request by request: an
// entry counts until its time + 10µs, two requests in the same µs both
// count, and a denial waits exactly for the oldest entries it needs gone.
func TestLogCounts(t *testing.T) {
	logRun(t, logConfig(Every(10*us, 3)), []step{
		{at: 0, req: consume(1), want: allowed(3, 2, 1, 10, "0")},
		{at: 1, req: consume(2), want: allowed(3, 0, 2, 10, "0")},
		// Full: the entry at 0 leaves the window at 10.
		{at: 5, req: consume(1), want: denied(3, 0, 5, 6, "0")},
		{at: 9, req: inspect(), want: denied(3, 0, 1, 2, "0")},
		{at: 10, req: consume(1), want: allowed(3, 0, 1, 10, "0")},
		// Both entries at 1 count: the next one is due at 11.
		{at: 10, req: consume(1), want: denied(3, 0, 1, 10, "0")},
		{at: 11, req: consume(2), want: allowed(3, 0, 2, 10, "0")},
		// 3 lacking: the third oldest, at 11, must go.
		{at: 12, req: estimate(3), want: denied(3, 0, 9, 9, "0")},
		{at: 12, req: estimate(1), want: denied(3, 0, 8, 9, "0")},
		{at: 20, req: consume(1), want: allowed(3, 0, 1, 10, "0")},
		{at: 29, req: inspect(), want: allowed(3, 2, 0, 1, "0")},
		// Three in one µs: each counts.
		{at: 100, req: consume(1), want: allowed(3, 2, 1, 10, "0")},
		{at: 100, req: consume(1), want: allowed(3, 1, 1, 10, "0")},
		{at: 100, req: consume(1), want: allowed(3, 0, 1, 10, "0")},
		{at: 100, req: consume(1), want: denied(3, 0, 10, 10, "0")},
		{at: 109, req: consume(1), want: denied(3, 0, 1, 1, "0")},
	}, []int64{100, 100, 100})
}

// TestLogNoBoundaryBurst: a fixed window of 3 per 10µs admits 3 at 9 and 3
// more at 10; the log admits the second 3 only at 19.
func TestLogNoBoundaryBurst(t *testing.T) {
	logRun(t, logConfig(Every(10*us, 3)), []step{
		{at: 9, req: consume(3), want: allowed(3, 0, 3, 10, "0")},
		{at: 10, req: consume(3), want: denied(3, 0, 9, 9, "0")},
		{at: 10, req: consumeUpTo(3), want: denied(3, 0, 9, 9, "0")},
		{at: 18, req: consume(1), want: denied(3, 0, 1, 1, "0")},
		{at: 19, req: consume(3), want: allowed(3, 0, 3, 10, "0")},
	}, []int64{19, 19, 19})
}

// TestLogSeveralBandwidths: 2 per 10µs and 3 per 100µs. A request passes
// only if both windows have room; the binding bandwidth is the one with the
// fewest left, or, denied, the one that needs longest.
func TestLogSeveralBandwidths(t *testing.T) {
	logRun(t, logConfig(Every(10*us, 2).WithID("a"), Every(100*us, 3).WithID("b")), []step{
		{at: 0, req: consume(1), want: allowed(2, 1, 1, 100, "a")},
		{at: 1, req: consume(1), want: allowed(2, 0, 1, 100, "a")},
		{at: 2, req: consume(1), want: denied(2, 0, 8, 99, "a")},
		// Ties go to the first.
		{at: 10, req: consume(1), want: allowed(2, 0, 1, 100, "a")},
		{at: 25, req: consume(1), want: denied(3, 0, 75, 85, "b")},
		{at: 25, req: consumeUpTo(5), want: denied(3, 0, 75, 85, "b")},
		// At 100 the entry at 0 is gone; 2 more need the one at 1 gone too.
		{at: 100, req: consume(2), want: denied(3, 1, 1, 10, "b")},
		{at: 101, req: consume(2), want: allowed(2, 0, 2, 100, "a")},
		// Both lack: a for 6µs (its 2nd oldest, at 101), b for 5µs.
		{at: 105, req: consume(1), want: denied(2, 0, 6, 96, "a")},
		{at: 111, req: consume(1), want: allowed(3, 0, 1, 100, "b")},
	}, []int64{101, 101, 111})
}

// TestLogOps: ConsumeUpTo takes what every window has room for, Add
// refunds the newest entries, Reset empties the log, Estimate and Inspect
// take nothing.
func TestLogOps(t *testing.T) {
	logRun(t, logConfig(Every(10*us, 5)), []step{
		{at: 0, req: consume(3), want: allowed(5, 2, 3, 10, "0")},
		{at: 2, req: consumeUpTo(10), want: allowed(5, 0, 2, 10, "0")},
		{at: 3, req: consumeUpTo(1), want: denied(5, 0, 7, 9, "0")},
		// The refund takes back an entry at 2, the newest.
		{at: 3, req: add(1), want: allowed(5, 1, 0, 9, "0")},
		{at: 3, req: add(math.MaxInt64), want: allowed(5, 5, 0, 0, "0")},
		{at: 4, req: consume(5), want: allowed(5, 0, 5, 10, "0")},
		{at: 5, req: Request{Op: Reset}, want: allowed(5, 5, 0, 0, "0")},
		{at: 5, req: consume(1), want: allowed(5, 4, 1, 10, "0")},
		{at: 6, req: estimate(4), want: allowed(5, 4, 0, 9, "0")},
		{at: 6, req: estimate(5), want: denied(5, 4, 9, 9, "0")},
		{at: 6, req: inspect(), want: allowed(5, 4, 0, 9, "0")},
		{at: 7, req: add(1), want: allowed(5, 5, 0, 0, "0")},
		{at: 7, req: consumeUpTo(2), want: allowed(5, 3, 2, 10, "0")},
	}, []int64{7, 7})
}

// TestLogConfigChange: the log carries over a config change and the new
// limits apply to it, trimmed to what the new config's longest window may
// hold; ResetTokens forgets it; and an expired state starts afresh even
// when the new window would still hold its entries.
func TestLogConfigChange(t *testing.T) {
	wide := logConfig(Every(100*us, 5).WithID("x"))
	narrow := logConfig(Every(20*us, 2).WithID("x"))
	used := []step{
		{at: 0, req: consume(2), want: allowed(5, 3, 2, 100, "x")},
		{at: 10, req: consume(2), want: allowed(5, 1, 2, 100, "x")},
		{at: 15, req: consume(1), want: allowed(5, 0, 1, 100, "x")},
	}
	with := func(op Op, s Inheritance, n int64) Request { return Request{Op: op, Tokens: n, Strategy: s} }
	tests := []struct {
		name  string
		steps []step
		log   []int64
	}{
		{"narrower keeps the newest 2", append(slices.Clone(used),
			step{at: 16, cfg: &narrow, req: consume(1), want: denied(2, 0, 14, 19, "x")},
			// Back to wide: the 2 kept count, the 3 dropped are gone.
			step{at: 16, req: consume(3), want: allowed(5, 0, 3, 100, "x")},
		), []int64{10, 15, 16, 16, 16}},
		{"every strategy but ResetTokens keeps the log", append(slices.Clone(used),
			step{at: 16, cfg: &narrow, req: with(Inspect, Proportionally, 0), want: denied(2, 0, 14, 19, "x")},
			step{at: 16, req: with(Replace, Additive, 0), want: allowed(5, 3, 0, 99, "x")},
			step{at: 16, req: with(Replace, AsIs, 0), want: allowed(5, 3, 0, 99, "x")},
		), []int64{10, 15}},
		{"ResetTokens", append(slices.Clone(used),
			step{at: 17, cfg: &narrow, req: with(Consume, ResetTokens, 1), want: allowed(2, 1, 1, 20, "x")},
			step{at: 17, req: with(Replace, ResetTokens, 0), want: allowed(5, 5, 0, 0, "x")},
		), nil},
		{"expired before the change", append(slices.Clone(used),
			step{at: 17, cfg: &narrow, req: with(Consume, ResetTokens, 1), want: allowed(2, 1, 1, 20, "x")},
			// Expired at 37 under narrow; wide would still count 17.
			step{at: 37, req: consume(5), want: allowed(5, 0, 5, 100, "x")},
		), []int64{37, 37, 37, 37, 37}},
		{"wider window counts old entries", []step{
			{at: 0, cfg: &narrow, req: consume(2), want: allowed(2, 0, 2, 20, "x")},
			{at: 19, req: consume(4), want: denied(5, 3, 81, 81, "x")},
			{at: 19, req: consume(3), want: allowed(5, 0, 3, 100, "x")},
			{at: 20, req: consume(1), want: denied(5, 0, 80, 99, "x")},
		}, []int64{0, 0, 19, 19, 19}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { logRun(t, wide, tt.steps, tt.log) })
	}
}

// TestLogClockBack: when the clock steps back, entries after now still
// count, and new ones go in at their place in time order.
func TestLogClockBack(t *testing.T) {
	logRun(t, logConfig(Every(10*us, 3)), []step{
		{at: 100, req: consume(2), want: allowed(3, 1, 2, 10, "0")},
		{at: 95, req: consume(1), want: allowed(3, 0, 1, 15, "0")},
		{at: 96, req: inspect(), want: denied(3, 0, 9, 14, "0")},
		{at: 105, req: consume(1), want: allowed(3, 0, 1, 10, "0")},
		{at: 50, req: add(1), want: allowed(3, 1, 0, 60, "0")},
	}, []int64{100, 100})
}

// logRandConfig returns a valid SlidingWindowLog config of 1 to 3
// bandwidths of small periods and capacities, so that windows often
// overlap and fill.
func logRandConfig(r *rand.Rand) Config {
	for {
		cfg := Config{Algorithm: SlidingWindowLog}
		ids := []string{"", "", "a", "b"}
		for range 1 + r.IntN(3) {
			b := Every(time.Duration(1+r.Int64N(40))*us, 1+r.Int64N(8))
			b.ID = ids[r.IntN(len(ids))]
			cfg.Bandwidths = append(cfg.Bandwidths, b)
		}
		if cfg.Validate() == nil {
			return cfg
		}
	}
}

// logRandRequest returns a valid request for cfg, mostly Consume.
func logRandRequest(r *rand.Rand, cfg Config) Request {
	req := Request{Tokens: 1 + r.Int64N(cfg.MinCapacity()), Strategy: Inheritance(r.IntN(4))}
	switch k := r.IntN(20); {
	case k < 9:
		req.Op = Consume
	case k < 11:
		req.Op = Estimate
	case k < 13:
		req.Op = ConsumeUpTo
		req.Tokens = 1 + r.Int64N(20)
	case k < 15:
		req.Op = Add
		req.Tokens = 1 + r.Int64N(5)
	case k < 16:
		req.Op = Reset
	case k < 17:
		req.Op = Replace
	default:
		req.Op = Inspect
	}
	return req
}

// logModel is a deliberately naive sliding log, the reference Apply is
// checked against. It keeps the times taken unsorted, counts a window by
// scanning them all, and finds every wait by stepping the clock one
// microsecond at a time until the request fits; it shares no arithmetic
// with Apply.
type logModel struct {
	cfg     Config
	times   []int64
	expires int64
	built   bool
}

// inWindow counts the times bandwidth b holds at t.
func (m *logModel) inWindow(b Bandwidth, t int64) int64 {
	var n int64
	for _, x := range m.times {
		if t < x+b.PeriodMicros() {
			n++
		}
	}
	return n
}

// waitOf steps from now until bandwidth b has room for n: -1 if it has
// already.
func (m *logModel) waitOf(b Bandwidth, n, now int64) int64 {
	for w := int64(0); ; w++ {
		if m.inWindow(b, now+w)+n <= b.Capacity {
			return w
		}
	}
}

// newestFirst sorts the times, newest first.
func (m *logModel) newestFirst() {
	slices.SortFunc(m.times, func(a, b int64) int { return int(b - a) })
}

func (m *logModel) apply(cfg Config, req Request, now int64) Decision {
	switch {
	case !m.built || req.Op == Reset || now >= m.expires:
		m.times = nil
	case (req.Op == Replace || cfg.Fingerprint() != m.cfg.Fingerprint()) && req.Strategy == ResetTokens:
		m.times = nil
	}
	m.cfg, m.built = cfg, true
	// What the longest window no longer holds goes, then the oldest beyond
	// the smallest capacity among the longest windows.
	var longest int64
	for _, b := range cfg.Bandwidths {
		longest = max(longest, b.PeriodMicros())
	}
	bound := int64(math.MaxInt64)
	for _, b := range cfg.Bandwidths {
		if b.PeriodMicros() == longest {
			bound = min(bound, b.Capacity)
		}
	}
	m.times = slices.DeleteFunc(m.times, func(x int64) bool { return x <= now-longest })
	m.newestFirst()
	m.times = m.times[:min(len(m.times), int(bound))]

	d := Decision{Allowed: true}
	binding := -1
	deny := func(n int64) {
		d.Allowed = false
		for i, b := range cfg.Bandwidths {
			if w := m.waitOf(b, n, now); w > int64(d.RetryAfter/us) {
				d.RetryAfter, binding = time.Duration(w)*us, i
			}
		}
	}
	take := func(n int64) {
		for range n {
			m.times = append(m.times, now)
		}
		d.Consumed = n
	}
	switch req.Op {
	case Consume, Estimate, Inspect:
		n := req.Tokens
		if req.Op == Inspect {
			n = 1
		}
		fits := true
		for _, b := range cfg.Bandwidths {
			fits = fits && m.inWindow(b, now)+n <= b.Capacity
		}
		switch {
		case !fits:
			deny(n)
		case req.Op == Consume:
			take(n)
		}
	case ConsumeUpTo:
		n := req.Tokens
		for _, b := range cfg.Bandwidths {
			n = min(n, b.Capacity-m.inWindow(b, now))
		}
		if n > 0 {
			take(n)
		} else {
			deny(1)
		}
	case Add:
		m.newestFirst()
		m.times = m.times[min(len(m.times), int(req.Tokens)):]
	}
	for i, b := range cfg.Bandwidths {
		left := max(0, b.Capacity-m.inWindow(b, now))
		if i == binding || binding < 0 && (i == 0 || left < d.Remaining) {
			d.Limit, d.Remaining, d.Bandwidth, d.RefillAfter = b.Capacity, left, bandName(cfg.Bandwidths, i), 0
			if left < b.Capacity {
				d.RefillAfter = time.Duration(m.waitOf(b, left+1, now)) * us
			}
		}
	}
	var reset int64
	for _, b := range cfg.Bandwidths {
		reset = max(reset, m.waitOf(b, b.Capacity, now))
	}
	d.ResetAfter, m.expires = time.Duration(reset)*us, now+reset
	return d
}

// TestLogMatchesModel runs seeded random sequences of requests on two
// configs, the clock mostly moving ahead and sometimes back, through Apply
// and the naive model: every decision, the log and the expiry must agree,
// and the log must never hold more than the bound, whatever the traffic.
func TestLogMatchesModel(t *testing.T) {
	for seed := range uint64(1500) {
		r := rand.New(rand.NewPCG(seed, 0x109))
		cfgs := [2]Config{logRandConfig(r), logRandConfig(r)}
		var s State
		var m logModel
		now := int64(1000)
		cur := 0
		for i := range 60 {
			switch k := r.IntN(10); {
			case k < 5:
				now += r.Int64N(4)
			case k < 8:
				now += r.Int64N(30)
			case k < 9:
				now -= r.Int64N(30)
			}
			if r.IntN(8) == 0 {
				cur = 1 - cur
			}
			cfg := cfgs[cur]
			req := logRandRequest(r, cfg)
			if err := CheckRequest("key", cfg, req); err != nil {
				t.Fatalf("bad call: %v", err)
			}
			got, want := Apply(&s, cfg, req, now), m.apply(cfg, req, now)
			wantLog := slices.Clone(m.times)
			slices.Sort(wantLog)
			if got != want || !slices.Equal(s.Log, wantLog) || s.ExpiresAt != m.expires {
				t.Fatalf("seed %d, step %d: %+v at %d on %s:\n got %+v, log %v, expires %d\nwant %+v, log %v, expires %d",
					seed, i, req, now, describe(cfg), got, s.Log, s.ExpiresAt, want, wantLog, m.expires)
			}
			if _, bound := logLimits(cfg.Bandwidths); int64(len(s.Log)) > bound {
				t.Fatalf("seed %d, step %d: log of %d entries, beyond the bound %d", seed, i, len(s.Log), bound)
			}
		}
	}
}

// TestLogWindowHoldsAtMostCapacity checks the log's promise by brute force:
// over a random run of requests, no window of RefillPeriod holds more than
// Capacity tokens taken, for every bandwidth.
func TestLogWindowHoldsAtMostCapacity(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 0xb0057))
		cfg := logRandConfig(r)
		var s State
		takenAt := map[int64]int64{}
		now := int64(0)
		for range 200 {
			now += r.Int64N(6)
			req := consume(1 + r.Int64N(cfg.MinCapacity()))
			if r.IntN(3) == 0 {
				req = consumeUpTo(1 + r.Int64N(10))
			}
			takenAt[now] += Apply(&s, cfg, req, now).Consumed
		}
		admitted := int64(0)
		for _, n := range takenAt {
			admitted += n
		}
		for _, b := range cfg.Bandwidths {
			w := b.PeriodMicros()
			for start := -w; start <= now; start++ {
				var in int64
				for at := start; at < start+w; at++ {
					in += takenAt[at]
				}
				if in > b.Capacity {
					t.Fatalf("seed %d: %s admitted %d in [%d, %d), beyond %d", seed, describe(cfg), in, start, start+w, b.Capacity)
				}
			}
		}
		// The limit binds: a run this dense must be refused sometimes.
		if admitted == 0 {
			t.Fatalf("seed %d: admitted nothing", seed)
		}
	}
}

// logSteadyState is a bucket of cfg that took one request a microsecond
// from 0 to n-1, and n, when its oldest entry leaves if cfg admits n per
// n µs.
func logSteadyState(cfg Config, n int64) (State, int64) {
	var s State
	for at := range n {
		Apply(&s, cfg, consume(1), at)
	}
	return s, n
}

// TestLogNoAllocation: once the log has grown to the limit, a decision
// allocates nothing, whether it admits (dropping the oldest entry) or not.
func TestLogNoAllocation(t *testing.T) {
	cfg := logConfig(Every(1000*us, 1000), Every(100*us, 500).WithID("short"))
	s, now := logSteadyState(cfg, 1000)
	allocs := testing.AllocsPerRun(1000, func() {
		Apply(&s, cfg, consume(1), now)
		Apply(&s, cfg, consume(1), now)
		Apply(&s, cfg, estimate(2), now)
		now++
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run, want 0", allocs)
	}
}

// BenchmarkLogConsume decides on a log kept at its limit of 10,000 entries:
// each admitted request drops the oldest entry.
func BenchmarkLogConsume(b *testing.B) {
	cfg := logConfig(Every(10000*us, MaxLogCapacity))
	s, now := logSteadyState(cfg, MaxLogCapacity)
	b.ReportAllocs()
	for b.Loop() {
		Apply(&s, cfg, consume(1), now)
		now++
	}
}

// logFuzzConfig reads a valid SlidingWindowLog config of 1 to 3
// bandwidths from the input.
func (in *fuzzInput) logFuzzConfig() Config {
	ids := [...]string{"", "a", "b", ""}
	cfg := Config{Algorithm: SlidingWindowLog}
	for range 1 + in.byte()%3 {
		period := in.in(1, int64(MaxRefillPeriod/us))
		b := Every(time.Duration(period)*us, in.in(1, min(period, MaxLogCapacity)))
		b.ID = ids[in.byte()%4]
		for _, o := range cfg.Bandwidths {
			if o.ID == b.ID {
				b.ID = ""
			}
		}
		cfg.Bandwidths = append(cfg.Bandwidths, b)
	}
	return cfg
}

// logCheck checks one call of Apply, made on a copy of before at now: the
// decision is in range and consistent, the log sorted, within the longest
// window and the bound, the expiry at now + ResetAfter; every op but Add,
// Reset and Replace leaves the log a read leaves, plus the entries it
// reports taken; and a denial's RetryAfter is exact.
func logCheck(t *testing.T, before *State, cfg Config, req Request, now int64) {
	t.Helper()
	s := logClone(before)
	d := Apply(&s, cfg, req, now)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%+v at %d on %s, log %v: %+v, log %v: %s", req, now, describe(cfg), before.Log, d, s.Log, fmt.Sprintf(format, args...))
	}
	checkDecision(t, cfg, req, d)
	longest, bound := logLimits(cfg.Bandwidths)
	switch {
	case !slices.IsSorted(s.Log):
		fail("log not in time order")
	case int64(len(s.Log)) > bound:
		fail("log beyond the bound %d", bound)
	case len(s.Log) > 0 && s.Log[0] <= now-longest:
		fail("log holds an entry the longest window does not")
	case s.ExpiresAt != now+int64(d.ResetAfter/us) || s.ExpiresAt > exact:
		fail("ExpiresAt %d, want now + ResetAfter, below 2^53", s.ExpiresAt)
	case s.Fingerprint != cfg.Fingerprint() || s.Algorithm != SlidingWindowLog || len(s.Bands) != len(cfg.Bandwidths):
		fail("state %+v not stamped for the config", s)
	}
	read := logClone(before)
	Apply(&read, cfg, Request{Op: Inspect, Strategy: req.Strategy}, now)
	switch req.Op {
	case Add, Reset, Replace:
		return
	case Consume, ConsumeUpTo:
		if int64(len(s.Log)) != int64(len(read.Log))+d.Consumed {
			fail("took %d, yet the log went from %d entries to %d", d.Consumed, len(read.Log), len(s.Log))
		}
	default:
		if !slices.Equal(s.Log, read.Log) || s.ExpiresAt != read.ExpiresAt {
			fail("changed more than a read: log %v, expiry %d", read.Log, read.ExpiresAt)
		}
	}
	if d.Allowed {
		return
	}
	if !slices.Equal(s.Log, read.Log) {
		fail("a denial changed the log")
	}
	n := req.Tokens
	if req.Op == ConsumeUpTo || req.Op == Inspect {
		n = 1
	}
	wait := int64(d.RetryAfter / us)
	early, due := logClone(&s), logClone(&s)
	if Apply(&early, cfg, estimate(n), now+wait-1).Allowed || !Apply(&due, cfg, estimate(n), now+wait).Allowed {
		fail("RetryAfter is not exact")
	}
}

// FuzzSlidingLog decodes two configs and a run of requests and clock moves
// from the input, and checks every call with logCheck.
func FuzzSlidingLog(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x01\x00\x05\x00\x03\x00\x01\x00\x07\x00\x02\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x0d\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte("\x02\x00\x10\x00\x04\x01\x00\x30\x00\x06\x00\x00\x20\x00\x05\x00\x10\x00\x00\x02\x00\x00\x02\x00\x00\x0b\x00\x02\x00\x00\x0e\x00\x00\x0c\x02\x00\x01\x00\x02\x00\x00\x02\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := fuzzInput(data)
		cfgs := [2]Config{in.logFuzzConfig(), in.logFuzzConfig()}
		for _, cfg := range cfgs {
			if err := cfg.Validate(); err != nil {
				t.Fatalf("logFuzzConfig made a bad config: %v", err)
			}
		}
		var s State
		cur := 0
		now := in.in(0, maxClock-1)
		for len(in) > 0 {
			switch k := in.byte() % 16; {
			case k < 10:
				req := in.windowRequest(cfgs[cur])
				logCheck(t, &s, cfgs[cur], req, now)
				Apply(&s, cfgs[cur], req, now)
			case k < 13:
				now = min(now+in.in(0, 1<<20), maxClock-1)
			case k < 14:
				now = max(0, now-in.in(0, 1<<32))
			default:
				cur = 1 - cur
			}
		}
	})
}
