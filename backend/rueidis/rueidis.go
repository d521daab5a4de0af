// Package rueidisbackend keeps sluice's buckets in Redis through a rueidis
// client the service already has, standalone, cluster or Sentinel.
//
// Each decision is one call of a Lua function on one key (FCALL), so it is
// atomic however many processes share the bucket, and the server's clock
// decides.
// rueidis pipelines concurrent commands on shared connections
// automatically, so many goroutines deciding at once share round trips: at
// high concurrency this backend does several times the decisions per
// second of one that takes a pooled connection per call.
//
// The Redis Functions library, its loading on a server that lacks it and
// the fall back to scripts (EVALSHA) on a server that refuses Functions,
// the key layout and the stored state are those of
// [github.com/sluicehq/sluice/backend/redis], so processes on either client
// share buckets; see that package.
//
// # Permits
//
// [Backend.DoPermit] holds concurrency permits ([ratelimit.Concurrency]) as
// [github.com/sluicehq/sluice/backend/redis] does, in the same library,
// key and layout, so processes on either client share them.
//
// # Retries
//
// rueidis retries only commands marked read-only or retryable after a
// network error; FCALL and EVALSHA are neither, so a decision whose reply
// was lost is never sent twice (and never charged twice). Such a call
// returns an error: the tokens may or may not have been taken.
//
// # Errors
//
// Do and DoPermit return errors wrapping [ratelimit.ErrTimeout] when a
// timeout of the client's own (ConnWriteTimeout, say) ends the call,
// [ratelimit.ErrKeyRejected] when the key holds a value sluice did not
// write (another application's, a Redis type no script keeps, or a damaged
// state; the key is left as it is), and [ratelimit.ErrBackendUnavailable]
// for any other failure of the client or the server. When the caller's
// context has ended, the error wraps the context's ([context.Canceled] or
// [context.DeadlineExceeded]) and none of these: the caller gave up, the
// store did not fail. A call whose context is already done sends nothing;
// one whose context ends while it is out may still have run the script.
// rueidis returns at the cancel.
//
// The message names the sentinel, the backend, the op and the key, then
// the rueidis error, which stays reachable with errors.Is and errors.As:
//
//	ratelimit: key rejected: sluice/rueidis: Consume on key "k": sluice: key {k} holds a value sluice did not write
package rueidisbackend

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/backend/redischeck"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// Backend is a [ratelimit.Backend] over a rueidis client. It is safe for
// concurrent use, and holds nothing but the client (and, for a cluster, the
// slot map of [Backend.Node]): closing the client is the caller's business.
type Backend struct {
	client rueidis.Client
	rs     redisscript.Backend
}

var (
	_ ratelimit.Backend       = (*Backend)(nil)
	_ ratelimit.PermitBackend = (*Backend)(nil)
)

// name names the backend in its errors.
const name = "sluice/rueidis"

// DefaultPrefix is the key prefix unless [WithPrefix] sets one: none, so
// that a bucket key is no longer than it must be.
const DefaultPrefix = ""

// Option configures a [Backend].
type Option func(*options)

// options are what the [Option]s set: the settings both Redis backends
// take.
type options struct{ redisscript.Settings }

// WithPrefix puts prefix before every bucket key, to keep sluice's keys
// apart from others in the same database (and match ACL key patterns). It
// must not contain '{' or '}'. Every byte of it is stored in every key.
// Processes sharing buckets must use the same prefix.
func WithPrefix(prefix string) Option {
	return func(o *options) { o.Prefix = prefix }
}

// WithClock makes the script decide on c's time instead of the server's.
// It is for tests that step time by hand, such as
// [github.com/sluicehq/sluice/ratelimit/ratelimittest]: in production
// every replica must decide on one clock, the server's. The keys' TTLs
// still count in the server's real time, so they are lengthened by a
// minute; the expiry kept in each key decides. A nil c keeps the server's
// clock.
func WithClock(c ratelimit.Clock) Option {
	return func(o *options) { o.Clock = c }
}

// New returns a Backend that keeps buckets in Redis through client. It
// returns an error wrapping [ratelimit.ErrInvalidConfig] for a nil client
// (a nil pointer of a client type too) or a bad option. It does not talk
// to the server; [Backend.Check] does.
func New(client rueidis.Client, opts ...Option) (*Backend, error) {
	o := options{redisscript.Settings{Prefix: DefaultPrefix}}
	for _, opt := range opts {
		opt(&o)
	}
	if redisscript.NilClient(client) {
		return nil, fmt.Errorf("%w: %s: the client is nil", ratelimit.ErrInvalidConfig, name)
	}
	if err := o.Check(name); err != nil {
		return nil, err
	}
	return &Backend{client: client, rs: redisscript.Backend{
		Name: name, Settings: o.Settings, Runner: redisscript.NewRunner(scriptClient{client}), Topology: topology(client),
	}}, nil
}

// scripts are redisscript.Scripts, ready to run.
var scripts = func() []*rueidis.Lua {
	s := make([]*rueidis.Lua, len(redisscript.Scripts))
	for i, src := range redisscript.Scripts {
		s[i] = rueidis.NewLuaScript(src.Source)
	}
	return s
}()

// Do applies req to the bucket at key in one call of its function (or
// script); see [ratelimit.Backend].
func (b *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	return b.rs.Do(ctx, key, cfg, req)
}

// DoPermit applies req to the concurrency permits of key in one call of
// the permits' function (or script); see [ratelimit.PermitBackend] and
// Permits in the package documentation.
func (b *Backend) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	return b.rs.DoPermit(ctx, key, lim, req)
}

// scriptClient is the backend's client as [redisscript.Runner] uses it.
type scriptClient struct{ rueidis.Client }

func (c scriptClient) FCall(ctx context.Context, fn, key, arg string) (string, error) {
	return c.Do(ctx, c.B().Fcall().Function(fn).Numkeys(1).Key(key).Arg(arg).Build()).ToString()
}

func (c scriptClient) Eval(ctx context.Context, script int, key, arg string) (string, error) {
	return scripts[script].Exec(ctx, c.Client, []string{key}, []string{arg}).ToString()
}

// LoadFunctions sends FUNCTION LOAD, which names no key, to the slot of
// key, so that in a cluster the master that serves key gets it.
func (c scriptClient) LoadFunctions(ctx context.Context, key string) error {
	return c.Do(ctx, c.B().FunctionLoad().FunctionCode(redisscript.Functions.Source).Build().SetSlot(key)).Error()
}

// Report is what [Backend.Check] found, a [redischeck.Report]: Servers,
// every server the client reaches (a [Server] each), and Problems, each
// setting that can break the limits, in words, with how to fix it. Both
// Redis backends return this type.
type Report = redischeck.Report

// Server is one server in a [Report], a [redischeck.Server]: its Addr as
// the client knows it, and its Version and MaxmemoryPolicy from INFO.
type Server = redischeck.Server

// ErrUnsafeServer is wrapped by the error [Backend.Check] returns when a
// setting can break the limits. It is [redischeck.ErrUnsafeServer].
var ErrUnsafeServer = redischeck.ErrUnsafeServer

// Check asks every server the client reaches (each node of a cluster) for
// its version and maxmemory-policy, and loads the library there (a replica
// gets it from its master; a server that refuses Redis Functions, the
// scripts). It returns
// the [Report] and, if a server's maxmemory-policy is not noeviction (Redis
// may then evict bucket keys under memory pressure, and an evicted bucket
// starts full again), an error wrapping [ErrUnsafeServer].
//
// An error reaching a server wraps [ratelimit.ErrTimeout] or
// [ratelimit.ErrBackendUnavailable] as in Do, or the context's error if
// ctx has ended. Run Check at start-up and log or refuse the
// problems; Do does not call it.
func (b *Backend) Check(ctx context.Context) (Report, error) {
	var servers []Server
	for addr, c := range b.client.Nodes() {
		info, err := c.Do(ctx, c.B().Info().Build()).ToString()
		if err == nil {
			err = b.rs.Runner.Loaded(c.Do(ctx, c.B().FunctionLoad().FunctionCode(redisscript.Functions.Source).Build()).Error())
		}
		if err == nil && b.rs.Runner.EvalOnly() {
			for _, script := range redisscript.Scripts {
				if err = c.Do(ctx, c.B().ScriptLoad().Script(script.Source).Build()).Error(); err != nil {
					break
				}
			}
		}
		if err != nil {
			return Report{}, redisscript.Error(ctx, fmt.Errorf("%s: %w", addr, err), name+": Check")
		}
		servers = append(servers, redisscript.ParseInfo(addr, info))
	}
	return redisscript.Assess(servers)
}
