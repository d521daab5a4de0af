// Package redistest is the test suite that both Redis backends
// (backend/redis over go-redis, backend/rueidis over rueidis) run against
// real servers: the conformance suite on a standalone server and on a
// 3-master cluster, on a stepped clock and on the server's, plus what only
// Redis has: exact admission from two clients at once, the library lost
// and loaded again, another version's library left alone, a server that
// refuses Redis Functions (scripts instead), TTLs, hash tags, client and
// server failures, Check, and concurrency permits (DoPermit).
//
// Each backend's test calls [Run] with an [Adapter]; the adapters differ
// only in how they build a client. [LowLatency] checks each backend's
// LowLatency client settings on paused, stalled and killed servers.
package redistest

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/backend/redischeck"
	"github.com/sluicehq/sluice/ratelimit"
)

// Backend is what the Redis backends offer: a [ratelimit.Backend] that
// holds concurrency permits too, and Check.
type Backend interface {
	ratelimit.Backend
	ratelimit.PermitBackend
	Check(ctx context.Context) (redischeck.Report, error)
}

// Options are the backend options the suite varies.
type Options struct {
	Prefix string          // the key prefix
	Clock  ratelimit.Clock // nil: the server's clock
}

// Adapter builds backends over one client library.
type Adapter struct {
	// Connect returns a backend on a new client of the server at addrs[0],
	// or of the cluster at addrs when cluster is set, and a function that
	// closes the client. The client must not retry commands, and must
	// give up when the context's deadline passes. Connect registers the
	// close with t.Cleanup as well; closing twice must be harmless.
	Connect func(t *testing.T, addrs []string, cluster bool, opts Options) (Backend, func())
	// Sentinel is Connect for a failover client that finds the master named
	// master through the Sentinels at sentinels.
	Sentinel func(t *testing.T, sentinels []string, master string) Backend
}

// Run runs the suite: most groups on one standalone server and one cluster,
// fault tests on servers of their own.
func Run(t *testing.T, a Adapter) {
	if a.Connect == nil || a.Sentinel == nil {
		t.Fatal("redistest: Adapter.Connect or Adapter.Sentinel is nil")
	}
	tops := topologies(t)
	t.Run("Conformance", func(t *testing.T) { testConformance(t, a, tops) })
	t.Run("Exact", func(t *testing.T) { testExact(t, a, tops) })
	t.Run("Sentinel", func(t *testing.T) { testSentinel(t, a) })
	t.Run("ScriptCache", func(t *testing.T) { testScriptCache(t, a) })
	t.Run("Functions", func(t *testing.T) { testFunctions(t, a) })
	t.Run("Keys", func(t *testing.T) { testKeys(t, a, tops) })
	t.Run("Failures", func(t *testing.T) { testFailures(t, a) })
	t.Run("Check", func(t *testing.T) { testCheck(t, a) })
	t.Run("Permits", func(t *testing.T) { testPermits(t, a, tops) })
}
