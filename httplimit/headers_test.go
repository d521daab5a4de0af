package httplimit

import (
	"net/textproto"
	"testing"
	"time"

	sfv "github.com/shogo82148/go-sfv"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestQuota(t *testing.T) {
	for _, tc := range []struct {
		name string
		bw   ratelimit.Bandwidth
		q, w int64
	}{
		{"10/s", ratelimit.PerSecond(10), 10, 1},
		{"10/s burst 20", ratelimit.PerSecond(10).WithBurst(20), 20, 2},
		{"1000/h", ratelimit.PerHour(1000), 1000, 3600},
		{"3 per 7 s", ratelimit.Every(7*time.Second, 3), 3, 7},
		{"5, 2 per 3 s: 7.5 s rounds up", ratelimit.Every(3*time.Second, 2).WithBurst(5), 5, 8},
		{"1 per 100 ms: under a second, so per second", ratelimit.Every(100*time.Millisecond, 1), 10, 1},
		{"1 per 1 µs", ratelimit.Every(time.Microsecond, 1), 1_000_000, 1},
		{"largest capacity, beyond a structured-field Integer", ratelimit.PerSecond(1_000_000).WithBurst(ratelimit.MaxCapacity), maxSFInteger, 1_125_899_907},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := (ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{tc.bw}}).Validate(); err != nil {
				t.Fatal(err)
			}
			if q, w := quota(tc.bw); q != tc.q || w != tc.w {
				t.Errorf("quota = q=%d w=%d, want q=%d w=%d", q, w, tc.q, tc.w)
			}
		})
	}
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second: 0, 0: 0, time.Microsecond: 1, time.Second: 1, time.Second + 1: 2,
		1<<63 - 1: 9223372037,
	} {
		if got := seconds(d); got != want {
			t.Errorf("seconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestHeaderNamesCanonical: the fields are set straight into the map, so
// their names must be what Header.Get looks for.
func TestHeaderNamesCanonical(t *testing.T) {
	for _, name := range []string{headerPolicy, headerLimit, headerRetryAfter, headerXLimit, headerXRemaining, headerXReset} {
		if c := textproto.CanonicalMIMEHeaderKey(name); c != name {
			t.Errorf("%q is not canonical (%q)", name, c)
		}
	}
}

// TestPoliciesBounded: the policy cache never holds more than
// maxPolicies configs.
func TestPoliciesBounded(t *testing.T) {
	var p policies
	for i := range int64(3 * maxPolicies) {
		p.get(ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1 + i)}})
	}
	n := 0
	p.m.Range(func(any, any) bool { n++; return true })
	if n > maxPolicies {
		t.Errorf("%d policies cached, want at most %d", n, maxPolicies)
	}
}

// FuzzPolicy: for any valid bandwidth, the RateLimit-Policy field parses
// back as the draft's syntax says, with the bandwidth's name and q and w
// within the structured-field Integer range (w at least 1). It is read
// with go-sfv, not with httpsfv, which writes it.
func FuzzPolicy(f *testing.F) {
	f.Add(int64(20), int64(10), int64(1_000_000), "burst")
	f.Add(int64(1), int64(1), int64(100_000), "")
	f.Add(int64(ratelimit.MaxCapacity), int64(1_000_000), int64(1_000_000), "a.b-c_d:e")
	f.Fuzz(func(t *testing.T, capacity, refill, periodMicros int64, id string) {
		bw := ratelimit.Bandwidth{ID: id, Capacity: capacity, RefillTokens: refill,
			RefillPeriod: time.Duration(periodMicros) * time.Microsecond}
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{bw}}
		if periodMicros > int64(ratelimit.MaxRefillPeriod/time.Microsecond) || cfg.Validate() != nil {
			return
		}
		pol, err := newPolicy(cfg)
		if err != nil {
			t.Fatalf("valid config %+v: %v", bw, err)
		}
		list, err := sfv.DecodeList([]string{pol.field})
		if err != nil || len(list) != 1 {
			t.Fatalf("field %q: %v", pol.field, err)
		}
		item := list[0]
		qi, qok := item.Parameters.Get("q").(int64)
		wi, wok := item.Parameters.Get("w").(int64)
		if item.Value != cfg.BandwidthName(0) || !qok || !wok || qi < 1 || wi < 1 || qi > maxSFInteger || wi > maxSFInteger {
			t.Fatalf("field %q for %+v", pol.field, bw)
		}
	})
}
