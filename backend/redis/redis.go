// Package redisbackend keeps sluice's buckets in Redis through a go-redis
// v9 client the service already has: a plain client, a cluster client, a
// failover (Sentinel) client or a ring.
//
// Each decision is one call of a Lua function on one key (FCALL), so it is
// atomic however many processes share the bucket, and the server's clock
// decides. The functions are one Redis Functions library, whose name
// carries a hash of its source, so that other versions of sluice on the
// same server keep theirs; the backend loads it (FUNCTION LOAD) on a server
// that lacks it (a new server, or one restarted without persistence), the
// first time a call there finds it missing, and sends the call again. On a
// server that refuses Redis Functions (Redis before 7.0, or a FUNCTION
// command that is renamed, denied by an ACL or refused by a proxy) the
// backend runs the same Lua as scripts instead (EVALSHA, and EVAL once
// whenever the server lacks the script), from the first refusal on. The
// same Lua, key layout and state serve
// [github.com/sluicehq/sluice/backend/rueidis], so processes on either
// client share buckets.
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
// # Permits
//
// [Backend.DoPermit] holds concurrency permits ([ratelimit.Concurrency],
// taken with [ratelimit.Limiter.TryAcquire] and Acquire) in one more
// function of the same library, one call per acquire, release or renew,
// on the server's clock. The permits of key k are a sorted set at
// {k}:permits, after the prefix: beside the bucket of k, on its cluster
// slot, with a member (of about 30 bytes for a Limiter's holders) per
// permit held, so never more than the limit's. Each call first frees the
// permits whose lease has ended, and the key expires when its last lease
// does. A retried acquire (see Retries) is harmless: a holder's second
// acquire keeps the permit it took and renews its lease. A retried
// release whose first reply was lost finds nothing left to free, and the
// [ratelimit.Permit] reports [ratelimit.ErrPermitLost].
//
// # Pipelining
//
// A decision made while no other is out goes on a connection of its own,
// as any go-redis command does. One made while others are out (an FCALL;
// the scripts a server without Redis Functions runs go on their own) goes
// through the client's deferred autopipeliner (go-redis's
// AsyncAutoPipeline, which the client owns and its Close stops): it sends
// the calls of many goroutines in one write on one connection and reads
// their replies in one read, so that under concurrency the server and the
// client make a round trip for many decisions, not one each. It is what
// the rueidis backend gets from rueidis by default; at 64 and 256
// goroutines it made 1.7 to 2.1 times the decisions a second
// (docs/redis.md). The client's
// options apply to it: its AutoPipelineOptions, if set, its timeouts,
// its MaxRetries (a pipeline that fails on a network error is retried
// whole, charging each decision in it again unless MaxRetries is -1) and
// its hooks (as pipeline hooks, or process hooks for a batch of one). A
// Ring has no autopipeliner, so on a Ring every call goes on its own; so
// does every call on a cluster client, whose autopipeliner puts calls for
// several masters in one batch, which then waits for the slowest: a
// stalled master would hold up the decisions of keys on the others.
// [WithAutoPipelining](false) turns it off for the others too.
//
// go-redis runs a pipelined call on the autopipeliner's context, not the
// caller's; the caller stops waiting when its context ends, and the call
// may still run, as one on its own connection may.
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
// # Deadlines
//
// go-redis puts a context's deadline on the socket only if the client has
// ContextTimeoutEnabled: true. Without it a call ignores the deadline and,
// when the server stalls, waits out ReadTimeout (5s by default): a
// decision meant to take a millisecond holds its request for seconds.
// Give the limiter a client with ContextTimeoutEnabled: true, or one set
// up by [LowLatency], which also sets the rest of what this package
// advises; [Backend.Check] reports a client without it. (A pipelined call
// returns when its context ends either way; the pipeline's reads end at
// ReadTimeout.)
//
// # Errors
//
// Do and DoPermit return errors wrapping [ratelimit.ErrTimeout] when a
// timeout of the client's own (ReadTimeout, say) ends the call,
// [ratelimit.ErrKeyRejected] when the key holds a value sluice did not
// write (another application's, a Redis type no script keeps, or a damaged
// state; the key is left as it is), and [ratelimit.ErrBackendUnavailable]
// for any other failure of the client or the server. When the caller's
// context has ended, the error wraps the context's ([context.Canceled] or
// [context.DeadlineExceeded]) and none of these: the caller gave up, the
// store did not fail. A call whose context is already done sends nothing;
// one whose context ends while it is out may still have run the script.
// go-redis does not end a read when a context without a deadline is
// cancelled: such a call, on a connection of its own, returns only at
// ReadTimeout, its error wrapping [context.Canceled]; a pipelined one
// returns at the cancel.
//
// The message names the sentinel, the backend, the op and the key, then
// the go-redis error, which stays reachable with errors.Is and errors.As:
//
//	ratelimit: timeout: sluice/redis: Consume on key "k": read tcp 127.0.0.1:52110->127.0.0.1:6379: i/o timeout
package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend/redischeck"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// Backend is a [ratelimit.Backend] over a go-redis client. It is safe for
// concurrent use, and holds nothing but the client (and, for a cluster, the
// slot map of [Backend.Node]; otherwise the client's autopipeliner, which
// the client owns): closing the client is the caller's business.
type Backend struct {
	client  redis.UniversalClient
	scripts *scriptClient
	rs      redisscript.Backend
}

var (
	_ ratelimit.Backend       = (*Backend)(nil)
	_ ratelimit.PermitBackend = (*Backend)(nil)
)

// name names the backend in its errors.
const name = "sluice/redis"

// DefaultPrefix is the key prefix unless [WithPrefix] sets one: none, so
// that a bucket key is no longer than it must be.
const DefaultPrefix = ""

// Option configures a [Backend].
type Option func(*options)

// options are what the [Option]s set: the settings both Redis backends
// take, and whether calls may ride the client's autopipeliner.
type options struct {
	redisscript.Settings
	direct bool
}

// WithPrefix puts prefix before every bucket key, to keep sluice's keys
// apart from others in the same database (and match ACL key patterns). It
// must not contain '{' or '}'. Every byte of it is stored in every key.
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

// WithAutoPipelining sets whether a decision made while others are out
// goes through the client's deferred autopipeliner (go-redis's
// AsyncAutoPipeline), which sends the calls of many goroutines in one
// write and reads their replies in one read: on by default. See
// Pipelining in the package documentation.
func WithAutoPipelining(on bool) Option {
	return func(o *options) { o.direct = !on }
}

// New returns a Backend that keeps buckets in Redis through client. It
// returns an error wrapping [ratelimit.ErrInvalidConfig] for a nil client
// (a nil pointer of a client type too) or a bad option. It does not talk
// to the server; [Backend.Check] does.
func New(client redis.UniversalClient, opts ...Option) (*Backend, error) {
	o := options{Settings: redisscript.Settings{Prefix: DefaultPrefix}}
	for _, opt := range opts {
		opt(&o)
	}
	if redisscript.NilClient(client) {
		return nil, fmt.Errorf("%w: %s: the client is nil", ratelimit.ErrInvalidConfig, name)
	}
	if err := o.Check(name); err != nil {
		return nil, err
	}
	scripts := newScriptClient(client, !o.direct)
	return &Backend{client: client, scripts: scripts, rs: redisscript.Backend{
		Name: name, Settings: o.Settings, Runner: redisscript.NewRunner(scripts), Topology: topology(client),
	}}, nil
}

// scripts are redisscript.Scripts, ready to run.
var scripts = func() []*redis.Script {
	s := make([]*redis.Script, len(redisscript.Scripts))
	for i, src := range redisscript.Scripts {
		s[i] = redis.NewScript(src.Source)
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
type scriptClient struct {
	redis.UniversalClient
	// auto is whether an FCALL may ride the client's autopipeliner, and
	// pipeliner that autopipeliner once fetched; out counts the FCALLs
	// out.
	auto      atomic.Bool
	pipeliner atomic.Pointer[redis.AutoPipeliner]
	out       atomic.Int64
}

// newScriptClient returns client as the Runner uses it, its FCALLs riding
// the client's autopipeliner if auto is set and the client is not a
// cluster's (see Pipelining in the package documentation).
func newScriptClient(client redis.UniversalClient, auto bool) *scriptClient {
	c := &scriptClient{UniversalClient: client}
	_, cluster := client.(*redis.ClusterClient)
	c.auto.Store(auto && !cluster)
	return c
}

// FCall sends the call on a connection of its own when no other is out,
// and otherwise through the client's autopipeliner, with the others'.
func (c *scriptClient) FCall(ctx context.Context, fn, key, arg string) (string, error) {
	if c.auto.Load() {
		defer c.out.Add(-1)
		if c.out.Add(1) > 1 {
			if reply, sent, err := c.pipelined(ctx, fn, key, arg); sent {
				return reply, err
			}
		}
	}
	return c.UniversalClient.FCall(ctx, fn, []string{key}, arg).Text()
}

// pipelined submits the call to the client's deferred autopipeliner and
// waits for its reply or for ctx to end; the call may still run after
// that, as one that ctx ends while it is out on a connection of its own.
// sent is false when the call was not sent: the client has no
// autopipeliner (a Ring has none; a closed client's is gone), which turns
// pipelining off from then on, or the one it had has been closed, which
// the next call replaces.
func (c *scriptClient) pipelined(ctx context.Context, fn, key, arg string) (reply string, sent bool, err error) {
	ap := c.pipeliner.Load()
	if ap == nil {
		if ap, err = c.UniversalClient.AsyncAutoPipeline(); err != nil {
			c.auto.Store(false)
			return "", false, nil
		}
		c.pipeliner.Store(ap)
	}
	cmd := redis.NewCmd(ctx, "fcall", fn, 1, key, arg)
	if err := ap.Submit(ctx, cmd).WaitContext(ctx); err != nil {
		if errors.Is(err, redis.ErrClosed) {
			c.pipeliner.CompareAndSwap(ap, nil)
			return "", false, nil
		}
		return "", true, err
	}
	reply, err = cmd.Text()
	return reply, true, err
}

func (c *scriptClient) Eval(ctx context.Context, script int, key, arg string) (string, error) {
	return scripts[script].Run(ctx, c.UniversalClient, []string{key}, arg).Text()
}

// LoadFunctions loads the library on the master that serves key: for a
// cluster client the slot's master, for a ring every shard (a ring does
// not say which shard serves a key), and otherwise the client's server.
func (c *scriptClient) LoadFunctions(ctx context.Context, key string) error {
	switch cl := c.UniversalClient.(type) {
	case *redis.ClusterClient:
		master, err := cl.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		return master.FunctionLoad(ctx, redisscript.Functions.Source).Err()
	case *redis.Ring:
		return cl.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
			return shard.FunctionLoad(ctx, redisscript.Functions.Source).Err()
		})
	}
	return c.FunctionLoad(ctx, redisscript.Functions.Source).Err()
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

// Check asks every server the client reaches (each shard of a cluster or
// ring) for its version and maxmemory-policy, loads the library there (a
// replica gets it from its master; a server that refuses Redis Functions,
// the scripts), and looks at the client's retry and deadline settings. It returns the
// [Report] and, if a setting can break the limits, an error wrapping
// [ErrUnsafeServer]:
//
//   - a maxmemory-policy other than noeviction: Redis may evict bucket keys
//     under memory pressure, and an evicted bucket starts full again;
//   - MaxRetries above 0 on the client: see Retries in the package comment;
//   - ContextTimeoutEnabled not set on the client: see Deadlines in the
//     package comment.
//
// The client's settings are read from a *redis.Client (a failover client
// is one too), a *redis.ClusterClient or a *redis.Ring; another
// implementation of redis.UniversalClient has only its servers checked.
//
// An error reaching a server wraps [ratelimit.ErrTimeout] or
// [ratelimit.ErrBackendUnavailable] as in Do, or the context's error if
// ctx has ended. Run Check at start-up and log or refuse the
// problems; Do does not call it.
func (b *Backend) Check(ctx context.Context) (Report, error) {
	var (
		mu      sync.Mutex
		servers []Server
	)
	check := func(ctx context.Context, addr string, c redis.Cmdable) error {
		info, err := c.Info(ctx).Result()
		if err == nil {
			err = b.rs.Runner.Loaded(c.FunctionLoad(ctx, redisscript.Functions.Source).Err())
		}
		if err == nil && b.rs.Runner.EvalOnly() {
			for _, script := range scripts {
				if err = script.Load(ctx, c).Err(); err != nil {
					break
				}
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
	shard := func(ctx context.Context, c *redis.Client) error { return check(ctx, serverAddr(ctx, c), c) }
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
		return Report{}, redisscript.Error(ctx, err, name+": Check")
	}
	return redisscript.Assess(servers, clientProblems(b.client)...)
}

// failoverAddr is the Addr go-redis gives the options of a failover
// client, which has no address of its own: it asks the Sentinels.
const failoverAddr = "FailoverClient"

// serverAddr is the address of c's server as the report names it: its
// Addr, or for a failover client the master's address from CLIENT INFO
// (Redis 6.2 and later), else "FailoverClient".
func serverAddr(ctx context.Context, c *redis.Client) string {
	addr := c.Options().Addr
	if addr != failoverAddr {
		return addr
	}
	if info, err := c.ClientInfo(ctx).Result(); err == nil && info.LAddr != "" {
		return info.LAddr
	}
	return addr
}

// clientProblems are the settings of c that can break the limits, in words
// with how to fix them; none if c's settings cannot be told.
func clientProblems(c redis.UniversalClient) []string {
	var (
		maxRetries     int
		contextTimeout bool
		fix            string // how to turn ContextTimeoutEnabled on
	)
	switch c := c.(type) {
	case *redis.Client:
		o := c.Options()
		maxRetries, contextTimeout = o.MaxRetries, o.ContextTimeoutEnabled
		fix = "set ContextTimeoutEnabled: true on the limiter's client, or build its options with LowLatency (LowLatencyFailover for a failover client)"
	case *redis.ClusterClient:
		o := c.Options()
		maxRetries, contextTimeout = o.MaxRetries, o.ContextTimeoutEnabled
		fix = "set ContextTimeoutEnabled: true on the limiter's client, or build its options with LowLatencyCluster"
	case *redis.Ring:
		o := c.Options()
		maxRetries, contextTimeout = o.MaxRetries, o.ContextTimeoutEnabled
		fix = "set ContextTimeoutEnabled: true in the limiter's RingOptions"
	default:
		return nil
	}
	var problems []string
	if maxRetries > 0 {
		problems = append(problems, fmt.Sprintf("the client retries a command up to %d times after a network error, so a decision whose reply was lost is charged again; set MaxRetries: -1 on the limiter's client", maxRetries))
	}
	if !contextTimeout {
		problems = append(problems, "the client has ContextTimeoutEnabled off, so a call ignores its context's deadline and, when the server stalls, waits out ReadTimeout (5s by default) instead of failing at the deadline; "+fix)
	}
	return problems
}
