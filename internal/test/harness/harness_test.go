package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestConnectRejects: a spec Connect cannot build a client of says why,
// naming the field, before it sends anything.
func TestConnectRejects(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := []string{"127.0.0.1:1"}
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"NoAddrs", Spec{Backend: BackendGoRedis}, "no Addrs"},
		{"ClusterAndSentinel", Spec{Backend: BackendGoRedis, Server: Server{Addrs: addrs, Cluster: true, Sentinel: "m"}}, "Cluster and Sentinel both set"},
		{"Backend", Spec{Backend: "memcached", Server: Server{Addrs: addrs}}, `Backend "memcached"`},
		{"CAFileMissing", Spec{Backend: BackendRueidis, Server: Server{Addrs: addrs, TLS: &TLS{CAFile: filepath.Join(dir, "none.pem")}}}, "TLS CAFile"},
		{"CAFileNotPEM", Spec{Backend: BackendGoRedis, Server: Server{Addrs: addrs, TLS: &TLS{CAFile: notPEM}}}, "no PEM certificate"},
		{"CertWithoutKey", Spec{Backend: BackendGoRedis, Server: Server{Addrs: addrs, TLS: &TLS{CertFile: notPEM}}}, "give both or neither"},
		{"BadKeyPair", Spec{Backend: BackendGoRedis, Server: Server{Addrs: addrs, TLS: &TLS{CertFile: notPEM, KeyFile: notPEM}}}, "TLS CertFile and KeyFile"},
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

// TestClientSettings: the settings in words are the ones the client was
// built with, go-redis's defaults filled in.
func TestClientSettings(t *testing.T) {
	addrs := []string{"127.0.0.1:1"}
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"Advised", Spec{Backend: BackendGoRedis, Server: Server{Addrs: addrs}}, "go-redis client: MaxRetries 0, ContextTimeoutEnabled true"},
		{"Defaults", Spec{Backend: BackendGoRedis, Server: Server{Addrs: addrs, Retries: 3, NoContextTimeout: true}}, "go-redis client: MaxRetries 3, ContextTimeoutEnabled false"},
		{"LowLatencyCluster", Spec{Backend: BackendGoRedis, Server: Server{Addrs: addrs, Cluster: true, LowLatency: true}}, "MaxRedirects 0"},
		{"Sentinel", Spec{Backend: BackendRueidis, Server: Server{Addrs: addrs, Sentinel: "m"}}, "rueidis Sentinel client: DisableRetry true, ConnWriteTimeout 10s, Dialer.Timeout 5s"},
		{"RueidisRetries", Spec{Backend: BackendRueidis, Server: Server{Addrs: addrs, Retries: 1}}, "rueidis client: DisableRetry false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var settings []string
			if tt.spec.Backend == BackendRueidis {
				// rueidis dials in NewClient, and nothing listens on port 1.
				_, settings = rueidisOption(tt.spec.Server, nil)
			} else {
				c, err := Connect(tt.spec)
				if err != nil {
					t.Fatal(err)
				}
				settings = c.Settings
				c.Close()
			}
			if got := strings.Join(settings, "; "); !strings.Contains(got, tt.want) {
				t.Errorf("settings %q; want %q", got, tt.want)
			}
		})
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
