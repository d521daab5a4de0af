package plans

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

func TestParseBandwidths(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []ratelimit.Bandwidth
	}{
		{"required fields only", `[{"capacity":10,"refill_tokens":1,"refill_period":"1s"}]`,
			[]ratelimit.Bandwidth{ratelimit.PerSecond(1).WithBurst(10)}},
		{"every field", `[{"id":"daily","capacity":5,"refill_tokens":5,"refill_period":"24h","refill":"IntervalAligned","initial_tokens":0,"aligned_start":"2026-01-01T00:00:00+01:00"}]`,
			[]ratelimit.Bandwidth{ratelimit.Every(24*time.Hour, 5).WithID("daily").WithInitialTokens(0).
				AlignedTo(time.Date(2025, 12, 31, 23, 0, 0, 0, time.UTC))}},
		{"nulls for optional fields", `[{"id":null,"capacity":1,"refill_tokens":1,"refill_period":"1m","refill":null,"initial_tokens":null,"aligned_start":null}]`,
			[]ratelimit.Bandwidth{ratelimit.PerMinute(1)}},
		{"fields in any order, whitespace", " [ {\"refill_period\" : \"1h30m\", \"refill\":\"Interval\",\n\"refill_tokens\":2, \"capacity\":3} ] \n",
			[]ratelimit.Bandwidth{ratelimit.Every(90*time.Minute, 2).WithBurst(3).WithRefill(ratelimit.Interval)}},
		{"escaped key", `[{"\u0063apacity":1,"refill_tokens":1,"refill_period":"1s"}]`,
			[]ratelimit.Bandwidth{ratelimit.PerSecond(1)}},
		{"two", `[{"capacity":1,"refill_tokens":1,"refill_period":"1s"},{"id":"h","capacity":100,"refill_tokens":100,"refill_period":"1h"}]`,
			[]ratelimit.Bandwidth{ratelimit.PerSecond(1), ratelimit.PerHour(100).WithID("h")}},
		{"values are checked later", `[{"capacity":-1,"refill_tokens":0,"refill_period":"-5s"}]`,
			[]ratelimit.Bandwidth{{Capacity: -1, RefillPeriod: -5 * time.Second}}},
		{"empty", `[]`, []ratelimit.Bandwidth{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBandwidths([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if got == nil || !equalBandwidths(got, tt.want) {
				t.Errorf("ParseBandwidths = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseBandwidthsErrors(t *testing.T) {
	const ok = `{"capacity":1,"refill_tokens":1,"refill_period":"1s"}`
	seventeen := "[" + strings.Repeat(ok+",", 16) + ok + "]"
	tests := []struct {
		name, in, want string
	}{
		{"empty", ``, `bandwidths: invalid JSON at offset 0: unexpected EOF`},
		{"null", `null`, `bandwidths: must be a JSON array, got null`},
		{"object", `{"capacity":1}`, `bandwidths: must be a JSON array, got an object`},
		{"not JSON", `[x]`, `bandwidths[0]: invalid JSON at offset 1: invalid character 'x' looking for beginning of value`},
		{"unterminated", `[` + ok, `bandwidths: invalid JSON at offset 54: unexpected EOF`},
		{"unterminated object", `[{"capacity":1`, `bandwidths[0]: invalid JSON at offset 14: unexpected EOF`},
		{"trailing array", `[]` + `[]`, `bandwidths: unexpected data after the array: an array`},
		{"trailing garbage", `[] x`, `bandwidths: invalid JSON at offset 3: invalid character 'x' looking for beginning of value`},
		{"trailing number", `[] 1`, `bandwidths: unexpected data after the array: number 1`},
		{"element not an object", `[` + ok + `,7]`, `bandwidths[1]: must be an object, got number 7`},
		{"unknown field", `[{"capacity":1,"Capacity":1}]`, `bandwidths[0]: unknown field "Capacity"`},
		{"repeated field", `[{"capacity":1,"capacity":2}]`, `bandwidths[0].capacity: repeated`},
		{"repeated escaped", `[{"capacity":1,"\u0063apacity":2}]`, `bandwidths[0].capacity: repeated`},
		{"missing capacity", `[{"refill_tokens":1,"refill_period":"1s"}]`, `bandwidths[0].capacity: missing`},
		{"missing refill_tokens", `[{"capacity":1,"refill_period":"1s"}]`, `bandwidths[0].refill_tokens: missing`},
		{"missing refill_period", `[` + ok + `,{"capacity":1,"refill_tokens":1}]`, `bandwidths[1].refill_period: missing`},
		{"null capacity", `[{"capacity":null}]`, `bandwidths[0].capacity: must be an integer, got null`},
		{"fraction", `[{"capacity":1.5}]`, `bandwidths[0].capacity: must be an integer, got 1.5`},
		{"exponent", `[{"refill_tokens":1e3}]`, `bandwidths[0].refill_tokens: must be an integer, got 1e3`},
		{"too big", `[{"initial_tokens":9223372036854775808}]`, `bandwidths[0].initial_tokens: must be in the int64 range, got 9223372036854775808`},
		{"string number", `[{"capacity":"1"}]`, `bandwidths[0].capacity: must be an integer, got string "1"`},
		{"bool", `[{"capacity":true}]`, `bandwidths[0].capacity: must be an integer, got true`},
		{"nested", `[{"capacity":{"n":1}}]`, `bandwidths[0].capacity: must be an integer, got an object`},
		{"period number", `[{"refill_period":60000000000}]`, `bandwidths[0].refill_period: must be a duration string such as "1m", got number 60000000000`},
		{"period bad", `[{"refill_period":"1 minute"}]`, `bandwidths[0].refill_period: time: unknown unit " minute" in duration "1 minute"`},
		{"id number", `[{"id":1}]`, `bandwidths[0].id: must be a string, got number 1`},
		{"refill unknown", `[{"refill":"greedy"}]`, `bandwidths[0].refill: RefillKind "greedy" is not a known RefillKind (Greedy, Interval, IntervalAligned)`},
		{"refill number", `[{"refill":0}]`, `bandwidths[0].refill: must be a string, got number 0`},
		{"aligned_start bad", `[{"aligned_start":"2026-01-01"}]`, `bandwidths[0].aligned_start: parsing time "2026-01-01" as "2006-01-02T15:04:05Z07:00": cannot parse "" as "T"`},
		{"too many", seventeen, `bandwidths: must have at most 16 entries`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBandwidths([]byte(tt.in))
			want := "plans: invalid plan: " + tt.want
			if err == nil || err.Error() != want {
				t.Fatalf("ParseBandwidths = %+v, %v\nwant error %s", got, err, want)
			}
			if !errors.Is(err, ErrInvalidPlan) {
				t.Errorf("error does not wrap ErrInvalidPlan")
			}
			if got != nil {
				t.Errorf("ParseBandwidths returned %+v with its error, want nil", got)
			}
		})
	}
}

func TestParseBandwidthsKeepsCauses(t *testing.T) {
	_, err := ParseBandwidths([]byte(`[{"refill":"x"}]`))
	if !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Errorf("unknown refill: %v does not wrap ratelimit.ErrInvalidConfig", err)
	}
	_, err = ParseBandwidths([]byte(`[{"aligned_start":"x"}]`))
	var perr *time.ParseError
	if !errors.As(err, &perr) {
		t.Errorf("bad aligned_start: %v does not wrap a *time.ParseError", err)
	}
}

func TestMarshalBandwidths(t *testing.T) {
	bws := []ratelimit.Bandwidth{
		ratelimit.PerMinute(100).WithID("burst").WithInitialTokens(50),
		ratelimit.Every(24*time.Hour, 1000).AlignedTo(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
	}
	got, err := MarshalBandwidths(bws)
	if err != nil {
		t.Fatal(err)
	}
	const want = `[{"id":"burst","capacity":100,"refill_tokens":100,"refill_period":"1m0s","refill":"Greedy","initial_tokens":50},` +
		`{"capacity":1000,"refill_tokens":1000,"refill_period":"24h0m0s","refill":"IntervalAligned","aligned_start":"2026-01-01T00:00:00Z"}]`
	if string(got) != want {
		t.Errorf("MarshalBandwidths =\n%s\nwant\n%s", got, want)
	}
	back, err := ParseBandwidths(got)
	if err != nil || !equalBandwidths(back, bws) {
		t.Errorf("ParseBandwidths(MarshalBandwidths(bws)) = %+v, %v; want %+v", back, err, bws)
	}
	if got, err := MarshalBandwidths(nil); err != nil || string(got) != "[]" {
		t.Errorf("MarshalBandwidths(nil) = %s, %v; want []", got, err)
	}
}

func TestMarshalBandwidthsErrors(t *testing.T) {
	tests := []struct {
		name string
		bws  []ratelimit.Bandwidth
		want string
	}{
		{"unknown refill", []ratelimit.Bandwidth{ratelimit.PerSecond(1), ratelimit.PerSecond(1).WithRefill(7)},
			`plans: invalid plan: bandwidths[1].refill: RefillKind 7 is not a known RefillKind`},
		{"year out of range", []ratelimit.Bandwidth{ratelimit.PerSecond(1).AlignedTo(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))},
			`plans: invalid plan: bandwidths[0].aligned_start: Time.MarshalText: year outside of range [0,9999]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MarshalBandwidths(tt.bws)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("MarshalBandwidths = %s, %v\nwant error %s", got, err, tt.want)
			}
			if !errors.Is(err, ErrInvalidPlan) {
				t.Errorf("error does not wrap ErrInvalidPlan")
			}
		})
	}
}

func FuzzParseBandwidths(f *testing.F) {
	for _, s := range []string{
		`[{"id":"burst","capacity":100,"refill_tokens":100,"refill_period":"1m","refill":"Greedy","initial_tokens":50,"aligned_start":"2026-01-01T00:00:00Z"}]`,
		`[{"capacity":1,"refill_tokens":1,"refill_period":"1s"},{"capacity":5,"refill_tokens":5,"refill_period":"24h","refill":"IntervalAligned","aligned_start":"2026-01-01T00:00:00.5+05:30"}]`,
		`[{"capacity":1,"refill_tokens":1,"refill_period":"-2562047h47m16.854775808s","id":"\u00ff\ud800"}]`,
		`[{"capacity":1,"capacity":1}]`,
		`[] []`,
		`{}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		bws, err := ParseBandwidths(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidPlan) {
				t.Fatalf("error %v does not wrap ErrInvalidPlan", err)
			}
			return
		}
		out, err := MarshalBandwidths(bws)
		if err != nil {
			t.Fatalf("MarshalBandwidths(%+v) of what parsed: %v", bws, err)
		}
		back, err := ParseBandwidths(out)
		if err != nil {
			t.Fatalf("ParseBandwidths(%s) of what MarshalBandwidths wrote: %v", out, err)
		}
		if !equalBandwidths(back, bws) {
			t.Fatalf("round trip changed\n%+v\nto\n%+v\nvia %s", bws, back, out)
		}
		if again, err := MarshalBandwidths(back); err != nil || string(again) != string(out) {
			t.Fatalf("MarshalBandwidths not stable: %s then %s, %v", out, again, err)
		}
		_ = (Plan{Name: "fuzz", Version: 1, Bandwidths: bws}).Validate() // must not panic
	})
}
