package redisscript_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

func init() {
	stateChecks[ratelimit.SlidingWindowLog] = stateCheck{readLog, checkLog}
}

// logScript runs slidinglog.lua.
var logScript = redis.NewScript(redisscript.Scripts[3].Source)

func readLog(ctx context.Context, pipe redis.Pipeliner, key string) redis.Cmder {
	return pipe.ZRangeWithScores(ctx, key, 0, -1)
}

// logStored is a sliding log as slidinglog.lua stores it.
type logStored struct {
	fp      uint64
	expiry  int64
	times   []int64 // the tokens' scores, oldest first
	members []int64 // the tokens' members, in the same order
	length  int64   // the length the state member records
	serial  int64   // the member the next token gets
	version uint64  // the config version the fingerprint member records
	packed  []byte  // and, for a version above 0, its packed bandwidths
}

// logDecode parses a sliding log's sorted set, in rank order: the two
// state members, then the tokens, whose scores and members must be whole
// numbers.
func logDecode(zs []redis.Z) (logStored, error) {
	var s logStored
	if len(zs) < 3 {
		return s, fmt.Errorf("%d members: want the two state members and a token at least", len(zs))
	}
	seen := 0
	for _, z := range zs[:2] {
		name, _ := z.Member.(string)
		v := -1 - z.Score
		if v < 0 || v != math.Trunc(v) || v >= 1<<53 {
			return s, fmt.Errorf("state member %q scored %v", name, z.Score)
		}
		switch {
		case name == "":
			seen |= 1
			s.length, s.serial = int64(v)%65536, int64(v)/65536
		case len(name) == 8 || len(name) > 17 && int(name[15]) >= 1:
			seen |= 2
			s.fp, s.expiry = binary.LittleEndian.Uint64([]byte(name)), int64(v)
			if len(name) > 8 {
				s.version, s.packed = uintN([]byte(name[8:]), 7), []byte(name[16:])
			}
		}
	}
	if seen != 3 {
		return s, fmt.Errorf("members %v: want the state members first", zs[:2])
	}
	for _, z := range zs[2:] {
		name, _ := z.Member.(string)
		m, err := strconv.ParseInt(name, 10, 64)
		if err != nil || z.Score < 0 || z.Score != math.Trunc(z.Score) {
			return s, fmt.Errorf("token %q scored %v", name, z.Score)
		}
		s.times, s.members = append(s.times, int64(z.Score)), append(s.members, m)
	}
	return s, nil
}

// checkLog compares the stored log with Apply's state: fingerprint, expiry
// and every token's time; and checks that the members stay small: below
// the serial, itself within max(4096, 4 × the largest capacity).
func checkLog(stored redis.Cmder, state ratelimit.State, now int64) error {
	zs, err := stored.(*redis.ZSliceCmd).Result()
	if err != nil {
		return fmt.Errorf("ZRANGE: %w", err)
	}
	got, err := logDecode(zs)
	if err != nil {
		return err
	}
	if err := checkVersion(got.version, got.packed, state); err != nil {
		return err
	}
	if got.fp != state.Fingerprint || got.expiry != state.ExpiresAt || !slices.Equal(got.times, state.Log) {
		return fmt.Errorf("stored fingerprint %x, expiry %d, log %v\nwant fingerprint %x, expiry %d, log %v",
			got.fp, got.expiry, got.times, state.Fingerprint, state.ExpiresAt, state.Log)
	}
	span := int64(4096)
	for _, b := range state.Bands {
		span = max(span, 4*b.Capacity)
	}
	if got.length != int64(len(got.times)) || got.serial > span || slices.Max(got.members) >= got.serial {
		return fmt.Errorf("length %d, serial %d, members %v: want the length of the log, a serial within %d above every member",
			got.length, got.serial, got.members, span)
	}
	return nil
}

// logRun runs req through the script and Apply at now and compares the
// decisions, the stored log and its TTL, as TestScriptMatchesApply does.
func logRun(t *testing.T, c *redis.Client, key string, s *ratelimit.State, cfg ratelimit.Config, req ratelimit.Request, now int64) ratelimit.Decision {
	t.Helper()
	ctx := context.Background()
	want := ratelimit.Apply(s, cfg, req, now)
	call := redisscript.NewCall("", key, cfg, req, now)
	reply, err := logScript.Run(ctx, c, []string{call.Key}, call.Arg).Text()
	if err != nil {
		t.Fatalf("%+v at %d: %v", req, now, err)
	}
	got, err := call.Decision(reply)
	if err != nil || got != want {
		t.Fatalf("%+v at %d: got %+v, %v; want %+v", req, now, got, err, want)
	}
	if s.ExpiresAt <= now {
		if n := c.Exists(ctx, call.Key).Val(); n != 0 {
			t.Fatalf("%+v at %d: the log is empty, yet the key exists", req, now)
		}
		return got
	}
	zs := c.ZRangeWithScores(ctx, call.Key, 0, -1)
	if err := checkLog(zs, *s, now); err != nil {
		t.Fatalf("%+v at %d: %v", req, now, err)
	}
	ttl := ceilDiv(s.ExpiresAt-now, 1000) + 60_000
	if got := c.PTTL(ctx, call.Key).Val().Milliseconds(); got > ttl || got < ttl-pttlSlack {
		t.Fatalf("%+v at %d: PTTL %dms, want %dms", req, now, got, ttl)
	}
	return got
}

// TestLogScriptRenumbers drives thousands of tokens through logs small and
// large, with refunds and the clock stepping back, so that the
// serial passes its span again and again: every token must stay, under a
// member of its own.
func TestLogScriptRenumbers(t *testing.T) {
	c := newClient(t)
	for _, cfg := range []ratelimit.Config{
		{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(50*time.Microsecond, 60)}},
		{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{
			ratelimit.Every(40*time.Microsecond, 1500), ratelimit.Every(10*time.Microsecond, 600).WithID("short"),
		}},
	} {
		t.Run(describe(cfg), func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, 7))
			key := fmt.Sprintf("log:renumber:%d", time.Now().UnixNano())
			var s ratelimit.State
			now := int64(1_700_000_000_000_000)
			// Three times the span: 4096, or 4 × the capacity.
			taken, limit := int64(0), cfg.Bandwidths[0].Capacity
			for taken < 3*max(4096, 4*limit) {
				now += r.Int64N(10)
				req := ratelimit.Request{Op: ratelimit.ConsumeUpTo, Tokens: 1 + r.Int64N(limit)}
				switch r.IntN(8) {
				case 0:
					req = ratelimit.Request{Op: ratelimit.Add, Tokens: 1 + r.Int64N(3)}
				case 1:
					now -= r.Int64N(20)
				}
				taken += logRun(t, c, key, &s, cfg, req, now).Consumed
			}
		})
	}
}

// TestLogScriptFullLog fills a log of the largest capacity in one request,
// more values than one ZADD may carry from Lua, and takes it back in one
// refund.
func TestLogScriptFullLog(t *testing.T) {
	c := newClient(t)
	cfg := ratelimit.Config{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(ratelimit.MaxLogCapacity)}}
	key := fmt.Sprintf("log:full:%d", time.Now().UnixNano())
	var s ratelimit.State
	now := int64(1_700_000_000_000_000)
	for _, req := range []ratelimit.Request{
		{Tokens: ratelimit.MaxLogCapacity},
		{Tokens: 1},
		{Op: ratelimit.Add, Tokens: 5000},
		{Op: ratelimit.ConsumeUpTo, Tokens: math.MaxInt64},
		{Op: ratelimit.Add, Tokens: math.MaxInt64},
	} {
		logRun(t, c, key, &s, cfg, req, now)
		now++
	}
}

// TestLogScriptTTL: on the server's clock the key expires at the end of the
// second in which the log empties, or later when a call kept the TTL.
func TestLogScriptTTL(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(300*time.Millisecond, 5)}}
	key := fmt.Sprintf("log:ttl:%d", time.Now().UnixNano())
	kept := 0
	var last int64
	for i := range 40 {
		req := ratelimit.Request{Tokens: 1}
		if i%7 == 6 {
			req = ratelimit.Request{Op: ratelimit.Add, Tokens: 2}
		}
		call := redisscript.NewCall("", key, cfg, req, redisscript.ServerClock)
		if err := logScript.Run(ctx, c, []string{call.Key}, call.Arg).Err(); err != nil {
			t.Fatal(err)
		}
		zs, err := c.ZRangeWithScores(ctx, call.Key, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(zs) == 0 {
			last = 0
			continue
		}
		s, err := logDecode(zs)
		if err != nil {
			t.Fatal(err)
		}
		at, err := c.Do(ctx, "PEXPIRETIME", call.Key).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if at%1000 != 0 || at*1000 < s.expiry || at*1000 >= s.expiry+2_000_000 {
			t.Fatalf("call %d: key expires at %dms; want the end of a second, at or after the log's expiry %dµs and within a second of it", i, at, s.expiry)
		}
		if at == last {
			kept++
		}
		last = at
		time.Sleep(7 * time.Millisecond)
	}
	if kept == 0 {
		t.Errorf("no call kept the key's TTL")
	}
}

// TestLogScriptOtherValues: another algorithm's state at the key starts
// the log afresh, as Apply does; a value sluice did not write is an error,
// and the key is left alone.
func TestLogScriptOtherValues(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}}
	tb := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}}
	now := int64(1_700_000_000_000_000)
	key := fmt.Sprintf("log:other:%d", time.Now().UnixNano())
	tbCall := redisscript.NewCall("", key, tb, ratelimit.Request{Tokens: 3}, now)
	if err := scripts[0].Run(ctx, c, []string{tbCall.Key}, tbCall.Arg).Err(); err != nil {
		t.Fatal(err)
	}
	var s ratelimit.State
	logRun(t, c, key, &s, cfg, ratelimit.Request{Tokens: 4}, now)
	// And the token bucket takes the log's key as absent.
	tbCall = redisscript.NewCall("", key, tb, ratelimit.Request{Tokens: 10}, now)
	if reply, err := scripts[0].Run(ctx, c, []string{tbCall.Key}, tbCall.Arg).Text(); err != nil || reply[0] != 1 {
		t.Fatalf("token bucket on a log's key: %v, %v; want it allowed, as on a new bucket", reply, err)
	}

	for i, set := range []func(k string) error{
		func(k string) error { return c.Set(ctx, k, "~not sluice's", 0).Err() },
		func(k string) error { return c.Set(ctx, k, "", 0).Err() },
		func(k string) error { return c.HSet(ctx, k, "f", "v").Err() },
		func(k string) error { return c.RPush(ctx, k, "x").Err() },
	} {
		call := redisscript.NewCall("", fmt.Sprintf("%s:%d", key, i), cfg, ratelimit.Request{Tokens: 1}, now)
		if err := set(call.Key); err != nil {
			t.Fatal(err)
		}
		err := logScript.Run(ctx, c, []string{call.Key}, call.Arg).Err()
		if err == nil || !strings.Contains(err.Error(), "sluice did not write") {
			t.Errorf("value %d: %v; want a foreign-value error", i, err)
		}
		if typ := c.Type(ctx, call.Key).Val(); typ == "zset" || typ == "none" {
			t.Errorf("value %d: the key became a %s", i, typ)
		}
	}
}

// TestLogScriptGarbage damages logs the script wrote, in every way a
// sorted set allows (state members lost, renamed or scored anything,
// tokens scored below zero, between microseconds or at infinity, members
// added): the script must call the log corrupt or decide on it, or, once
// the state members are damaged, refuse the set as no log's and leave it
// as it was; it must never fail inside Lua, and what it leaves must be a
// log it reads again.
func TestLogScriptGarbage(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{
		ratelimit.Every(100*time.Microsecond, 8), ratelimit.Every(20*time.Microsecond, 3).WithID("s"),
	}}
	scores := []float64{math.Inf(1), math.Inf(-1), -1, -0.5, 0, 0.5, 1 << 53, 1 << 60, -(1 << 53), 1_700_000_000_000_050, -1_700_000_000_000_101}
	r := rand.New(rand.NewPCG(3, 4))
	now := int64(1_700_000_000_000_000)
	corrupt, refused, decided := 0, 0, 0
	for i := range 1500 {
		key := fmt.Sprintf("log:garbage:%d", i)
		call := redisscript.NewCall("", key, cfg, ratelimit.Request{Tokens: 1 + r.Int64N(3)}, now)
		for range 1 + r.IntN(4) {
			if err := logScript.Run(ctx, c, []string{call.Key}, call.Arg).Err(); err != nil {
				t.Fatal(err)
			}
		}
		zs := c.ZRangeWithScores(ctx, call.Key, 0, -1).Val()
		for range 1 + r.IntN(3) {
			z := zs[r.IntN(len(zs))]
			switch r.IntN(5) {
			case 0:
				c.ZRem(ctx, call.Key, z.Member)
			case 1:
				c.ZAdd(ctx, call.Key, redis.Z{Score: scores[r.IntN(len(scores))], Member: z.Member})
			case 2:
				c.ZAdd(ctx, call.Key, redis.Z{Score: scores[r.IntN(len(scores))], Member: fmt.Sprint(r.IntN(10))})
			case 3:
				c.ZAdd(ctx, call.Key, redis.Z{Score: z.Score, Member: []string{"", "12345678", "junk"}[r.IntN(3)]})
			default:
				c.ZAdd(ctx, call.Key, redis.Z{Score: float64(now - r.Int64N(200)), Member: fmt.Sprint(r.IntN(100))})
			}
		}
		for _, req := range []ratelimit.Request{
			{Tokens: 1 + r.Int64N(3)},
			{Op: ratelimit.Inspect},
			{Op: ratelimit.ConsumeUpTo, Tokens: 5},
			{Op: ratelimit.Add, Tokens: 1 + r.Int64N(4)},
			{Op: ratelimit.Replace, Strategy: ratelimit.AsIs},
		} {
			call := redisscript.NewCall("", key, cfg, req, now+r.Int64N(150))
			before := c.ZRangeWithScores(ctx, call.Key, 0, -1).Val()
			reply, err := logScript.Run(ctx, c, []string{call.Key}, call.Arg).Text()
			if err != nil {
				switch {
				case strings.Contains(err.Error(), "sluice: corrupt state"):
					corrupt++
				case strings.Contains(err.Error(), "sluice did not write"):
					if after := c.ZRangeWithScores(ctx, call.Key, 0, -1).Val(); !slices.Equal(after, before) {
						t.Fatalf("%v on %v refused it, and left %v", req, before, after)
					}
					refused++
				default:
					t.Fatalf("%v on %v: %v; want a corrupt-state or foreign-value error, or a decision", req, before, err)
				}
				break
			}
			if _, err := call.Decision(reply); err != nil && !strings.Contains(err.Error(), "not a decision") {
				t.Fatalf("%v on %v: %v", req, zs, err)
			}
			decided++
		}
	}
	t.Logf("damaged logs: %d calls called them corrupt, %d refused them as no log's, %d decided", corrupt, refused, decided)
	if corrupt == 0 || refused == 0 || decided == 0 {
		t.Errorf("want every outcome")
	}
}

// TestLogScriptMemory reports what a log costs Redis at full load
// (MEMORY USAGE), and checks it stays within a bound per token: the
// members are small.
func TestLogScriptMemory(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	now := int64(1_700_000_000_000_000)
	for _, tc := range []struct {
		capacity int64
		perToken int64 // bytes, at most
	}{{10, 20}, {100, 16}, {126, 16}, {1000, 120}, {ratelimit.MaxLogCapacity, 120}} {
		cfg := ratelimit.Config{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(tc.capacity)}}
		key := fmt.Sprintf("log:memory:%d:%d", tc.capacity, time.Now().UnixNano())
		// One token a microsecond, as traffic at the limit leaves it.
		var call redisscript.Call
		for i := range tc.capacity {
			call = redisscript.NewCall("", key, cfg, ratelimit.Request{Tokens: 1}, now+i)
			if err := logScript.Run(ctx, c, []string{call.Key}, call.Arg).Err(); err != nil {
				t.Fatal(err)
			}
		}
		bytes, err := c.MemoryUsage(ctx, call.Key, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		enc := c.ObjectEncoding(ctx, call.Key).Val()
		t.Logf("capacity %d: %d bytes (%s), %.1f a token", tc.capacity, bytes, enc, float64(bytes)/float64(tc.capacity))
		if bytes > tc.perToken*tc.capacity+200 {
			t.Errorf("capacity %d: %d bytes at full load, beyond %d a token", tc.capacity, bytes, tc.perToken)
		}
	}
}
