package redisbackend

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

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
// more after a load; see [ratelimit.NodeLocator]. It returns "" for a
// client that is not a *redis.ClusterClient, and until the first map has
// loaded.
func (b *Backend) Node(key string) string { return b.rs.Node(key) }

// Masters asks the cluster, through the client, for its masters and their
// slots (CLUSTER SHARDS); see [ratelimit.TopologyReporter]. It needs a
// *redis.ClusterClient, and Redis 7.0 or later.
func (b *Backend) Masters(ctx context.Context) ([]ratelimit.Master, error) {
	return b.rs.Masters(ctx, fmt.Sprintf("the client is a %T, not a *redis.ClusterClient", b.client))
}

// topology returns the slot map of c if it is a cluster client, else nil.
func topology(c redis.UniversalClient) *redisscript.Topology {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	return redisscript.ClusterTopology(name, func(ctx context.Context) ([]redis.ClusterShard, error) {
		return cc.ClusterShards(ctx).Result()
	}, shardsOf)
}

// shardsOf is go-redis's decoding of a CLUSTER SHARDS reply, RESP2 or
// RESP3, as redisscript.Masters reads it.
func shardsOf(reply []redis.ClusterShard) ([]redisscript.Shard, error) {
	shards := make([]redisscript.Shard, len(reply))
	for i, s := range reply {
		for _, r := range s.Slots {
			shards[i].Slots = append(shards[i].Slots, [2]int64{r.Start, r.End})
		}
		for _, n := range s.Nodes {
			shards[i].Nodes = append(shards[i].Nodes, redisscript.ShardNode{
				Endpoint: n.Endpoint, IP: n.IP, Port: n.Port, TLSPort: n.TLSPort, Role: n.Role, Health: n.Health,
			})
		}
	}
	return shards, nil
}
