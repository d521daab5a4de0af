package redistest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// testPermits: what DoPermit does on Redis beyond the conformance suite's
// Permits group (which testConformance and testFunctions run): bad input
// refused before any I/O; a call out on a stalled server ended by its
// context's deadline with the context's error; the key expiring when its
// last lease ends, on the server's clock; a key's state of a member per
// permit held, never more than its limit; the key beside the bucket of the
// same user key, on its slot, on a standalone server and a cluster; and a
// key that holds what sluice did not write.
func testPermits(t *testing.T, a Adapter, tops []topology) {
	standalone := tops[0]
	t.Run("BeforeIO", func(t *testing.T) { t.Parallel(); testPermitBeforeIO(t, a, standalone) })
	t.Run("Deadline", func(t *testing.T) { t.Parallel(); testPermitDeadline(t, a) })
	t.Run("TTL", func(t *testing.T) { t.Parallel(); testPermitTTL(t, a, standalone) })
	t.Run("Foreign", func(t *testing.T) { t.Parallel(); testPermitForeign(t, a, standalone) })
	for _, top := range tops {
		t.Run(top.name, func(t *testing.T) {
			t.Parallel()
			t.Run("StateSize", func(t *testing.T) { testPermitStateSize(t, a, top) })
			t.Run("Layout", func(t *testing.T) { testPermitLayout(t, a, top) })
		})
	}
}

// acquire is an acquire of weight w by holder.
func acquire(holder string, w int64) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: holder, Weight: w}
}

// permitOp is req's op by holder, of weight 1.
func permitOp(op ratelimit.PermitOp, holder string) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: op, Holder: holder, Weight: 1}
}

// expectPermit runs req and wants its Granted and InFlight.
func expectPermit(t *testing.T, b ratelimit.PermitBackend, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest, granted bool, inFlight int64) ratelimit.PermitDecision {
	t.Helper()
	d, err := b.DoPermit(context.Background(), key, lim, req)
	if err != nil || d.Granted != granted || d.InFlight != inFlight || d.Limit != lim.Limit {
		t.Fatalf("%v by %q of %d under %+v: %+v, %v; want Granted %v, InFlight %d", req.Op, req.Holder, req.Weight, lim, d, err, granted, inFlight)
	}
	return d
}

// members returns the sorted set at rkey, member by score.
func members(t *testing.T, c redis.UniversalClient, rkey string) map[string]float64 {
	t.Helper()
	zs, err := c.ZRangeWithScores(context.Background(), rkey, 0, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE %s: %v", rkey, err)
	}
	m := map[string]float64{}
	for _, z := range zs {
		m[z.Member.(string)] = z.Score
	}
	return m
}

// testPermitBeforeIO: bad input fails on a closed client with the error
// that names the field, not the client's: it is refused before any I/O.
// (The conformance suite checks every field, and that nothing changes.)
func testPermitBeforeIO(t *testing.T, a Adapter, top topology) {
	ctx := context.Background()
	b, closeClient := a.Connect(t, top.addrs, false, Options{})
	closeClient()
	lim := ratelimit.InFlight(5, time.Hour)
	for _, tc := range []struct {
		name  string
		key   string
		lim   ratelimit.Concurrency
		req   ratelimit.PermitRequest
		want  error
		field string
	}{
		{"empty key", "", lim, acquire("b", 1), ratelimit.ErrInvalidKey, "key"},
		{"zero limit", "k", ratelimit.InFlight(0, time.Hour), acquire("b", 1), ratelimit.ErrInvalidConfig, "Concurrency.Limit"},
		{"lease of ns", "k", ratelimit.InFlight(5, time.Second+time.Nanosecond), acquire("b", 1), ratelimit.ErrInvalidConfig, "Concurrency.Lease"},
		{"release without holder", "k", lim, permitOp(ratelimit.PermitRelease, ""), ratelimit.ErrInvalidRequest, "Holder"},
		{"weight over the limit", "k", lim, acquire("b", 6), ratelimit.ErrInvalidRequest, "Weight"},
	} {
		d, err := b.DoPermit(ctx, tc.key, tc.lim, tc.req)
		if !errors.Is(err, tc.want) || errors.Is(err, ratelimit.ErrBackendUnavailable) || !strings.Contains(err.Error(), tc.field) || d != (ratelimit.PermitDecision{}) {
			t.Errorf("%s on a closed client: %+v, %v; want %v naming %s, found before any I/O", tc.name, d, err, tc.want, tc.field)
		}
	}
	if _, err := b.DoPermit(ctx, "k", lim, acquire("b", 1)); !errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Errorf("DoPermit on a closed client: %v; want ErrBackendUnavailable", err)
	}
}

// testPermitDeadline: a call out on a paused server ends at its context's
// deadline with the context's error, not a store failure.
func testPermitDeadline(t *testing.T, a Adapter) {
	ctx := context.Background()
	r := servers.StartRedis(t)
	b, _ := a.Connect(t, []string{r.Addr()}, false, Options{})
	key := uniqueKey(t, "deadline")
	lim := ratelimit.InFlight(5, time.Minute)
	expectPermit(t, b, key, lim, acquire("a", 1), true, 1)
	r.Pause(t)
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	start := time.Now()
	_, err := b.DoPermit(tctx, key, lim, acquire("b", 1))
	cancel()
	elapsed := time.Since(start)
	r.Resume(t)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ratelimit.ErrTimeout) || errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Fatalf("DoPermit on a paused server: %v; want the caller's context.DeadlineExceeded, no store sentinel", err)
	}
	if elapsed > 2*time.Second {
		t.Errorf("DoPermit on a paused server returned after %v; want about the context's 200ms", elapsed)
	}
	// The paused call may have run on the resumed server: b holds or not.
	if _, err := eventually(t, func() (ratelimit.PermitDecision, error) {
		return b.DoPermit(ctx, key, lim, permitOp(ratelimit.PermitRelease, "a"))
	}); err != nil {
		t.Fatalf("DoPermit after Resume: %v", err)
	}
}

// serverNow returns the time, in µs, of c's server.
func serverNow(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMicro()
}

// waitServerPast polls the time of c's server until it is past µs, by a
// bound that a loaded machine keeps.
func waitServerPast(t *testing.T, c redis.UniversalClient, µs int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for serverNow(t, c) <= µs {
		if time.Now().After(deadline) {
			t.Fatalf("the server's clock did not pass %dµs within 30s", µs)
		}
		time.Sleep(time.Millisecond)
	}
}

// testPermitTTL: the key expires at the millisecond its last lease ends,
// on the server's clock, and is gone once that has passed, or once its
// last permit is released.
func testPermitTTL(t *testing.T, a Adapter, top topology) {
	ctx := context.Background()
	b, _ := a.Connect(t, top.addrs, false, Options{Prefix: "rl:"})
	c := raw(t, top)
	key := uniqueKey(t, "ttl")
	rkey := "rl:{" + key + "}:permits"
	lim := ratelimit.InFlight(3, 30*time.Second)
	before := serverNow(t, c)
	expectPermit(t, b, key, lim, acquire("a", 2), true, 2)
	after := serverNow(t, c)
	ceilMs := func(µs int64) int64 { return (µs + 999) / 1000 }
	at, err := c.Do(ctx, "PEXPIRETIME", rkey).Int64()
	if l := lim.Lease.Microseconds(); err != nil || at < ceilMs(before+l) || at > ceilMs(after+l) {
		t.Fatalf("PEXPIRETIME %s = %d, %v; want %d to %d, when the lease ends", rkey, at, err, ceilMs(before+l), ceilMs(after+l))
	}
	short := ratelimit.InFlight(3, 5*time.Millisecond)
	expectPermit(t, b, key, lim, permitOp(ratelimit.PermitRelease, "a"), true, 0)
	if n := c.Exists(ctx, rkey).Val(); n != 0 {
		t.Fatalf("the key outlived its last permit's release")
	}
	expectPermit(t, b, key, short, acquire("b", 1), true, 1)
	after = serverNow(t, c)
	// Redis drops a key once the millisecond it expires at has passed.
	waitServerPast(t, c, (ceilMs(after+short.Lease.Microseconds())+1)*1000)
	if n := c.Exists(ctx, rkey).Val(); n != 0 {
		t.Fatalf("the key outlived its last lease")
	}
}

// testPermitStateSize: a key holds at most a member per permit of its
// limit, however many acquire; a limit lowered below what is held denies
// every acquire, and the key does not grow.
func testPermitStateSize(t *testing.T, a Adapter, top topology) {
	ctx := context.Background()
	b, _ := a.Connect(t, top.addrs, top.cluster, Options{})
	c := raw(t, top)
	key := uniqueKey(t, "size")
	rkey := redisscript.PermitKey("", key)
	lim := ratelimit.InFlight(5, time.Hour)
	granted := 0
	for i := range 40 {
		w := int64(1 + i%3)
		d, err := b.DoPermit(ctx, key, lim, acquire(fmt.Sprint("h", i), w))
		if err != nil {
			t.Fatal(err)
		}
		if d.Granted {
			granted++
		}
		if n := c.ZCard(ctx, rkey).Val(); n > lim.Limit || n != d.InFlight {
			t.Fatalf("after acquire %d the key holds %d members (InFlight %d); want at most the limit, %d", i, n, d.InFlight, lim.Limit)
		}
	}
	if granted == 0 {
		t.Fatal("no acquire was granted")
	}
	lowered := ratelimit.InFlight(2, time.Hour)
	held := c.ZCard(ctx, rkey).Val()
	for i := range 10 {
		expectPermit(t, b, key, lowered, acquire(fmt.Sprint("late", i), 1), false, held)
	}
	if n := c.ZCard(ctx, rkey).Val(); n != held {
		t.Fatalf("denied acquires under a lowered limit took the key from %d members to %d", held, n)
	}
}

// testPermitLayout: a key's permits are a sorted set at its bucket's key
// and ":permits", after the prefix, on the slot of its bucket, and live
// beside its bucket, of any algorithm, without either touching the other.
func testPermitLayout(t *testing.T, a Adapter, top topology) {
	ctx := context.Background()
	b, _ := a.Connect(t, top.addrs, top.cluster, Options{Prefix: "rl:"})
	c := raw(t, top)
	lim := ratelimit.InFlight(2, time.Hour)
	keys := []string{"{victim}", "a}b{c", "%7B", "plain"}
	for i := range 20 {
		keys = append(keys, fmt.Sprint("user:", i))
	}
	base := uniqueKey(t, "")
	for i, k := range keys {
		key := k + base
		alg := ratelimit.Algorithm(uint64(i) % numAlgorithms)
		cfg := ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3)}}
		if d, err := b.Do(ctx, key, cfg, ratelimit.Request{Tokens: 1}); err != nil || !d.Allowed {
			t.Fatalf("%v Consume on %q: %+v, %v", alg, key, d, err)
		}
		expectPermit(t, b, key, lim, acquire("h", 2), true, 2)
		if d, err := b.Do(ctx, key, cfg, ratelimit.Request{Tokens: 1}); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("%v Consume on %q beside its permits: %+v, %v; want allowed, Remaining 1", alg, key, d, err)
		}
		expectPermit(t, b, key, lim, permitOp(ratelimit.PermitInspect, ""), false, 2)
		pkey, bkey := redisscript.PermitKey("rl:", key), redisscript.Key("rl:", key)
		if kind := c.Type(ctx, pkey).Val(); kind != "zset" || len(members(t, c, pkey)) != 2 {
			t.Fatalf("key %q: its permits at %q are a %s of %v; want a sorted set of 2 members", key, pkey, kind, members(t, c, pkey))
		}
		if !strings.HasPrefix(pkey, bkey) || c.Exists(ctx, bkey).Val() != 1 {
			t.Fatalf("key %q: permits at %q, bucket at %q; want both, the permits' key the bucket's and a suffix", key, pkey, bkey)
		}
		if top.cluster {
			ps, bs := c.ClusterKeySlot(ctx, pkey).Val(), c.ClusterKeySlot(ctx, bkey).Val()
			if ps != bs || ps != int64(redisscript.Slot("rl:", key)) {
				t.Fatalf("key %q: permits on slot %d, bucket on %d, Slot says %d; want one slot", key, ps, bs, redisscript.Slot("rl:", key))
			}
		}
	}
}

// testPermitForeign: a permits key that holds another type is refused
// with ErrKeyRejected, not as a store failure, and left as it is.
func testPermitForeign(t *testing.T, a Adapter, top topology) {
	ctx := context.Background()
	b, _ := a.Connect(t, top.addrs, false, Options{})
	c := raw(t, top)
	key := uniqueKey(t, "foreign")
	rkey := redisscript.PermitKey("", key)
	c.Set(ctx, rkey, "hello", 0)
	_, err := b.DoPermit(ctx, key, ratelimit.InFlight(3, time.Minute), acquire("a", 1))
	if !errors.Is(err, ratelimit.ErrKeyRejected) || errors.Is(err, ratelimit.ErrBackendUnavailable) || !strings.Contains(err.Error(), "Acquire on key") {
		t.Fatalf("DoPermit on a string: %v; want ErrKeyRejected naming the op and key", err)
	}
	if v := c.Get(ctx, rkey).Val(); v != "hello" {
		t.Fatalf("the string became %q", v)
	}
}
