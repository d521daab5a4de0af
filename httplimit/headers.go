package httplimit

import (
	"fmt"
	"math/big"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/sluicehq/sluice/ratelimit"
)

// Headers selects the rate-limit response fields the middleware sends.
type Headers uint8

const (
	// IETFHeaders are RateLimit-Policy and RateLimit, as
	// draft-ietf-httpapi-ratelimit-headers-10 defines them: structured fields
	// (RFC 9651), one quota policy per bandwidth of the bucket's config, and
	// the service limit of the binding one.
	//
	//	RateLimit-Policy: "burst";q=20;w=2, "hourly";q=1000;w=3600
	//	RateLimit: "burst";r=17;t=1
	//
	// A policy is named by its bandwidth's ID, or its index when it has none.
	// q is the bandwidth's Capacity and w the whole seconds it takes to refill
	// from empty, rounded up (Capacity×RefillPeriod/RefillTokens); a bandwidth
	// that refills from empty within a second shows its rate over one second
	// instead (q tokens, w=1).
	//
	// The RateLimit item names the binding bandwidth
	// ([ratelimit.Decision.Bandwidth]), and both its parameters are that
	// bandwidth's. r is its whole tokens left, the draft's remaining quota
	// units (Section 4.1.1). t is the draft's reset parameter (Section
	// 4.1.2), "the number of seconds until additional quota associated with
	// the quota policy is made available": the seconds, rounded up, until
	// that bandwidth holds more than r tokens, when its next token arrives
	// ([ratelimit.Decision.RefillAfter]), or 0 when it is full. So a client
	// told r=0 that waits t seconds finds that bandwidth's token there
	// (another with none left too may still refuse it: of equals, the first
	// in the config is named), and one that comes back sooner is refused and
	// told to wait until that same moment, to within the rounding to whole
	// seconds. A 429 names the bandwidth that refused the request, and its t
	// is the Retry-After: the middleware asks for one token, which that
	// bandwidth gets first at t (Section 6: a Retry-After never earlier than
	// t).
	//
	// Every figure of these fields and of [XRateLimitHeaders] is an RFC 9651
	// Integer (Section 3.3.1): one larger than 999,999,999,999,999 (a
	// Capacity reaches 2^50, a little more) is sent as 999,999,999,999,999.
	IETFHeaders Headers = 1 << iota
	// XRateLimitHeaders are the de facto trio, each a decimal integer:
	// X-RateLimit-Limit (the binding bandwidth's Capacity),
	// X-RateLimit-Remaining (the RateLimit field's r) and X-RateLimit-Reset
	// (its t: seconds from now, not an epoch time, as some libraries send).
	// Their figures are bounded as the RateLimit field's are, so that they
	// are the same numbers and Remaining is never more than Limit.
	XRateLimitHeaders

	// DefaultHeaders are the fields sent unless [WithHeaders] says
	// otherwise: both sets.
	DefaultHeaders = IETFHeaders | XRateLimitHeaders
)

// A HeaderWriter writes the rate-limit fields of decisions as the
// middleware writes them, for a server that answers for another:
// sluice-server puts them in the response_headers_to_add it sends Envoy.
// It keeps each config's RateLimit-Policy field, worked out once. It is
// safe for concurrent use; make one with [NewHeaderWriter].
type HeaderWriter struct {
	which    Headers
	policies policies
}

// NewHeaderWriter returns a HeaderWriter of the fields which selects.
func NewHeaderWriter(which Headers) *HeaderWriter {
	return &HeaderWriter{which: which}
}

// Write sets in h the fields for decision d on a bucket of config cfg, as
// [Headers] describes them, and for a denied d the Retry-After the
// middleware's 429 carries. A config that [ratelimit.Config.Validate]
// rejects has no fields.
func (w *HeaderWriter) Write(h http.Header, cfg ratelimit.Config, d ratelimit.Decision) {
	pol := w.policies.get(cfg)
	if pol == nil {
		return
	}
	setHeaders(h, w.which, pol, d)
	if !d.Allowed {
		h.Set(headerRetryAfter, strconv.FormatInt(retryAfter(d.RetryAfter), 10))
	}
}

// Header names, as net/http canonicalizes them (textproto.CanonicalMIMEHeaderKey),
// so that Header.Get finds them.
const (
	headerPolicy     = "Ratelimit-Policy"
	headerLimit      = "Ratelimit"
	headerRetryAfter = "Retry-After"
	headerXLimit     = "X-Ratelimit-Limit"
	headerXRemaining = "X-Ratelimit-Remaining"
	headerXReset     = "X-Ratelimit-Reset"
)

// maxSFInteger is the largest Integer a structured field may carry
// (RFC 9651, Section 3.3.1), and the largest figure any rate-limit field
// sends. Capacities reach 2^50, a little more.
const maxSFInteger = 999_999_999_999_999

// figure is n as every rate-limit field sends it: in decimal, within 0 and
// maxSFInteger.
func figure(n int64) string {
	return strconv.FormatInt(min(max(n, 0), maxSFInteger), 10)
}

// policy is what the headers need of one config, worked out once.
type policy struct {
	field string   // the RateLimit-Policy field value
	names []string // each bandwidth's serialized policy name, by index
	ids   []string // what Decision.Bandwidth says for each, by index
	// capacities are each bandwidth's Capacity, and limits the same as a
	// figure, for X-RateLimit-Limit.
	capacities []int64
	limits     []string
}

// policies caches each config's policy by fingerprint. It holds at most
// maxPolicies; when full it starts again empty, which costs the next
// requests one serialization each.
type policies struct {
	m sync.Map // uint64 → *policy
	n atomic.Int64
}

const maxPolicies = 1024

// get returns cfg's policy; nil only for a config that Validate rejects,
// whose decision is an error anyway.
func (p *policies) get(cfg ratelimit.Config) *policy {
	fp := cfg.Fingerprint()
	if v, ok := p.m.Load(fp); ok {
		return v.(*policy)
	}
	pol, err := newPolicy(cfg)
	if err != nil {
		return nil
	}
	if p.n.Add(1) > maxPolicies {
		p.m.Clear()
		p.n.Store(1)
	}
	p.m.Store(fp, pol)
	return pol
}

func newPolicy(cfg ratelimit.Config) (*policy, error) {
	n := len(cfg.Bandwidths)
	pol := &policy{names: make([]string, n), ids: make([]string, n), capacities: make([]int64, n), limits: make([]string, n)}
	list := make(httpsfv.List, len(cfg.Bandwidths))
	for i, bw := range cfg.Bandwidths {
		pol.ids[i] = cfg.BandwidthName(i)
		name, err := httpsfv.Marshal(httpsfv.List{httpsfv.NewItem(pol.ids[i])})
		if err != nil { // not for a valid config: IDs are letters, digits and -_.:
			return nil, fmt.Errorf("httplimit: bandwidth name %q: %w", pol.ids[i], err)
		}
		pol.names[i] = name
		pol.capacities[i], pol.limits[i] = bw.Capacity, figure(bw.Capacity)
		q, w := quota(bw)
		item := httpsfv.NewItem(pol.ids[i])
		item.Params.Add("q", q)
		item.Params.Add("w", w)
		list[i] = item
	}
	field, err := httpsfv.Marshal(list)
	if err != nil {
		return nil, fmt.Errorf("httplimit: RateLimit-Policy: %w", err)
	}
	pol.field = field
	return pol, nil
}

// quota is a bandwidth as a draft quota policy: Capacity tokens over the
// whole seconds it takes to refill from empty, or, when that is under a
// second, the tokens it refills in one second over w=1.
func quota(bw ratelimit.Bandwidth) (q, w int64) {
	// window = Capacity × RefillPeriod / RefillTokens, which overflows int64
	// for large capacities and periods; it is computed once per config.
	num := new(big.Int).Mul(big.NewInt(bw.Capacity), big.NewInt(int64(bw.RefillPeriod)))
	den := new(big.Int).Mul(big.NewInt(bw.RefillTokens), big.NewInt(int64(time.Second)))
	if num.Cmp(den) < 0 {
		perSecond := new(big.Int).Quo(
			new(big.Int).Mul(big.NewInt(bw.RefillTokens), big.NewInt(int64(time.Second))),
			big.NewInt(int64(bw.RefillPeriod)))
		return clampSF(perSecond), 1
	}
	secs, rem := new(big.Int).QuoRem(num, den, new(big.Int))
	if rem.Sign() != 0 {
		secs.Add(secs, big.NewInt(1))
	}
	return min(bw.Capacity, maxSFInteger), clampSF(secs)
}

func clampSF(v *big.Int) int64 {
	if !v.IsInt64() || v.Int64() > maxSFInteger {
		return maxSFInteger
	}
	return v.Int64()
}

// seconds rounds d up to whole seconds: a client told to wait less than the
// limiter needs comes back too early and is refused again.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// retryAfter is the Retry-After for a denial: d rounded up, and never 0,
// which would invite an immediate retry.
func retryAfter(d time.Duration) int64 {
	return max(seconds(d), 1)
}

// setHeaders writes the selected fields for decision d on a bucket with
// policy pol. A decision that names no bandwidth (a fail policy decided
// without the store) has no service limit to report, only the policy.
//
// The fields go straight into the map under their canonical names, with one
// backing array for the values: Header.Set would canonicalize each name
// again and allocate a slice for each value, and on the allowed path that is
// most of the middleware's own cost.
func setHeaders(h http.Header, which Headers, pol *policy, d ratelimit.Decision) {
	if pol == nil || which == 0 {
		return
	}
	i := pol.binding(d.Bandwidth)
	vals := make([]string, 0, 5)
	set := func(name, v string) {
		vals = append(vals, v)
		n := len(vals)
		h[name] = vals[n-1 : n : n]
	}
	if which&IETFHeaders != 0 {
		set(headerPolicy, pol.field)
	}
	if i < 0 {
		return
	}
	remaining, reset := figure(d.Remaining), figure(seconds(d.RefillAfter))
	if which&IETFHeaders != 0 {
		set(headerLimit, pol.names[i]+";r="+remaining+";t="+reset)
	}
	if which&XRateLimitHeaders != 0 {
		limit := pol.limits[i]
		if d.Limit != pol.capacities[i] {
			limit = figure(d.Limit)
		}
		set(headerXLimit, limit)
		set(headerXRemaining, remaining)
		set(headerXReset, reset)
	}
}

// binding returns the index of the bandwidth a decision names, or -1.
func (p *policy) binding(name string) int {
	if name == "" {
		return -1
	}
	for i, id := range p.ids {
		if id == name {
			return i
		}
	}
	return -1
}
