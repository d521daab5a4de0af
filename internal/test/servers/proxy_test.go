package servers_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/test/servers"
)

// TestProxyStallAfter: through a proxy stalled after INCR, an INCR on an
// open connection and one on a new connection both reach the server, which
// runs them, and Marked counts them, but their replies time out, while the
// new connection's handshake and a PING before the INCR pass; after
// Release, replies flow.
func TestProxyStallAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := servers.StartRedis(t)
	p := servers.StartProxy(t, r.Addr())
	open := newClient(t, p.Addr())
	if err := open.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING through the proxy: %v", err)
	}

	p.StallAfter("incr")
	fresh := newClient(t, p.Addr())
	if err := fresh.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING on a new connection during the stall: %v", err)
	}
	for name, c := range map[string]*redis.Client{"open": open, "new": fresh} {
		err := c.Incr(ctx, "n").Err()
		var netErr net.Error
		if !errors.As(err, &netErr) || !netErr.Timeout() {
			t.Errorf("INCR on the %s connection during the stall: %v; want a timeout", name, err)
		}
	}
	if n, err := newClient(t, r.Addr()).Get(ctx, "n").Int(); err != nil || n != 2 {
		t.Errorf("GET n on the server = %d, %v; want 2: both INCRs ran", n, err)
	}
	if n := p.Marked(); n != 2 {
		t.Errorf("Marked() = %d; want the 2 INCRs", n)
	}

	p.Release()
	if n, err := open.Incr(ctx, "n").Result(); err != nil || n != 3 {
		t.Errorf("INCR after Release = %d, %v; want 3", n, err)
	}
}

// TestStartProxiedCluster: a cluster client given the proxies' addresses
// sees only them, and reaches every master through them.
func TestStartProxiedCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl, proxies := servers.StartProxiedCluster(t)
	var addrs []string
	for _, p := range proxies {
		addrs = append(addrs, p.Addr())
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: -1})
	t.Cleanup(func() { cc.Close() })
	for i := range 100 {
		k := fmt.Sprintf("key-%d", i)
		if err := cc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	//lint:ignore SA1019 go-redis's ClusterClient maps slots with CLUSTER SLOTS, so that is the view that counts.
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	starts := []int{0, 5461, 10923} // of the ranges the nodes own, in order
	for _, s := range slots {
		i := slices.Index(starts, s.Start)
		if i < 0 {
			t.Fatalf("CLUSTER SLOTS has a range %d-%d", s.Start, s.End)
		}
		if got, want := s.Nodes[0].Addr, addrs[i]; got != want {
			t.Errorf("slots %d-%d are at %s; want the proxy %s", s.Start, s.End, got, want)
		}
	}
	for i, n := range cl.Nodes() {
		if size, err := newClient(t, n.Addr()).DBSize(ctx).Result(); err != nil || size == 0 {
			t.Errorf("node %d: DBSIZE = %d, %v; want keys on every master", i, size, err)
		}
	}
}
