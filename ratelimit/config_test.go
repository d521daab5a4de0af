package ratelimit

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	long := strings.Repeat("x", MaxIDLen)
	many := func(n int) Config {
		var c Config
		for range n {
			c.Bandwidths = append(c.Bandwidths, PerSecond(1))
		}
		return c
	}
	tests := []struct {
		name  string
		cfg   Config
		field string // "" when valid: the field the error must name
	}{
		{"per second", cfgOf(PerSecond(1)), ""},
		{"helpers", cfgOf(PerSecond(10).WithBurst(50).WithID("burst"), PerMinute(100).WithID("minute"), PerHour(1000).WithID("hour")), ""},

		{"unknown algorithm", Config{Algorithm: 200, Bandwidths: []Bandwidth{PerSecond(1)}}, "Algorithm"},
		{"GCRA", Config{Algorithm: GCRA, Bandwidths: []Bandwidth{PerSecond(10).WithBurst(50)}}, ""},
		{"GCRA Interval", Config{Algorithm: GCRA, Bandwidths: []Bandwidth{PerSecond(10).WithRefill(Interval)}}, "Bandwidths[0].Refill"},
		{"LeakyBucket aligned", Config{Algorithm: LeakyBucket, Bandwidths: []Bandwidth{PerSecond(10).AlignedTo(time.UnixMicro(0))}}, "Bandwidths[0].Refill"},
		{"FixedWindow", Config{Algorithm: FixedWindow, Bandwidths: []Bandwidth{PerMinute(100), PerHour(1000).AlignedTo(time.UnixMicro(0))}}, ""},
		{"FixedWindow burst", Config{Algorithm: FixedWindow, Bandwidths: []Bandwidth{PerMinute(100).WithBurst(200)}}, "Bandwidths[0].RefillTokens"},
		{"FixedWindow Interval", Config{Algorithm: FixedWindow, Bandwidths: []Bandwidth{PerMinute(100).WithRefill(Interval)}}, "Bandwidths[0].Refill"},
		{"FixedWindow InitialTokens", Config{Algorithm: FixedWindow, Bandwidths: []Bandwidth{PerMinute(100).WithInitialTokens(5)}}, "Bandwidths[0].InitialTokens"},
		{"SlidingWindowLog at MaxLogCapacity", Config{Algorithm: SlidingWindowLog, Bandwidths: []Bandwidth{PerMinute(MaxLogCapacity)}}, ""},
		{"SlidingWindowLog past MaxLogCapacity", Config{Algorithm: SlidingWindowLog, Bandwidths: []Bandwidth{PerMinute(MaxLogCapacity + 1)}}, "Bandwidths[0].Capacity"},
		{"SlidingWindowLog aligned", Config{Algorithm: SlidingWindowLog, Bandwidths: []Bandwidth{PerMinute(10).AlignedTo(time.UnixMicro(0))}}, "Bandwidths[0].Refill"},
		{"SlidingWindowCounter a day", Config{Algorithm: SlidingWindowCounter, Bandwidths: []Bandwidth{Every(24*time.Hour, 100_000)}}, ""},
		{"SlidingWindowCounter past 2^53", Config{Algorithm: SlidingWindowCounter, Bandwidths: []Bandwidth{Every(24*time.Hour, 200_000)}}, "Bandwidths[0].Capacity × RefillPeriod"},
		{"SlidingWindowCounter at 2^53", Config{Algorithm: SlidingWindowCounter, Bandwidths: []Bandwidth{Every(1<<43*us, 1<<10)}}, ""},
		{"SlidingWindowCounter past 2^53 by one", Config{Algorithm: SlidingWindowCounter, Bandwidths: []Bandwidth{Every(1<<43*us+us, 1<<10)}}, "Bandwidths[0].Capacity"},
		{"no bandwidths", Config{}, "Bandwidths"},
		{"MaxBandwidths", many(MaxBandwidths), ""},
		{"MaxBandwidths+1", many(MaxBandwidths + 1), "Bandwidths"},
		{"zero bandwidth", cfgOf(Bandwidth{}), "Bandwidths[0].Capacity"},
		{"names the index", cfgOf(PerSecond(1), PerSecond(0)), "Bandwidths[1].Capacity"},

		{"Capacity 0", cfgOf(PerSecond(1).WithBurst(0)), "Bandwidths[0].Capacity"},
		{"Capacity -1", cfgOf(PerSecond(1).WithBurst(-1)), "Bandwidths[0].Capacity"},
		{"Capacity MaxCapacity", cfgOf(Every(us, 1).WithBurst(MaxCapacity)), ""},
		{"Capacity MaxCapacity+1", cfgOf(Every(us, 1).WithBurst(MaxCapacity + 1)), "Bandwidths[0].Capacity"},
		{"Capacity MaxInt64", cfgOf(Every(us, 1).WithBurst(math.MaxInt64)), "Bandwidths[0].Capacity"},

		{"RefillPeriod 1µs", cfgOf(Every(us, 1)), ""},
		{"RefillPeriod 0", cfgOf(Every(0, 1)), "Bandwidths[0].RefillPeriod"},
		{"RefillPeriod negative", cfgOf(Every(-time.Second, 1)), "Bandwidths[0].RefillPeriod"},
		{"RefillPeriod under 1µs", cfgOf(Every(999, 1)), "Bandwidths[0].RefillPeriod"},
		{"RefillPeriod not whole µs", cfgOf(Every(1500, 1)), "Bandwidths[0].RefillPeriod"},
		{"RefillPeriod MaxRefillPeriod", cfgOf(Every(MaxRefillPeriod, 1)), ""},
		{"RefillPeriod MaxRefillPeriod+1µs", cfgOf(Every(MaxRefillPeriod+us, 1)), "Bandwidths[0].RefillPeriod"},
		{"RefillPeriod MaxInt64", cfgOf(Every(math.MaxInt64, 1)), "Bandwidths[0].RefillPeriod"},

		{"RefillTokens 0", cfgOf(Every(time.Second, 0).WithBurst(1)), "Bandwidths[0].RefillTokens"},
		{"RefillTokens -1", cfgOf(Every(time.Second, -1).WithBurst(1)), "Bandwidths[0].RefillTokens"},
		{"1 token a µs", cfgOf(PerSecond(1_000_000)), ""},
		{"faster than 1 token a µs", cfgOf(PerSecond(1_000_001)), "Bandwidths[0].RefillTokens"},
		{"2 tokens a µs", cfgOf(Every(us, 2)), "Bandwidths[0].RefillTokens"},

		// Greedy: Capacity × Scale ≤ MaxScaled, Scale = period/gcd.
		{"greedy at MaxScaled", cfgOf(Every(1<<20*us, 1).WithBurst(1 << 31)), ""},
		{"greedy past MaxScaled", cfgOf(Every(1<<20*us, 1).WithBurst(1<<31 + 1)), "Bandwidths[0].Capacity"},
		{"greedy at MaxScaled by gcd", cfgOf(Every(1<<20*us, 1<<10).WithBurst(1 << 41)), ""},
		{"greedy past MaxScaled by gcd", cfgOf(Every(1<<20*us, 1<<10).WithBurst(1<<41 + 1)), "Bandwidths[0].Capacity"},
		{"greedy MaxCapacity, scale 2", cfgOf(Every(2*us, 1).WithBurst(MaxCapacity)), ""},
		{"greedy MaxCapacity, scale 4", cfgOf(Every(4*us, 1).WithBurst(MaxCapacity)), "Bandwidths[0].Capacity"},
		{"greedy 71 per 366 days", cfgOf(Every(MaxRefillPeriod, 1).WithBurst(71)), ""},
		{"greedy 72 per 366 days", cfgOf(Every(MaxRefillPeriod, 1).WithBurst(72)), "Bandwidths[0].Capacity"},
		{"greedy 1 per hour, biggest burst", cfgOf(PerHour(1).WithBurst(MaxScaled / 3_600_000_000)), ""},
		{"greedy 1 per hour, burst too big", cfgOf(PerHour(1).WithBurst(MaxScaled/3_600_000_000 + 1)), "Bandwidths[0].Capacity"},

		// Interval kinds: ⌈Capacity/RefillTokens⌉ periods ≤ MaxScaled µs.
		{"interval fills in 2^51µs", cfgOf(Every(1<<20*us, 1).WithRefill(Interval).WithBurst(1 << 31)), ""},
		{"interval fills in more", cfgOf(Every(1<<20*us, 1).WithRefill(Interval).WithBurst(1<<31 + 1)), "Bandwidths[0].Capacity"},
		{"interval by 3 fills in 2^51µs", cfgOf(Every(1<<20*us, 3).WithRefill(Interval).WithBurst(3 << 31)), ""},
		{"interval by 3 fills in more", cfgOf(Every(1<<20*us, 3).WithRefill(Interval).WithBurst(3<<31 + 1)), "Bandwidths[0].Capacity"},
		{"interval MaxCapacity", cfgOf(Every(us, 1).WithRefill(Interval).WithBurst(MaxCapacity)), ""},
		{"aligned fills in more", cfgOf(Every(1<<20*us, 1).AlignedTo(time.UnixMicro(0)).WithBurst(1<<31 + 1)), "Bandwidths[0].Capacity"},

		{"InitialTokens 0", cfgOf(PerSecond(5).WithInitialTokens(0)), ""},
		{"InitialTokens Capacity", cfgOf(PerSecond(5).WithInitialTokens(5)), ""},
		{"InitialTokens -1", cfgOf(PerSecond(5).WithInitialTokens(-1)), "Bandwidths[0].InitialTokens"},
		{"InitialTokens Capacity+1", cfgOf(PerSecond(5).WithInitialTokens(6)), "Bandwidths[0].InitialTokens"},

		{"ID of every allowed byte", cfgOf(PerSecond(1).WithID("azAZ09-_.:")), ""},
		{"ID MaxIDLen", cfgOf(PerSecond(1).WithID(long)), ""},
		{"ID MaxIDLen+1", cfgOf(PerSecond(1).WithID(long + "x")), "Bandwidths[0].ID"},
		{"ID with a space", cfgOf(PerSecond(1).WithID("a b")), "Bandwidths[0].ID"},
		{"ID not ASCII", cfgOf(PerSecond(1).WithID("é")), "Bandwidths[0].ID"},
		{"ID with a NUL", cfgOf(PerSecond(1).WithID("a\x00")), "Bandwidths[0].ID"},
		{"ID with a brace", cfgOf(PerSecond(1).WithID("{a}")), "Bandwidths[0].ID"},
		{"duplicate IDs", cfgOf(PerSecond(1).WithID("a"), PerSecond(2).WithID("a")), "Bandwidths[1].ID"},
		{"duplicate IDs apart", cfgOf(PerSecond(1).WithID("a"), PerSecond(2).WithID("b"), PerSecond(3).WithID("a")), "Bandwidths[2].ID"},
		{"several without ID", cfgOf(PerSecond(1), PerSecond(2)), ""},

		{"unknown Refill", cfgOf(PerSecond(1).WithRefill(3)), "Bandwidths[0].Refill"},
		{"greedy with AlignedStart", cfgOf(Bandwidth{Capacity: 1, RefillTokens: 1, RefillPeriod: time.Second, AlignedStart: time.UnixMicro(5)}), "Bandwidths[0].AlignedStart"},
		{"interval with AlignedStart", cfgOf(Bandwidth{Capacity: 1, RefillTokens: 1, RefillPeriod: time.Second, Refill: Interval, AlignedStart: time.UnixMicro(5)}), "Bandwidths[0].AlignedStart"},
		{"aligned without AlignedStart", cfgOf(PerSecond(1).WithRefill(IntervalAligned)), "Bandwidths[0].AlignedStart"},
		{"aligned to 1970", cfgOf(PerSecond(1).AlignedTo(time.UnixMicro(0))), ""},
		{"aligned before 1970", cfgOf(PerSecond(1).AlignedTo(time.UnixMicro(-1))), "Bandwidths[0].AlignedStart"},
		{"aligned to the last µs", cfgOf(PerSecond(1).AlignedTo(time.UnixMicro(maxClock - 1))), ""},
		{"aligned past 2112", cfgOf(PerSecond(1).AlignedTo(time.UnixMicro(maxClock))), "Bandwidths[0].AlignedStart"},
		// The clock's range, not how far ahead a bucket may be reserved
		// (2^51µs, in 2041), bounds AlignedStart.
		{"aligned past 2041", cfgOf(PerSecond(1).AlignedTo(time.UnixMicro(maxHorizon))), ""},
		{"aligned to 2100", cfgOf(PerSecond(1).AlignedTo(time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC))), ""},
		{"aligned to midnight", cfgOf(Every(24*time.Hour, 1000).AlignedTo(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want an error wrapping ErrInvalidConfig", err)
			}
			if want := "ratelimit: invalid config: " + tt.field + " "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Validate() = %q, want it to begin %q", err, want)
			}
		})
	}
}

func TestCheckRequest(t *testing.T) {
	small := cfgOf(PerSecond(5), PerMinute(3))
	tests := []struct {
		name    string
		key     string
		cfg     Config
		req     Request
		wantErr error  // nil when valid
		field   string // what the error must name
	}{
		{"valid", "k", small, consume(1), nil, ""},
		{"empty key", "", small, consume(1), ErrInvalidKey, "key"},
		{"key MaxKeyLen", strings.Repeat("k", MaxKeyLen), small, consume(1), nil, ""},
		{"key MaxKeyLen+1", strings.Repeat("k", MaxKeyLen+1), small, consume(1), ErrInvalidKey, "key"},
		{"key checked first", "", Config{}, Request{Op: 99}, ErrInvalidKey, "key"},
		{"bad config", "k", cfgOf(PerSecond(0)), consume(1), ErrInvalidConfig, "Bandwidths[0].Capacity"},
		{"config checked before request", "k", Config{}, Request{Op: 99}, ErrInvalidConfig, "Bandwidths"},

		{"unknown Op", "k", small, Request{Op: Inspect + 1}, ErrInvalidRequest, "Op"},
		{"unknown Strategy", "k", small, Request{Op: Replace, Strategy: Additive + 1}, ErrInvalidRequest, "Strategy"},
		{"unknown Strategy on Consume", "k", small, Request{Tokens: 1, Strategy: 200}, ErrInvalidRequest, "Strategy"},

		{"Consume 0", "k", small, consume(0), ErrInvalidRequest, "Tokens"},
		{"Consume -1", "k", small, consume(-1), ErrInvalidRequest, "Tokens"},
		{"Consume the smallest capacity", "k", small, consume(3), nil, ""},
		{"Consume more than the smallest capacity", "k", small, consume(4), ErrInvalidRequest, "Tokens"},
		{"Consume MaxInt64", "k", small, consume(math.MaxInt64), ErrInvalidRequest, "Tokens"},
		{"Estimate 0", "k", small, estimate(0), ErrInvalidRequest, "Tokens"},
		{"Estimate too many", "k", small, estimate(4), ErrInvalidRequest, "Tokens"},
		{"Estimate the smallest capacity", "k", small, estimate(3), nil, ""},
		{"Reserve 0", "k", small, reserve(0, time.Second), ErrInvalidRequest, "Tokens"},
		{"Reserve too many", "k", small, reserve(4, time.Second), ErrInvalidRequest, "Tokens"},
		{"Reserve, MaxWait 0", "k", small, reserve(3, 0), nil, ""},
		{"Reserve, MaxWait MaxInt64", "k", small, reserve(3, math.MaxInt64), nil, ""},
		{"Reserve, negative MaxWait", "k", small, reserve(1, -time.Nanosecond), ErrInvalidRequest, "MaxWait"},
		{"Consume, negative MaxWait", "k", small, Request{Op: Consume, Tokens: 1, MaxWait: -1}, ErrInvalidRequest, "MaxWait"},

		{"ConsumeUpTo 0", "k", small, consumeUpTo(0), ErrInvalidRequest, "Tokens"},
		{"ConsumeUpTo MaxInt64", "k", small, consumeUpTo(math.MaxInt64), nil, ""},
		{"Add 0", "k", small, add(0), ErrInvalidRequest, "Tokens"},
		{"Add -5", "k", small, add(-5), ErrInvalidRequest, "Tokens"},
		{"Add MaxInt64", "k", small, add(math.MaxInt64), nil, ""},

		{"Reset ignores Tokens and MaxWait", "k", small, Request{Op: Reset, Tokens: -1, MaxWait: -1}, nil, ""},
		{"Replace ignores Tokens", "k", small, Request{Op: Replace, Tokens: -1, Strategy: Additive}, nil, ""},
		{"Inspect ignores Tokens", "k", small, Request{Op: Inspect, Tokens: math.MinInt64}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckRequest(tt.key, tt.cfg, tt.req)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("CheckRequest() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("CheckRequest() = %v, want an error wrapping %v", err, tt.wantErr)
			}
			for _, other := range []error{ErrInvalidKey, ErrInvalidConfig, ErrInvalidRequest} {
				if other != tt.wantErr && errors.Is(err, other) {
					t.Errorf("CheckRequest() = %v, which also wraps %v", err, other)
				}
			}
			if want := tt.wantErr.Error() + ": "; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("CheckRequest() = %q, want it to begin %q and name %s", err, want, tt.field)
			}
		})
	}
}

func TestFingerprint(t *testing.T) {
	base := func() Config {
		return cfgOf(
			PerSecond(10).WithBurst(20).WithID("burst"),
			Every(time.Hour, 100).WithRefill(Interval),
			Every(24*time.Hour, 1000).AlignedTo(time.UnixMicro(1_700_000_000_000_000)).WithInitialTokens(10),
		)
	}
	fp := base().Fingerprint()
	// Pinned: a change to the hash converts every stored bucket once, on
	// its next call, as if each had changed plan.
	if want := uint64(0x6ceb0be442e7ca57); fp != want {
		t.Errorf("Fingerprint() = %#x, want %#x", fp, want)
	}

	same := map[string]func(*Config){
		"unchanged":               func(*Config) {},
		"InitialTokens as a copy": func(c *Config) { c.Bandwidths[2].InitialTokens = ptr(int64(10)) },
		"InitialTokens spelled":   func(c *Config) { c.Bandwidths[0].InitialTokens = ptr(int64(20)) },
		"AlignedStart elsewhere": func(c *Config) {
			c.Bandwidths[2].AlignedStart = time.UnixMicro(1_700_000_000_000_000).In(time.FixedZone("X", 3600))
		},
	}
	for name, change := range same {
		c := base()
		change(&c)
		if got := c.Fingerprint(); got != fp {
			t.Errorf("%s: Fingerprint() = %#x, want %#x", name, got, fp)
		}
	}

	differ := map[string]func(*Config){
		"ID":            func(c *Config) { c.Bandwidths[0].ID = "burst2" },
		"ID added":      func(c *Config) { c.Bandwidths[1].ID = "hour" },
		"Capacity":      func(c *Config) { c.Bandwidths[0].Capacity = 21 },
		"RefillTokens":  func(c *Config) { c.Bandwidths[1].RefillTokens = 99 },
		"RefillPeriod":  func(c *Config) { c.Bandwidths[1].RefillPeriod = time.Hour + us },
		"Refill":        func(c *Config) { c.Bandwidths[1].Refill = Greedy },
		"InitialTokens": func(c *Config) { c.Bandwidths[2].InitialTokens = ptr(int64(11)) },
		"AlignedStart":  func(c *Config) { c.Bandwidths[2].AlignedStart = time.UnixMicro(1_700_000_000_000_001) },
		"Algorithm":     func(c *Config) { c.Algorithm = 200 },
		"order":         func(c *Config) { c.Bandwidths[0], c.Bandwidths[1] = c.Bandwidths[1], c.Bandwidths[0] },
		"one more":      func(c *Config) { c.Bandwidths = append(c.Bandwidths, PerSecond(1)) },
		"one fewer":     func(c *Config) { c.Bandwidths = c.Bandwidths[:2] },
	}
	for name, change := range differ {
		c := base()
		change(&c)
		if got := c.Fingerprint(); got == fp {
			t.Errorf("%s changed: Fingerprint() = %#x, the same as before", name, got)
		}
	}

	// ID bytes are delimited by the length: "ab"+"c" is not "a"+"bc".
	a := cfgOf(PerSecond(1).WithID("ab"), PerSecond(1).WithID("c"))
	b := cfgOf(PerSecond(1).WithID("a"), PerSecond(1).WithID("bc"))
	if a.Fingerprint() == b.Fingerprint() {
		t.Errorf("IDs ab,c and a,bc have the same fingerprint %#x", a.Fingerprint())
	}
}

func TestAlgorithmString(t *testing.T) {
	want := []string{"TokenBucket", "GCRA", "FixedWindow", "SlidingWindowLog", "SlidingWindowCounter", "LeakyBucket"}
	for i, name := range want {
		if got := Algorithm(i).String(); got != name {
			t.Errorf("Algorithm(%d).String() = %q, want %q", i, got, name)
		}
	}
	if got := Algorithm(7).String(); got != "Algorithm(7)" {
		t.Errorf("Algorithm(7).String() = %q", got)
	}
}

// TestAlgorithmSupports: only the token bucket and GCRA reserve; every
// algorithm takes the other ops, and CheckRequest refuses what Supports
// denies, naming the op and the algorithm.
func TestAlgorithmSupports(t *testing.T) {
	for alg := range numAlgorithms + 1 {
		cfg := Config{Algorithm: alg, Bandwidths: []Bandwidth{PerMinute(10)}}
		for op := Consume; op <= Inspect+1; op++ {
			want := alg < numAlgorithms && op <= Inspect && (op != Reserve || alg == TokenBucket || alg == GCRA)
			if got := alg.Supports(op); got != want {
				t.Errorf("%v.Supports(%v) = %v, want %v", alg, op, got, want)
			}
			if alg == numAlgorithms || op > Inspect {
				continue
			}
			err := CheckRequest("k", cfg, Request{Op: op, Tokens: 1})
			switch {
			case want && err != nil:
				t.Errorf("%v: CheckRequest(%v) = %v, want nil", alg, op, err)
			case !want && (!errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "Op Reserve is not supported by "+alg.String())):
				t.Errorf("%v: CheckRequest(%v) = %v, want ErrInvalidRequest naming the op and algorithm", alg, op, err)
			}
		}
	}
}
