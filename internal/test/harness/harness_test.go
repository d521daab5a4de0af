package harness

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redisconn"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestBoundsCheck: admitted + remaining within the bound passes, and
// without refill must be exactly the capacity; over or under it fails,
// saying by how much. The tokens of calls whose outcome is unknown lower
// the low bound only; failed calls whose error says the bucket was left
// alone lower nothing.
func TestBoundsCheck(t *testing.T) {
	exact := Bounds{Low: 1000, High: 1000, Span: time.Second}
	refill := Bounds{Low: 1000, High: 1100, Span: time.Second}
	tests := []struct {
		name      string
		b         Bounds
		n         Tally
		remaining int64
		want      string // in the error; "" for none
	}{
		{"Exact", exact, Tally{Calls: 5000, Admitted: 1000, Denied: 4000}, 0, ""},
		{"FewerCallsThanTokens", exact, Tally{Calls: 990, Admitted: 990}, 10, ""},
		{"DeniedWithTokensLeft", exact, Tally{Calls: 5000, Admitted: 990, Denied: 4010}, 10, "admitted 990 of 5000 calls without refill; want exactly 1000"},
		{"Over", exact, Tally{Calls: 5000, Admitted: 1400, Denied: 3600}, 3, "admitted 1400, 400 over the bound"},
		{"OverWithRemaining", exact, Tally{Calls: 5000, Admitted: 999, Denied: 4001}, 3, "admitted 999 + remaining 3 = 1002, 2 over the bound"},
		{"Under", exact, Tally{Calls: 5000, Admitted: 900, Denied: 4100}, 0, "admitted 900 + 0 unknown + remaining 0 = 900, 100 under the bound"},
		// The flake of issue 28: 59 calls past their deadline.
		{"UnknownMayHaveTaken", exact, Tally{Calls: 5000, Admitted: 990, Denied: 3951, Failed: 59, Unknown: 59}, 0, ""},
		{"UnknownMayNotHave", exact, Tally{Calls: 5000, Admitted: 995, Denied: 3995, Failed: 10, Unknown: 10}, 5, ""},
		{"UnknownTokens", exact, Tally{Calls: 5000, Admitted: 970, Denied: 4020, Failed: 10, Unknown: 30}, 0, ""},
		{"UnderUnknown", exact, Tally{Calls: 5000, Admitted: 980, Denied: 4010, Failed: 10, Unknown: 10}, 0, "admitted 980 + 10 unknown + remaining 0 = 990, 10 under the bound"},
		{"UnknownDoNotRaiseTheHigh", exact, Tally{Calls: 5000, Admitted: 1001, Denied: 3989, Failed: 10, Unknown: 10}, 0, "1 over the bound"},
		{"RefusedDoNotLowerTheLow", exact, Tally{Calls: 5000, Admitted: 990, Denied: 4000, Failed: 10}, 0, "10 under the bound"},
		{"RefusedNotCalls", exact, Tally{Calls: 1005, Admitted: 995, Failed: 10}, 5, ""},
		{"Refill", refill, Tally{Calls: 5000, Admitted: 1080, Denied: 3920}, 5, ""},
		{"RefillOver", refill, Tally{Calls: 5000, Admitted: 1100, Denied: 3900}, 1, "1 over the bound"},
		{"RefillUnknown", refill, Tally{Calls: 5000, Admitted: 990, Denied: 4000, Failed: 10, Unknown: 10}, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.b.Check(tt.n, tt.remaining)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Check = %v; want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Check = %v; want an error with %q", err, tt.want)
			}
		})
	}
}

// TestTokenBucketBounds: the high bound gains the whole tokens refilled
// over the span, rounded down.
func TestTokenBucketBounds(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	bw := ratelimit.Every(10*time.Millisecond, 1).WithBurst(1000)
	b := TokenBucketBounds(bw, t0, t0.Add(1234*time.Millisecond+500*time.Microsecond))
	if b.Low != 1000 || b.High != 1123 || b.Span != 1234500*time.Microsecond {
		t.Errorf("bounds %+v; want [1000, 1123] over 1.2345s", b)
	}
	for _, bucket := range Buckets(1000) {
		b := TokenBucketBounds(bucket.Bandwidth, t0, t0.Add(2*time.Second))
		if want := bucket.Name != "TokenBucketRefill"; (b.High == b.Low) != want {
			t.Errorf("%s: bounds %+v over 2s; want exact: %t", bucket.Name, b, want)
		}
		if err := bucket.Config().Validate(); err != nil {
			t.Errorf("%s: %v", bucket.Name, err)
		}
	}
}

// TestTally: each call counts once, as the store decided it, a fail
// policy did, or an error; the tokens of the failed calls that were not
// refused are unknown; the span runs from the first start to the last
// end.
func TestTally(t *testing.T) {
	calls := []Call{
		{Start: 20, End: 50, Decision: ratelimit.Decision{Allowed: true}},
		{Start: 10, End: 30},
		{Start: 30, End: 90, Decision: ratelimit.Decision{Allowed: true, Degraded: true}},
		{Start: 40, End: 45, Err: "boom", Tokens: 2},
		{Start: 60, Err: ErrUnreported, Tokens: 3},
		{Start: 70, End: 80, Err: "invalid", Refused: true, Tokens: 5},
	}
	got := Count(calls)
	want := Tally{Calls: 6, Admitted: 1, Denied: 1, Degraded: 1, Failed: 3, Unknown: 5, First: 10, Last: 90, Longest: 60}
	if got != want {
		t.Errorf("Count = %+v; want %+v", got, want)
	}
	if got.Span() != 80 {
		t.Errorf("Span = %v; want 80ns", got.Span())
	}
}

// TestGlobEscaper: a prefix with SCAN's pattern characters is matched
// literally.
func TestGlobEscaper(t *testing.T) {
	if got, want := globEscaper.Replace(`a*b?c[d]e\f`), `a\*b\?c\[d\]e\\f`; got != want {
		t.Errorf("escaped %q; want %q", got, want)
	}
}

// TestConnectRejects: a spec Connect cannot build a backend of says why,
// naming the field, before it sends anything: redisconn's reasons for the
// Server, on either client, and its own for the Backend.
func TestConnectRejects(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"NoAddrsGoRedis", Spec{Backend: BackendGoRedis}, "no Addrs"},
		{"NoAddrsRueidis", Spec{Backend: BackendRueidis}, "no Addrs"},
		{"Backend", Spec{Backend: "memcached", Server: Server{Server: redisconn.Server{Addrs: []string{"127.0.0.1:1"}}}}, `Backend "memcached"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Connect(tt.spec)
			if err == nil {
				c.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Connect = %v; want an error with %q", err, tt.want)
			}
		})
	}
}

// TestConnectSettings: a Conn's settings are its client's, as redisconn
// words them, and the racy backend says what it is.
func TestConnectSettings(t *testing.T) {
	s := Server{Server: redisconn.Server{Addrs: []string{"127.0.0.1:1"}}}
	for _, tt := range []struct {
		backend string
		want    string
	}{
		{BackendGoRedis, "go-redis client: MaxRetries 0, ContextTimeoutEnabled true"},
		{BackendRacy, "go-redis client: MaxRetries 0, ContextTimeoutEnabled true"},
		{BackendRacy, "racy: GET, decide in Go, SET (not atomic: tests only)"},
	} {
		c, err := Connect(Spec{Backend: tt.backend, Server: s})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(c.Settings, "; "); !strings.Contains(got, tt.want) {
			t.Errorf("%s: settings %q; want %q", tt.backend, got, tt.want)
		}
		c.Close()
	}
}

// TestCutLine: a Line is found after its prefix, even behind output that
// did not end its line; any other output is not a Line.
func TestCutLine(t *testing.T) {
	for _, tt := range []struct {
		text, other, line string
		isLine            bool
	}{
		{LinePrefix + `{"Ready":true}`, "", `{"Ready":true}`, true},
		{"PASS", "PASS", "", false},
		{"no newline: " + LinePrefix + `{"Done":true}`, "no newline: ", `{"Done":true}`, true},
		{`{"Done":true}`, `{"Done":true}`, "", false},
	} {
		other, line, isLine := cutLine([]byte(tt.text))
		if string(other) != tt.other || string(line) != tt.line || isLine != tt.isLine {
			t.Errorf("cutLine(%q) = %q, %q, %t; want %q, %q, %t", tt.text, other, line, isLine, tt.other, tt.line, tt.isLine)
		}
	}
}
