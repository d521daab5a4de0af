package redisscript_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// newClusterNodeClient connects to one node of a throwaway cluster, which
// answers CLUSTER KEYSLOT for any key: the command names no key to
// redirect by.
func newClusterNodeClient(t *testing.T) *redis.Client {
	t.Helper()
	cluster := servers.StartCluster(t)
	c := redis.NewClient(&redis.Options{Addr: cluster.Addrs()[0], MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// keySlots asks the server for CLUSTER KEYSLOT of each Redis key, in one
// pipeline.
func keySlots(t *testing.T, c *redis.Client, rkeys []string) []int {
	t.Helper()
	ctx := context.Background()
	cmds := make([]*redis.IntCmd, len(rkeys))
	if _, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range rkeys {
			cmds[i] = pipe.ClusterKeySlot(ctx, k)
		}
		return nil
	}); err != nil {
		t.Fatalf("CLUSTER KEYSLOT of %d keys: %v", len(rkeys), err)
	}
	slots := make([]int, len(rkeys))
	for i, cmd := range cmds {
		slots[i] = int(cmd.Val())
	}
	return slots
}

// randomKeys returns n keys of 0 to 600 random bytes, a quarter of them
// the bytes that matter to hash tags and to the key escape ('{', '}', '%')
// and NUL, so that tags open, close and nest in every way.
func randomKeys(r *rand.Rand, n int) []string {
	const special = "{}%\x00"
	keys := make([]string, n)
	for i := range keys {
		b := make([]byte, r.IntN(601))
		for j := range b {
			if r.IntN(4) == 0 {
				b[j] = special[r.IntN(len(special))]
			} else {
				b[j] = byte(r.Uint32())
			}
		}
		keys[i] = string(b)
	}
	return keys
}

// TestSlotIntegration checks KeySlot and Slot against CLUSTER KEYSLOT on
// one node of a cluster.
func TestSlotIntegration(t *testing.T) {
	c := newClusterNodeClient(t)
	t.Run("Vectors", func(t *testing.T) { keySlotVectors(t, c) })
	t.Run("RandomKeys", func(t *testing.T) { keySlotRandom(t, c) })
	t.Run("BucketKeys", func(t *testing.T) { bucketSlots(t, c) })
}

// keySlotVectors: KeySlot gives Redis's documented answers (CRC16 of
// "123456789" is 0x31C3; CLUSTER KEYSLOT's examples), hashes what Redis's
// hash tag rule says it hashes, and agrees with CLUSTER KEYSLOT on every
// key.
func keySlotVectors(t *testing.T, c *redis.Client) {
	for _, tc := range []struct {
		key    string
		hashed string // the part of key Redis hashes
		want   int    // the slot, when the documentation gives it; else -1
	}{
		{"123456789", "123456789", 0x31C3},
		{"somekey", "somekey", 11058},
		{"foo{hash_tag}", "hash_tag", 2515},
		{"{user1000}.following", "user1000", -1},
		{"{user1000}.followers", "user1000", -1},
		{"foo{}{bar}", "foo{}{bar}", -1}, // an empty tag: the whole key
		{"foo{{bar}}zap", "{bar", -1},    // from the first '{' to the first '}'
		{"foo{bar}{zap}", "bar", -1},     // the first tag only
		{"{}", "{}", -1},
		{"}{", "}{", -1},
		{"{", "{", -1},
		{"}", "}", -1},
		{"a{b", "a{b", -1},
		{"{a}", "a", -1},
		{"", "", 0},
	} {
		slots := keySlots(t, c, []string{tc.key, tc.hashed})
		got := redisscript.KeySlot(tc.key)
		if got != slots[0] || slots[0] != slots[1] || tc.want >= 0 && got != tc.want {
			t.Errorf("KeySlot(%q) = %d; CLUSTER KEYSLOT says %d for it and %d for %q, the part it hashes; the documented slot is %d",
				tc.key, got, slots[0], slots[1], tc.hashed, tc.want)
		}
	}
}

// keySlotRandom: KeySlot agrees with CLUSTER KEYSLOT on thousands of
// random keys full of braces, '%' and NUL.
func keySlotRandom(t *testing.T, c *redis.Client) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	keys := randomKeys(rand.New(rand.NewPCG(seed, 0)), 4000)
	for i, want := range keySlots(t, c, keys) {
		if got := redisscript.KeySlot(keys[i]); got != want {
			t.Errorf("KeySlot(%q) = %d; CLUSTER KEYSLOT says %d", keys[i], got, want)
		}
	}
}

// bucketSlots: the slot Slot gives a bucket is the one its Redis key lands
// on, by KeySlot and by CLUSTER KEYSLOT, whatever the key holds, under
// each prefix, the backends' default of none included.
func bucketSlots(t *testing.T, c *redis.Client) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	keys := append(randomKeys(rand.New(rand.NewPCG(seed, 0)), 1000),
		"", "user:12345", "{victim}", "a{b}c", "}{", "{}", "%", "%7B", "%7D%", "{user1000}.following", "\x00{\x00}")
	for _, prefix := range []string{"", "rl:", "sluice:v1:"} {
		rkeys := make([]string, len(keys))
		for i, k := range keys {
			rkeys[i] = redisscript.Key(prefix, k)
		}
		for i, want := range keySlots(t, c, rkeys) {
			got, keySlot := redisscript.Slot(prefix, keys[i]), redisscript.KeySlot(rkeys[i])
			if got != want || keySlot != want {
				t.Errorf("Slot(%q, %q) = %d, KeySlot(%q) = %d; CLUSTER KEYSLOT says %d", prefix, keys[i], got, rkeys[i], keySlot, want)
			}
		}
	}
}

// FuzzSlot: Slot is KeySlot of the bucket's Redis key, a slot in range,
// for every key and prefix (even one with the braces Settings.Check
// refuses).
func FuzzSlot(f *testing.F) {
	for _, k := range []string{"user:12345", "{victim}", "a{b}c", "}{", "{}", "%", "%7B", "", "\x00"} {
		f.Add("p:", k)
	}
	f.Add("", "k")
	f.Add("{", "k")
	f.Add("a}b{", "")
	f.Fuzz(func(t *testing.T, prefix, key string) {
		got, want := redisscript.Slot(prefix, key), redisscript.KeySlot(redisscript.Key(prefix, key))
		if got != want || got < 0 || got >= ratelimit.NumSlots {
			t.Fatalf("Slot(%q, %q) = %d; want KeySlot(%q) = %d, in [0, %d)", prefix, key, got, redisscript.Key(prefix, key), want, ratelimit.NumSlots)
		}
	})
}

// TestSlotAllocs: Slot allocates nothing for a key with nothing to
// escape, so that a decorator may call it on every decision.
func TestSlotAllocs(t *testing.T) {
	key := "user:" + strings.Repeat("x", 100)
	var slot int
	if n := testing.AllocsPerRun(100, func() { slot = redisscript.Slot("rl:", key) }); n != 0 {
		t.Errorf("Slot(%q, %q) allocates %v times; want none", "rl:", key, n)
	}
	if want := redisscript.KeySlot(redisscript.Key("rl:", key)); slot != want {
		t.Errorf("Slot = %d; want %d", slot, want)
	}
}
