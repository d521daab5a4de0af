package failpolicy_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// nodeTimeout is the policy's deadline in TestNodeStallIntegration, and
// the clients' timeouts: the LowLatency ones (50ms) are met by a healthy
// master on a quiet machine, but not always beside CPU burners with the
// race detector on, and a healthy master's slow answer must not read as a
// failure here. The test pauses a master for a few of them, far within
// the cluster's 10s node timeout, after which the other masters would
// refuse every key (cluster_state:fail).
const nodeTimeout = time.Second

// nodeCoolDown is the breaker's cool-down in TestNodeStallIntegration.
const nodeCoolDown = 500 * time.Millisecond

// nodeRecoveryCap bounds the wait for every key to be decided by the store
// again once the master is back: a probe within a cool-down of the next
// decision, and a few more cool-downs for a loaded machine.
const nodeRecoveryCap = 20 * time.Second

// clusterAdapters build a Redis backend on a cluster client set up by its
// LowLatency helper, its timeouts then widened to nodeTimeout.
var clusterAdapters = []struct {
	name    string
	connect func(t testing.TB, addrs []string) ratelimit.Backend
}{
	{"goredis", func(t testing.TB, addrs []string) ratelimit.Backend {
		opts := &redis.ClusterOptions{Addrs: addrs}
		redisbackend.LowLatencyCluster(opts)
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout, opts.PoolTimeout = nodeTimeout, nodeTimeout, nodeTimeout, nodeTimeout
		return goRedisBackend(t, redis.NewClusterClient(opts))
	}},
	{"rueidis", func(t testing.TB, addrs []string) ratelimit.Backend {
		opt := rueidis.ClientOption{InitAddress: addrs, DisableCache: true}
		rueidisbackend.LowLatency(&opt)
		opt.ConnWriteTimeout, opt.Dialer.Timeout = nodeTimeout, nodeTimeout
		c, err := rueidis.NewClient(opt)
		if err != nil {
			t.Fatal(err)
		}
		return rueidisBackend(t, c)
	}},
}

// TestNodeStallIntegration pauses one master of a 3-master Redis Cluster
// (SIGSTOP) behind a Closed policy, for each client. The keys on the
// paused master degrade, and open its breaker; the keys on the two others
// are decided by Redis throughout, even while calls on the paused master
// are out, and their breakers never move. Once the master is back
// (SIGCONT), every key is decided by Redis again, the paused master's
// breaker closed by a probe. Keys are picked per master with the
// policy's Slot (passed through from the backend) and its Masters.
func TestNodeStallIntegration(t *testing.T) {
	for _, a := range clusterAdapters {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			cluster := servers.StartCluster(t)
			store := a.connect(t, cluster.Addrs())
			var log hookLog
			policy := newPolicy(t, store, failpolicy.Closed,
				failpolicy.WithTimeout(nodeTimeout), failpolicy.WithBreaker(3, nodeCoolDown), failpolicy.WithHooks(log.hooks()))
			masters := loadMasters(t, policy)
			keys := keysOn(t, policy, masters, 3)
			cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6)}}
			for _, k := range slices.Concat(keys...) {
				warm(t, store, k, cfg) // dials each master and loads the script there
			}

			// The master to pause: the second, and package servers' node of its
			// address.
			const victim = 1
			var paused *servers.Redis
			for _, n := range cluster.Nodes() {
				if n.Addr() == masters[victim].Addr {
					paused = n
				}
			}
			if paused == nil {
				t.Fatalf("Masters named %q, which is none of the cluster's nodes %v", masters[victim].Addr, cluster.Addrs())
			}
			var healthy []string
			for i, ks := range keys {
				if i != victim {
					healthy = append(healthy, ks...)
				}
			}
			all := func(state failpolicy.BreakerState) map[string]failpolicy.BreakerState {
				states := map[string]failpolicy.BreakerState{}
				for _, m := range masters {
					states[m.Addr] = state
				}
				return states
			}

			decideAll(t, policy, slices.Concat(keys...), cfg, false)
			wantBreakers(t, policy, all(failpolicy.BreakerClosed))

			paused.Pause(t) // returns once the process is stopped
			pauseStart := time.Now()
			// The paused master's keys, all at once: each waits the
			// deadline, and the three failures open its breaker. The
			// healthy masters' keys are decided meanwhile.
			var wg sync.WaitGroup
			for _, k := range keys[victim] {
				wg.Go(func() { decideAll(t, policy, []string{k}, cfg, true) })
			}
			decideAll(t, policy, healthy, cfg, false)
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			want := all(failpolicy.BreakerClosed)
			want[masters[victim].Addr] = failpolicy.BreakerOpen
			if got := policy.Breakers(); got[masters[victim].Addr] == failpolicy.BreakerClosed || !equalBut(got, want, masters[victim].Addr) {
				t.Fatalf("Breakers with %s paused: %v; want it open (or half-open), the others closed", masters[victim].Addr, got)
			}
			if policy.Breaker() == failpolicy.BreakerClosed {
				t.Errorf("Breaker with %s paused: BreakerClosed; want its breaker's state", masters[victim].Addr)
			}
			decideAll(t, policy, keys[victim], cfg, true)
			decideAll(t, policy, healthy, cfg, false)
			paused.Resume(t) // returns once it answers again
			t.Logf("%s was paused for %v", masters[victim].Addr, time.Since(pauseStart).Round(time.Millisecond))

			back := time.Now()
			for !decidedByStore(t, policy, slices.Concat(keys...), cfg) {
				if time.Since(back) > nodeRecoveryCap {
					t.Fatalf("still degraded %v after %s came back; breakers %v", nodeRecoveryCap, masters[victim].Addr, policy.Breakers())
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("every key decided by Redis again %v after %s came back (cool-down %v)", time.Since(back).Round(time.Millisecond), masters[victim].Addr, nodeCoolDown)
			wantBreakers(t, policy, all(failpolicy.BreakerClosed))

			for i, m := range masters {
				changes := changesOf(&log, m.Addr)
				switch {
				case i != victim && len(changes) != 0:
					t.Errorf("BreakerChanged for the healthy %s: %v; want none", m.Addr, changes)
				case i == victim && (len(changes) < 2 || changes[0] != "BreakerClosed>BreakerOpen" || changes[len(changes)-1] != "BreakerHalfOpen>BreakerClosed"):
					t.Errorf("BreakerChanged for the paused %s: %v; want it opened, and closed at the end", m.Addr, changes)
				}
			}
			if changes := changesOf(&log, ""); len(changes) != 0 {
				t.Errorf("BreakerChanged for the shared breaker: %v; want none", changes)
			}
		})
	}
}

// loadMasters asks p (and so its backend) for the cluster's masters, which
// also loads the slot map that the backend's Node reads, and checks that
// Node then names a master for every slot.
func loadMasters(t *testing.T, p *failpolicy.Backend) []ratelimit.Master {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	masters, err := p.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != 3 {
		t.Fatalf("Masters: %v; want the cluster's 3", masters)
	}
	return masters
}

// keysOn returns n keys on each of masters, by p's Slot, and checks that
// p's Node names each key's master.
func keysOn(t *testing.T, p *failpolicy.Backend, masters []ratelimit.Master, n int) [][]string {
	t.Helper()
	keys := make([][]string, len(masters))
	for i, found := 0, 0; found < n*len(masters); i++ {
		key := fmt.Sprintf("node-stall:%d", i)
		slot, ok := p.Slot(key)
		if !ok {
			t.Fatalf("Slot(%q) cannot tell", key)
		}
		m := ratelimit.Owner(masters, slot)
		if m < 0 {
			t.Fatalf("slot %d of %q: no master of %v serves it", slot, key, masters)
		}
		if node := p.Node(key); node != masters[m].Addr {
			t.Fatalf("Node(%q) = %q; want %q, the master of its slot %d", key, node, masters[m].Addr, slot)
		}
		if len(keys[m]) < n {
			keys[m] = append(keys[m], key)
			found++
		}
	}
	return keys
}

// decideAll makes one decision on each key, and wants each Degraded or
// decided by Redis (and then allowed: the limit is far away).
func decideAll(t *testing.T, p *failpolicy.Backend, keys []string, cfg ratelimit.Config, degraded bool) {
	t.Helper()
	for _, k := range keys {
		d, err := p.Do(context.Background(), k, cfg, consume)
		if err != nil || d.Degraded != degraded || d.Allowed == degraded {
			t.Errorf("%s on %s: %+v, %v; want Degraded %v (breakers %v)", k, p.Node(k), d, err, degraded, p.Breakers())
		}
	}
}

// decidedByStore makes one decision on each key, and reports whether
// Redis decided them all.
func decidedByStore(t *testing.T, p *failpolicy.Backend, keys []string, cfg ratelimit.Config) bool {
	t.Helper()
	all := true
	for _, k := range keys {
		d, err := p.Do(context.Background(), k, cfg, consume)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		all = all && !d.Degraded
	}
	return all
}

// equalBut reports whether got and want have the same keys, and the same
// values but at key except.
func equalBut(got, want map[string]failpolicy.BreakerState, except string) bool {
	if len(got) != len(want) {
		return false
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok || k != except && g != w {
			return false
		}
	}
	return true
}
