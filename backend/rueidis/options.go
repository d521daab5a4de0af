package rueidisbackend

import (
	"time"

	"github.com/redis/rueidis"
)

// The settings [LowLatency] makes. rueidis ends a call at its context's
// deadline by itself; these bound what a deadline does not cover: a call
// without one, a new connection, and a connection to a stalled server.
const (
	// LowLatencyDialTimeout bounds connecting, TLS included, and the new
	// connection's handshake (HELLO, CLIENT SETINFO). A TCP connect within a
	// data centre takes well under a millisecond and the handshake a round
	// trip or two; a dial still pending after 100ms is to a host that is
	// down, or its SYN was lost and Linux resends it only after a second.
	LowLatencyDialTimeout = 100 * time.Millisecond

	// LowLatencyConnWriteTimeout is the ConnWriteTimeout: the socket
	// deadline of a call without a context deadline, and the time a PING
	// has to find a connection alive. 50ms is over twice the slowest p99 of
	// a decision in docs/redis.md (19ms, with 256 goroutines on a 2-CPU
	// machine shared with the server), so it closes a connection to a
	// server that has stalled, not to one that is busy.
	LowLatencyConnWriteTimeout = 50 * time.Millisecond

	// LowLatencyKeepAlive is the Dialer.KeepAlive, which rueidis also takes
	// as the gap between its checks of a connection: a PING goes out on a
	// connection that has had no reply since the previous check.
	LowLatencyKeepAlive = 100 * time.Millisecond
)

// LowLatency sets up o for a limiter whose decisions must not wait on a
// stalled server. rueidis honours the context's deadline without being
// told, and never sends a decision twice (see Retries in the package
// comment); LowLatency bounds the rest to tens of milliseconds. It
// overwrites these fields whatever they held, and leaves the others
// alone; set any of them after it to choose otherwise.
//
//   - ConnWriteTimeout: [LowLatencyConnWriteTimeout], instead of 10s. A
//     connection serving one call at a time puts it on the socket as the
//     deadline of a call whose context has none, or a later one. A
//     connection pipelining concurrent calls has no socket deadline: rueidis
//     finds a stall only when a PING gets no reply within ConnWriteTimeout,
//     and then closes the connection, failing every call waiting on it.
//   - Dialer.KeepAlive: [LowLatencyKeepAlive], instead of 1s: the gap
//     between those PINGs. A pipelining connection to a stalled server is
//     closed within two gaps and ConnWriteTimeout, 250ms instead of 12s, and
//     a call on it without a deadline waits that long. An idle connection
//     gets a PING every 100ms; the OS's TCP keep-alive counts in whole
//     seconds, so it stays at 1s.
//   - Dialer.Timeout and Sentinel.Dialer.Timeout: [LowLatencyDialTimeout],
//     instead of 5s for a server and no limit of the dialer's own for a
//     Sentinel, which a Sentinel client asks for the master's address.
//   - DisableRetry: true. rueidis retries read-only commands, and those
//     marked retryable, after a network error, as often as the context
//     allows. Nothing sluice sends is either (FCALL or EVALSHA, FUNCTION
//     LOAD, and Check's INFO and SCRIPT LOAD), so this is for anything else
//     sent on the client: it too fails at the first network error, as a
//     decision does.
//
// One wait no setting bounds: in rueidis v1.0.79 a call that opens a
// connection to a stalled server (a first call, or one after a stalled
// connection was closed) can return a second after its deadline, when the
// handshake fails and closing the new connection waits for a one-second
// timer. See docs/operations.md.
//
// Give the limiter a client of its own: these timeouts would fail a
// service's slower commands.
func LowLatency(o *rueidis.ClientOption) {
	o.ConnWriteTimeout = LowLatencyConnWriteTimeout
	o.Dialer.KeepAlive = LowLatencyKeepAlive
	o.Dialer.Timeout = LowLatencyDialTimeout
	o.Sentinel.Dialer.Timeout = LowLatencyDialTimeout
	o.DisableRetry = true
}
