package redistest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/backend/redischeck"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// testCheck: Check reports every server's version and policy, passes
// noeviction and refuses policies that evict keys with a TTL.
func testCheck(t *testing.T, a Adapter) {
	ctx := context.Background()
	for _, policy := range []string{"noeviction", "allkeys-lru", "volatile-ttl"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			r := servers.StartRedis(t, "--maxmemory-policy", policy)
			b, _ := a.Connect(t, []string{r.Addr()}, false, Options{})
			report, err := b.Check(ctx)
			if len(report.Servers) != 1 || report.Servers[0].MaxmemoryPolicy != policy || report.Servers[0].Version == "" {
				t.Fatalf("Check: %+v, %v; want one server with a version and policy %s", report, err, policy)
			}
			if safe := policy == "noeviction"; safe != (err == nil) || !safe && (!errors.Is(err, redischeck.ErrUnsafeServer) || !strings.Contains(err.Error(), policy)) {
				t.Fatalf("Check with %s: %v", policy, err)
			}
		})
	}
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		c := servers.StartCluster(t)
		b, _ := a.Connect(t, c.Addrs(), true, Options{})
		report, err := b.Check(ctx)
		if err != nil || len(report.Servers) != 3 {
			t.Fatalf("Check on a 3-master cluster: %+v, %v; want 3 servers, no problem", report, err)
		}
	})
	t.Run("Sentinel", func(t *testing.T) {
		t.Parallel()
		master := servers.StartRedis(t)
		b := a.Sentinel(t, []string{servers.StartSentinel(t, master.Addr()).Addr()}, servers.SentinelMaster)
		report, err := b.Check(ctx)
		if err != nil || len(report.Servers) != 1 || report.Servers[0].Addr != master.Addr() {
			t.Fatalf("Check through a Sentinel: %+v, %v; want the master, %s, no problem", report, err, master.Addr())
		}
	})
	t.Run("Down", func(t *testing.T) {
		t.Parallel()
		r := servers.StartRedis(t)
		b, _ := a.Connect(t, []string{r.Addr()}, false, Options{})
		r.Kill(t)
		if _, err := b.Check(ctx); !errors.Is(err, ratelimit.ErrBackendUnavailable) {
			t.Fatalf("Check on a dead server: %v; want ErrBackendUnavailable", err)
		}
	})
}
