package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
)

// DefaultHeaders are the rate-limit fields sent as response header
// metadata unless [WithHeaders] says otherwise: draft-10's RateLimit and
// RateLimit-Policy.
const DefaultHeaders = httplimit.IETFHeaders

// DefaultConcurrencyCode is the code of a call the concurrency limit
// refuses, unless [WithConcurrencyCode] says otherwise.
const DefaultConcurrencyCode = codes.ResourceExhausted

// MaxConcurrencyRetryAfter caps the RetryInfo delay of a call the
// concurrency limit refuses, as [httplimit.MaxConcurrencyRetryAfter] caps
// the middleware's Retry-After, for the same reason: the store's answer
// is the time until the first held lease ends, the latest a permit is
// sure to come back, and most calls end long before their lease.
const MaxConcurrencyRetryAfter = httplimit.MaxConcurrencyRetryAfter

// FailRetryAfter is the RetryInfo delay of a call refused because the
// limiter could not decide (codes.Unavailable) when no fail policy says
// another: the middleware's Retry-After of 1 s for a 503.
const FailRetryAfter = time.Second

// A KeyFunc returns the key of a call's bucket or permits, from its
// context (its metadata with metadata.FromIncomingContext, its peer with
// peer.FromContext, what an authentication interceptor before this one
// put there) and its full method name ("/pkg.Service/Method"). The key is
// the limiter's as it is: make it of what a client cannot vary freely (a
// validated API key, not a header it writes), or it gets a new bucket on
// every call. An error that carries a gRPC status (status.Error) ends the
// call with that status; any other with codes.Internal.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// An Option configures [New].
type Option func(*options) error

type options struct {
	key               KeyFunc
	keyOption         string
	config            func(context.Context, string) (ratelimit.Config, error)
	configOption      string
	concurrency       func(context.Context, string) (ratelimit.Concurrency, error)
	concurrencyOption string
	concurrencyKey    KeyFunc
	concurrencyCode   codes.Code
	headers           httplimit.Headers
	failOpen          bool
}

// claim records that option name gives what, which one option at most may
// give: by holds the option that did.
func claim(by *string, name, what string) error {
	if *by != "" {
		return fmt.Errorf("grpclimit: %s: the %s is already given by %s", name, what, *by)
	}
	*by = name
	return nil
}

// WithKey sets the key of each call's bucket, and of its permits unless
// [WithConcurrencyKey] says otherwise (default [PeerKey]).
func WithKey(f KeyFunc) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("grpclimit: WithKey: nil function")
		}
		if err := claim(&o.keyOption, "WithKey", "key"); err != nil {
			return err
		}
		o.key = f
		return nil
	}
}

// WithConfig limits the rate of every call with cfg. It is checked with
// [ratelimit.Config.Validate]: an invalid config fails [New].
func WithConfig(cfg ratelimit.Config) Option {
	return func(o *options) error {
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("grpclimit: WithConfig: %w", err)
		}
		cfg.Bandwidths = append([]ratelimit.Bandwidth(nil), cfg.Bandwidths...)
		return o.setConfig("WithConfig", func(context.Context, string) (ratelimit.Config, error) { return cfg, nil })
	}
}

// WithConfigFunc limits the rate of each call with the config f returns
// for it: a method's own, or its caller's plan (the Supplier of a
// plans.Cache, say). An error from f is answered as the store failing is
// (see [New]); a config that does not validate, as a misused limiter.
func WithConfigFunc(f func(ctx context.Context, fullMethod string) (ratelimit.Config, error)) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("grpclimit: WithConfigFunc: nil function")
		}
		return o.setConfig("WithConfigFunc", func(ctx context.Context, method string) (ratelimit.Config, error) {
			cfg, err := f(ctx, method)
			if err != nil {
				return cfg, fmt.Errorf("grpclimit: WithConfigFunc: %w", err)
			}
			return cfg, nil
		})
	}
}

func (o *options) setConfig(name string, f func(context.Context, string) (ratelimit.Config, error)) error {
	if err := claim(&o.configOption, name, "config"); err != nil {
		return err
	}
	o.config = f
	return nil
}

// WithConcurrency limits the calls each key has in flight at once to
// lim.Limit, across every server that shares the store. A unary call
// holds a permit while its handler runs, a stream while its handler does
// (until the stream ends); a call that finds every permit held is refused
// at once, never queued. A permit is leased for lim.Lease on the store's
// clock, so that the permits of a server that died come back within it;
// a call still running a third of a lease after it began has its permit
// renewed every third of a lease until it ends, so a stream may last any
// time. Size the lease for how long a dead server may keep its permits,
// not for the longest stream.
//
// With a rate limit too, the rate is decided first: a call it refuses
// takes no permit, and one the concurrency limit refuses has taken its
// token. lim is checked with [ratelimit.Concurrency.Validate]: an invalid
// limit fails [New]. The Limiter's Backend must hold permits
// ([ratelimit.PermitBackend]); each store of sluice's does.
func WithConcurrency(lim ratelimit.Concurrency) Option {
	return func(o *options) error {
		if err := lim.Validate(); err != nil {
			return fmt.Errorf("grpclimit: WithConcurrency: %w", err)
		}
		return o.setConcurrency("WithConcurrency", func(context.Context, string) (ratelimit.Concurrency, error) { return lim, nil })
	}
}

// WithConcurrencyFunc is [WithConcurrency] with the limit f returns for
// each call. An error from f is answered as the store failing is (see
// [New]); a limit that does not validate, as a misused limiter.
func WithConcurrencyFunc(f func(ctx context.Context, fullMethod string) (ratelimit.Concurrency, error)) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("grpclimit: WithConcurrencyFunc: nil function")
		}
		return o.setConcurrency("WithConcurrencyFunc", func(ctx context.Context, method string) (ratelimit.Concurrency, error) {
			lim, err := f(ctx, method)
			if err != nil {
				return lim, fmt.Errorf("grpclimit: WithConcurrencyFunc: %w", err)
			}
			return lim, nil
		})
	}
}

func (o *options) setConcurrency(name string, f func(context.Context, string) (ratelimit.Concurrency, error)) error {
	if err := claim(&o.concurrencyOption, name, "concurrency limit"); err != nil {
		return err
	}
	o.concurrency = f
	return nil
}

// WithConcurrencyKey sets the key of each call's permits apart from its
// bucket's: a method's name, say, to limit the calls in flight on each
// method whoever makes them, or a constant for the whole fleet's.
// Without it a call's permits are at its bucket's key ([WithKey]): a
// store keeps a key's permits apart from its bucket, as ratelimittest
// checks.
func WithConcurrencyKey(f KeyFunc) Option {
	return func(o *options) error {
		if f == nil {
			return errors.New("grpclimit: WithConcurrencyKey: nil function")
		}
		o.concurrencyKey = f
		return nil
	}
}

// WithConcurrencyCode sets the code of a call the concurrency limit
// refuses: codes.ResourceExhausted (the default) or codes.Unavailable.
// Both carry a RetryInfo.
//
// ResourceExhausted says that this caller has too many calls in flight:
// right for a key of one caller's own. Unavailable says that the server is
// at capacity: right for a key that many callers share
// ([WithConcurrencyKey]), where no one caller is at fault; a client's
// retry policy retries it, on another server if its balancer picks one.
func WithConcurrencyCode(c codes.Code) Option {
	return func(o *options) error {
		if c != codes.ResourceExhausted && c != codes.Unavailable {
			return fmt.Errorf("grpclimit: WithConcurrencyCode: code must be ResourceExhausted or Unavailable, got %v", c)
		}
		o.concurrencyCode = c
		return nil
	}
}

// WithHeaders selects the rate-limit fields sent as response header
// metadata with every call the rate limit decides, allowed or not
// (default [DefaultHeaders]), written as httplimit's
// [httplimit.HeaderWriter] writes them, under lower-case names
// ("ratelimit-policy", "ratelimit", "x-ratelimit-limit", ...), with
// "retry-after" on a refusal; 0 sends none.
func WithHeaders(h httplimit.Headers) Option {
	return func(o *options) error {
		if h&^httplimit.DefaultHeaders != 0 {
			return fmt.Errorf("grpclimit: WithHeaders: unknown headers %#x", uint8(h&^httplimit.DefaultHeaders))
		}
		o.headers = h
		return nil
	}
}

// WithFailOpen lets a call through when the limiter cannot decide: the
// store failed or timed out, it refused the key, or a config or limit
// function failed. The call then holds no permit. By default such a call
// is refused with codes.Unavailable (fail closed), as httplimit answers
// 503. A fail policy (sluice's failpolicy, in the Limiter's Backend)
// decides more finely, and its decisions are the store's to this package:
// one it lets through passes, one it refuses is refused.
//
// A misused limiter (an invalid config, limit or key, a Backend that holds
// no permits) is never let through, and a call whose own context ended
// gets its context's code, either way.
func WithFailOpen() Option {
	return func(o *options) error {
		o.failOpen = true
		return nil
	}
}
