package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// testKeys: the key layout, the prefix, the TTL, and the hash tag that a
// key's own braces cannot move.
func testKeys(t *testing.T, a Adapter, tops []topology) {
	standalone, cluster := tops[0], tops[1]
	ctx := context.Background()

	t.Run("LayoutAndTTL", func(t *testing.T) {
		t.Parallel()
		b, _ := a.Connect(t, standalone.addrs, false, Options{Prefix: "rl:"})
		c := raw(t, standalone)
		key := uniqueKey(t, "ttl")
		rkey := "rl:{" + key + "}"
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}}
		d, err := b.Do(ctx, key, cfg, ratelimit.Request{Op: ratelimit.Estimate, Tokens: 1})
		if err != nil || !d.Allowed {
			t.Fatalf("Estimate: %+v, %v", d, err)
		}
		if n := c.Exists(ctx, rkey).Val(); n != 0 {
			t.Fatalf("a full bucket is stored at %s; want no key, as for a new bucket", rkey)
		}
		d, err = b.Do(ctx, key, cfg, ratelimit.Request{Tokens: 5})
		if err != nil || !d.Allowed || d.ResetAfter != 500*time.Millisecond {
			t.Fatalf("Consume 5: %+v, %v; want allowed, ResetAfter 500ms", d, err)
		}
		ttl, err := c.PTTL(ctx, rkey).Result()
		if err != nil || ttl <= 400*time.Millisecond || ttl > 1500*time.Millisecond {
			t.Fatalf("PTTL %s = %v, %v; want the time to refill, 500ms, rounded up to the end of its second", rkey, ttl, err)
		}
		// 18 bytes of header and ID, then (capacity, level) and (scale,
		// expiry - stamp) in 3 bytes each: PerSecond(10) holds 500,000
		// scaled units, and the stamp lies 500,000µs before the expiry.
		if n := c.StrLen(ctx, rkey).Val(); n > 30 {
			t.Errorf("one bandwidth's state takes %d bytes; want at most 30", n)
		}
		if _, err := b.Do(ctx, key, cfg, ratelimit.Request{Op: ratelimit.Add, Tokens: 5}); err != nil {
			t.Fatal(err)
		}
		if n := c.Exists(ctx, rkey).Val(); n != 0 {
			t.Fatalf("a bucket refilled by Add is still stored; want it deleted")
		}
	})

	t.Run("HashTag", func(t *testing.T) {
		t.Parallel()
		b, _ := a.Connect(t, cluster.addrs, true, Options{})
		l := ratelimit.New(b)
		c := raw(t, cluster)
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(2)}}
		base := uniqueKey(t, "")
		escape := strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
		// Keys whose braces would, unescaped, pick another slot or share
		// one bucket; each must be a bucket of its own, on the slot of its
		// whole (escaped) text.
		keys := []string{"{victim}", "a{victim}", "b{victim}", "}{", "{}", "%7Bvictim%7D", "x}y{z", base + "{victim}"}
		for _, k := range keys {
			for want := int64(1); want >= 0; want-- {
				expectRemaining(t, l, k+base, cfg, want)
			}
			if d, err := l.Allow(ctx, k+base, cfg); err != nil || d.Allowed {
				t.Fatalf("third Allow on %q: %+v, %v; want denied: the key shares no bucket", k+base, d, err)
			}
			rkey := redisscript.Key("", k+base)
			slot := c.ClusterKeySlot(ctx, rkey).Val()
			whole := c.ClusterKeySlot(ctx, escape.Replace(k+base)).Val()
			if slot != whole {
				t.Errorf("key %q is stored at %q on slot %d; want the slot of the whole key, %d", k+base, rkey, slot, whole)
			}
			if c.Exists(ctx, rkey).Val() != 1 {
				t.Errorf("key %q: no bucket at %q", k+base, rkey)
			}
		}
	})
}
