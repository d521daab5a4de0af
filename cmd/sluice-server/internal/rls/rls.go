// Package rls is sluice-server's Envoy rate limit service (RLS v3,
// envoy.service.ratelimit.v3.RateLimitService): each descriptor of a
// request is looked up in the config (package rlsconfig) and decided by a
// sluice backend, under its domain's fail mode.
//
// # Semantics
//
// A descriptor that matches no limit, matches an unlimited one, or
// matches a limit that another descriptor of the request replaces is OK
// and takes nothing. Every other descriptor is decided on its own bucket,
// with the request's hits_addend (the descriptor's own when it has one; 1
// when neither says) as its cost: a cost of 0 looks at the bucket without
// taking anything, and a cost larger than the bucket can ever hold is
// OVER_LIMIT without taking anything. The descriptors are decided one
// after another and each takes its cost when it passes, whatever the
// others get, as envoyproxy/ratelimit's counters do; a rejected one takes
// nothing. The response is OVER_LIMIT when a descriptor of a limit that is
// not a quota_mode one is, or when every quota_mode descriptor is, unless
// the server runs in shadow mode; a descriptor of a shadow_mode limit that
// is over reports OK.
package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlsconfig"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
)

// PlanSource supplies a plan limit's config by its subject: a
// plans.Cache.
type PlanSource interface {
	Config(ctx context.Context, subject string) (ratelimit.Config, error)
}

// Options are a Server's settings.
type Options struct {
	// Backend returns the backend that decides under fail mode mode,
	// splitting each bucket into shards sub-buckets when shards > 1. It is
	// called for every decision, so it must be quick, and safe for
	// concurrent use.
	Backend func(mode string, shards int) ratelimit.Backend
	// FailModes are the modes Backend serves: a config whose domain names
	// another is refused, and so is a DefaultFailMode not among them.
	FailModes []string
	// DefaultFailMode is the fail mode of a domain whose config sets none.
	DefaultFailMode string
	// Plans supplies the configs of plan limits; a config with a plan
	// limit is refused without it.
	Plans PlanSource
	// ShadowMode answers every request OK, whatever its descriptors get
	// (each still reports its own code), as envoyproxy/ratelimit's
	// SHADOW_MODE does.
	ShadowMode bool
	// QuotaMode treats every limit as a quota_mode one, as
	// envoyproxy/ratelimit's QUOTA_MODE does.
	QuotaMode bool
	// DynamicMetadata fills in the response's dynamic_metadata, as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does: the domain,
	// the descriptors, the hits_addend and the merged metadata of the
	// limits whose descriptors passed.
	DynamicMetadata bool
	// Headers selects the rate-limit fields the response asks Envoy to add
	// (httplimit's IETF draft-10 fields, the X-RateLimit trio, or none).
	Headers httplimit.Headers
	// Meter makes the server's own instruments (see docs/server.md,
	// Metrics); nil for none.
	Meter metric.Meter
	// Clock tells the time of a blocked limit's window; nil for the
	// system's.
	Clock func() time.Time
}

// Server answers ShouldRateLimit. It is safe for concurrent use; SetConfig
// swaps the config without stopping calls in flight, which finish on the
// config they started with.
type Server struct {
	rlspb.UnimplementedRateLimitServiceServer
	opts     Options
	requests metric.Int64Counter // nil without a Meter
	config   atomic.Pointer[rlsconfig.Config]
	writer   *httplimit.HeaderWriter // nil for no headers
}

// New returns a server of cfg, which Check must accept.
func New(cfg *rlsconfig.Config, opts Options) (*Server, error) {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.DefaultFailMode == "" {
		return nil, errors.New("rls: no DefaultFailMode")
	}
	if opts.Backend == nil {
		return nil, errors.New("rls: no Backend")
	}
	if !slices.Contains(opts.FailModes, opts.DefaultFailMode) {
		return nil, fmt.Errorf("rls: the default fail mode %q is not one of FailModes %v", opts.DefaultFailMode, opts.FailModes)
	}
	s := &Server{opts: opts}
	if opts.Meter != nil {
		var err error
		s.requests, err = opts.Meter.Int64Counter("sluice.server.requests",
			metric.WithDescription("ShouldRateLimit calls, by domain (\"unknown\" for one the config lacks) and response code (OK, OVER_LIMIT or the gRPC error's code)"),
			metric.WithUnit("{request}"))
		if err != nil {
			return nil, fmt.Errorf("rls: %w", err)
		}
	}
	if opts.Headers != 0 {
		s.writer = httplimit.NewHeaderWriter(opts.Headers)
	}
	if err := s.SetConfig(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Check returns what keeps the server from serving cfg, or nil: a fail
// mode it has no backend for, or a plan limit without Plans.
func (s *Server) Check(cfg *rlsconfig.Config) error {
	for _, name := range cfg.Domains() {
		d := cfg.Domain(name)
		if d.FailMode != "" && !slices.Contains(s.opts.FailModes, d.FailMode) {
			return fmt.Errorf("domain %q: fail_mode %q is not available on this server", name, d.FailMode)
		}
		if s.opts.Plans == nil && d.HasPlans() {
			return fmt.Errorf("domain %q: a rate_limit with plan: true needs a plan store (--postgres)", name)
		}
	}
	return nil
}

// SetConfig makes cfg the config of the calls that start from now on, if
// Check accepts it; else the old one stays.
func (s *Server) SetConfig(cfg *rlsconfig.Config) error {
	if err := s.Check(cfg); err != nil {
		return err
	}
	s.config.Store(cfg)
	return nil
}

// Config returns the config calls start with now.
func (s *Server) Config() *rlsconfig.Config { return s.config.Load() }

// ShouldRateLimit decides a request, as the package doc says. A request
// without a domain or descriptors is InvalidArgument. The caller's end
// (its cancel or deadline) ends the call with Canceled or
// DeadlineExceeded; a store that cannot decide, under the "error" fail
// mode, is Unavailable.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (resp *rlspb.RateLimitResponse, err error) {
	if s.requests != nil {
		defer func() { s.count(ctx, req.GetDomain(), resp, err) }()
	}
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "descriptors must not be empty")
	}
	cfg := s.config.Load()
	dom := cfg.Domain(req.GetDomain())
	mode := s.opts.DefaultFailMode
	if dom != nil && dom.FailMode != "" {
		mode = dom.FailMode
	}
	c := call{Server: s, mode: mode, req: req}
	c.match(dom)
	resp = &rlspb.RateLimitResponse{
		OverallCode: rlspb.RateLimitResponse_OK,
		Statuses:    make([]*rlspb.RateLimitResponse_DescriptorStatus, len(descs)),
	}
	for i := range descs {
		st, err := c.decide(ctx, i)
		if err != nil {
			return nil, err
		}
		resp.Statuses[i] = st
	}
	passed, over := c.verdict(resp.Statuses)
	if over && !s.opts.ShadowMode {
		resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
	}
	resp.ResponseHeadersToAdd = c.responseHeaders()
	if s.opts.DynamicMetadata {
		resp.DynamicMetadata = c.dynamicMetadata(passed)
	}
	return resp, nil
}

// verdict returns the descriptors that passed (unlimited ones aside), and
// whether the request is over: over a limit that is not a quota, or over
// every quota it matched.
func (c *call) verdict(statuses []*rlspb.RateLimitResponse_DescriptorStatus) (passed []int, over bool) {
	failedLimits, failedQuotas, quotas := 0, 0, 0
	for i, st := range statuses {
		l := c.matches[i].Limit
		if l != nil && l.Unlimited {
			continue
		}
		quota := c.opts.QuotaMode || (l != nil && l.QuotaMode)
		switch {
		case st.Code != rlspb.RateLimitResponse_OVER_LIMIT:
			passed = append(passed, i)
		case quota:
			failedQuotas++
		default:
			failedLimits++
		}
		if quota {
			quotas++
		}
	}
	return passed, failedLimits > 0 || (quotas > 0 && failedQuotas == quotas)
}

// count adds a call to the requests counter.
func (s *Server) count(ctx context.Context, domain string, resp *rlspb.RateLimitResponse, err error) {
	if s.Config().Domain(domain) == nil {
		domain = "unknown" // a caller's domain names are not telemetry
	}
	code := resp.GetOverallCode().String()
	if err != nil {
		code = status.Code(err).String()
	}
	s.requests.Add(ctx, 1, metric.WithAttributes(attribute.String("domain", domain), attribute.String("code", code)))
}

// call is one request's decisions.
type call struct {
	*Server
	mode string // the domain's fail mode
	req  *rlspb.RateLimitRequest
	// matches are each descriptor's match, with no Limit for none.
	matches []rlsconfig.Match
	// decided are each descriptor's decision and its bucket's config,
	// where a bucket decided it.
	decided []decided
}

type decided struct {
	ok  bool
	d   ratelimit.Decision
	cfg ratelimit.Config
}

// match looks each descriptor up, and drops the matches that another's
// replaces names.
func (c *call) match(dom *rlsconfig.Domain) {
	descs := c.req.GetDescriptors()
	c.matches = make([]rlsconfig.Match, len(descs))
	c.decided = make([]decided, len(descs))
	if dom == nil {
		return
	}
	var replaced []string
	for i, d := range descs {
		if m, ok := dom.Lookup(d); ok {
			c.matches[i] = m
			replaced = append(replaced, m.Limit.Replaces...)
		}
	}
	for i, m := range c.matches {
		if m.Limit != nil && m.Limit.Name != "" && slices.Contains(replaced, m.Limit.Name) {
			c.matches[i] = rlsconfig.Match{}
		}
	}
}

// cost is descriptor d's hits: its own hits_addend, else the request's,
// else 1.
func (c *call) cost(d *commonpb.RateLimitDescriptor) uint64 {
	if h := d.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	if h := c.req.GetHitsAddend(); h != 0 {
		return uint64(h)
	}
	return 1
}

// decide returns descriptor i's status.
func (c *call) decide(ctx context.Context, i int) (*rlspb.RateLimitResponse_DescriptorStatus, error) {
	m := c.matches[i]
	l := m.Limit
	switch {
	case l == nil:
		return &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}, nil
	case l.Unlimited:
		return &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}, nil
	case l.Blocked():
		return c.blocked(l), nil
	}
	cfg := l.Config
	if l.Plan {
		pc, err := c.opts.Plans.Config(ctx, m.Subject)
		if err != nil {
			return nil, c.failed(ctx, err)
		}
		cfg = pc
	}
	req := ratelimit.Request{
		Op:     ratelimit.Consume,
		Tokens: int64(min(c.cost(c.req.GetDescriptors()[i]), math.MaxInt64)),
		// A plan change keeps a bucket's tokens, as the SDK's Limiter does.
		Strategy: ratelimit.DefaultInheritance,
	}
	if req.Tokens == 0 {
		req.Op = ratelimit.Inspect
	}
	backend := c.opts.Backend(c.mode, l.Shards)
	d, err := backend.Do(ctx, m.Key, cfg, req)
	if errors.Is(err, ratelimit.ErrInvalidRequest) && req.Op == ratelimit.Consume {
		// More than the bucket can ever hold: over the limit, and nothing
		// taken. Inspect tells the rest.
		if d, err = backend.Do(ctx, m.Key, cfg, ratelimit.Request{Op: ratelimit.Inspect}); err == nil {
			d.Allowed, d.Remaining = false, 0
		}
	}
	if err != nil {
		return nil, c.failed(ctx, err)
	}
	c.decided[i] = decided{ok: true, d: d, cfg: cfg}
	st := &rlspb.RateLimitResponse_DescriptorStatus{
		Code:               rlspb.RateLimitResponse_OK,
		CurrentLimit:       currentLimit(l, cfg, d),
		LimitRemaining:     uint32(min(max(d.Remaining, 0), math.MaxUint32)),
		DurationUntilReset: durationpb.New(d.ResetAfter),
	}
	if !d.Allowed {
		st.LimitRemaining = 0
		if !l.ShadowMode {
			st.Code = rlspb.RateLimitResponse_OVER_LIMIT
		}
	}
	return st, nil
}

// failed is the gRPC error of a decision that err ended: the caller's own
// end as such, anything else Unavailable.
func (c *call) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.Unavailable, "rate limit store: "+err.Error())
}

// blocked is the status of a limit of 0 requests per unit: over the limit
// until the unit's window ends, nothing counted.
func (c *call) blocked(l *rlsconfig.Limit) *rlspb.RateLimitResponse_DescriptorStatus {
	unit := rlsconfig.UnitLength(l.Unit)
	now := c.opts.Clock()
	code := rlspb.RateLimitResponse_OVER_LIMIT
	if l.ShadowMode {
		code = rlspb.RateLimitResponse_OK
	}
	return &rlspb.RateLimitResponse_DescriptorStatus{
		Code:               code,
		CurrentLimit:       &rlspb.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: 0, Unit: l.Unit},
		DurationUntilReset: durationpb.New(unit - time.Duration(now.UnixNano())%unit),
	}
}

// currentLimit is the limit a status reports: the one the config writes,
// or for bandwidths and plans the bandwidth the decision names.
func currentLimit(l *rlsconfig.Limit, cfg ratelimit.Config, d ratelimit.Decision) *rlspb.RateLimitResponse_RateLimit {
	if !l.Plan && len(cfg.Bandwidths) == 1 {
		return &rlspb.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: l.Unit}
	}
	bw := cfg.Bandwidths[0]
	for i := range cfg.Bandwidths {
		if cfg.BandwidthName(i) == d.Bandwidth {
			bw = cfg.Bandwidths[i]
			break
		}
	}
	unit, rpu := rlsconfig.Reported(bw)
	name := l.Name
	if name == "" {
		name = bw.ID
	}
	return &rlspb.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: unit}
}

// responseHeaders are the rate-limit fields of the descriptor that binds
// the request: the first that is over its limit, else the one with the
// fewest requests left; none when no bucket decided any.
func (c *call) responseHeaders() []*corepb.HeaderValue {
	if c.writer == nil {
		return nil
	}
	best := -1
	for i, dd := range c.decided {
		if !dd.ok {
			continue
		}
		if !dd.d.Allowed {
			best = i
			break
		}
		if best < 0 || dd.d.Remaining < c.decided[best].d.Remaining {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	h := http.Header{}
	c.writer.Write(h, c.decided[best].cfg, c.decided[best].d)
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]*corepb.HeaderValue, 0, len(names))
	for _, name := range names {
		for _, v := range h[name] {
			out = append(out, &corepb.HeaderValue{Key: name, Value: v})
		}
	}
	return out
}

// dynamicMetadata is the response's dynamic metadata, in the shape
// envoyproxy/ratelimit gives it: the domain; each descriptor's entries
// ("key=value"), its limit override and its hits_addend, where it has
// them; the request's hits_addend, if not 0; and the metadata of the
// passed descriptors' limits, merged (the first value of a key wins, and
// structs merge).
func (c *call) dynamicMetadata(passed []int) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(c.req.GetDomain())}
	var descs []*structpb.Value
	for _, d := range c.req.GetDescriptors() {
		entries := make([]*structpb.Value, len(d.GetEntries()))
		for i, e := range d.GetEntries() {
			entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if d.GetLimit() != nil {
			df["limit"] = structpb.NewStringValue(d.GetLimit().String())
		}
		if h := d.GetHitsAddend(); h != nil {
			df["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := c.req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	merged := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for _, i := range passed {
		if l := c.matches[i].Limit; l != nil && l.Metadata != nil {
			merge(merged, l.Metadata)
		}
	}
	if len(merged.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(merged)
	}
	return &structpb.Struct{Fields: fields}
}

// merge adds src's fields to dst: a key dst has keeps its value, unless
// both are structs, which merge.
func merge(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		switch {
		case !ok:
			// A copy: the config's struct is shared by every call.
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
		case have.GetStructValue() != nil && v.GetStructValue() != nil:
			merge(have.GetStructValue(), v.GetStructValue())
		}
	}
}
