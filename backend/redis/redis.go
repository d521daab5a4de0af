// Package redisbackend keeps sluice's buckets in Redis through a go-redis
// v9 client the service already has: a plain client, a cluster client, a
// failover (Sentinel) client or a ring.
//
// Each decision is one EVALSHA of a Lua script on one key, so it is atomic
// however many processes share the bucket, and the server's clock decides.
// The script is sent with EVAL once whenever the server lacks it (after a
// restart, a failover or SCRIPT FLUSH), and cached again. The same script,
// key layout and state serve [github.com/sluicehq/sluice/backend/rueidis],
// so processes on either client share buckets.
//
// # Keys
//
// The bucket at key k lives in the Redis key {k}, after an optional prefix
// ([WithPrefix]). The braces make k the cluster hash tag, so a bucket is
// one key on one slot; braces and '%' inside k are percent-encoded, so a
// caller cannot choose the slot of its bucket. A key holds a few dozen bytes
// and expires within a second after the bucket has refilled: an idle bucket
// costs nothing.
//
// # Retries
//
// go-redis retries a command up to MaxRetries times (3 unless set) after a
// network error, including a read timeout after the command was sent. A
// decision whose reply was lost has already taken its tokens, and the
// retry takes them again: under network trouble a client is charged twice.
// Give the limiter a client with MaxRetries: -1 (see the example), or
// accept the double charge; [Backend.Check] reports it.
//
// # Errors
//
// Do returns errors wrapping [ratelimit.ErrTimeout] for a deadline or
// network timeout and [ratelimit.ErrBackendUnavailable] for any other
// failure of the client or the server; the go-redis error stays reachable
// with errors.Is and errors.As.
package redisbackend

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// Backend is a [ratelimit.Backend] over a go-redis client. It is safe for
// concurrent use, and holds nothing but the client: closing the client is
// the caller's business.
type Backend struct {
	client   redis.UniversalClient
	settings redisscript.Settings
}

var _ ratelimit.Backend = (*Backend)(nil)

// DefaultPrefix is the key prefix unless [WithPrefix] sets one: none, so
// that a bucket key is no longer than it must be.
const DefaultPrefix = ""

// Option configures a [Backend].
type Option func(*redisscript.Settings)

// WithPrefix puts prefix before every bucket key, to keep sluice's keys
// apart from others in the same database (and match ACL key patterns). It
// must not contain '{' or '}'. Every byte of it is stored in every key.
func WithPrefix(prefix string) Option {
	return func(s *redisscript.Settings) { s.Prefix = prefix }
}

// WithClock makes the script decide on c's time instead of the server's.
// It is for tests that step time by hand, such as
// [github.com/sluicehq/sluice/ratelimit/ratelimittest]: in production
// every replica must decide on one clock, the server's. The keys' TTLs
// still count in the server's real time, so they are lengthened by a
// minute; the expiry kept in each key decides. A nil c keeps the server's
// clock.
func WithClock(c ratelimit.Clock) Option {
	return func(s *redisscript.Settings) { s.Clock = c }
}

// New returns a Backend that keeps buckets in Redis through client. It
// returns an error wrapping [ratelimit.ErrInvalidConfig] for a nil client or
// a bad option. It does not talk to the server; [Backend.Check] does.
func New(client redis.UniversalClient, opts ...Option) (*Backend, error) {
	b := &Backend{client: client, settings: redisscript.Settings{Prefix: DefaultPrefix}}
	for _, opt := range opts {
		opt(&b.settings)
	}
	if client == nil {
		return nil, fmt.Errorf("%w: sluice/redis: the client is nil", ratelimit.ErrInvalidConfig)
	}
	if err := b.settings.Check(); err != nil {
		return nil, err
	}
	return b, nil
}

// scripts are redisscript.Scripts, ready to run.
var scripts = func() []*redis.Script {
	s := make([]*redis.Script, len(redisscript.Scripts))
	for i, src := range redisscript.Scripts {
		s[i] = redis.NewScript(src.Source)
	}
	return s
}()

// Do applies req to the bucket at key in one script call; see
// [ratelimit.Backend].
func (b *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	call, err := b.settings.Prepare(key, cfg, req)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	reply, err := scripts[call.Script].Run(ctx, b.client, []string{call.Key}, call.Arg).Int64Slice()
	if err != nil {
		return ratelimit.Decision{}, redisscript.Error(err, fmt.Sprintf("sluice/redis: %v on key %q", req.Op, key))
	}
	return call.Decision(reply)
}

// Report is what [Backend.Check] found: each server's version and
// maxmemory-policy, and every problem in words.
type Report = redisscript.Report

// Server is one server in a [Report].
type Server = redisscript.Server

// ErrUnsafeServer is wrapped by the error [Backend.Check] returns when a
// setting can break the limits.
var ErrUnsafeServer = redisscript.ErrUnsafeServer

// Check asks every server the client reaches (each shard of a cluster or
// ring) for its version and maxmemory-policy, loads the script there, and
// looks at the client's retry setting. It returns the [Report] and, if a
// setting can break the limits, an error wrapping [ErrUnsafeServer]:
//
//   - a maxmemory-policy other than noeviction: Redis may evict bucket keys
//     under memory pressure, and an evicted bucket starts full again;
//   - MaxRetries above 0 on the client: see Retries in the package comment.
//
// An error reaching a server wraps [ratelimit.ErrBackendUnavailable] or
// [ratelimit.ErrTimeout]. Run Check at start-up and log or refuse the
// problems; Do does not call it.
func (b *Backend) Check(ctx context.Context) (Report, error) {
	var (
		mu      sync.Mutex
		servers []Server
	)
	check := func(ctx context.Context, addr string, c redis.Cmdable) error {
		info, err := c.Info(ctx).Result()
		for _, script := range scripts {
			if err == nil {
				err = script.Load(ctx, c).Err()
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		mu.Lock()
		defer mu.Unlock()
		servers = append(servers, redisscript.ParseInfo(addr, info))
		return nil
	}
	shard := func(ctx context.Context, c *redis.Client) error { return check(ctx, c.Options().Addr, c) }
	var err error
	switch c := b.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachShard(ctx, shard)
	case *redis.Ring:
		err = c.ForEachShard(ctx, shard)
	case *redis.Client:
		err = shard(ctx, c)
	default:
		err = check(ctx, fmt.Sprintf("%T", c), c)
	}
	if err != nil {
		return Report{}, redisscript.Error(err, "sluice/redis: Check")
	}
	var problems []string
	if n := maxRetries(b.client); n > 0 {
		problems = append(problems, fmt.Sprintf("the client retries a command up to %d times after a network error, so a decision whose reply was lost is charged again; set MaxRetries: -1 on the limiter's client", n))
	}
	return redisscript.Assess(servers, problems...)
}

// maxRetries is the client's retry count, or 0 if it cannot be told.
func maxRetries(c redis.UniversalClient) int {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().MaxRetries
	case *redis.ClusterClient:
		return c.Options().MaxRetries
	case *redis.Ring:
		return c.Options().MaxRetries
	}
	return 0
}
