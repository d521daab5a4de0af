package redisbackend_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// clusterSlots are the slot ranges servers.StartCluster gives its nodes,
// the i-th to the i-th of Cluster.Addrs.
var clusterSlots = []ratelimit.SlotRange{{First: 0, Last: 5460}, {First: 5461, Last: 10922}, {First: 10923, Last: 16383}}

// slotKeys are bucket keys of every kind: plain, with what the hash tag
// escapes, empty, and many, so that each master serves some.
var slotKeys = func() []string {
	keys := []string{"", "{", "}", "%", "{user1000}.following", "foo{bar}{zap}", "a%7Bb", "\x00{\x00}"}
	for i := range 200 {
		keys = append(keys, fmt.Sprint("user:", i))
	}
	return keys
}()

// wantMasters is what Masters must report of c: its nodes, as addressed
// by package servers, with the slots they were given, sorted by address.
func wantMasters(c *servers.Cluster) []ratelimit.Master {
	var masters []ratelimit.Master
	for i, addr := range c.Addrs() {
		masters = append(masters, ratelimit.Master{Addr: addr, Slots: clusterSlots[i : i+1]})
	}
	slices.SortFunc(masters, func(a, b ratelimit.Master) int { return cmp.Compare(a.Addr, b.Addr) })
	return masters
}

// keySlots asks a node of c for CLUSTER KEYSLOT of each key's Redis key
// under prefix, in one pipeline.
func keySlots(t *testing.T, c *servers.Cluster, prefix string, keys []string) []int {
	t.Helper()
	ctx := context.Background()
	node := redis.NewClient(&redis.Options{Addr: c.Addrs()[0], MaxRetries: -1})
	defer node.Close()
	cmds := make([]*redis.IntCmd, len(keys))
	if _, err := node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = pipe.ClusterKeySlot(ctx, redisscript.Key(prefix, k))
		}
		return nil
	}); err != nil {
		t.Fatalf("CLUSTER KEYSLOT of %d keys: %v", len(keys), err)
	}
	slots := make([]int, len(keys))
	for i, cmd := range cmds {
		slots[i] = int(cmd.Val())
	}
	return slots
}

// wantNodes returns the address of the master of each key's bucket under
// prefix, by CLUSTER KEYSLOT and the slots the cluster was formed with.
func wantNodes(t *testing.T, c *servers.Cluster, prefix string, keys []string) []string {
	t.Helper()
	masters := wantMasters(c)
	nodes := make([]string, len(keys))
	for i, slot := range keySlots(t, c, prefix, keys) {
		nodes[i] = masters[ratelimit.Owner(masters, slot)].Addr
	}
	return nodes
}

// protocols are the RESP versions a client may speak: go-redis's default
// of 3, and 2, on which CLUSTER SHARDS replies with arrays, not maps.
var protocols = []int{3, 2}

// clusterBackend returns a backend under prefix on a new cluster client of
// c speaking RESP protocol. t.Cleanup closes the client, then waits for
// the backend's background topology load, if one is running, to end.
func clusterBackend(t *testing.T, c *servers.Cluster, prefix string, protocol int) (*redisbackend.Backend, *redis.ClusterClient) {
	t.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), Protocol: protocol, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { waitTopologyLoads(t) })
	t.Cleanup(func() { client.Close() })
	if info, err := client.ClientInfo(context.Background()).Result(); err != nil || info.Resp != protocol {
		t.Fatalf("CLIENT INFO = %+v, %v; want resp=%d", info, err, protocol)
	}
	b, err := redisbackend.New(client, redisbackend.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return b, client
}

// waitTopologyLoads waits until no goroutine is loading a slot map for a
// backend's Node, which ends within the load's 2s timeout; it fails t if
// one runs for 10s, a bound that leaves a loaded machine time. goleak
// in TestMain would report such a goroutine too, but only after retrying
// for well under a second, and without naming the test.
func waitTopologyLoads(t *testing.T) {
	buf := make([]byte, 4<<20)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		stacks := buf[:runtime.Stack(buf, true)]
		if !bytes.Contains(stacks, []byte("redisscript.(*Topology).load")) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("a topology load still runs 10s after the test:\n%s", stacks)
			return
		}
	}
}

// TestClusterTopologyIntegration checks Masters, Node and Slot on a
// cluster client, on RESP3 and on RESP2, against the cluster package servers
// formed and CLUSTER KEYSLOT.
func TestClusterTopologyIntegration(t *testing.T) {
	cluster := servers.StartCluster(t)
	const prefix = "rl:"
	want := wantNodes(t, cluster, prefix, slotKeys)

	for _, protocol := range protocols {
		t.Run(fmt.Sprint("RESP", protocol), func(t *testing.T) {
			t.Run("Masters", func(t *testing.T) {
				b, _ := clusterBackend(t, cluster, prefix, protocol)
				got, err := b.Masters(context.Background())
				if want := wantMasters(cluster); err != nil || !reflect.DeepEqual(got, want) {
					t.Fatalf("Masters = %+v, %v; want %+v", got, err, want)
				}
			})

			t.Run("NodeAfterMasters", func(t *testing.T) {
				b, client := clusterBackend(t, cluster, prefix, protocol)
				if _, err := b.Masters(context.Background()); err != nil {
					t.Fatal(err)
				}
				for i, k := range slotKeys {
					if got := b.Node(k); got != want[i] {
						t.Errorf("Node(%q) = %q; want %q, the master of its slot", k, got, want[i])
					}
				}
				// The client's own slot map agrees.
				for _, k := range slotKeys[:20] {
					m, err := client.MasterForKey(context.Background(), redisscript.Key(prefix, k))
					if err != nil {
						t.Fatal(err)
					}
					if got := b.Node(k); got != m.Options().Addr {
						t.Errorf("Node(%q) = %q; the client sends the key to %q", k, got, m.Options().Addr)
					}
				}
			})

			t.Run("NodeLoads", func(t *testing.T) {
				b, _ := clusterBackend(t, cluster, prefix, protocol)
				if got := b.Node(slotKeys[0]); got != "" {
					t.Fatalf("Node(%q) before the map has loaded = %q; want \"\"", slotKeys[0], got)
				}
				// That call started a load, in the background.
				for deadline := time.Now().Add(10 * time.Second); b.Node(slotKeys[0]) != want[0]; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("Node(%q) = %q 10s after the first call; want %q", slotKeys[0], b.Node(slotKeys[0]), want[0])
					}
				}
				for i, k := range slotKeys {
					if got := b.Node(k); got != want[i] {
						t.Errorf("Node(%q) = %q; want %q, the master of its slot", k, got, want[i])
					}
				}
			})
		})
	}

	t.Run("Slot", func(t *testing.T) {
		for _, prefix := range []string{redisbackend.DefaultPrefix, prefix} {
			b, _ := clusterBackend(t, cluster, prefix, 3)
			for i, want := range keySlots(t, cluster, prefix, slotKeys) {
				if got, ok := b.Slot(slotKeys[i]); got != want || !ok {
					t.Errorf("with prefix %q, Slot(%q) = %d, %v; want %d, true: CLUSTER KEYSLOT of %q", prefix, slotKeys[i], got, ok, want, redisscript.Key(prefix, slotKeys[i]))
				}
			}
		}
	})
}

// TestStandaloneTopologyIntegration: on a plain client, Node cannot tell,
// Masters is unsupported, and Slot is the one the bucket would have on a
// cluster.
func TestStandaloneTopologyIntegration(t *testing.T) {
	server := servers.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: server.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	defer c.Close()
	b, err := redisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Masters(context.Background()); got != nil || !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Masters = %+v, %v; want an error wrapping errors.ErrUnsupported", got, err)
	}
	for _, k := range slotKeys {
		if got := b.Node(k); got != "" {
			t.Errorf("Node(%q) = %q; want \"\"", k, got)
		}
		want := redisscript.KeySlot(redisscript.Key(redisbackend.DefaultPrefix, k))
		if got, ok := b.Slot(k); got != want || !ok {
			t.Errorf("Slot(%q) = %d, %v; want %d, true", k, got, ok, want)
		}
	}
}
