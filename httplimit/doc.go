// Package httplimit is sluice's net/http middleware: it decides each
// request with a [ratelimit.Limiter] before the handler runs, and answers
// the ones the limit denies with 429 Too Many Requests, Retry-After, the
// IETF RateLimit and RateLimit-Policy fields and a JSON body, without
// reading the request body. It can also hold a permit of a concurrency
// limit for as long as the handler runs.
//
//	limit, err := httplimit.New(limiter, httplimit.WithPlans(cache),
//		httplimit.WithTrustedProxies(httplimit.XForwardedFor, "10.0.0.0/8"))
//	mux.Handle("GET /v1/items/{id}", limit(items))
//
// It works with ServeMux and any router built on http.Handler (chi,
// gorilla/mux): wrap each route's handler, so that the route is its
// pattern, or the whole mux with [WithServeMux] or [WithRoute].
//
// # Keys
//
// A request is limited by who sends it: the API key or principal the
// service's authentication layer found (see [Caller]), or else the client's
// address. The address is the connection's peer, unless that peer is a
// proxy named by [WithTrustedProxies]: only then are X-Forwarded-For or
// Forwarded read, and only the hops those proxies appended, so a client
// cannot choose its own address. IPv6 clients are keyed by their /64, and a
// header that does not parse falls back to the peer's address, never to an
// empty key that every client would share. [New] gives the key's layout.
//
// # Configs
//
// The limits are a static config ([WithConfig]) or each caller's plan from
// a [plans.Cache] ([WithPlans]), so that a change of plan applies on the
// next request.
//
// # Requests in flight
//
// [WithConcurrency] limits the requests each key has in flight at once,
// across replicas: the middleware takes a permit ([ratelimit.Limiter.TryAcquire])
// before the handler runs, keeps it alive while the handler outlasts a
// third of its lease, and gives it back when the handler returns or
// panics. A request that finds no permit free is refused at once with 429,
// or 503 ([WithConcurrencyStatus]), and Retry-After. With a rate limit too,
// the rate is decided first, and a request it refuses takes no permit.
//
// # Errors
//
// Options are checked by [New], which names the option that does not hold.
// At run time nothing panics: a request the limiter cannot decide gets 503
// (or 500 when the limiter was used wrongly), as [New] says, and the
// request's own cancellation is never taken for the store failing.
package httplimit
