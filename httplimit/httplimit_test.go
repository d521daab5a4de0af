package httplimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

// fixedClock is a memory backend's clock that moves only when told.
type fixedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fixedClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func newClock() *fixedClock { return &fixedClock{t: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)} }

// stub is a Backend that answers what it is told and records the keys.
type stub struct {
	mu   sync.Mutex
	keys []string
	d    ratelimit.Decision
	err  error
}

func (s *stub) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, key)
	return s.d, s.err
}

func (s *stub) lastKey() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.keys) == 0 {
		return ""
	}
	return s.keys[len(s.keys)-1]
}

var (
	burst  = ratelimit.PerSecond(10).WithBurst(20).WithID("burst")
	hourly = ratelimit.PerHour(1000).WithID("hourly")
	twoBW  = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{burst, hourly}}
)

// handlerSpy is the protected handler: it counts its calls.
type handlerSpy struct{ calls atomic.Int64 }

func (h *handlerSpy) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.calls.Add(1)
	_, _ = io.WriteString(w, "ok")
}

func mustNew(t testing.TB, l *ratelimit.Limiter, opts ...httplimit.Option) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := httplimit.New(l, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return mw
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func TestHeadersExact(t *testing.T) {
	clock := newClock()
	l := ratelimit.New(memory.New(memory.WithClock(clock)))
	spy := &handlerSpy{}
	h := mustNew(t, l, httplimit.WithConfig(twoBW))(spy)

	for i := 1; i <= 20; i++ {
		rec := serve(h, httptest.NewRequest("GET", "/x", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200", i, rec.Code)
		}
		if i == 1 {
			want := map[string]string{
				"RateLimit-Policy":      `"burst";q=20;w=2, "hourly";q=1000;w=3600`,
				"RateLimit":             `"burst";r=19;t=1`, // the burst's next token is 100 ms away
				"X-RateLimit-Limit":     "20",
				"X-RateLimit-Remaining": "19",
				"X-RateLimit-Reset":     "1",
			}
			for name, v := range want {
				if got := rec.Header().Get(name); got != v {
					t.Errorf("%s = %q, want %q", name, got, v)
				}
			}
			if got := rec.Header().Get("Retry-After"); got != "" {
				t.Errorf("allowed request has Retry-After %q", got)
			}
		}
	}
	rec := serve(h, httptest.NewRequest("GET", "/x", nil))
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("21st request: status %d, want 429", rec.Code)
	}
	// The burst is empty: one token returns in 100 ms, so t and
	// Retry-After round up to 1 s.
	for name, v := range map[string]string{
		"RateLimit":             `"burst";r=0;t=1`,
		"Retry-After":           "1",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "1",
	} {
		if got := rec.Header().Get(name); got != v {
			t.Errorf("denied: %s = %q, want %q", name, got, v)
		}
	}
	if spy.calls.Load() != 20 {
		t.Errorf("handler called %d times, want 20", spy.calls.Load())
	}
}

// TestHeadersParse reads the fields back with an RFC 9651 parser of its
// own (see readFields): each is a List of String items whose parameters
// are Integers, as the draft's syntax says.
func TestHeadersParse(t *testing.T) {
	l := ratelimit.New(memory.New(memory.WithClock(newClock())))
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerMinute(50), // no ID: named by its index
		ratelimit.Every(24*time.Hour, 10000).WithID("daily"),
	}}
	rec := serve(mustNew(t, l, httplimit.WithConfig(cfg))(&handlerSpy{}), httptest.NewRequest("GET", "/", nil))
	f, err := readFields(rec.Header())
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]quota{"0": {50, 60}, "daily": {10000, 86400}}; fmt.Sprint(f.policies) != fmt.Sprint(want) {
		t.Errorf("RateLimit-Policy %q, want the policies %v", rec.Header().Get("RateLimit-Policy"), want)
	}
	// The per-minute bandwidth binds (49 left of 50), and its next token
	// is 1.2 s away; the daily one's, 8.64 s, is not its.
	if f.name != "0" || f.r != 49 || f.t != 2 {
		t.Errorf("RateLimit = %q, want \"0\";r=49;t=2", rec.Header().Get("RateLimit"))
	}
}

// TestRetryAfterRounding: Retry-After and t round up to whole seconds,
// and Retry-After is never 0. A denial of one token has RefillAfter equal
// to RetryAfter, so the two are the same moment.
func TestRetryAfterRounding(t *testing.T) {
	for _, tc := range []struct {
		wait        time.Duration
		retry, next string
	}{
		{0, "1", "0"}, // Retry-After never 0
		{time.Microsecond, "1", "1"},
		{time.Millisecond, "1", "1"},
		{time.Second, "1", "1"},
		{time.Second + time.Millisecond, "2", "2"},
		{2 * time.Second, "2", "2"},
		{59*time.Second + 1, "60", "60"},
	} {
		t.Run(tc.wait.String(), func(t *testing.T) {
			s := &stub{d: ratelimit.Decision{Limit: 20, RetryAfter: tc.wait, RefillAfter: tc.wait, ResetAfter: time.Hour, Bandwidth: "burst"}}
			rec := serve(mustNew(t, ratelimit.New(s), httplimit.WithConfig(twoBW))(&handlerSpy{}), httptest.NewRequest("GET", "/", nil))
			if rec.Code != http.StatusTooManyRequests {
				t.Fatalf("status %d, want 429", rec.Code)
			}
			if got := rec.Header().Get("Retry-After"); got != tc.retry {
				t.Errorf("Retry-After = %q, want %q", got, tc.retry)
			}
			if got, want := rec.Header().Get("RateLimit"), `"burst";r=0;t=`+tc.next; got != want {
				t.Errorf("RateLimit = %q, want %q", got, want)
			}
		})
	}
}

func TestJSONBody(t *testing.T) {
	s := &stub{d: ratelimit.Decision{Limit: 20, RetryAfter: 1500 * time.Millisecond, Bandwidth: "burst"}}
	rec := serve(mustNew(t, ratelimit.New(s), httplimit.WithConfig(twoBW))(&handlerSpy{}), httptest.NewRequest("POST", "/v1/items?x=1", nil))
	if got := rec.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q", got)
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	ts, _ := body["timestamp"].(string)
	if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		t.Errorf("timestamp %q: %v", ts, err)
	}
	delete(body, "timestamp")
	want := map[string]any{"status": 429.0, "error": "Too Many Requests",
		"message": "rate limit exceeded: retry in 2 s", "path": "/v1/items"}
	if fmt.Sprint(body) != fmt.Sprint(want) {
		t.Errorf("body = %v, want %v", body, want)
	}
}

func TestProblemDetails(t *testing.T) {
	s := &stub{d: ratelimit.Decision{Limit: 1000, RetryAfter: 3 * time.Second, Bandwidth: "hourly"}}
	mw := mustNew(t, ratelimit.New(s), httplimit.WithConfig(twoBW), httplimit.WithProblemDetails())
	rec := serve(mw(&handlerSpy{}), httptest.NewRequest("GET", "/", nil))
	if got := rec.Header().Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type = %q", got)
	}
	want := `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",` +
		`"title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,` +
		`"detail":"rate limit exceeded: retry in 3 s","violated-policies":["hourly"]}` + "\n"
	if rec.Body.String() != want {
		t.Errorf("body\n%s\nwant\n%s", rec.Body, want)
	}

	s.d, s.err = ratelimit.Decision{}, fmt.Errorf("%w: redis down", ratelimit.ErrBackendUnavailable)
	rec = serve(mw(&handlerSpy{}), httptest.NewRequest("GET", "/", nil))
	want = `{"type":"about:blank","title":"Service Unavailable","status":503,` +
		`"detail":"the rate limiter cannot decide right now: retry in 1 s"}` + "\n"
	if rec.Code != http.StatusServiceUnavailable || rec.Body.String() != want {
		t.Errorf("store down: %d %s, want 503 %s", rec.Code, rec.Body, want)
	}
}

func TestBodyHook(t *testing.T) {
	s := &stub{d: ratelimit.Decision{Limit: 20, RetryAfter: time.Second, Bandwidth: "burst"}}
	var got httplimit.Rejection
	mw := mustNew(t, ratelimit.New(s), httplimit.WithConfig(twoBW), httplimit.WithBody(
		func(w http.ResponseWriter, _ *http.Request, rej httplimit.Rejection) {
			got = rej
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(rej.Status)
			_, _ = io.WriteString(w, "slow down")
		}))
	rec := serve(mw(&handlerSpy{}), httptest.NewRequest("GET", "/", nil))
	if rec.Code != 429 || rec.Body.String() != "slow down" || rec.Header().Get("Retry-After") != "1" {
		t.Errorf("got %d %q Retry-After %q", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
	}
	if got.Status != 429 || got.RetryAfter != 1 || fmt.Sprint(got.Policies) != "[burst]" || got.Err != nil {
		t.Errorf("rejection = %+v", got)
	}
}

// failing is a store that is down.
type failing struct{}

func (failing) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	return ratelimit.Decision{}, fmt.Errorf("%w: connection refused", ratelimit.ErrBackendUnavailable)
}

func TestFailPolicies(t *testing.T) {
	policy, err := failpolicy.Wrap(failing{}, failpolicy.Closed, failpolicy.WithRetryAfter(2500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	spy := &handlerSpy{}
	rec := serve(mustNew(t, ratelimit.New(policy), httplimit.WithConfig(twoBW))(spy), httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", rec.Code)
	}
	if got := rec.Header().Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After = %q, want 3", got)
	}
	if got := rec.Header().Get("RateLimit"); got != "" {
		t.Errorf("RateLimit = %q on a decision the store did not make", got)
	}
	if spy.calls.Load() != 0 {
		t.Error("handler called")
	}

	// The Local mode's own share running out is the caller's quota: 429.
	// (Three an hour: no token comes back during the test.)
	local, err := failpolicy.Wrap(failing{}, failpolicy.Local)
	if err != nil {
		t.Fatal(err)
	}
	slow := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3).WithID("hourly")}}
	h := mustNew(t, ratelimit.New(local), httplimit.WithConfig(slow))(spy)
	for i, want := range []int{200, 200, 200, 429} {
		if rec := serve(h, httptest.NewRequest("GET", "/", nil)); rec.Code != want {
			t.Errorf("local share, request %d: status %d, want %d", i+1, rec.Code, want)
		}
	}
	spy.calls.Store(0)

	open, err := failpolicy.Wrap(failing{}, failpolicy.Open)
	if err != nil {
		t.Fatal(err)
	}
	rec = serve(mustNew(t, ratelimit.New(open), httplimit.WithConfig(twoBW))(spy), httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusOK || spy.calls.Load() != 1 {
		t.Errorf("fail open: status %d, handler calls %d; want 200 and 1", rec.Code, spy.calls.Load())
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		retryAfter string
	}{
		{"store down", fmt.Errorf("%w: refused", ratelimit.ErrBackendUnavailable), 503, "1"},
		{"store timeout", fmt.Errorf("%w: i/o timeout", ratelimit.ErrTimeout), 503, "1"},
		{"key rejected", fmt.Errorf("%w: at cap", ratelimit.ErrKeyRejected), 503, "1"},
		{"invalid key", fmt.Errorf("%w: too long", ratelimit.ErrInvalidKey), 500, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spy := &handlerSpy{}
			s := &stub{err: tc.err}
			var rej httplimit.Rejection
			mw := mustNew(t, ratelimit.New(s), httplimit.WithConfig(twoBW), httplimit.WithBody(
				func(w http.ResponseWriter, _ *http.Request, r httplimit.Rejection) { rej = r; w.WriteHeader(r.Status) }))
			rec := serve(mw(spy), httptest.NewRequest("GET", "/", nil))
			if rec.Code != tc.status || rec.Header().Get("Retry-After") != tc.retryAfter {
				t.Errorf("status %d Retry-After %q, want %d %q", rec.Code, rec.Header().Get("Retry-After"), tc.status, tc.retryAfter)
			}
			if !errors.Is(rej.Err, tc.err) {
				t.Errorf("Rejection.Err = %v, want %v", rej.Err, tc.err)
			}
			if spy.calls.Load() != 0 {
				t.Error("handler called")
			}
		})
	}
}

func TestClientGone(t *testing.T) {
	spy := &handlerSpy{}
	s := &stub{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := serve(mustNew(t, ratelimit.New(s), httplimit.WithConfig(twoBW))(spy), httptest.NewRequestWithContext(ctx, "GET", "/", nil))
	if rec.Body.Len() != 0 || len(rec.Header()) != 0 || spy.calls.Load() != 0 {
		t.Errorf("canceled request answered: %d %q %v, handler calls %d", rec.Code, rec.Body, rec.Header(), spy.calls.Load())
	}
}

// body counts reads of a request body.
type body struct{ reads atomic.Int64 }

func (b *body) Read(p []byte) (int, error) { b.reads.Add(1); return 0, io.EOF }

func TestRejectedNeverReachesHandler(t *testing.T) {
	for _, tc := range []struct {
		name string
		be   ratelimit.Backend
	}{
		{"429", &stub{d: ratelimit.Decision{Limit: 20, RetryAfter: time.Second, Bandwidth: "burst"}}},
		{"503", failing{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spy := &handlerSpy{}
			b := &body{}
			r := httptest.NewRequest("POST", "/upload", b)
			rec := serve(mustNew(t, ratelimit.New(tc.be), httplimit.WithConfig(twoBW))(spy), r)
			if rec.Code == http.StatusOK || spy.calls.Load() != 0 || b.reads.Load() != 0 {
				t.Errorf("status %d, handler calls %d, body reads %d; want a rejection, 0, 0", rec.Code, spy.calls.Load(), b.reads.Load())
			}
		})
	}
}

func TestKeys(t *testing.T) {
	for _, tc := range []struct {
		name   string
		caller *httplimit.Caller
		remote string
		opts   []httplimit.Option
		want   string
	}{
		{"anonymous IPv4", nil, "203.0.113.7:4711", nil, "rl:-:default:-:ip:203.0.113.7"},
		{"anonymous IPv6 by its /64", nil, "[2001:db8:1:2:aaaa::5]:4711", nil, "rl:-:default:-:ip:2001:db8:1:2::/64"},
		{"IPv6 /48", nil, "[2001:db8:1:2::5]:4711", []httplimit.Option{httplimit.WithIPv6Prefix(48)}, "rl:-:default:-:ip:2001:db8:1::/48"},
		{"api key first", &httplimit.Caller{Tenant: "acme", APIKey: "k_1", Principal: "ann"}, "203.0.113.7:1", nil, "rl:acme:default:-:key:k_1"},
		{"principal", &httplimit.Caller{Tenant: "acme", Principal: "ann@acme.test"}, "203.0.113.7:1", nil, "rl:acme:default:-:user:ann@acme.test"},
		{"escaped", &httplimit.Caller{Tenant: "a:b{c}", Principal: "x:{y} z%"}, "203.0.113.7:1", nil, "rl:a%3Ab%7Bc%7D:default:-:user:x:%7By%7D%20z%25"},
		{"literal dash", &httplimit.Caller{Tenant: "-", APIKey: "-"}, "", nil, "rl:%2D:default:-:key:%2D"},
		{"long principal digested", &httplimit.Caller{Principal: strings.Repeat("p", 200)}, "", nil,
			"rl:-:default:-:user:~" + digest(strings.Repeat("p", 200))},
		{"prefix", nil, "203.0.113.7:1", []httplimit.Option{httplimit.WithKeyPrefix("svc-a")}, "svc-a:-:default:-:ip:203.0.113.7"},
		{"no remote address", nil, "", nil, "rl:-:default:-:ip:unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &stub{d: ratelimit.Decision{Allowed: true}}
			mw := mustNew(t, ratelimit.New(s), append([]httplimit.Option{httplimit.WithConfig(twoBW)}, tc.opts...)...)
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.remote
			if tc.caller != nil {
				r = r.WithContext(httplimit.ContextWithCaller(r.Context(), *tc.caller))
			}
			serve(mw(&handlerSpy{}), r)
			if got := s.lastKey(); got != tc.want {
				t.Errorf("key %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRoutes(t *testing.T) {
	s := &stub{d: ratelimit.Decision{Allowed: true}}
	l := ratelimit.New(s)

	// Each handler wrapped: ServeMux has set the request's Pattern.
	mux := http.NewServeMux()
	mux.Handle("GET /v1/items/{id}", mustNew(t, l, httplimit.WithConfig(twoBW))(&handlerSpy{}))
	serve(mux, httptest.NewRequest("GET", "/v1/items/42", nil))
	if got, want := s.lastKey(), "rl:-:default:GET%20/v1/items/%7Bid%7D:ip:192.0.2.1"; got != want {
		t.Errorf("wrapped handler: key %q, want %q", got, want)
	}

	// The whole mux wrapped: WithServeMux asks it for the pattern.
	outer := http.NewServeMux()
	outer.Handle("GET /v1/users/{id}/posts", &handlerSpy{})
	h := mustNew(t, l, httplimit.WithConfig(twoBW), httplimit.WithServeMux(outer))(outer)
	serve(h, httptest.NewRequest("GET", "/v1/users/7/posts", nil))
	if got, want := s.lastKey(), "rl:-:default:GET%20/v1/users/%7Bid%7D/posts:ip:192.0.2.1"; got != want {
		t.Errorf("WithServeMux: key %q, want %q", got, want)
	}
	serve(h, httptest.NewRequest("GET", "/nowhere/1", nil))
	if got, want := s.lastKey(), "rl:-:default:-:ip:192.0.2.1"; got != want {
		t.Errorf("unmatched: key %q, want %q (never the raw path)", got, want)
	}

	h = mustNew(t, l, httplimit.WithConfig(twoBW), httplimit.WithRoute(func(*http.Request) string { return "/things/:id" }))(&handlerSpy{})
	serve(h, httptest.NewRequest("GET", "/things/9", nil))
	if got, want := s.lastKey(), "rl:-:default:/things/%3Aid:ip:192.0.2.1"; got != want {
		t.Errorf("WithRoute: key %q, want %q", got, want)
	}
}

func TestPlans(t *testing.T) {
	store := &plans.MemoryStore{}
	free := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(2).WithID("free")}}
	pro := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(100).WithID("pro")}}
	for name, cfg := range map[string]ratelimit.Config{"free": free, "pro": pro} {
		if _, err := store.PutPlan(name, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Assign("acme", "free"); err != nil {
		t.Fatal(err)
	}
	cache, err := plans.NewCache(store, plans.WithReadWait(time.Minute)) // every lookup that waits gets its read, however busy the machine
	if err != nil {
		t.Fatal(err)
	}
	store.Notify(cache)
	s := &countingStore{Backend: memory.New(memory.WithClock(newClock()))}
	h := mustNew(t, ratelimit.New(s), httplimit.WithPlans(cache))(&handlerSpy{})
	get := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		return serve(h, r.WithContext(httplimit.ContextWithCaller(r.Context(), httplimit.Caller{Tenant: "acme", APIKey: "k1"})))
	}
	get()
	get()
	if rec := get(); rec.Code != 429 || rec.Header().Get("RateLimit-Policy") != `"free";q=2;w=60` {
		t.Fatalf("free plan, 3rd request: %d %q", rec.Code, rec.Header().Get("RateLimit-Policy"))
	}
	if _, err := store.Assign("acme", "pro"); err != nil {
		t.Fatal(err)
	}
	rec := get() // the upgrade applies on the next request
	if rec.Code != 200 || rec.Header().Get("RateLimit-Policy") != `"pro";q=100;w=60` {
		t.Errorf("after the upgrade: %d %q", rec.Code, rec.Header().Get("RateLimit-Policy"))
	}
	if got, want := s.lastKey(), "rl:acme:pro:-:key:k1"; got != want {
		t.Errorf("key %q, want %q", got, want)
	}

	// An anonymous client is on AnonymousSubject's plan, or the default.
	r := httptest.NewRequest("GET", "/", nil)
	serve(h, r)
	if got, want := s.lastKey(), "rl:-:"+plans.DefaultPlan().Name+":-:ip:192.0.2.1"; got != want {
		t.Errorf("anonymous key %q, want %q", got, want)
	}
	if _, err := store.Assign(httplimit.AnonymousSubject, "free"); err != nil {
		t.Fatal(err)
	}
	serve(h, r)
	if got, want := s.lastKey(), "rl:-:free:-:ip:192.0.2.1"; got != want {
		t.Errorf("anonymous key %q, want %q", got, want)
	}
}

// countingStore records the keys a real Backend is asked for.
type countingStore struct {
	ratelimit.Backend
	mu  sync.Mutex
	key string
}

func (c *countingStore) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	c.mu.Lock()
	c.key = key
	c.mu.Unlock()
	return c.Backend.Do(ctx, key, cfg, req)
}

func (c *countingStore) lastKey() string { c.mu.Lock(); defer c.mu.Unlock(); return c.key }

func TestHeadersSwitchable(t *testing.T) {
	s := &stub{d: ratelimit.Decision{Limit: 20, RetryAfter: time.Second, Bandwidth: "burst"}}
	for _, tc := range []struct {
		h     httplimit.Headers
		ietf  bool
		trio  bool
		label string
	}{
		{httplimit.DefaultHeaders, true, true, "default"},
		{httplimit.IETFHeaders, true, false, "ietf"},
		{httplimit.XRateLimitHeaders, false, true, "x"},
		{0, false, false, "none"},
	} {
		rec := serve(mustNew(t, ratelimit.New(s), httplimit.WithConfig(twoBW), httplimit.WithHeaders(tc.h))(&handlerSpy{}),
			httptest.NewRequest("GET", "/", nil))
		h := rec.Header()
		if (h.Get("RateLimit") != "") != tc.ietf || (h.Get("RateLimit-Policy") != "") != tc.ietf ||
			(h.Get("X-RateLimit-Limit") != "") != tc.trio || (h.Get("X-RateLimit-Reset") != "") != tc.trio ||
			h.Get("Retry-After") != "1" {
			t.Errorf("%s: headers %v", tc.label, h)
		}
	}
}

func TestNewErrors(t *testing.T) {
	l := ratelimit.New(memory.New())
	cfg := httplimit.WithConfig(twoBW)
	for _, tc := range []struct {
		name string
		l    *ratelimit.Limiter
		opts []httplimit.Option
		want string
	}{
		{"nil limiter", nil, []httplimit.Option{cfg}, "httplimit: New: nil limiter"},
		{"no limit", l, nil, "httplimit: New: no limit: pass WithConfig, WithPlans, WithConcurrency or WithConcurrencyFunc"},
		{"nil option", l, []httplimit.Option{cfg, nil}, "httplimit: New: nil option"},
		{"bad config", l, []httplimit.Option{httplimit.WithConfig(ratelimit.Config{})}, "httplimit: WithConfig: ratelimit: invalid config"},
		{"two configs", l, []httplimit.Option{cfg, httplimit.WithPlans(&plans.Cache{})}, "httplimit: WithPlans: the config is already given by WithConfig"},
		{"nil cache", l, []httplimit.Option{httplimit.WithPlans(nil)}, "httplimit: WithPlans: nil cache"},
		{"bad CIDR", l, []httplimit.Option{cfg, httplimit.WithTrustedProxies(httplimit.XForwardedFor, "10.0.0.0/33")}, `httplimit: WithTrustedProxies: "10.0.0.0/33" is not a CIDR prefix`},
		{"no header", l, []httplimit.Option{cfg, httplimit.WithTrustedProxies(0, "10.0.0.0/8")}, "httplimit: WithTrustedProxies: header must be XForwardedFor or Forwarded"},
		{"proxies twice", l, []httplimit.Option{cfg, httplimit.WithTrustedProxies(httplimit.XForwardedFor, "10.0.0.0/8"),
			httplimit.WithTrustedProxies(httplimit.Forwarded, "10.0.0.0/8")}, "httplimit: WithTrustedProxies: given twice"},
		{"IPv6 prefix", l, []httplimit.Option{cfg, httplimit.WithIPv6Prefix(129)}, "httplimit: WithIPv6Prefix: bits must be 1 to 128, got 129"},
		{"nil route", l, []httplimit.Option{cfg, httplimit.WithRoute(nil)}, "httplimit: WithRoute: nil function"},
		{"nil mux", l, []httplimit.Option{cfg, httplimit.WithServeMux(nil)}, "httplimit: WithServeMux: nil mux"},
		{"two routes", l, []httplimit.Option{cfg, httplimit.WithServeMux(http.NewServeMux()), httplimit.WithRoute(func(*http.Request) string { return "" })},
			"httplimit: WithRoute: the route is already given by WithServeMux"},
		{"headers", l, []httplimit.Option{cfg, httplimit.WithHeaders(8)}, "httplimit: WithHeaders: unknown headers 0x8"},
		{"nil body", l, []httplimit.Option{cfg, httplimit.WithBody(nil)}, "httplimit: WithBody: nil function"},
		{"two bodies", l, []httplimit.Option{cfg, httplimit.WithProblemDetails(), httplimit.WithBody(func(http.ResponseWriter, *http.Request, httplimit.Rejection) {})},
			"httplimit: WithBody: the body is already given by WithProblemDetails"},
		{"empty prefix", l, []httplimit.Option{cfg, httplimit.WithKeyPrefix("")}, "httplimit: WithKeyPrefix: prefix must be 1 to 64 bytes, got 0"},
		{"prefix brace", l, []httplimit.Option{cfg, httplimit.WithKeyPrefix("{rl}")}, `httplimit: WithKeyPrefix: prefix "{rl}" has '{' at byte 0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := httplimit.New(tc.l, tc.opts...)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || mw != nil {
				t.Errorf("New: %v, %v; want an error starting %q and no middleware", mw != nil, err, tc.want)
			}
		})
	}
}

// digest is how a key spells a segment too long to keep.
func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

// TestHeaderWriterMatchesMiddleware checks that a HeaderWriter writes, for
// each decision, the fields and Retry-After the middleware sends for it:
// the same decisions, made on two buckets of one config at one time.
func TestHeaderWriterMatchesMiddleware(t *testing.T) {
	clock := newClock()
	h := mustNew(t, ratelimit.New(memory.New(memory.WithClock(clock))), httplimit.WithConfig(twoBW))(&handlerSpy{})
	l := ratelimit.New(memory.New(memory.WithClock(clock)))
	w := httplimit.NewHeaderWriter(httplimit.DefaultHeaders)
	for i := 1; i <= 22; i++ {
		rec := serve(h, httptest.NewRequest("GET", "/x", nil))
		d, err := l.Allow(t.Context(), "k", twoBW)
		if err != nil {
			t.Fatal(err)
		}
		got := http.Header{}
		w.Write(got, twoBW, d)
		for _, name := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
			if g, m := got.Get(name), rec.Header().Get(name); g != m {
				t.Errorf("request %d: %s = %q, the middleware's %q", i, name, g, m)
			}
		}
	}
}
