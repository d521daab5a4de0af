package plans

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

func TestPlanValidate(t *testing.T) {
	good := func() Plan {
		return Plan{Name: "pro", Version: 7, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(100)}}
	}
	with := func(f func(*Plan)) Plan { p := good(); f(&p); return p }
	tests := []struct {
		name       string
		plan       Plan
		want       string // "" for valid
		wantConfig bool   // the error also wraps ratelimit.ErrInvalidConfig
	}{
		{"valid", good(), "", false},
		{"name of 64 bytes", with(func(p *Plan) { p.Name = strings.Repeat("n", 64) }), "", false},
		{"name with spaces and unicode", with(func(p *Plan) { p.Name = "Pro plan – 2026" }), "", false},
		{"highest version", with(func(p *Plan) { p.Version = MaxVersion }), "", false},
		{"empty name", with(func(p *Plan) { p.Name = "" }),
			`plans: invalid plan: plan "" version 7: Name must not be empty`, false},
		{"long name", with(func(p *Plan) { p.Name = strings.Repeat("n", 65) }),
			`plans: invalid plan: plan "` + strings.Repeat("n", 65) + `" version 7: Name must be at most 64 bytes, got 65`, false},
		{"control character", with(func(p *Plan) { p.Name = "pro\n" }),
			`plans: invalid plan: plan "pro\n" version 7: Name "pro\n" must be printable UTF-8`, false},
		{"invalid UTF-8", with(func(p *Plan) { p.Name = "pro\xff" }),
			`plans: invalid plan: plan "pro\xff" version 7: Name "pro\xff" must be printable UTF-8`, false},
		{"version 0", with(func(p *Plan) { p.Version = 0 }),
			`plans: invalid plan: plan "pro" version 0: Version must be between 1 and 2^53-1, got 0`, false},
		{"version 2^53", with(func(p *Plan) { p.Version = 1 << 53 }),
			`plans: invalid plan: plan "pro" version 9007199254740992: Version must be between 1 and 2^53-1, got 9007199254740992`, false},
		{"negative capacity", with(func(p *Plan) { p.Bandwidths[0].Capacity = -5 }),
			`plans: invalid plan: plan "pro" version 7: Bandwidths[0].Capacity must be between 1 and 2^50, got -5`, true},
		{"no bandwidths", with(func(p *Plan) { p.Bandwidths = nil }),
			`plans: invalid plan: plan "pro" version 7: Bandwidths must have 1 to 16 entries, got 0`, true},
		{"unknown algorithm", with(func(p *Plan) { p.Algorithm = 9 }),
			`plans: invalid plan: plan "pro" version 7: Algorithm Algorithm(9) is not a known Algorithm`, true},
		{"algorithm rule", with(func(p *Plan) { p.Algorithm = ratelimit.GCRA; p.Bandwidths[0].Refill = ratelimit.Interval }),
			`plans: invalid plan: plan "pro" version 7: Bandwidths[0].Refill must be Greedy for GCRA, got Interval`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.plan.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Validate() = %v\nwant %s", err, tt.want)
			}
			if !errors.Is(err, ErrInvalidPlan) {
				t.Errorf("error does not wrap ErrInvalidPlan")
			}
			if got := errors.Is(err, ratelimit.ErrInvalidConfig); got != tt.wantConfig {
				t.Errorf("errors.Is(err, ratelimit.ErrInvalidConfig) = %v, want %v", got, tt.wantConfig)
			}
		})
	}
}

func TestPlanConfig(t *testing.T) {
	p := Plan{Name: "pro", Version: 7, Algorithm: ratelimit.GCRA, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}}
	cfg := p.Config()
	if cfg.Algorithm != ratelimit.GCRA || len(cfg.Bandwidths) != 1 || &cfg.Bandwidths[0] != &p.Bandwidths[0] {
		t.Errorf("Config() = %+v, want the plan's algorithm and its Bandwidths slice", cfg)
	}
	if n := testing.AllocsPerRun(100, func() { cfg = p.Config() }); n != 0 {
		t.Errorf("Config() allocates %v times, want 0", n)
	}
}

func TestPlanFromRow(t *testing.T) {
	const row = `[{"id":"burst","capacity":100,"refill_tokens":100,"refill_period":"1m","refill":"Greedy","initial_tokens":50},` +
		`{"id":"daily","capacity":1000,"refill_tokens":1000,"refill_period":"24h","refill":"IntervalAligned","aligned_start":"2026-01-01T00:00:00Z"}]`
	p, err := PlanFromRow("pro", 7, "TokenBucket", []byte(row))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	want := []ratelimit.Bandwidth{
		ratelimit.PerMinute(100).WithID("burst").WithInitialTokens(50),
		ratelimit.Every(24*time.Hour, 1000).WithID("daily").AlignedTo(start),
	}
	if p.Name != "pro" || p.Version != 7 || p.Algorithm != ratelimit.TokenBucket || !equalBandwidths(p.Bandwidths, want) {
		t.Errorf("PlanFromRow = %+v, want pro v7 TokenBucket %+v", p, want)
	}

	tests := []struct {
		name      string
		plan      string
		version   uint64
		algorithm string
		row       string
		want      string
	}{
		{"unknown algorithm", "pro", 7, "Token", row,
			`plans: invalid plan: plan "pro" version 7: Algorithm "Token" is not a known Algorithm (TokenBucket, GCRA, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket)`},
		{"no algorithm", "pro", 7, "", row,
			`plans: invalid plan: plan "pro" version 7: Algorithm "" is not a known Algorithm (TokenBucket, GCRA, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket)`},
		{"missing field", "pro", 7, "GCRA", `[{"capacity":1,"refill_tokens":1,"refill_period":"1s"},{"capacity":1,"refill_tokens":1}]`,
			`plans: invalid plan: plan "pro" version 7: bandwidths[1].refill_period: missing`},
		{"bad duration", "free", 3, "GCRA", `[{"capacity":1,"refill_tokens":1,"refill_period":"soon"}]`,
			`plans: invalid plan: plan "free" version 3: bandwidths[0].refill_period: time: invalid duration "soon"`},
		{"invalid value", "pro", 7, "TokenBucket", `[{"capacity":-5,"refill_tokens":1,"refill_period":"1s"}]`,
			`plans: invalid plan: plan "pro" version 7: Bandwidths[0].Capacity must be between 1 and 2^50, got -5`},
		{"invalid for the algorithm", "pro", 7, "GCRA", row,
			`plans: invalid plan: plan "pro" version 7: Bandwidths[1].Refill must be Greedy for GCRA, got IntervalAligned`},
		{"bad version", "pro", 0, "TokenBucket", row,
			`plans: invalid plan: plan "pro" version 0: Version must be between 1 and 2^53-1, got 0`},
		{"bad name", "", 7, "TokenBucket", row,
			`plans: invalid plan: plan "" version 7: Name must not be empty`},
		{"null column", "pro", 7, "TokenBucket", "",
			`plans: invalid plan: plan "pro" version 7: bandwidths: invalid JSON at offset 0: unexpected EOF`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := PlanFromRow(tt.plan, tt.version, tt.algorithm, []byte(tt.row))
			if err == nil || err.Error() != tt.want {
				t.Fatalf("PlanFromRow = %+v, %v\nwant error %s", p, err, tt.want)
			}
			if !errors.Is(err, ErrInvalidPlan) {
				t.Errorf("error does not wrap ErrInvalidPlan")
			}
			if p.Name != "" || p.Bandwidths != nil {
				t.Errorf("PlanFromRow returned %+v with its error, want the zero Plan", p)
			}
		})
	}
}

func TestParseAlgorithm(t *testing.T) {
	a, err := ParseAlgorithm("SlidingWindowCounter")
	if err != nil || a != ratelimit.SlidingWindowCounter {
		t.Errorf("ParseAlgorithm(SlidingWindowCounter) = %v, %v", a, err)
	}
	if _, err := ParseAlgorithm("tokenbucket"); !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Errorf("ParseAlgorithm(tokenbucket) = %v, want an ErrInvalidConfig", err)
	}
}

// equalBandwidths reports whether a and b are the same bandwidths:
// InitialTokens compared by value, AlignedStart as an instant.
func equalBandwidths(a, b []ratelimit.Bandwidth) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.ID != y.ID || x.Capacity != y.Capacity || x.RefillTokens != y.RefillTokens ||
			x.RefillPeriod != y.RefillPeriod || x.Refill != y.Refill || !x.AlignedStart.Equal(y.AlignedStart) ||
			(x.InitialTokens == nil) != (y.InitialTokens == nil) ||
			x.InitialTokens != nil && *x.InitialTokens != *y.InitialTokens {
			return false
		}
	}
	return true
}
