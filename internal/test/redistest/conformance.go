package redistest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// topology is a set of servers to run a group on.
type topology struct {
	name    string
	addrs   []string
	cluster bool
}

// topologies starts a standalone server and a 3-master cluster, or takes
// those $SLUICE_REDIS_ADDR and $SLUICE_REDIS_CLUSTER_ADDRS name (the test
// kit's containers, in make test-containers).
func topologies(t *testing.T) []topology {
	addr, _ := servers.StandaloneAddr(t)
	cluster, _ := servers.ClusterAddrs(t)
	return []topology{
		{name: "Standalone", addrs: []string{addr}},
		{name: "Cluster", addrs: cluster, cluster: true},
	}
}

// testConformance runs ratelimittest, its permit scenarios included, on
// each topology, on a stepped clock (every scenario, exact values: the same
// the memory backend passes) and on the server's clock; then random
// sequences against the memory backend.
func testConformance(t *testing.T, a Adapter, tops []topology) {
	for _, top := range tops {
		t.Run(top.name, func(t *testing.T) {
			t.Parallel()
			ratelimittest.Run(t, ratelimittest.Harness{
				Permits: true,
				New: func(t *testing.T, clock ratelimit.Clock) ratelimit.Backend {
					b, _ := a.Connect(t, top.addrs, top.cluster, Options{Clock: clock})
					return b
				},
			})
		})
		t.Run(top.name+"ServerClock", func(t *testing.T) {
			t.Parallel()
			ratelimittest.Run(t, ratelimittest.Harness{
				ServerClock: true,
				Permits:     true,
				New: func(t *testing.T, _ ratelimit.Clock) ratelimit.Backend {
					b, _ := a.Connect(t, top.addrs, top.cluster, Options{})
					return b
				},
			})
		})
		t.Run(top.name+"MatchesMemory", func(t *testing.T) {
			t.Parallel()
			testMatchesMemory(t, a, top)
		})
	}
}

// numAlgorithms is how many algorithms ratelimit has.
const numAlgorithms = uint64(ratelimit.LeakyBucket) + 1

// testMatchesMemory runs seeded random sequences of requests through the
// backend and the memory backend, both on one stepped clock, on every
// algorithm, some of them with an Ago, and wants every decision equal.
func testMatchesMemory(t *testing.T, a Adapter, top topology) {
	const sequences, steps = 300, 30
	ctx := context.Background()
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	run := time.Now().UnixNano()
	for seed := range uint64(sequences) {
		r := rand.New(rand.NewPCG(seed, 0x3e3))
		clock := ratelimittest.NewClock(start)
		b, closeClient := a.Connect(t, top.addrs, top.cluster, Options{Clock: clock})
		mem := memory.New(memory.WithClock(clock))
		// Every algorithm in turn; now and then the bucket switches to
		// another one.
		alg := ratelimit.Algorithm(seed % numAlgorithms)
		other := alg
		if r.IntN(4) == 0 {
			other = ratelimit.Algorithm(r.Uint64N(numAlgorithms))
		}
		cfgs := [2]ratelimit.Config{RandConfig(r, alg, false), RandConfig(r, other, false)}
		RandVersions(r, cfgs[:])
		key := fmt.Sprintf("matches-memory:%d:%d", run, seed)
		cur := 0
		for i := range steps {
			now := start.UnixMicro() + Advance(r, clock.Now().UnixMicro()-start.UnixMicro(), false)
			clock.Advance(time.UnixMicro(now).Sub(clock.Now()))
			if r.IntN(6) == 0 {
				cur = 1 - cur
			}
			req := RandRequest(r, cfgs[cur])
			if takes := req.Op == ratelimit.Consume || req.Op == ratelimit.ConsumeUpTo || req.Op == ratelimit.Reserve; takes && r.IntN(4) == 0 {
				// As of a while ago: before the bucket's last change, as
				// often as not.
				req.Ago = time.Duration(r.Int64N(int64(time.Minute)))
			}
			got, err := b.Do(ctx, key, cfgs[cur], req)
			if err != nil {
				t.Fatalf("seed %d, step %d: %+v: %v", seed, i, req, err)
			}
			want, err := mem.Do(ctx, key, cfgs[cur], req)
			if err != nil {
				t.Fatalf("seed %d, step %d: %+v: memory: %v", seed, i, req, err)
			}
			if got != want {
				t.Fatalf("seed %d, step %d: %+v:\n got %+v\nwant %+v (memory backend)", seed, i, req, got, want)
			}
		}
		mem.Close()
		closeClient()
	}
}
