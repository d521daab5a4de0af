package grpclimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
)

// Interceptors limit a gRPC server's calls with a [ratelimit.Limiter]:
// their rate, their concurrency, or both. Make them with [New] and install
// both, so that unary calls and streams are limited alike:
//
//	grpc.NewServer(
//		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
//
// They are safe for concurrent use.
type Interceptors struct {
	limiter *ratelimit.Limiter
	options
	headers *httplimit.HeaderWriter // nil: no rate limit or no fields
}

// New returns interceptors that decide each call with limiter before its
// handler runs: its rate by the config of [WithConfig] or
// [WithConfigFunc], its concurrency by [WithConcurrency] or
// [WithConcurrencyFunc], or both, the rate first (at least one is
// required). A call's key is [PeerKey]'s unless [WithKey] says otherwise.
//
// A call the rate limit refuses ends with codes.ResourceExhausted and a
// google.rpc.RetryInfo detail whose delay is the decision's RetryAfter,
// exact to the microsecond; with the draft-10 RateLimit and
// RateLimit-Policy fields as header metadata (see [WithHeaders]), on
// every call the rate limit decides. A call the concurrency limit refuses
// ends with codes.ResourceExhausted, or codes.Unavailable by
// [WithConcurrencyCode], and a RetryInfo of the time until the first held
// lease ends, at most [MaxConcurrencyRetryAfter].
//
// When the limiter cannot decide (the store failed or timed out, it
// refused the key, a fail policy refused without it, a config or limit
// function failed), the call ends with codes.Unavailable and a RetryInfo
// ([FailRetryAfter], or the fail policy's), unless [WithFailOpen] lets it
// through. A misused limiter (an invalid config, limit or key, a Backend
// that holds no permits) ends it with codes.Internal, saying how. A call
// whose context ended first gets its context's code (codes.Canceled,
// codes.DeadlineExceeded). In each of these cases the handler is not
// called.
//
// An option that does not hold is an error naming it, and New then returns
// no interceptors.
func New(limiter *ratelimit.Limiter, opts ...Option) (*Interceptors, error) {
	if limiter == nil {
		return nil, errors.New("grpclimit: New: nil limiter")
	}
	o := options{key: PeerKey, headers: DefaultHeaders}
	for _, opt := range opts {
		if opt == nil {
			return nil, errors.New("grpclimit: New: nil option")
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.config == nil && o.concurrency == nil {
		return nil, errors.New("grpclimit: New: no limit: pass WithConfig, WithConfigFunc, WithConcurrency or WithConcurrencyFunc")
	}
	if o.concurrency == nil && (o.concurrencyKey != nil || o.concurrencyCode != codes.OK) {
		return nil, errors.New("grpclimit: New: WithConcurrencyKey and WithConcurrencyCode need WithConcurrency or WithConcurrencyFunc")
	}
	if o.concurrencyCode == codes.OK {
		o.concurrencyCode = DefaultConcurrencyCode
	}
	in := &Interceptors{limiter: limiter, options: o}
	if o.config != nil && o.headers != 0 {
		in.headers = httplimit.NewHeaderWriter(o.headers)
	}
	return in, nil
}

// UnaryServerInterceptor returns the interceptor of unary calls: the
// call's permit, if any, is held while its handler runs.
func (in *Interceptors) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		a, err := in.admit(ctx, info.FullMethod)
		if a.header != nil {
			_ = grpc.SetHeader(ctx, a.header) // fails only once headers are sent: not before the handler
		}
		if err != nil {
			return nil, err
		}
		if a.permit == nil {
			return handler(ctx, req)
		}
		var resp any
		a.permit.Hold(ctx, func() { resp, err = handler(ctx, req) })
		return resp, err
	}
}

// StreamServerInterceptor returns the interceptor of streams: the
// stream's permit, if any, is held until its handler returns, when the
// stream ends.
func (in *Interceptors) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		a, err := in.admit(ctx, info.FullMethod)
		if a.header != nil {
			_ = ss.SetHeader(a.header)
		}
		if err != nil {
			return err
		}
		if a.permit == nil {
			return handler(srv, ss)
		}
		a.permit.Hold(ctx, func() { err = handler(srv, ss) })
		return err
	}
}

// admission is a call let through: the header metadata to send, and the
// permit to hold while it runs (nil for none).
type admission struct {
	header metadata.MD
	permit *ratelimit.Permit
}

// admit decides the call to method: the rate, then the concurrency. An
// error is the status the call ends with.
func (in *Interceptors) admit(ctx context.Context, method string) (admission, error) {
	var a admission
	key, err := in.key(ctx, method)
	if err != nil {
		return a, keyError(err)
	}
	if in.config != nil {
		d, cfg, err := in.decideRate(ctx, method, key)
		switch {
		case err != nil:
			if err = in.fail(ctx, err); err != nil {
				return a, err
			}
		default:
			a.header = in.header(cfg, d)
			if !d.Allowed {
				return a, rateRefusal(d)
			}
		}
	}
	if in.concurrency == nil {
		return a, nil
	}
	p, d, err := in.acquire(ctx, method, key)
	switch {
	case err != nil:
		return a, in.fail(ctx, err) // nil when open: the call goes on without a permit
	case p == nil:
		return a, in.concurrencyRefusal(d)
	}
	a.permit = p
	return a, nil
}

// decideRate takes a token from key's bucket.
func (in *Interceptors) decideRate(ctx context.Context, method, key string) (ratelimit.Decision, ratelimit.Config, error) {
	cfg, err := in.config(ctx, method)
	if err != nil {
		return ratelimit.Decision{}, cfg, err
	}
	d, err := in.limiter.Allow(ctx, key, cfg)
	return d, cfg, err
}

// acquire tries to take a permit for the call.
func (in *Interceptors) acquire(ctx context.Context, method, key string) (*ratelimit.Permit, ratelimit.PermitDecision, error) {
	lim, err := in.concurrency(ctx, method)
	if err != nil {
		return nil, ratelimit.PermitDecision{}, err
	}
	if in.concurrencyKey != nil {
		if key, err = in.concurrencyKey(ctx, method); err != nil {
			return nil, ratelimit.PermitDecision{}, keyError(err)
		}
	}
	return in.limiter.TryAcquire(ctx, key, lim, 1)
}

// header is the rate-limit fields of decision d on a bucket of config
// cfg, as metadata; nil for none.
func (in *Interceptors) header(cfg ratelimit.Config, d ratelimit.Decision) metadata.MD {
	if in.headers == nil {
		return nil
	}
	h := make(http.Header, 4)
	in.headers.Write(h, cfg, d)
	if len(h) == 0 {
		return nil
	}
	md := make(metadata.MD, len(h))
	for name, v := range h {
		md[strings.ToLower(name)] = v
	}
	return md
}

// rateRefusal is the status of a call the rate limit refused.
func rateRefusal(d ratelimit.Decision) error {
	if d.Degraded && d.Bandwidth == "" {
		// A fail policy refused without the store (Closed, or Local with
		// no room for the key): the limiter is out, not the caller's
		// quota.
		return unavailable(d.RetryAfter)
	}
	return withRetry(codes.ResourceExhausted, "grpclimit: rate limit exceeded", d.RetryAfter)
}

// concurrencyRefusal is the status of a call the concurrency limit
// refused.
func (in *Interceptors) concurrencyRefusal(d ratelimit.PermitDecision) error {
	if d.Degraded && d.InFlight == 0 {
		// A fail policy refused without a count (Closed, or Local
		// unable to decide): the limiter is out, not the caller's share.
		// Local's own share being full is the caller's.
		return unavailable(d.RetryAfter)
	}
	msg := "grpclimit: too many calls in flight"
	if in.concurrencyCode == codes.Unavailable {
		msg = "grpclimit: the server is at capacity"
	}
	return withRetry(in.concurrencyCode, msg, min(d.RetryAfter, MaxConcurrencyRetryAfter))
}

// fail is the status of a call the limiter could not decide, nil to let
// it through.
func (in *Interceptors) fail(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, ratelimit.ErrInvalidConfig) || errors.Is(err, ratelimit.ErrInvalidKey) ||
		errors.Is(err, ratelimit.ErrInvalidRequest) || errors.Is(err, errors.ErrUnsupported):
		return status.Error(codes.Internal, "grpclimit: the limiter is misconfigured: "+err.Error())
	case in.failOpen:
		return nil
	}
	return unavailable(0)
}

// unavailable is the status of a call refused because the limiter could
// not decide; wait is a fail policy's, 0 for none.
func unavailable(wait time.Duration) error {
	if wait <= 0 {
		wait = FailRetryAfter
	}
	return withRetry(codes.Unavailable, "grpclimit: the rate limiter cannot decide right now", wait)
}

// withRetry is a status of code with a RetryInfo of wait, which the
// message says too.
func withRetry(c codes.Code, msg string, wait time.Duration) error {
	st := status.New(c, fmt.Sprintf("%s: retry in %v", msg, wait))
	withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
	if err != nil { // not for a RetryInfo, which always marshals
		return st.Err()
	}
	return withInfo.Err()
}

// keyError is the status of a call whose key could not be found.
func keyError(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, "grpclimit: key: "+err.Error())
}

// keyPrefix starts the keys of [PeerKey].
const keyPrefix = "grpc:"

// PeerKey is the default [KeyFunc]: each method's calls from each peer
// address (its host, without the port) share a bucket,
//
//	grpc:/pkg.Service/Method:203.0.113.7
//
// A peer is the connection's, not a client behind a proxy: behind a load
// balancer, key by what your authentication found instead (see [WithKey]).
// A call with no peer (in a test) is keyed by "unknown". The full method
// is the path the client sent, which a server with an unknown-service
// handler lets it choose: a key too long for [ratelimit.MaxKeyLen] has
// what follows "grpc:" replaced by "~" and a digest.
func PeerKey(ctx context.Context, fullMethod string) (string, error) {
	host := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		host = p.Addr.String()
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
	}
	id := fullMethod + ":" + host
	if len(keyPrefix)+len(id) > ratelimit.MaxKeyLen {
		sum := sha256.Sum256([]byte(id))
		id = "~" + hex.EncodeToString(sum[:16])
	}
	return keyPrefix + id, nil
}
