package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
)

// permitSpy is the memory backend, recording the permit calls it is asked.
type permitSpy struct {
	*memory.Backend
	mu   sync.Mutex
	ops  map[ratelimit.PermitOp]int
	keys []string
}

func newPermitSpy(opts ...memory.Option) *permitSpy {
	return &permitSpy{Backend: memory.New(append([]memory.Option{memory.WithSweepInterval(0)}, opts...)...), ops: map[ratelimit.PermitOp]int{}}
}

func (s *permitSpy) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	s.mu.Lock()
	s.ops[req.Op]++
	s.keys = append(s.keys, key)
	s.mu.Unlock()
	return s.Backend.DoPermit(ctx, key, lim, req)
}

func (s *permitSpy) count(op ratelimit.PermitOp) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ops[op]
}

// inFlight is the permits the store holds for key under lim.
func inFlight(t *testing.T, b ratelimit.PermitBackend, key string, lim ratelimit.Concurrency) int64 {
	t.Helper()
	d, err := b.DoPermit(context.Background(), key, lim, ratelimit.PermitRequest{Op: ratelimit.PermitInspect})
	if err != nil {
		t.Fatalf("inspect %q: %v", key, err)
	}
	return d.InFlight
}

// anonKey is the permit key of an anonymous request from httptest's
// default address, with no route.
const anonKey = "rl:-:default:-:ip:192.0.2.1"

// blocking is a handler that says when it starts and returns when told.
type blocking struct {
	entered chan struct{}
	release chan struct{}
}

func newBlocking() *blocking {
	return &blocking{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	b.entered <- struct{}{}
	<-b.release
	w.WriteHeader(http.StatusOK)
}

// TestConcurrencyExact sends m requests at once to a handler that blocks
// until told: exactly n run, and the rest are refused at once with the
// configured status and Retry-After; when the n return, their permits are
// back.
func TestConcurrencyExact(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const n, m = 3, 10
	lim := ratelimit.InFlight(n, time.Minute)
	for _, tc := range []struct {
		name   string
		opts   []httplimit.Option
		status int
		key    func(i int) string // the client of request i
	}{
		{"per client 429", nil, 429, func(int) string { return "192.0.2.1:1000" }},
		{"shared key 503", []httplimit.Option{httplimit.WithConcurrencyStatus(503), httplimit.WithConcurrencyKey(func(*http.Request) string { return "" })},
			503, func(i int) string { return fmt.Sprintf("192.0.2.%d:1000", i+1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newPermitSpy()
			h := newBlocking()
			mw := mustNew(t, ratelimit.New(store), append([]httplimit.Option{httplimit.WithConcurrency(lim)}, tc.opts...)...)(h)
			results := make(chan *httptest.ResponseRecorder, m)
			for i := range m {
				r := httptest.NewRequest("GET", "/", nil)
				r.RemoteAddr = tc.key(i)
				go func() { results <- serve(mw, r) }()
			}
			// Every request either enters the handler or is answered
			// without it; the ones that enter stay there.
			entered, refused := 0, 0
			for entered+refused < m {
				select {
				case <-h.entered:
					entered++
				case rec := <-results:
					refused++
					if rec.Code != tc.status || rec.Header().Get("Retry-After") != "5" {
						t.Errorf("refused: status %d, Retry-After %q; want %d and 5 (a minute's lease, capped)", rec.Code, rec.Header().Get("Retry-After"), tc.status)
					}
				}
			}
			if entered != n {
				t.Fatalf("%d handlers ran at once, want %d", entered, n)
			}
			close(h.release)
			for range n {
				if rec := <-results; rec.Code != 200 {
					t.Errorf("admitted: status %d", rec.Code)
				}
			}
			key := anonKey
			if tc.status == 503 {
				key = "rl:-"
			}
			if got := inFlight(t, store, key, lim); got != 0 {
				t.Errorf("%d permits held after every handler returned", got)
			}
			if got := store.count(ratelimit.PermitRelease); got != n {
				t.Errorf("%d releases, want %d", got, n)
			}
		})
	}
}

// TestConcurrencyRetryAfter checks that a refusal's Retry-After is the
// time until the first lease ends, in whole seconds rounded up, capped at
// MaxConcurrencyRetryAfter.
func TestConcurrencyRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		lease time.Duration
		want  string
	}{
		{time.Millisecond, "1"},
		{2500 * time.Millisecond, "3"},
		{5 * time.Second, "5"},
		{5*time.Second + time.Microsecond, "5"},
		{ratelimit.MaxPermitLease, "5"},
	} {
		t.Run(tc.lease.String(), func(t *testing.T) {
			store := newPermitSpy(memory.WithClock(newClock()))
			lim := ratelimit.InFlight(1, tc.lease)
			l := ratelimit.New(store)
			if _, _, err := l.TryAcquire(context.Background(), anonKey, lim, 1); err != nil {
				t.Fatal(err)
			}
			var rej httplimit.Rejection
			mw := mustNew(t, l, httplimit.WithConcurrency(lim), httplimit.WithBody(
				func(w http.ResponseWriter, _ *http.Request, r httplimit.Rejection) { rej = r; w.WriteHeader(r.Status) }))
			spy := &handlerSpy{}
			rec := serve(mw(spy), httptest.NewRequest("GET", "/", nil))
			if rec.Code != 429 || rec.Header().Get("Retry-After") != tc.want || spy.calls.Load() != 0 {
				t.Errorf("status %d, Retry-After %q, handler calls %d; want 429, %s, 0", rec.Code, rec.Header().Get("Retry-After"), spy.calls.Load(), tc.want)
			}
			if !rej.TooManyInFlight || rej.Permit.Limit != 1 || rej.Permit.InFlight != 1 || rej.Permit.RetryAfter != tc.lease || rej.Err != nil {
				t.Errorf("rejection %+v", rej)
			}
		})
	}
}

// TestConcurrencyReleaseOnPanic checks that a panicking handler gives its
// permit back, and that the panic goes on up unchanged.
func TestConcurrencyReleaseOnPanic(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	store := newPermitSpy()
	lim := ratelimit.InFlight(1, time.Minute)
	boom := errors.New("boom")
	h := mustNew(t, ratelimit.New(store), httplimit.WithConcurrency(lim))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(boom)
	}))
	for range 2 { // the second would be refused if the first kept its permit
		func() {
			defer func() {
				if got := recover(); got != boom {
					t.Errorf("recovered %v, want the handler's panic", got)
				}
			}()
			serve(h, httptest.NewRequest("GET", "/", nil))
		}()
		if got := inFlight(t, store, anonKey, lim); got != 0 {
			t.Errorf("%d permits held after the handler panicked", got)
		}
	}
	if got := store.count(ratelimit.PermitRelease); got != 2 {
		t.Errorf("%d releases, want 2", got)
	}
}

// TestConcurrencyKeepAlive runs a handler for longer than its permit's
// lease, on synctest's clock: the permit is renewed while it runs, so that
// a request half-way through is still refused, and it is released when it
// returns, with no renewal left running. A handler that returns within a
// third of its lease is never renewed.
func TestConcurrencyKeepAlive(t *testing.T) {
	const lease = 3 * time.Second
	lim := ratelimit.InFlight(1, lease)
	synctest.Test(t, func(t *testing.T) {
		store := newPermitSpy()    // the monotonic clock: synctest's, in the bubble
		long := 10*lease + lease/6 // between two renewals
		h := mustNew(t, ratelimit.New(store), httplimit.WithConcurrency(lim))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(long)
		}))
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- serve(h, httptest.NewRequest("GET", "/", nil)) }()
		for range 9 {
			time.Sleep(lease)
			synctest.Wait()
			if got := inFlight(t, store, anonKey, lim); got != 1 {
				t.Fatalf("the long request's permit is gone (%d held) before it returned", got)
			}
			if rec := serve(h, httptest.NewRequest("GET", "/", nil)); rec.Code != 429 {
				t.Fatalf("a request beside the long one: status %d, want 429", rec.Code)
			}
		}
		if rec := <-done; rec.Code != 200 {
			t.Errorf("long request: status %d", rec.Code)
		}
		synctest.Wait() // no time passes: a renewal left running would be here now
		if n := goroutinesIn("ratelimit.(*Permit).keepAliveFromAThird"); n != 0 {
			t.Errorf("%d keep-alive goroutines left after the handler returned", n)
		}
		if got := inFlight(t, store, anonKey, lim); got != 0 {
			t.Errorf("%d permits held after the long request", got)
		}
		if got := store.count(ratelimit.PermitRenew); got < 27 {
			t.Errorf("%d renewals in 10 leases, want one a third of a lease (≥ 27)", got)
		}

		long = lease/3 - time.Millisecond
		renewed := store.count(ratelimit.PermitRenew)
		if rec := serve(h, httptest.NewRequest("GET", "/", nil)); rec.Code != 200 {
			t.Errorf("short request: status %d", rec.Code)
		}
		time.Sleep(lease)
		synctest.Wait()
		if got := store.count(ratelimit.PermitRenew) - renewed; got != 0 {
			t.Errorf("a request shorter than a third of its lease renewed its permit %d times", got)
		}
	})
}

// TestConcurrencyAfterRate checks that the rate is decided first: a
// request the rate limit refuses takes no permit, and one the concurrency
// limit refuses has taken its token, and carries the rate fields.
func TestConcurrencyAfterRate(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	store := newPermitSpy(memory.WithClock(newClock()))
	lim := ratelimit.InFlight(1, time.Minute)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3).WithID("hourly")}}
	h := newBlocking()
	mw := mustNew(t, ratelimit.New(store), httplimit.WithConfig(cfg), httplimit.WithConcurrency(lim))(h)

	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- serve(mw, httptest.NewRequest("GET", "/", nil)) }()
	<-h.entered
	rec := serve(mw, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 429 || rec.Header().Get("RateLimit") != `"hourly";r=1;t=1200` {
		t.Errorf("refused by the concurrency limit: status %d, RateLimit %q; want 429 and the token it took", rec.Code, rec.Header().Get("RateLimit"))
	}
	var body struct{ Message string }
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Message != "too many requests in flight: retry in 5 s" {
		t.Errorf("body %q (%v)", rec.Body, err)
	}
	close(h.release)
	if rec := <-first; rec.Code != 200 {
		t.Fatalf("first: status %d", rec.Code)
	}
	acquires := store.count(ratelimit.PermitAcquire)
	if acquires != 2 {
		t.Fatalf("%d acquires, want 2", acquires)
	}
	// The third token, then none.
	if rec := serve(mw, httptest.NewRequest("GET", "/", nil)); rec.Code != 200 {
		t.Fatalf("third: status %d", rec.Code)
	}
	rec = serve(mw, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "1200" {
		t.Errorf("refused by the rate limit: status %d, Retry-After %q; want 429 and 1200", rec.Code, rec.Header().Get("Retry-After"))
	}
	if got := store.count(ratelimit.PermitAcquire); got != acquires+1 {
		t.Errorf("%d acquires after a request the rate limit refused, want %d", got, acquires+1)
	}
}

// TestConcurrencyKeys checks which requests share permits: by default each
// client on each route has its own; WithConcurrencyKey groups them.
func TestConcurrencyKeys(t *testing.T) {
	lim := ratelimit.InFlight(1, time.Minute)
	for _, tc := range []struct {
		name   string
		opts   []httplimit.Option
		caller *httplimit.Caller
		want   string
	}{
		{"address", nil, nil, anonKey},
		{"api key, tenant, prefix", []httplimit.Option{httplimit.WithKeyPrefix("svc")}, &httplimit.Caller{Tenant: "acme", APIKey: "k_1"},
			"svc:acme:default:-:key:k_1"},
		{"shared by route", []httplimit.Option{httplimit.WithConcurrencyKey(func(r *http.Request) string { return "GET /v1/{id}" })}, nil,
			"rl:GET%20/v1/%7Bid%7D"},
		{"whole server", []httplimit.Option{httplimit.WithConcurrencyKey(func(r *http.Request) string { return "" })}, nil, "rl:-"},
		{"long digested", []httplimit.Option{httplimit.WithConcurrencyKey(func(r *http.Request) string { return strings.Repeat("t", 200) })}, nil,
			"rl:~" + digest(strings.Repeat("t", 200))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newPermitSpy()
			mw := mustNew(t, ratelimit.New(store), append([]httplimit.Option{httplimit.WithConcurrency(lim)}, tc.opts...)...)
			r := httptest.NewRequest("GET", "/", nil)
			if tc.caller != nil {
				r = r.WithContext(httplimit.ContextWithCaller(r.Context(), *tc.caller))
			}
			if rec := serve(mw(&handlerSpy{}), r); rec.Code != 200 {
				t.Fatalf("status %d", rec.Code)
			}
			if fmt.Sprint(store.keys) != fmt.Sprint([]string{tc.want, tc.want}) {
				t.Errorf("permit keys %q, want an acquire and a release of %q", store.keys, tc.want)
			}
		})
	}

	// Two clients at once: each has its own permit.
	store := newPermitSpy()
	h := newBlocking()
	mw := mustNew(t, ratelimit.New(store), httplimit.WithConcurrency(lim))(h)
	results := make(chan int, 2)
	for _, addr := range []string{"192.0.2.1:1", "192.0.2.2:1"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		go func() { results <- serve(mw, r).Code }()
	}
	for entered := 0; entered < 2; { // both run at once
		select {
		case <-h.entered:
			entered++
		case code := <-results:
			t.Fatalf("a client refused (%d) while another held its own permit", code)
		}
	}
	close(h.release)
	if a, b := <-results, <-results; a != 200 || b != 200 {
		t.Errorf("statuses %d %d, want 200 200", a, b)
	}
}

// TestConcurrencyFunc checks a limit per request, found from the plan, and
// what errors of the function and bad limits are answered with.
func TestConcurrencyFunc(t *testing.T) {
	store := newPermitSpy()
	var plan string
	var err error
	lim := ratelimit.InFlight(1, time.Minute)
	mw := mustNew(t, ratelimit.New(store), httplimit.WithConfig(twoBW), httplimit.WithConcurrencyFunc(
		func(r *http.Request, p string) (ratelimit.Concurrency, error) { plan = p; return lim, err }))
	h := mw(&handlerSpy{})
	if rec := serve(h, httptest.NewRequest("GET", "/", nil)); rec.Code != 200 || plan != httplimit.StaticPlan {
		t.Errorf("status %d, plan %q; want 200, %q", rec.Code, plan, httplimit.StaticPlan)
	}
	err = fmt.Errorf("%w: the limits' store is down", ratelimit.ErrBackendUnavailable)
	if rec := serve(h, httptest.NewRequest("GET", "/", nil)); rec.Code != 503 || rec.Header().Get("Retry-After") != "1" {
		t.Errorf("function failed: status %d, Retry-After %q; want 503, 1", rec.Code, rec.Header().Get("Retry-After"))
	}
	err, lim = nil, ratelimit.InFlight(0, time.Minute)
	if rec := serve(h, httptest.NewRequest("GET", "/", nil)); rec.Code != 500 {
		t.Errorf("invalid limit: status %d, want 500", rec.Code)
	}
}

// noPermits is a Backend that decides rates only.
type noPermits struct{ ratelimit.Backend }

// permitAnswer is a PermitBackend that answers what it is told.
type permitAnswer struct {
	d   ratelimit.PermitDecision
	err error
}

func (a permitAnswer) Do(context.Context, string, ratelimit.Config, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errors.ErrUnsupported
}

func (a permitAnswer) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	if err := ctx.Err(); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	return a.d, a.err
}

// TestConcurrencyErrors checks the answers when the store cannot decide:
// as for the rate limit, 503 for a store that fails or a fail policy that
// refuses without it, 500 for a Backend that holds no permits, and none
// for a client that went away.
func TestConcurrencyErrors(t *testing.T) {
	lim := ratelimit.InFlight(2, time.Minute)
	for _, tc := range []struct {
		name    string
		b       ratelimit.Backend
		status  int
		handler int64
		inFl    bool
	}{
		{"store down", permitAnswer{err: fmt.Errorf("%w: refused", ratelimit.ErrBackendUnavailable)}, 503, 0, false},
		{"key rejected", permitAnswer{err: fmt.Errorf("%w: at cap", ratelimit.ErrKeyRejected)}, 503, 0, false},
		{"fail closed", permitAnswer{d: ratelimit.PermitDecision{Degraded: true, Limit: 2}}, 503, 0, false},
		{"fail open", permitAnswer{d: ratelimit.PermitDecision{Granted: true, Degraded: true, Limit: 2}}, 200, 1, false},
		{"no permits", noPermits{memory.New(memory.WithSweepInterval(0))}, 500, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spy := &handlerSpy{}
			var rej httplimit.Rejection
			mw := mustNew(t, ratelimit.New(tc.b), httplimit.WithConcurrency(lim), httplimit.WithConcurrencyStatus(429), httplimit.WithBody(
				func(w http.ResponseWriter, _ *http.Request, r httplimit.Rejection) { rej = r; w.WriteHeader(r.Status) }))
			rec := serve(mw(spy), httptest.NewRequest("GET", "/", nil))
			if rec.Code != tc.status || spy.calls.Load() != tc.handler || rej.TooManyInFlight {
				t.Errorf("status %d, handler calls %d, rejection %+v; want %d, %d", rec.Code, spy.calls.Load(), rej, tc.status, tc.handler)
			}
			if wantRA := tc.status == 503; (rec.Header().Get("Retry-After") == "1") != wantRA {
				t.Errorf("Retry-After %q", rec.Header().Get("Retry-After"))
			}
		})
	}

	spy := &handlerSpy{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := serve(mustNew(t, ratelimit.New(newPermitSpy()), httplimit.WithConcurrency(lim))(spy), httptest.NewRequestWithContext(ctx, "GET", "/", nil))
	if rec.Body.Len() != 0 || len(rec.Header()) != 0 || spy.calls.Load() != 0 {
		t.Errorf("canceled request answered: %d %q %v, handler calls %d", rec.Code, rec.Body, rec.Header(), spy.calls.Load())
	}
}

// TestConcurrencyFailPolicies runs the middleware over failpolicy on a
// permit store that is down. Closed refuses every request with 503: the
// limiter is out. Local admits its share on its own count (here the whole
// limit, as one instance) and refuses the next request as the store
// would, with the configured status and TooManyInFlight: the caller's
// share is full, not the limiter out.
func TestConcurrencyFailPolicies(t *testing.T) {
	down := permitAnswer{err: fmt.Errorf("%w: connection refused", ratelimit.ErrBackendUnavailable)}
	lim := ratelimit.InFlight(2, time.Hour)
	closed, err := failpolicy.Wrap(down, failpolicy.Closed)
	if err != nil {
		t.Fatal(err)
	}
	spy := &handlerSpy{}
	rec := serve(mustNew(t, ratelimit.New(closed), httplimit.WithConcurrency(lim))(spy), httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" || spy.calls.Load() != 0 {
		t.Errorf("fail closed: status %d, Retry-After %q, handler calls %d; want 503, 1, 0", rec.Code, rec.Header().Get("Retry-After"), spy.calls.Load())
	}

	local, err := failpolicy.Wrap(down, failpolicy.Local)
	if err != nil {
		t.Fatal(err)
	}
	var rej httplimit.Rejection
	h := newBlocking()
	mw := mustNew(t, ratelimit.New(local), httplimit.WithConcurrency(lim), httplimit.WithBody(
		func(w http.ResponseWriter, _ *http.Request, r httplimit.Rejection) { rej = r; w.WriteHeader(r.Status) }))(h)
	var wg sync.WaitGroup
	held := make([]int, lim.Limit)
	for i := range held {
		wg.Go(func() { held[i] = serve(mw, httptest.NewRequest("GET", "/", nil)).Code })
	}
	for range held {
		<-h.entered
	}
	rec = serve(mw, httptest.NewRequest("GET", "/", nil))
	// Retry-After: the first local lease ends in an hour, capped.
	if rec.Code != http.StatusTooManyRequests || !rej.TooManyInFlight || !rej.Permit.Degraded || rej.Permit.InFlight != lim.Limit ||
		rec.Header().Get("Retry-After") != "5" {
		t.Errorf("local share full: status %d, Retry-After %q, rejection %+v; want 429, 5, too many in flight on the local count",
			rec.Code, rec.Header().Get("Retry-After"), rej)
	}
	close(h.release)
	wg.Wait()
	if held[0] != http.StatusOK || held[1] != http.StatusOK {
		t.Errorf("the requests in flight answered %v, want 200s", held)
	}
	if rec := serve(mw, httptest.NewRequest("GET", "/", nil)); rec.Code != http.StatusOK {
		t.Errorf("after the local permits were released: status %d, want 200", rec.Code)
	}
}

// TestConcurrencyBodies checks the concurrency limit's refusals in the
// default JSON body and as problem details: "about:blank", not the rate
// limit's quota-exceeded type, which names quota policies.
func TestConcurrencyBodies(t *testing.T) {
	lim := ratelimit.InFlight(1, 2*time.Second)
	for _, tc := range []struct {
		name string
		opts []httplimit.Option
		ct   string
		want string
	}{
		{"json 429", nil, "application/json",
			`"status":429,"error":"Too Many Requests","message":"too many requests in flight: retry in 2 s","path":"/v1/x"}`},
		{"json 503", []httplimit.Option{httplimit.WithConcurrencyStatus(503)}, "application/json",
			`"status":503,"error":"Service Unavailable","message":"the server is at capacity: retry in 2 s","path":"/v1/x"}`},
		{"problem 429", []httplimit.Option{httplimit.WithProblemDetails()}, "application/problem+json",
			`{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"too many requests in flight: retry in 2 s"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newPermitSpy(memory.WithClock(newClock()))
			l := ratelimit.New(store)
			if _, _, err := l.TryAcquire(context.Background(), anonKey, lim, 1); err != nil {
				t.Fatal(err)
			}
			rec := serve(mustNew(t, l, append([]httplimit.Option{httplimit.WithConcurrency(lim)}, tc.opts...)...)(&handlerSpy{}),
				httptest.NewRequest("GET", "/v1/x", nil))
			if rec.Header().Get("Content-Type") != tc.ct || !strings.HasSuffix(strings.TrimSpace(rec.Body.String()), tc.want) {
				t.Errorf("%s %q, want %s ending %s", rec.Header().Get("Content-Type"), rec.Body, tc.ct, tc.want)
			}
		})
	}
}

func TestConcurrencyNewErrors(t *testing.T) {
	l := ratelimit.New(memory.New(memory.WithSweepInterval(0)))
	conc := httplimit.WithConcurrency(ratelimit.InFlight(1, time.Second))
	for _, tc := range []struct {
		name string
		opts []httplimit.Option
		want string
	}{
		{"bad limit", []httplimit.Option{httplimit.WithConcurrency(ratelimit.InFlight(0, time.Second))},
			"httplimit: WithConcurrency: ratelimit: invalid config: Concurrency.Limit must be 1 to 65536, got 0"},
		{"bad lease", []httplimit.Option{httplimit.WithConcurrency(ratelimit.InFlight(1, 0))},
			"httplimit: WithConcurrency: ratelimit: invalid config: Concurrency.Lease must be"},
		{"nil func", []httplimit.Option{httplimit.WithConcurrencyFunc(nil)}, "httplimit: WithConcurrencyFunc: nil function"},
		{"two limits", []httplimit.Option{conc, httplimit.WithConcurrencyFunc(func(*http.Request, string) (ratelimit.Concurrency, error) {
			return ratelimit.Concurrency{}, nil
		})}, "httplimit: WithConcurrencyFunc: the concurrency limit is already given by WithConcurrency"},
		{"status", []httplimit.Option{conc, httplimit.WithConcurrencyStatus(500)}, "httplimit: WithConcurrencyStatus: status must be 429 or 503, got 500"},
		{"nil key", []httplimit.Option{conc, httplimit.WithConcurrencyKey(nil)}, "httplimit: WithConcurrencyKey: nil function"},
		{"status without limit", []httplimit.Option{httplimit.WithConfig(twoBW), httplimit.WithConcurrencyStatus(503)},
			"httplimit: New: WithConcurrencyKey and WithConcurrencyStatus need WithConcurrency or WithConcurrencyFunc"},
		{"key without limit", []httplimit.Option{httplimit.WithConfig(twoBW), httplimit.WithConcurrencyKey(func(*http.Request) string { return "" })},
			"httplimit: New: WithConcurrencyKey and WithConcurrencyStatus need WithConcurrency or WithConcurrencyFunc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := httplimit.New(l, tc.opts...)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || mw != nil {
				t.Errorf("New: %v, %v; want an error starting %q and no middleware", mw != nil, err, tc.want)
			}
		})
	}
}

// goroutinesIn counts the goroutines with fn in their stacks.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}
