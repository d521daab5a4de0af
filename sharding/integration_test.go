package sharding_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// TestNamesIntegration: on a real 3-master cluster, through the go-redis
// backend under a prefix, hot keys short and of up to MaxKeyLen bytes
// (499 bytes, the longest kept whole in the sub-keys, and 500, the
// shortest not), with the bytes the Redis key escapes, are split: sub-bucket
// i of n has a Redis key on the slot at the centre of the i-th of n equal
// parts of the slots, as CLUSTER KEYSLOT tells, so 3 ways one on each
// master and 6 ways two on each; and the key counts what it gives out.
func TestNamesIntegration(t *testing.T) {
	cluster := servers.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	const prefix = "rl:"
	backend, err := redisbackend.New(client, redisbackend.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	long := func(head string) string {
		return head + strings.Repeat("{x}%", ratelimit.MaxKeyLen)[:ratelimit.MaxKeyLen-len(head)]
	}
	b, err := sharding.New(backend, sharding.Keys(3, long("global:")), sharding.Prefix(3, "t3:"), sharding.Prefix(6, "t6:"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(600)}}
	for key, n := range map[string]int{
		long("global:"): 3, "t3:{42}%": 3, long("t3:"): 3, long("t3:")[:499]: 3,
		"t6:{42}%": 6, long("t6:"): 6, long("t6:")[:500]: 6,
	} {
		for range 12 {
			if d, err := b.Do(ctx, key, cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); err != nil || !d.Allowed {
				t.Fatalf("%d-byte key: Consume: %+v, %v; want allowed", len(key), d, err)
			}
		}
		if d, err := b.Do(ctx, key, cfg, ratelimit.Request{Op: ratelimit.Inspect}); err != nil || d.Remaining != 600-12 {
			t.Errorf("%d-byte key: Inspect after 12 Consumes: %+v, %v; want 588 left", len(key), d, err)
		}
		subs, err := b.Slots(ctx, key)
		if err != nil || len(subs) != n {
			t.Fatalf("%d-byte key: Slots: %v, %v; want %d", len(key), subs, err, n)
		}
		served := map[string]int{}
		for i, s := range subs {
			slot, err := client.ClusterKeySlot(ctx, redisscript.Key(prefix, s.Key)).Result()
			if centre := (2*i + 1) * ratelimit.NumSlots / (2 * n); err != nil || int(slot) != centre || s.Slot != int(slot) {
				t.Errorf("%d-byte key: sub-bucket %d: CLUSTER KEYSLOT %d, %v; Slots says %d; want %d", len(key), i, slot, err, s.Slot, centre)
			}
			if len(s.Key) > ratelimit.MaxKeyLen {
				t.Errorf("%d-byte key: sub-bucket %d's key has %d bytes", len(key), i, len(s.Key))
			}
			served[s.Master]++
		}
		if len(served) != 3 || served[""] != 0 {
			t.Errorf("%d-byte key split %d ways: sub-buckets per master %v; want %d on each of 3", len(key), n, served, n/3)
		}
		for m, k := range served {
			if k != n/3 {
				t.Errorf("%d-byte key split %d ways: %s serves %d; want %d", len(key), n, m, k, n/3)
			}
		}
	}
}
