package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The tests' plans refill one token an hour, so that what a burst is
// allowed does not depend on how long the test takes: no token comes back
// while it runs.
const (
	slowFree      = `{"algorithm":"TokenBucket","capacity":5,"refill_tokens":1,"refill_period":"1h"}`
	slowAnonymous = `{"algorithm":"TokenBucket","capacity":2,"refill_tokens":1,"refill_period":"1h"}`
)

const keyFree = "X-API-Key: demo-free"

func TestBurstPastCapacityIsDenied(t *testing.T) {
	_, srv := newTestServer(t)
	mustPutPlan(t, srv, "free", slowFree)

	statuses, denied := burst(t, srv, 20, keyFree)
	if statuses[http.StatusOK] != 5 || statuses[http.StatusTooManyRequests] != 15 || len(statuses) != 2 {
		t.Fatalf("a burst of 20 on a bucket of 5: got statuses %v, want 5 × 200 and 15 × 429", statuses)
	}
	for name, want := range map[string]string{
		"RateLimit-Policy":      `"free";q=5;w=18000`,
		"X-RateLimit-Limit":     "5",
		"X-RateLimit-Remaining": "0",
		"Content-Type":          "application/json",
	} {
		if got := denied.header.Get(name); got != want {
			t.Errorf("429 %s: got %q, want %q", name, got, want)
		}
	}
	retry, err := strconv.Atoi(denied.header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 3600 {
		t.Errorf("429 Retry-After: got %q, want whole seconds from 1 to 3600", denied.header.Get("Retry-After"))
	}
	if got, want := denied.header.Get("RateLimit"), `"free";r=0;t=`+strconv.Itoa(retry); got != want {
		t.Errorf("429 RateLimit: got %q, want %q", got, want)
	}
	var body struct {
		Timestamp string `json:"timestamp"`
		Status    int    `json:"status"`
		Error     string `json:"error"`
		Message   string `json:"message"`
		Path      string `json:"path"`
	}
	if err := json.Unmarshal([]byte(denied.body), &body); err != nil {
		t.Fatalf("429 body: %v in %s", err, denied.body)
	}
	if _, err := time.Parse(time.RFC3339Nano, body.Timestamp); err != nil || body.Status != 429 ||
		body.Error != "Too Many Requests" || body.Message == "" || body.Path != "/api/hello" {
		t.Errorf("429 body: got %s", denied.body)
	}
}

func TestPlanChangeAppliesOnNextRequest(t *testing.T) {
	t.Run("new limits", func(t *testing.T) {
		_, srv := newTestServer(t)
		before := do(t, srv, http.MethodGet, "/api/hello", "", keyFree)
		if got, want := before.header.Get("RateLimit-Policy"), `"free";q=10;w=10`; got != want {
			t.Fatalf("before the change, RateLimit-Policy: got %q, want %q", got, want)
		}
		r := putPlan(t, srv, "free", `{"algorithm":"GCRA","capacity":20,"refill_tokens":5,"refill_period":"1s"}`)
		var plan planJSON
		if err := json.Unmarshal([]byte(r.body), &plan); r.status != http.StatusOK || err != nil {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
		after := do(t, srv, http.MethodGet, "/api/hello", "", keyFree)
		if got, want := after.header.Get("RateLimit-Policy"), `"free";q=20;w=4`; got != want {
			t.Errorf("after the change, RateLimit-Policy: got %q, want %q", got, want)
		}
		if got := after.header.Get("X-RateLimit-Limit"); got != "20" {
			t.Errorf("after the change, X-RateLimit-Limit: got %q, want 20", got)
		}
		var hello helloJSON
		if err := json.Unmarshal([]byte(after.body), &hello); err != nil || hello.Plan != "free" || hello.PlanVersion != plan.Version {
			t.Errorf("after the change, body %s: want plan free version %d", after.body, plan.Version)
		}
	})
	t.Run("tokens kept", func(t *testing.T) {
		// The bandwidth keeps its ID across a revision of the same
		// algorithm, so the bucket keeps its tokens (AsIs): a bigger
		// capacity does not hand out a fresh burst.
		_, srv := newTestServer(t)
		mustPutPlan(t, srv, "free", slowFree)
		for range 3 {
			do(t, srv, http.MethodGet, "/api/hello", "", keyFree)
		}
		mustPutPlan(t, srv, "free", `{"algorithm":"TokenBucket","capacity":8,"refill_tokens":1,"refill_period":"1h"}`)
		r := do(t, srv, http.MethodGet, "/api/hello", "", keyFree)
		if r.status != http.StatusOK || r.header.Get("X-RateLimit-Limit") != "8" || r.header.Get("X-RateLimit-Remaining") != "1" {
			t.Errorf("after 3 of 5 tokens and a capacity of 8: got %d, limit %q, remaining %q; want 200, 8, 1",
				r.status, r.header.Get("X-RateLimit-Limit"), r.header.Get("X-RateLimit-Remaining"))
		}
	})
}

func TestTenantsAreLimitedApart(t *testing.T) {
	_, srv := newTestServer(t)
	mustPutPlan(t, srv, "free", slowFree)
	burst(t, srv, 10, keyFree)
	r := do(t, srv, http.MethodGet, "/api/hello", "", "X-API-Key: demo-pro")
	if r.status != http.StatusOK || r.header.Get("RateLimit-Policy") != `"pro";q=50;w=5` {
		t.Errorf("pro after free's burst: got %d, RateLimit-Policy %q; want 200 on the pro plan", r.status, r.header.Get("RateLimit-Policy"))
	}
}

func TestAnonymousCallersAreLimitedByAddress(t *testing.T) {
	d, srv := newTestServer(t)
	mustPutPlan(t, srv, "anonymous", slowAnonymous)

	// From loopback, the demo trusts X-Forwarded-For: each address has a
	// bucket of its own.
	statuses, denied := burst(t, srv, 5, "X-Forwarded-For: 203.0.113.7")
	if statuses[http.StatusOK] != 2 || statuses[http.StatusTooManyRequests] != 3 {
		t.Errorf("203.0.113.7, a burst of 5 on a bucket of 2: got %v", statuses)
	}
	if got := denied.header.Get("RateLimit-Policy"); got != `"anonymous";q=2;w=7200` {
		t.Errorf("anonymous RateLimit-Policy: got %q", got)
	}
	for _, headers := range [][]string{{"X-Forwarded-For: 198.51.100.23"}, nil} {
		r := do(t, srv, http.MethodGet, "/api/hello", "", headers...)
		if r.status != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != "1" {
			t.Errorf("anonymous %v after another address's burst: got %d, remaining %q; want 200, 1",
				headers, r.status, r.header.Get("X-RateLimit-Remaining"))
		}
	}

	// From anywhere else it does not: the peer's address is the key.
	for i, xff := range []string{"192.0.2.10", "192.0.2.11", "192.0.2.12"} {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/api/hello", nil)
		req.RemoteAddr = "198.18.0.1:40000"
		req.Header.Set("X-Forwarded-For", xff)
		rec := httptest.NewRecorder()
		d.handler.ServeHTTP(rec, req)
		want := http.StatusOK
		if i >= 2 {
			want = http.StatusTooManyRequests
		}
		if rec.Code != want {
			t.Errorf("request %d from 198.18.0.1 claiming %s: got %d, want %d", i+1, xff, rec.Code, want)
		}
	}
}

func TestUnknownAPIKeyIsRefused(t *testing.T) {
	_, srv := newTestServer(t)
	r := do(t, srv, http.MethodGet, "/api/hello", "", "X-API-Key: guess")
	var e errorJSON
	if err := json.Unmarshal([]byte(r.body), &e); r.status != http.StatusUnauthorized || err != nil || e.Field != "X-API-Key" {
		t.Errorf("unknown key: got %d %s, want 401 naming X-API-Key", r.status, r.body)
	}
}

func TestControlEndpointIsNotLimited(t *testing.T) {
	_, srv := newTestServer(t)
	for i := range 30 {
		r := putPlan(t, srv, "anonymous", slowAnonymous)
		if r.status != http.StatusOK || r.header.Get("RateLimit-Policy") != "" {
			t.Fatalf("PUT %d: got %d with RateLimit-Policy %q, want 200 with none", i+1, r.status, r.header.Get("RateLimit-Policy"))
		}
	}
}

func TestMetrics(t *testing.T) {
	_, srv := newTestServer(t)
	mustPutPlan(t, srv, "free", slowFree)
	burst(t, srv, 8, keyFree)

	r := do(t, srv, http.MethodGet, "/metrics", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d", r.status)
	}
	decisions := `sluice_rate_limit_decisions_total{`
	labels := []string{`sluice_rate_limit_key_class="free"`, `sluice_rate_limit_route="GET /api/hello"`, `sluice_rate_limit_algorithm="TokenBucket"`}
	for result, want := range map[string]string{"allowed": "5", "rejected": "3"} {
		l := append([]string{decisions, `sluice_rate_limit_result="` + result + `"`}, labels...)
		if got := metricValue(t, r.body, l...); got != want {
			t.Errorf("%s with %v: got %q, want %s", decisions, l[1:], got, want)
		}
	}
	for _, series := range [][]string{
		{"sluice_rate_limit_decision_duration_seconds_count{", `sluice_rate_limit_result="allowed"`},
		{"sluice_plan_cache_lookups_total{", `sluice_plan_cache_result="hit"`},
	} {
		if metricValue(t, r.body, series...) == "" {
			t.Errorf("no %v series in /metrics", series)
		}
	}
}

// metricValue returns the value of the one series in the exposition text
// whose line holds every part, "" if none does.
func metricValue(t *testing.T, text string, parts ...string) string {
	t.Helper()
	value := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !containsAll(line, parts) {
			continue
		}
		if value != "" {
			t.Fatalf("more than one series with %v", parts)
		}
		value = line[strings.LastIndexByte(line, ' ')+1:]
	}
	return value
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func TestPageIsSelfContained(t *testing.T) {
	_, srv := newTestServer(t)
	for path, want := range map[string]string{
		"/":            "text/html",
		"/app.js":      "text/javascript",
		"/style.css":   "text/css",
		"/favicon.svg": "image/svg+xml",
	} {
		r := do(t, srv, http.MethodGet, path, "")
		if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), want) {
			t.Errorf("GET %s: got %d %q, want 200 %s", path, r.status, r.header.Get("Content-Type"), want)
		}
		if r.header.Get("Content-Security-Policy") != contentSecurityPolicy {
			t.Errorf("GET %s: no Content-Security-Policy", path)
		}
	}
	if r := do(t, srv, http.MethodGet, "/nothing-here", ""); r.status != http.StatusNotFound {
		t.Errorf("GET /nothing-here: got %d, want 404", r.status)
	}
	// Nothing is loaded from elsewhere: no CDN, no web fonts.
	err := fs.WalkDir(webFiles, "web", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := fs.ReadFile(webFiles, path)
		if strings.Contains(string(b), "://") && !strings.HasSuffix(path, ".svg") {
			t.Errorf("%s refers to another origin", path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestServeShutsDownOnCancel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln, options{}, testLogger(t)) }()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + ln.Addr().String() + "/api/plans")
	if err != nil {
		cancel()
		<-served
		t.Fatal(err)
	}
	resp.Body.Close()
	cancel()
	if err := <-served; err != nil {
		t.Errorf("serve after cancel: %v", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Error("the listener is still open after shutdown")
	}
}

func TestRedisUnreachable(t *testing.T) {
	// Nothing listens on port 1 of loopback: the check at start-up fails at
	// once, naming the flag, rather than every request failing later.
	_, err := newDemo(t.Context(), options{redisAddrs: []string{"127.0.0.1:1"}}, testLogger(t))
	if err == nil || !strings.Contains(err.Error(), "--redis 127.0.0.1:1") {
		t.Errorf("newDemo with an unreachable Redis: got %v, want an error naming --redis", err)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Errorf("the error %v does not hold the dial's", err)
	}
}
