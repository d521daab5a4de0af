package rueidisbackend

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

var (
	_ ratelimit.SlotMapper       = (*Backend)(nil)
	_ ratelimit.NodeLocator      = (*Backend)(nil)
	_ ratelimit.TopologyReporter = (*Backend)(nil)
)

// Slot returns the Redis Cluster hash slot of the bucket at key, and of
// its permits, and true; see [ratelimit.SlotMapper]. It is the same
// whatever the client, since the key layout alone decides it.
func (b *Backend) Slot(key string) (int, bool) { return b.rs.Slot(key), true }

// Node returns the address of the cluster master that serves the bucket at
// key, and its permits, from a slot map that the backend loads with
// CLUSTER SHARDS in the background, and again when it is used a second or
// more after a load (rueidis keeps its own map to itself); see
// [ratelimit.NodeLocator]. It returns "" for a client that is not in
// cluster mode, and until the first map has loaded.
func (b *Backend) Node(key string) string { return b.rs.Node(key) }

// Masters asks the cluster, through the client, for its masters and their
// slots (CLUSTER SHARDS); see [ratelimit.TopologyReporter]. It needs a
// client in cluster mode, and Redis 7.0 or later.
func (b *Backend) Masters(ctx context.Context) ([]ratelimit.Master, error) {
	return b.rs.Masters(ctx, "the client is not in cluster mode")
}

// topology returns the slot map of c if it is a cluster client, else nil.
func topology(c rueidis.Client) *redisscript.Topology {
	if c.Mode() != rueidis.ClientModeCluster {
		return nil
	}
	return redisscript.ClusterTopology(name, func(ctx context.Context) ([]rueidis.RedisMessage, error) {
		return c.Do(ctx, c.B().ClusterShards().Build()).ToArray()
	}, parseShards)
}

// parseShards decodes a CLUSTER SHARDS reply, RESP2 or RESP3.
func parseShards(reply []rueidis.RedisMessage) ([]redisscript.Shard, error) {
	shards := make([]redisscript.Shard, len(reply))
	for i := range reply {
		fields, err := reply[i].AsMap()
		if err != nil {
			return nil, fmt.Errorf("CLUSTER SHARDS: shard %d: %w", i, err)
		}
		slotsMsg, nodesMsg := fields["slots"], fields["nodes"]
		slots, err := slotsMsg.AsIntSlice()
		if err != nil {
			return nil, fmt.Errorf("CLUSTER SHARDS: shard %d: slots: %w", i, err)
		}
		if len(slots)%2 != 0 {
			return nil, fmt.Errorf("CLUSTER SHARDS: shard %d: slots %v are not pairs of first and last", i, slots)
		}
		for j := 0; j < len(slots); j += 2 {
			shards[i].Slots = append(shards[i].Slots, [2]int64{slots[j], slots[j+1]})
		}
		nodes, err := nodesMsg.ToArray()
		if err != nil {
			return nil, fmt.Errorf("CLUSTER SHARDS: shard %d: nodes: %w", i, err)
		}
		for j := range nodes {
			n, err := nodes[j].AsMap()
			if err != nil {
				return nil, fmt.Errorf("CLUSTER SHARDS: shard %d: node %d: %w", i, j, err)
			}
			str := func(k string) string { m := n[k]; s, _ := m.ToString(); return s }
			num := func(k string) int64 { m := n[k]; v, _ := m.AsInt64(); return v }
			shards[i].Nodes = append(shards[i].Nodes, redisscript.ShardNode{
				Endpoint: str("endpoint"), IP: str("ip"), Port: num("port"), TLSPort: num("tls-port"),
				Role: str("role"), Health: str("health"),
			})
		}
	}
	return shards, nil
}
