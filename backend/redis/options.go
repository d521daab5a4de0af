package redisbackend

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// The timeouts [LowLatency], [LowLatencyCluster] and [LowLatencyFailover]
// set. They are a backstop: once ContextTimeoutEnabled is set, a context
// deadline bounds a call by itself, and these bound a call whose context
// has no deadline, or a later one.
const (
	// LowLatencyDialTimeout bounds one dial. A TCP connect within a data
	// centre takes well under a millisecond and a TLS handshake a few round
	// trips; a dial still pending after 100ms is to a host that is down, or
	// its SYN was lost and Linux resends it only after a second.
	LowLatencyDialTimeout = 100 * time.Millisecond

	// LowLatencyTimeout is the ReadTimeout, the WriteTimeout and the
	// PoolTimeout. 50ms is over twice the slowest p99 of a decision in
	// docs/redis.md (19ms, with 256 goroutines on a 2-CPU machine shared
	// with the server), so it fails a call when the server has stalled, not
	// when it is busy.
	LowLatencyTimeout = 50 * time.Millisecond
)

// LowLatency sets up o for a limiter whose decisions must not wait on a
// stalled server: the client gives up at the context's deadline, never
// sends a decision twice, and bounds a call without a deadline to tens of
// milliseconds. It overwrites these fields whatever they held, and leaves
// the others alone; set any of them after it to choose otherwise.
//
//   - ContextTimeoutEnabled: true. Without it go-redis never puts the
//     context's deadline on the socket, and a call waits out ReadTimeout
//     (5s by default) whatever the context says. Only a deadline counts: a
//     context cancelled without one does not end a read, ReadTimeout does.
//   - MaxRetries: -1, no retries. go-redis retries a command up to 3 times
//     after a network error, including a read timeout after the command was
//     sent; the script may have run, and the retry takes the tokens again.
//   - DialerRetries: 1, one dial a call. go-redis dials up to 5 times, 100ms
//     apart, so a call to a server that refuses connections would wait out
//     its context's deadline, or 400ms without one, instead of failing at
//     once.
//   - DialTimeout: [LowLatencyDialTimeout], instead of 5s.
//   - ReadTimeout and WriteTimeout: [LowLatencyTimeout], instead of 5s. A
//     socket wait ends at the context's deadline or after these, whichever
//     comes first.
//   - PoolTimeout: [LowLatencyTimeout], instead of ReadTimeout plus a
//     second: the wait for a free connection while PoolSize calls are in
//     flight. A call that cannot get one in 50ms would not decide in time
//     either; failing it sheds load rather than queueing it behind a stall.
//     go-redis reports this wait as an error that is not a timeout, so the
//     backend wraps it in [github.com/sluicehq/sluice/ratelimit.ErrBackendUnavailable].
//
// Give the limiter a client of its own: these timeouts would fail a
// service's slower commands.
func LowLatency(o *redis.Options) {
	lowLatency{&o.ContextTimeoutEnabled, &o.MaxRetries, &o.DialerRetries, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout}.set()
}

// lowLatency points at the fields that [LowLatency] sets in each kind of
// go-redis options.
type lowLatency struct {
	contextTimeout                               *bool
	maxRetries, dialerRetries                    *int
	dialTimeout, readTimeout, writeTimeout, pool *time.Duration
}

func (l lowLatency) set() {
	*l.contextTimeout = true
	*l.maxRetries = -1
	*l.dialerRetries = 1
	*l.dialTimeout = LowLatencyDialTimeout
	*l.readTimeout = LowLatencyTimeout
	*l.writeTimeout = LowLatencyTimeout
	*l.pool = LowLatencyTimeout
}

// LowLatencyCluster is [LowLatency] for a cluster client (the timeouts
// apply to each node's connections), and also sets MaxRedirects: -1.
//
// A cluster client retries through MaxRedirects (3 by default), whatever
// MaxRetries says: after a network error, a read timeout included, it
// sends the command again, to the same node and then to another, so a
// decision whose reply was lost is charged again. Without redirects it
// does not follow MOVED or ASK either: while slots move (resharding, a
// failover) a decision on a moved key fails with an error wrapping
// [github.com/sluicehq/sluice/ratelimit.ErrBackendUnavailable], and the
// client reloads the slot map for the next one. Set MaxRedirects after
// calling it to follow redirects, at the price of those retries.
func LowLatencyCluster(o *redis.ClusterOptions) {
	lowLatency{&o.ContextTimeoutEnabled, &o.MaxRetries, &o.DialerRetries, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout}.set()
	o.MaxRedirects = -1
}

// LowLatencyFailover is [LowLatency] for a failover (Sentinel) client. The
// timeouts apply to the Sentinel connections too, which are asked for the
// master's address when the client connects; MaxRetries: -1 also stops
// retries through a failover cluster client (NewFailoverClusterClient),
// where it is the MaxRedirects of [LowLatencyCluster].
func LowLatencyFailover(o *redis.FailoverOptions) {
	lowLatency{&o.ContextTimeoutEnabled, &o.MaxRetries, &o.DialerRetries, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout}.set()
}
