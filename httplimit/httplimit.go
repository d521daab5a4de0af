package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

// DefaultIPv6Prefix is the prefix length IPv6 clients are keyed by unless
// [WithIPv6Prefix] says otherwise: a /64 is what one subscriber gets, and
// any address in it is theirs to use.
const DefaultIPv6Prefix = 64

// StaticPlan is the plan segment of the keys of a [WithConfig] middleware.
const StaticPlan = "default"

// An Option configures [New].
type Option func(*options) error

type options struct {
	static       *ratelimit.Config
	plans        *plans.Cache
	proxyHeader  ProxyHeader
	proxies      []string
	proxiesSet   bool
	ipv6Bits     int
	route        func(*http.Request) string
	routeOption  string
	headers      Headers
	body         func(http.ResponseWriter, *http.Request, Rejection)
	bodyOption   string
	prefix       string
	configOption string
	// concurrency is the limit on requests in flight of WithConcurrency or
	// WithConcurrencyFunc, nil for none.
	concurrency       func(*http.Request, string) (ratelimit.Concurrency, error)
	concurrencyOption string
	concurrencyKey    func(*http.Request) string
	concurrencyStatus int
}

// WithConfig limits every request with cfg, a static config. It is checked
// with [ratelimit.Config.Validate]: an invalid config fails [New].
func WithConfig(cfg ratelimit.Config) Option {
	return func(o *options) error {
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("httplimit: WithConfig: %w", err)
		}
		if err := claim(&o.configOption, "WithConfig", "config"); err != nil {
			return err
		}
		cfg.Bandwidths = append([]ratelimit.Bandwidth(nil), cfg.Bandwidths...)
		o.static = &cfg
		return nil
	}
}

// WithPlans limits each request by its caller's plan, from c: the plan of
// the [Caller]'s Tenant, else of its APIKey, else of its Principal, else of
// [AnonymousSubject]. A plan change applies on the caller's next request.
func WithPlans(c *plans.Cache) Option {
	return func(o *options) error {
		if c == nil {
			return errors.New("httplimit: WithPlans: nil cache")
		}
		if err := claim(&o.configOption, "WithPlans", "config"); err != nil {
			return err
		}
		o.plans = c
		return nil
	}
}

// claim records that option name gives what (the config, the route, the
// body), which one option at most may give: by holds the option that did.
func claim(by *string, name, what string) error {
	if *by != "" {
		return fmt.Errorf("httplimit: %s: the %s is already given by %s", name, what, *by)
	}
	*by = name
	return nil
}

// WithTrustedProxies names the proxies in front of the service, as CIDR
// prefixes ("10.0.0.0/8", "2001:db8::/32") or single addresses, and the
// header they append their peer's address to. Only a request whose direct
// peer is one of them has that header read, right to left, and the first
// address that is not a trusted proxy is the client. Without this option
// the client is the request's RemoteAddr, whatever headers it sends.
//
// Name the one header your proxies write: a proxy that appends to
// X-Forwarded-For passes a client's own Forwarded header on untouched, and
// reading it would let the client choose its address.
func WithTrustedProxies(header ProxyHeader, cidrs ...string) Option {
	return func(o *options) error {
		if o.proxiesSet {
			return errors.New("httplimit: WithTrustedProxies: given twice")
		}
		o.proxyHeader, o.proxies, o.proxiesSet = header, append([]string(nil), cidrs...), true
		if header == 0 {
			return fmt.Errorf("httplimit: WithTrustedProxies: header must be XForwardedFor or Forwarded, got %v", header)
		}
		return nil
	}
}

// WithIPv6Prefix sets the prefix length, from 1 to 128, that IPv6 clients
// are keyed by (default [DefaultIPv6Prefix]). IPv4 clients are keyed by
// their exact address.
func WithIPv6Prefix(bits int) Option {
	return func(o *options) error {
		if bits < 1 || bits > 128 {
			return fmt.Errorf("httplimit: WithIPv6Prefix: bits must be 1 to 128, got %d", bits)
		}
		o.ipv6Bits = bits
		return nil
	}
}

// WithRoute sets how a request's route is found, for routers other than
// net/http's ServeMux: f returns the matched route's pattern ("/v1/items/:id"),
// never the raw path, which a client can vary to get a new bucket each time.
// By default the route is the request's Pattern, which ServeMux sets on the
// requests it passes to a handler (see also [WithServeMux]). A request with
// no route, or for which f returns "", is keyed under the route "-".
func WithRoute(f func(*http.Request) string) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("httplimit: WithRoute: nil function")
		}
		return o.setRoute("WithRoute", f)
	}
}

// WithServeMux finds each request's route by asking mux which pattern it
// would match, for a middleware that wraps mux itself (and so runs before
// mux has set the request's Pattern).
func WithServeMux(mux *http.ServeMux) Option {
	return func(o *options) error {
		if mux == nil {
			return errors.New("httplimit: WithServeMux: nil mux")
		}
		return o.setRoute("WithServeMux", func(r *http.Request) string {
			_, pattern := mux.Handler(r)
			return pattern
		})
	}
}

func (o *options) setRoute(name string, f func(*http.Request) string) error {
	if err := claim(&o.routeOption, name, "route"); err != nil {
		return err
	}
	o.route = f
	return nil
}

// WithHeaders selects the rate-limit fields sent with every response the
// middleware sees, allowed or not (default [DefaultHeaders]); 0 sends none
// but Retry-After, which a 429 or 503 always has.
func WithHeaders(h Headers) Option {
	return func(o *options) error {
		if h&^DefaultHeaders != 0 {
			return fmt.Errorf("httplimit: WithHeaders: unknown headers %#x", uint8(h&^DefaultHeaders))
		}
		o.headers = h
		return nil
	}
}

// WithProblemDetails answers rejections with RFC 9457 problem details
// (application/problem+json) instead of the default JSON body: a 429 of
// the rate limit has the draft's type [ProblemQuotaExceeded] and its
// "violated-policies" member, and every other rejection (the concurrency
// limit's, a 503, a 500) the type "about:blank".
func WithProblemDetails() Option {
	return func(o *options) error {
		return o.setBody("WithProblemDetails", writeProblemBody)
	}
}

// WithBody replaces the body of rejections: f writes the response for rej,
// its Content-Type, then w.WriteHeader(rej.Status) and the body. When f is
// called the rate-limit headers and Retry-After are already set.
//
// The default body is JSON:
//
//	{"timestamp":"2026-12-02T10:15:00.123Z","status":429,"error":"Too Many Requests",
//	 "message":"rate limit exceeded: retry in 2 s","path":"/v1/items"}
func WithBody(f func(w http.ResponseWriter, r *http.Request, rej Rejection)) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("httplimit: WithBody: nil function")
		}
		return o.setBody("WithBody", f)
	}
}

func (o *options) setBody(name string, f func(http.ResponseWriter, *http.Request, Rejection)) error {
	if err := claim(&o.bodyOption, name, "body"); err != nil {
		return err
	}
	o.body = f
	return nil
}

// WithKeyPrefix sets the first segment of every bucket key (default
// [DefaultKeyPrefix]): 1 to 64 bytes of printable ASCII without ':', '%',
// '~', '{' or '}'.
func WithKeyPrefix(prefix string) Option {
	return func(o *options) error {
		if prefix == "" || len(prefix) > maxPrefixLen {
			return fmt.Errorf("httplimit: WithKeyPrefix: prefix must be 1 to %d bytes, got %d", maxPrefixLen, len(prefix))
		}
		for i := 0; i < len(prefix); i++ {
			if c := prefix[i]; mustEscape(c, false) || c >= 0x80 {
				return fmt.Errorf("httplimit: WithKeyPrefix: prefix %q has %q at byte %d", prefix, c, i)
			}
		}
		o.prefix = prefix
		return nil
	}
}

// New returns middleware that limits each request before the handler runs,
// with limiter: its rate by the config of [WithConfig] or [WithPlans], its
// concurrency by [WithConcurrency] or [WithConcurrencyFunc], or both (at
// least one is required).
//
// A request's bucket key is
//
//	rl:{tenant}:{plan}:{route}:{kind}:{id}
//
// with the [Caller]'s Tenant ("-" for none), the plan's name ([StaticPlan]
// for WithConfig), the route (see [WithRoute]), and the caller's identity:
// "key:" and its APIKey, else "user:" and its Principal, else "ip:" and the
// client address (see [WithTrustedProxies]; an IPv6 client by its /64).
// Every segment is escaped so that no value can add a segment or a Redis
// Cluster hash tag, and one longer than 96 bytes is replaced by a digest.
//
// An allowed request goes to the handler with the rate-limit headers set
// (see [Headers]). A denied one gets 429 Too Many Requests with Retry-After
// in whole seconds, rounded up and never 0, and a JSON body (see
// [WithBody], [WithProblemDetails]). When the limiter cannot decide (the
// store is down, a fail policy failed closed) the answer is 503 Service
// Unavailable with Retry-After; a limiter used wrongly (an invalid config
// or key, a Backend that holds no permits) answers 500. In every such case
// the handler is not called and the request body is not read. A request
// whose client went away (its context canceled) gets no answer. A request
// the concurrency limit refuses gets 429, or 503 by
// [WithConcurrencyStatus], with Retry-After.
//
// An option that does not hold is an error naming it, and New then returns
// no middleware.
func New(limiter *ratelimit.Limiter, opts ...Option) (func(http.Handler) http.Handler, error) {
	if limiter == nil {
		return nil, errors.New("httplimit: New: nil limiter")
	}
	o := options{ipv6Bits: DefaultIPv6Prefix, headers: DefaultHeaders, body: writeJSONBody, prefix: DefaultKeyPrefix}
	for _, opt := range opts {
		if opt == nil {
			return nil, errors.New("httplimit: New: nil option")
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.configOption == "" && o.concurrency == nil {
		return nil, errors.New("httplimit: New: no limit: pass WithConfig, WithPlans, WithConcurrency or WithConcurrencyFunc")
	}
	if o.concurrency == nil && (o.concurrencyKey != nil || o.concurrencyStatus != 0) {
		return nil, errors.New("httplimit: New: WithConcurrencyKey and WithConcurrencyStatus need WithConcurrency or WithConcurrencyFunc")
	}
	if o.concurrencyStatus == 0 {
		o.concurrencyStatus = DefaultConcurrencyStatus
	}
	ips, err := newIPResolver(o.proxyHeader, o.proxies, o.ipv6Bits)
	if err != nil {
		return nil, err
	}
	if o.route == nil {
		o.route = func(r *http.Request) string { return r.Pattern }
	}
	m := &middleware{limiter: limiter, options: o, ips: ips}
	if o.static != nil {
		m.staticPolicy = m.policies.get(*o.static)
	}
	return func(next http.Handler) http.Handler {
		return &handler{middleware: m, next: next}
	}, nil
}

// middleware is what every handler New wraps shares.
type middleware struct {
	limiter *ratelimit.Limiter
	options
	ips      *ipResolver
	policies policies
	// staticPolicy is WithConfig's policy, worked out once.
	staticPolicy *policy
}

type handler struct {
	*middleware
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	caller, _ := CallerFromContext(ctx)
	plan, cfg, err := h.config(ctx, caller)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	kind, id := h.identity(r, caller)
	key := bucketKey(h.prefix, caller.Tenant, plan, h.route(r), kind, id)
	var d ratelimit.Decision
	if h.configOption != "" {
		if d, err = h.limiter.Allow(ctx, key, cfg); err != nil {
			h.fail(w, r, err)
			return
		}
		pol := h.staticPolicy
		if pol == nil {
			pol = h.policies.get(cfg)
		}
		setHeaders(w.Header(), h.headers, pol, d)
		switch {
		case d.Allowed:
		case d.Degraded && d.Bandwidth == "":
			// A fail policy denied without the store (Closed, or Local with no
			// room for the key): the limiter is out, not the caller's quota.
			h.reject(w, r, Rejection{Status: http.StatusServiceUnavailable, Decision: d}, d.RetryAfter)
			return
		default:
			h.reject(w, r, Rejection{Status: http.StatusTooManyRequests, Decision: d, Policies: []string{d.Bandwidth}}, d.RetryAfter)
			return
		}
	}
	if h.concurrency != nil {
		h.serveHolding(w, r, plan, key, d)
		return
	}
	h.next.ServeHTTP(w, r)
}

// config returns the plan name and config for caller's request: with no
// rate limit, StaticPlan and no config.
func (h *handler) config(ctx context.Context, caller Caller) (string, ratelimit.Config, error) {
	switch {
	case h.static != nil:
		return StaticPlan, *h.static, nil
	case h.plans == nil:
		return StaticPlan, ratelimit.Config{}, nil
	}
	a, err := h.plans.Lookup(ctx, caller.Subject())
	if err != nil {
		return "", ratelimit.Config{}, err
	}
	return a.Plan.Name, a.Config(), nil
}

// identity is the last two segments of the request's key.
func (h *handler) identity(r *http.Request, caller Caller) (kind, id string) {
	switch {
	case caller.APIKey != "":
		return kindAPIKey, caller.APIKey
	case caller.Principal != "":
		return kindPrincipal, caller.Principal
	}
	return kindIP, h.ips.clientKey(r)
}

// fail answers a request the limiter could not decide.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client has gone: no one reads an answer
	}
	status := http.StatusServiceUnavailable
	if errors.Is(err, ratelimit.ErrInvalidConfig) || errors.Is(err, ratelimit.ErrInvalidKey) ||
		errors.Is(err, ratelimit.ErrInvalidRequest) || errors.Is(err, errors.ErrUnsupported) {
		status = http.StatusInternalServerError
	}
	h.reject(w, r, Rejection{Status: status, Err: err}, 0)
}

// reject sets Retry-After on a 429 or 503, from wait, and writes the body.
func (h *handler) reject(w http.ResponseWriter, r *http.Request, rej Rejection, wait time.Duration) {
	if rej.Status != http.StatusInternalServerError {
		rej.RetryAfter = retryAfter(wait)
		w.Header().Set(headerRetryAfter, strconv.FormatInt(rej.RetryAfter, 10))
	}
	h.body(w, r, rej)
}
