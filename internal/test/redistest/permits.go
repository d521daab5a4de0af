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

// testPermits: DoPermit through the backend, on the server's clock unless
// a test says otherwise: bad input refused before any I/O, naming the
// field and changing nothing; a caller's ended context taking nothing, and
// ending a call that is out with the context's error; leases reclaimed
// and the key expiring on the server's clock; weights; a key's state no
// larger than its limit; the key beside the bucket of the same user key,
// on its slot, on a standalone server and a cluster; scripts where a
// server refuses Functions; and a key that holds what sluice did not
// write.
func testPermits(t *testing.T, a Adapter, tops []topology) {
	standalone := tops[0]
	t.Run("BadInput", func(t *testing.T) { t.Parallel(); testPermitBadInput(t, a, standalone) })
	t.Run("Cancelled", func(t *testing.T) { t.Parallel(); testPermitCancelled(t, a, standalone) })
	t.Run("Deadline", func(t *testing.T) { t.Parallel(); testPermitDeadline(t, a) })
	t.Run("TTL", func(t *testing.T) { t.Parallel(); testPermitTTL(t, a, standalone) })
	t.Run("Scripts", func(t *testing.T) {
		t.Parallel()
		top := topology{name: "Scripts", addrs: []string{servers.StartRedis(t, "--rename-command", "FUNCTION", "").Addr()}}
		testPermitWeights(t, a, top)
	})
	t.Run("Foreign", func(t *testing.T) { t.Parallel(); testPermitForeign(t, a, standalone) })
	for _, top := range tops {
		t.Run(top.name, func(t *testing.T) {
			t.Parallel()
			t.Run("Reclaim", func(t *testing.T) { testPermitReclaim(t, a, top) })
			t.Run("Weights", func(t *testing.T) { testPermitWeights(t, a, top) })
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

func testPermitBadInput(t *testing.T, a Adapter, top topology) {
	ctx := context.Background()
	b, _ := a.Connect(t, top.addrs, false, Options{})
	closed, closeClient := a.Connect(t, top.addrs, false, Options{})
	closeClient()
	c := raw(t, top)
	key := uniqueKey(t, "bad")
	rkey := redisscript.PermitKey("", key)
	lim := ratelimit.InFlight(5, time.Hour)
	expectPermit(t, b, key, lim, acquire("a", 2), true, 2)
	before := members(t, c, rkey)
	for _, tc := range []struct {
		name  string
		key   string
		lim   ratelimit.Concurrency
		req   ratelimit.PermitRequest
		want  error
		field string
	}{
		{"empty key", "", lim, acquire("b", 1), ratelimit.ErrInvalidKey, "key"},
		{"long key", strings.Repeat("k", ratelimit.MaxKeyLen+1), lim, acquire("b", 1), ratelimit.ErrInvalidKey, "key"},
		{"zero limit", key, ratelimit.InFlight(0, time.Hour), acquire("b", 1), ratelimit.ErrInvalidConfig, "Concurrency.Limit"},
		{"huge limit", key, ratelimit.InFlight(ratelimit.MaxPermits+1, time.Hour), acquire("b", 1), ratelimit.ErrInvalidConfig, "Concurrency.Limit"},
		{"short lease", key, ratelimit.InFlight(5, time.Millisecond-time.Microsecond), acquire("b", 1), ratelimit.ErrInvalidConfig, "Concurrency.Lease"},
		{"long lease", key, ratelimit.InFlight(5, 25*time.Hour), acquire("b", 1), ratelimit.ErrInvalidConfig, "Concurrency.Lease"},
		{"lease of ns", key, ratelimit.InFlight(5, time.Second+time.Nanosecond), acquire("b", 1), ratelimit.ErrInvalidConfig, "Concurrency.Lease"},
		{"no holder", key, lim, acquire("", 1), ratelimit.ErrInvalidRequest, "Holder"},
		{"long holder", key, lim, acquire(strings.Repeat("h", ratelimit.MaxHolderLen+1), 1), ratelimit.ErrInvalidRequest, "Holder"},
		{"release without holder", key, lim, permitOp(ratelimit.PermitRelease, ""), ratelimit.ErrInvalidRequest, "Holder"},
		{"zero weight", key, lim, acquire("b", 0), ratelimit.ErrInvalidRequest, "Weight"},
		{"weight over the limit", key, lim, acquire("b", 6), ratelimit.ErrInvalidRequest, "Weight"},
		{"unknown op", key, lim, ratelimit.PermitRequest{Op: 9, Holder: "b", Weight: 1}, ratelimit.ErrInvalidRequest, "Op"},
	} {
		for name, b := range map[string]ratelimit.PermitBackend{"open": b, "closed": closed} {
			d, err := b.DoPermit(ctx, tc.key, tc.lim, tc.req)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.field) || d != (ratelimit.PermitDecision{}) {
				t.Errorf("%s, on a client %s: %+v, %v; want %v naming %s, found before any I/O", tc.name, name, d, err, tc.want, tc.field)
			}
		}
	}
	if after := members(t, c, rkey); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("bad calls changed the permits from %v to %v", before, after)
	}
}

func testPermitCancelled(t *testing.T, a Adapter, top topology) {
	b, _ := a.Connect(t, top.addrs, false, Options{})
	c := raw(t, top)
	key := uniqueKey(t, "cancelled")
	lim := ratelimit.InFlight(5, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, req := range []ratelimit.PermitRequest{acquire("a", 1), permitOp(ratelimit.PermitRenew, "a"), permitOp(ratelimit.PermitInspect, "")} {
		_, err := b.DoPermit(ctx, key, lim, req)
		if !errors.Is(err, context.Canceled) || errors.Is(err, ratelimit.ErrBackendUnavailable) || errors.Is(err, ratelimit.ErrTimeout) || !strings.Contains(err.Error(), req.Op.String()) {
			t.Errorf("%v with a cancelled context: %v; want context.Canceled naming the op, and no store sentinel", req.Op, err)
		}
	}
	if n := c.Exists(context.Background(), redisscript.PermitKey("", key)).Val(); n != 0 {
		t.Errorf("an acquire with a cancelled context took a permit")
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
	// The paused call may have run on the resumed server: b or not.
	if _, err := eventually(t, func() (ratelimit.Decision, error) {
		_, err := b.DoPermit(ctx, key, lim, permitOp(ratelimit.PermitRelease, "a"))
		return ratelimit.Decision{}, err
	}); err != nil {
		t.Fatalf("DoPermit after Resume: %v", err)
	}
}

// serverNow returns the time, in µs, of the server that serves rkey.
func serverNow(t *testing.T, c redis.UniversalClient, rkey string) int64 {
	t.Helper()
	ctx := context.Background()
	node := redis.Cmdable(c)
	if cc, ok := c.(*redis.ClusterClient); ok {
		master, err := cc.MasterForKey(ctx, rkey)
		if err != nil {
			t.Fatal(err)
		}
		node = master
	}
	now, err := node.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMicro()
}

// waitServerPast polls the time of the server that serves rkey until it
// is past µs, by a bound that a loaded machine keeps.
func waitServerPast(t *testing.T, c redis.UniversalClient, rkey string, µs int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for serverNow(t, c, rkey) <= µs {
		if time.Now().After(deadline) {
			t.Fatalf("the server's clock did not pass %dµs within 30s", µs)
		}
		time.Sleep(time.Millisecond)
	}
}

// testPermitReclaim: on the server's clock, a lease that ends frees its
// permit for the next acquire, and its holder's release and renew are
// then refused (Permit says ErrPermitLost). Each call states its own
// lease, so the others hold theirs for an hour: only the first ends while
// the test runs, whatever the machine's load.
func testPermitReclaim(t *testing.T, a Adapter, top topology) {
	ctx := context.Background()
	b, _ := a.Connect(t, top.addrs, top.cluster, Options{})
	c := raw(t, top)
	key := uniqueKey(t, "reclaim")
	rkey := redisscript.PermitKey("", key)
	short, long := ratelimit.InFlight(1, 200*time.Millisecond), ratelimit.InFlight(1, time.Hour)
	before := serverNow(t, c, rkey)
	p, d, err := ratelimit.New(b).TryAcquire(ctx, key, short, 1)
	if err != nil || p == nil || !d.Granted || d.InFlight != 1 {
		t.Fatalf("TryAcquire: %v, %+v, %v; want a permit", p, d, err)
	}
	after := serverNow(t, c, rkey)
	d, err = b.DoPermit(ctx, key, long, acquire("other", 1))
	if served := serverNow(t, c, rkey); served < before+short.Lease.Microseconds() {
		// Served before the first lease could have ended: denied until it
		// does.
		if err != nil || d.Granted || d.InFlight != 1 || d.RetryAfter <= 0 || d.RetryAfter > short.Lease {
			t.Fatalf("acquire past the limit: %+v, %v; want denied, RetryAfter within the lease, %v", d, err, short.Lease)
		}
	}
	waitServerPast(t, c, rkey, after+short.Lease.Microseconds())
	expectPermit(t, b, key, long, acquire("other", 1), true, 1)
	if err := p.Renew(ctx); !errors.Is(err, ratelimit.ErrPermitLost) {
		t.Fatalf("Renew of a reclaimed permit: %v; want ErrPermitLost", err)
	}
	if err := p.Release(ctx); !errors.Is(err, ratelimit.ErrPermitLost) {
		t.Fatalf("Release of a reclaimed permit: %v; want ErrPermitLost", err)
	}
	expectPermit(t, b, key, long, permitOp(ratelimit.PermitInspect, ""), false, 1)
}

// testPermitTTL: the key expires at the millisecond its last lease ends,
// on the server's clock, and is gone once that has passed.
func testPermitTTL(t *testing.T, a Adapter, top topology) {
	ctx := context.Background()
	b, _ := a.Connect(t, top.addrs, false, Options{Prefix: "rl:"})
	c := raw(t, top)
	key := uniqueKey(t, "ttl")
	rkey := "rl:{" + key + "}:permits"
	lim := ratelimit.InFlight(3, 30*time.Second)
	before := serverNow(t, c, rkey)
	expectPermit(t, b, key, lim, acquire("a", 2), true, 2)
	after := serverNow(t, c, rkey)
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
	after = serverNow(t, c, rkey)
	// Redis drops a key once the millisecond it expires at has passed.
	waitServerPast(t, c, rkey, (ceilMs(after+short.Lease.Microseconds())+1)*1000)
	if n := c.Exists(ctx, rkey).Val(); n != 0 {
		t.Fatalf("the key outlived its last lease")
	}
}

// testPermitWeights: weights add up to the limit and no further, and a
// release frees its holder's whole weight.
func testPermitWeights(t *testing.T, a Adapter, top topology) {
	b, _ := a.Connect(t, top.addrs, top.cluster, Options{})
	c := raw(t, top)
	key := uniqueKey(t, "weights")
	lim := ratelimit.InFlight(10, time.Hour)
	expectPermit(t, b, key, lim, acquire("a", 7), true, 7)
	d := expectPermit(t, b, key, lim, acquire("b", 4), false, 7)
	if d.RetryAfter <= 0 || d.RetryAfter > lim.Lease {
		t.Fatalf("denied acquire: RetryAfter %v; want within the lease", d.RetryAfter)
	}
	expectPermit(t, b, key, lim, acquire("c", 3), true, 10)
	expectPermit(t, b, key, lim, acquire("a", 7), true, 10) // sent again: a holds still
	expectPermit(t, b, key, lim, permitOp(ratelimit.PermitRenew, "c"), true, 10)
	expectPermit(t, b, key, lim, permitOp(ratelimit.PermitRelease, "a"), true, 3)
	expectPermit(t, b, key, lim, permitOp(ratelimit.PermitRelease, "a"), false, 3)
	expectPermit(t, b, key, lim, acquire("b", 4), true, 7)
	expectPermit(t, b, key, lim, permitOp(ratelimit.PermitInspect, ""), true, 7)
	if n := c.ZCard(context.Background(), redisscript.PermitKey("", key)).Val(); n != 7 {
		t.Fatalf("the key holds %d members; want one per permit held, 7", n)
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
