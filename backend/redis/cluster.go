package redisbackend

import (
	"context"
	"errors"
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
func (b *Backend) Slot(key string) (int, bool) {
	return redisscript.Slot(b.settings.Prefix, key), true
}

// Node returns the address of the cluster master that serves the bucket at
// key, and its permits, from a slot map that the backend loads with
// CLUSTER SHARDS in the background, and again when it is used a second or
// more after a load; see [ratelimit.NodeLocator]. It returns "" for a
// client that is not a *redis.ClusterClient, and until the first map has
// loaded.
func (b *Backend) Node(key string) string {
	if b.topology == nil {
		return ""
	}
	return b.topology.Node(redisscript.Slot(b.settings.Prefix, key))
}

// Masters asks the cluster, through the client, for its masters and their
// slots (CLUSTER SHARDS); see [ratelimit.TopologyReporter]. It needs a
// *redis.ClusterClient, and Redis 7.0 or later.
func (b *Backend) Masters(ctx context.Context) ([]ratelimit.Master, error) {
	if b.topology == nil {
		return nil, fmt.Errorf("%s: Masters: the client is a %T, not a *redis.ClusterClient: %w", name, b.client, errors.ErrUnsupported)
	}
	return b.topology.Masters(ctx)
}

// topology returns the slot map of c if it is a cluster client, else nil.
func topology(c redis.UniversalClient) *redisscript.Topology {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	return redisscript.NewTopology(func(ctx context.Context) ([]ratelimit.Master, error) {
		reply, err := cc.ClusterShards(ctx).Result()
		if err != nil {
			return nil, redisscript.Error(ctx, err, name+": CLUSTER SHARDS")
		}
		masters, err := redisscript.Masters(shardsOf(reply))
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ratelimit.ErrBackendUnavailable, name, err)
		}
		return masters, nil
	})
}

// shardsOf is go-redis's decoding of a CLUSTER SHARDS reply, RESP2 or
// RESP3, as redisscript.Masters reads it.
func shardsOf(reply []redis.ClusterShard) []redisscript.Shard {
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
	return shards
}
