package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
)

// A ServeMux route limited to a burst of 2 per client address: the third
// request in a row gets 429 with Retry-After and the IETF fields.
func Example() {
	limiter := ratelimit.New(memory.New())
	limit, err := httplimit.New(limiter, httplimit.WithConfig(ratelimit.Config{
		Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(2).WithID("per-minute")},
	}))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /hello", limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello")
	})))

	for range 3 {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/hello", nil))
		fmt.Printf("%d %s Retry-After=%q\n", rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 "per-minute";q=2;w=60 Retry-After=""
	// 200 "per-minute";q=2;w=60 Retry-After=""
	// 429 "per-minute";q=2;w=60 Retry-After="30"
}

// An authentication layer tells the middleware who the caller is; the
// bucket is then the API key's, on its tenant's plan.
func ExampleContextWithCaller() {
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// ... validate the key in r's Authorization header, then:
			c := httplimit.Caller{Tenant: "acme", APIKey: "key_2f9c"}
			next.ServeHTTP(w, r.WithContext(httplimit.ContextWithCaller(r.Context(), c)))
		})
	}
	limit, err := httplimit.New(ratelimit.New(memory.New()), httplimit.WithConfig(ratelimit.Config{
		Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)},
	}))
	if err != nil {
		panic(err)
	}
	h := auth(limit(http.NotFoundHandler()))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	fmt.Println(rec.Header().Get("RateLimit"))
	// Output:
	// "0";r=9;t=1
}

// Behind a load balancer at 10.0.0.0/8 that appends to X-Forwarded-For,
// the client is the first address from the right that is not the load
// balancer's: the one it appended, not one a client wrote itself.
func ExampleWithTrustedProxies() {
	limit, err := httplimit.New(ratelimit.New(memory.New()),
		httplimit.WithConfig(ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(1)}}),
		httplimit.WithTrustedProxies(httplimit.XForwardedFor, "10.0.0.0/8"))
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	send := func(peer, xff string) int {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", xff)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	fmt.Println(send("10.1.2.3:5000", "203.0.113.7"))          // through the load balancer
	fmt.Println(send("10.1.2.3:5000", "1.2.3.4, 203.0.113.7")) // the same client, a forged hop in front
	fmt.Println(send("10.1.2.3:5000", "203.0.113.8"))          // another client
	fmt.Println(send("203.0.113.7:5000", "9.9.9.9"))           // straight in: its own address, not the header
	// Output:
	// 200
	// 429
	// 200
	// 429
}

// A HeaderWriter writes the middleware's fields for a decision made
// elsewhere: here, the second of a burst of 2, then a denial.
func ExampleHeaderWriter() {
	limiter := ratelimit.New(memory.New())
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(2).WithID("per-minute")}}
	w := httplimit.NewHeaderWriter(httplimit.IETFHeaders)
	for range 3 {
		d, err := limiter.Allow(context.Background(), "client-1", cfg)
		if err != nil {
			panic(err)
		}
		h := http.Header{}
		w.Write(h, cfg, d)
		fmt.Printf("%s Retry-After=%q\n", h.Get("RateLimit"), h.Get("Retry-After"))
	}
	// Output:
	// "per-minute";r=1;t=30 Retry-After=""
	// "per-minute";r=0;t=30 Retry-After=""
	// "per-minute";r=0;t=30 Retry-After="30"
}

// At most one request in flight per client: while the first runs, a
// second from the same client is refused, with Retry-After; once the first
// has returned, its permit is back.
func ExampleWithConcurrency() {
	limit, err := httplimit.New(ratelimit.New(memory.New()),
		httplimit.WithConcurrency(ratelimit.InFlight(1, time.Minute)))
	if err != nil {
		panic(err)
	}
	send := func(h http.Handler) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/report", nil))
		return rec
	}
	var h http.Handler
	h = limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		rec := send(h) // the same client again, while this request runs
		fmt.Printf("beside it: %d Retry-After=%s\n", rec.Code, rec.Header().Get("Retry-After"))
	}))
	fmt.Println("first:", send(h).Code)
	// Output:
	// beside it: 429 Retry-After=5
	// first: 200
}
