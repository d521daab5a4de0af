package rueidisbackend_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
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

// protocols are the ways a client may speak to the server: RESP3, which
// rueidis tries first, and RESP2, on which CLUSTER SHARDS replies with
// arrays instead of maps.
var protocols = []struct {
	name  string
	resp2 bool
}{{"RESP3", false}, {"RESP2", true}}

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
// under prefix, in one round trip.
func keySlots(t *testing.T, c *servers.Cluster, prefix string, keys []string) []int {
	t.Helper()
	node, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs()[:1], ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = node.B().ClusterKeyslot().Key(redisscript.Key(prefix, k)).Build()
	}
	slots := make([]int, len(keys))
	for i, r := range node.DoMulti(context.Background(), cmds...) {
		slot, err := r.AsInt64()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", redisscript.Key(prefix, keys[i]), err)
		}
		slots[i] = int(slot)
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

// clusterBackend returns a backend under prefix on a new cluster client of
// c, on RESP2 if resp2. t.Cleanup closes the client, then waits for the
// backend's background topology load, if one is running, to end.
func clusterBackend(t *testing.T, c *servers.Cluster, prefix string, resp2 bool) *rueidisbackend.Backend {
	t.Helper()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs(), AlwaysRESP2: resp2, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { waitTopologyLoads(t) })
	t.Cleanup(client.Close)
	if client.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("a client of %v is in mode %v; want cluster", c.Addrs(), client.Mode())
	}
	wantResp := map[bool]string{false: "resp=3", true: "resp=2"}[resp2]
	if info, err := client.Do(context.Background(), client.B().ClientInfo().Build()).ToString(); err != nil || !strings.Contains(info, wantResp) {
		t.Fatalf("CLIENT INFO = %q, %v; want it to say %s", info, err, wantResp)
	}
	b, err := rueidisbackend.New(client, rueidisbackend.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return b
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

	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Run("Masters", func(t *testing.T) {
				b := clusterBackend(t, cluster, prefix, p.resp2)
				got, err := b.Masters(context.Background())
				if want := wantMasters(cluster); err != nil || !reflect.DeepEqual(got, want) {
					t.Fatalf("Masters = %+v, %v; want %+v", got, err, want)
				}
			})

			t.Run("NodeAfterMasters", func(t *testing.T) {
				b := clusterBackend(t, cluster, prefix, p.resp2)
				if _, err := b.Masters(context.Background()); err != nil {
					t.Fatal(err)
				}
				for i, k := range slotKeys {
					if got := b.Node(k); got != want[i] {
						t.Errorf("Node(%q) = %q; want %q, the master of its slot", k, got, want[i])
					}
				}
			})

			t.Run("NodeLoads", func(t *testing.T) {
				b := clusterBackend(t, cluster, prefix, p.resp2)
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
		for _, prefix := range []string{rueidisbackend.DefaultPrefix, prefix} {
			b := clusterBackend(t, cluster, prefix, false)
			for i, want := range keySlots(t, cluster, prefix, slotKeys) {
				if got, ok := b.Slot(slotKeys[i]); got != want || !ok {
					t.Errorf("with prefix %q, Slot(%q) = %d, %v; want %d, true: CLUSTER KEYSLOT of %q", prefix, slotKeys[i], got, ok, want, redisscript.Key(prefix, slotKeys[i]))
				}
			}
		}
	})
}

// TestStandaloneTopologyIntegration: on a client not in cluster mode, Node
// cannot tell, Masters is unsupported, and Slot is the one the bucket
// would have on a cluster.
func TestStandaloneTopologyIntegration(t *testing.T) {
	server := servers.StartRedis(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{server.Addr()}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := rueidisbackend.New(c)
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
		want := redisscript.KeySlot(redisscript.Key(rueidisbackend.DefaultPrefix, k))
		if got, ok := b.Slot(k); got != want || !ok {
			t.Errorf("Slot(%q) = %d, %v; want %d, true", k, got, ok, want)
		}
	}
}
