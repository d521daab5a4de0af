package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// DefaultConcurrencyStatus is the status of a request the concurrency limit
// refuses, unless [WithConcurrencyStatus] says otherwise.
const DefaultConcurrencyStatus = http.StatusTooManyRequests

// MaxConcurrencyRetryAfter caps the Retry-After of a request the
// concurrency limit refuses. The store's answer is the time until the
// first held lease ends: the latest moment a permit is sure to come back
// (unless its holder renews it), and a lease is sized for the slowest
// request, up to a day, while most requests end in a fraction of it. A
// client told to come back too early costs one more decision; one told
// too late sits idle beside a free permit. So the wait is capped at 5 s,
// and rounded up to whole seconds, never 0, as every Retry-After is.
const MaxConcurrencyRetryAfter = 5 * time.Second

// WithConcurrency limits the requests each key has in flight at once to
// lim.Limit, across every replica that shares the store: the middleware
// takes a permit for the request's key before the handler runs, and gives
// it back when the handler returns, or panics. A request that finds every
// permit held is refused at once, never queued (see
// [WithConcurrencyStatus]). The permits are at the request's bucket key
// (see [New]), so that each client has lim in flight on each route, unless
// [WithConcurrencyKey] chooses which requests share permits. A store keeps
// a key's permits apart from its bucket, as ratelimittest checks.
//
// A permit is leased for lim.Lease on the store's clock, so that one held
// by a replica that died comes back within it. A handler still running a
// third of a lease after it began has its permit renewed every third of a
// lease ([ratelimit.Permit.KeepAlive]) until it returns; a shorter one
// costs no more than a timer. Size the lease for how long a crashed
// replica may keep its permits, not for the slowest request.
//
// With a rate limit ([WithConfig], [WithPlans]) the rate is decided
// first: a request the rate limit refuses takes no permit, and one the
// concurrency limit refuses has taken its token. lim is checked with
// [ratelimit.Concurrency.Validate]: an invalid limit fails [New]. The
// Limiter's Backend must hold permits ([ratelimit.PermitBackend]); each
// store of sluice's does.
func WithConcurrency(lim ratelimit.Concurrency) Option {
	return func(o *options) error {
		if err := lim.Validate(); err != nil {
			return fmt.Errorf("httplimit: WithConcurrency: %w", err)
		}
		return o.setConcurrency("WithConcurrency", func(*http.Request, string) (ratelimit.Concurrency, error) {
			return lim, nil
		})
	}
}

// WithConcurrencyFunc is [WithConcurrency] with a limit for each request:
// f returns the limit of r, whose caller is on the plan named plan (its
// name from the cache with [WithPlans], else [StaticPlan]), and may read
// the [Caller] from r's context. An error from f, or a limit that does not
// validate, answers the request as a store failure or a misused limiter
// would be (see [New]).
func WithConcurrencyFunc(f func(r *http.Request, plan string) (ratelimit.Concurrency, error)) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("httplimit: WithConcurrencyFunc: nil function")
		}
		return o.setConcurrency("WithConcurrencyFunc", func(r *http.Request, plan string) (ratelimit.Concurrency, error) {
			lim, err := f(r, plan)
			if err != nil {
				return lim, fmt.Errorf("httplimit: WithConcurrencyFunc: %w", err)
			}
			return lim, nil
		})
	}
}

// WithConcurrencyKey makes the requests for which f returns one string
// share one key's permits: f returning the route (r.Pattern) limits the
// requests in flight on each route, whoever sends them; returning the
// Caller's Tenant, each tenant's; returning "", the whole server's (every
// replica's that shares the store). The key is the key prefix, then f's
// string, escaped as a bucket key's last segment is (see [New]):
//
//	rl:{f(r)}
//
// Without this option each client has its own permits on each route.
func WithConcurrencyKey(f func(r *http.Request) string) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("httplimit: WithConcurrencyKey: nil function")
		}
		o.concurrencyKey = f
		return nil
	}
}

func (o *options) setConcurrency(name string, f func(*http.Request, string) (ratelimit.Concurrency, error)) error {
	if err := claim(&o.concurrencyOption, name, "concurrency limit"); err != nil {
		return err
	}
	o.concurrency = f
	return nil
}

// WithConcurrencyStatus sets the status of a request the concurrency limit
// refuses: http.StatusTooManyRequests (429, the default) or
// http.StatusServiceUnavailable (503). Both carry Retry-After (see
// [MaxConcurrencyRetryAfter]).
//
// 429 says that this client has too many requests in flight: right for a
// key of one client's own (the default key, by API key, principal or
// address). 503 says that the server is at capacity: right for a key that
// many clients share ([WithConcurrencyKey]: a route's, a tenant's, the
// whole server's), where no one client is at fault, and clients and
// proxies that retry a 503 elsewhere may find another server with room.
func WithConcurrencyStatus(status int) Option {
	return func(o *options) error {
		if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
			return fmt.Errorf("httplimit: WithConcurrencyStatus: status must be 429 or 503, got %d", status)
		}
		o.concurrencyStatus = status
		return nil
	}
}

// serveHolding runs the handler holding a permit for key, or refuses the
// request; rate is the rate limit's decision, the zero value with none.
func (h *handler) serveHolding(w http.ResponseWriter, r *http.Request, plan, key string, rate ratelimit.Decision) {
	lim, err := h.concurrency(r, plan)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	p, d, err := h.limiter.TryAcquire(r.Context(), h.permitKey(r, key), lim, 1)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if p == nil {
		rej := Rejection{Status: h.concurrencyStatus, Decision: rate, Permit: d, TooManyInFlight: true}
		if d.Degraded && d.InFlight == 0 {
			// A fail policy refused without a count (Closed, or Local
			// unable to decide): the limiter is out, not the caller's
			// share. Local's own share being full is the caller's.
			rej.Status, rej.TooManyInFlight = http.StatusServiceUnavailable, false
		}
		h.reject(w, r, rej, min(d.RetryAfter, MaxConcurrencyRetryAfter))
		return
	}
	p.Hold(r.Context(), func() { h.next.ServeHTTP(w, r) })
}

// permitKey is the key of r's permits, whose bucket key is key.
func (h *handler) permitKey(r *http.Request, key string) string {
	if h.concurrencyKey == nil {
		return key
	}
	var b strings.Builder
	b.WriteString(h.prefix)
	b.WriteByte(':')
	writeSegment(&b, h.concurrencyKey(r), true)
	return b.String()
}
