package redisscript_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

func init() {
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.LeakyBucket} {
		stateChecks[alg] = stateCheck{readString, gcraCheck(alg)}
	}
}

// gcraTAT is one bandwidth's theoretical arrival time as gcra.lua stores
// it: its whole µs and its fraction in 1/rate µs, with the bandwidth's ID.
// In Apply's state they are Stamp, Level and ID.
type gcraTAT struct {
	Stamp, Fraction int64
	ID              string
}

// gcraDecode parses a value gcra.lua stored for alg: its fingerprint,
// expiry and TATs, from each bandwidth's pairs (fraction, expiry − TAT)
// and (0, 0).
func gcraDecode(v []byte, alg ratelimit.Algorithm) (fp uint64, expiry int64, tats []gcraTAT, err error) {
	fp, expiry, bands, err := decodeStored(v, alg)
	if err != nil {
		return 0, 0, nil, err
	}
	for i, b := range bands {
		if b.U2 != 0 || b.S2 != 0 {
			return 0, 0, nil, fmt.Errorf("value %x: bandwidth %d's second pair is (%d, %d), not (0, 0)", v, i, b.U2, b.S2)
		}
		tats = append(tats, gcraTAT{Stamp: expiry - b.S1, Fraction: b.U1, ID: b.ID})
	}
	return fp, expiry, tats, nil
}

// gcraCheck compares what gcra.lua stored for alg with Apply's state: the
// fingerprint, the expiry, and each bandwidth's TAT and ID.
func gcraCheck(alg ratelimit.Algorithm) func(stored redis.Cmder, state ratelimit.State, now int64) error {
	return func(stored redis.Cmder, state ratelimit.State, now int64) error {
		v, err := stored.(*redis.StringCmd).Bytes()
		if err != nil {
			return fmt.Errorf("GET: %w", err)
		}
		fp, expiry, got, err := gcraDecode(v, alg)
		if err != nil {
			return err
		}
		var want []gcraTAT
		for _, st := range state.Bands {
			want = append(want, gcraTAT{Stamp: st.Stamp, Fraction: st.Level, ID: st.ID})
		}
		if fp != state.Fingerprint || expiry != state.ExpiresAt || !slices.Equal(got, want) {
			return fmt.Errorf("stored fingerprint %x, expiry %d, TATs %+v\nwant %x, %d, %+v", fp, expiry, got, state.Fingerprint, state.ExpiresAt, want)
		}
		return nil
	}
}

// gcraRun runs req on the bucket at key through the script and through
// Apply on state, and compares the decisions and what the script stored.
func gcraRun(t *testing.T, c *redis.Client, key string, cfg ratelimit.Config, req ratelimit.Request, now int64, state *ratelimit.State) ratelimit.Decision {
	t.Helper()
	ctx := context.Background()
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		t.Fatal(err)
	}
	want := ratelimit.Apply(state, cfg, req, now)
	call := redisscript.NewCall("", key, cfg, req, now)
	reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Text()
	if err != nil {
		t.Fatalf("%+v at %d: %v", req, now, err)
	}
	got, err := call.Decision(reply)
	if err != nil || got != want {
		t.Fatalf("%+v at %d: got %+v, %v; want %+v", req, now, got, err, want)
	}
	stored := c.Get(ctx, call.Key)
	if state.ExpiresAt <= now {
		if !errors.Is(stored.Err(), redis.Nil) {
			t.Fatalf("%+v at %d: the state equals a new bucket's, yet the key holds %q", req, now, stored.Val())
		}
		return got
	}
	if err := gcraCheck(cfg.Algorithm)(stored, *state, now); err != nil {
		t.Fatalf("%+v at %d: %v", req, now, err)
	}
	return got
}

// TestGCRAScriptStoredBytes: one bandwidth of 10 a second or 100 a minute
// without an ID takes 22 bytes however used (a token bucket's take 26):
// prelude.lua's 16-byte header and one byte of widths, the pairs of one
// byte each, and the ID's length.
func TestGCRAScriptStoredBytes(t *testing.T) {
	c := newClient(t)
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.LeakyBucket} {
		for _, bw := range []ratelimit.Bandwidth{ratelimit.PerSecond(10), ratelimit.PerMinute(100)} {
			cfg := ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{bw}}
			key := fmt.Sprintf("gcra-bytes:%v:%d:%d", alg, bw.Capacity, time.Now().UnixNano())
			var state ratelimit.State
			now := int64(1_700_000_000_000_000)
			for i, req := range []ratelimit.Request{
				{Op: ratelimit.Consume, Tokens: 1},
				{Op: ratelimit.Consume, Tokens: bw.Capacity - 1},
				{Op: ratelimit.Consume, Tokens: 1},
				{Op: ratelimit.Add, Tokens: 3},
				{Op: ratelimit.ConsumeUpTo, Tokens: 5},
			} {
				gcraRun(t, c, key, cfg, req, now+int64(i)*12345, &state)
				v, err := c.Get(context.Background(), redisscript.Key("", key)).Bytes()
				if err != nil {
					t.Fatal(err)
				}
				if len(v) != 22 {
					t.Errorf("%v, %d per %v, after %+v: %d bytes, want 22", alg, bw.Capacity, bw.RefillPeriod, req, len(v))
				}
			}
		}
	}
}

// gcraRequest is a request of every op alg supports, by turns.
func gcraRequest(i int, alg ratelimit.Algorithm) ratelimit.Request {
	reqs := []ratelimit.Request{
		{Op: ratelimit.Consume, Tokens: 1},
		{Op: ratelimit.Add, Tokens: math.MaxInt64},
		{Op: ratelimit.ConsumeUpTo, Tokens: 1 << 40},
		{Op: ratelimit.Inspect},
		{Op: ratelimit.Replace},
		{Op: ratelimit.Reserve, Tokens: 2, MaxWait: time.Hour},
	}
	req := reqs[i%len(reqs)]
	if !alg.Supports(req.Op) {
		req = reqs[0]
	}
	req.Strategy = ratelimit.Inheritance(i / len(reqs) % 4)
	return req
}

// TestGCRAScriptGarbageState stores random values where a GCRA or leaky
// bucket lives: most shaped like its state, some of those damaged, and
// some another algorithm's (a token bucket's, the other one of the two's),
// well formed or not, and some sorted sets that are no sliding log's. The
// script must call its own damaged values corrupt or read them as a
// state, start afresh on another algorithm's well-formed state and refuse
// anything else, never fail inside Lua, and what it writes back must
// decode.
func TestGCRAScriptGarbageState(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10), ratelimit.PerHour(100).WithID("hourly")}}
	r := rand.New(rand.NewPCG(3, 4))
	corrupt, refused, read, farOff, foreign := 0, 0, 0, 0, 0
	for i := range 3000 {
		alg := ratelimit.GCRA
		if i%2 == 1 {
			alg = ratelimit.LeakyBucket
		}
		cfg.Algorithm = alg
		key := fmt.Sprintf("gcra-garbage:%d", i)
		call := redisscript.NewCall("", key, cfg, gcraRequest(i/2, alg), 1_700_000_000_000_000)
		v := garbage(r) // with a token bucket's format byte, but when damaged there
		other := i%7 == 0
		switch {
		case other && i%3 == 0:
			// No sliding log's, though one has a member "" as a log
			// does: refused.
			c.ZAdd(ctx, call.Key, redis.Z{Score: 1, Member: []string{"", "x"}[r.IntN(2)]})
		case other:
			// A token bucket's value, or the other one of the two's.
			head := byte(16)
			if i%3 == 2 {
				head = byte(16 * (ratelimit.GCRA + ratelimit.LeakyBucket - alg + 1))
			}
			v[0] = head + v[0]%16
			c.Set(ctx, call.Key, v, 0)
		default:
			if v[0] >= 16 && v[0] < 32 {
				v[0] += byte(16 * alg)
			}
			c.Set(ctx, call.Key, v, 0)
		}
		reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Text()
		switch {
		case err == nil:
		case other && (strings.Contains(err.Error(), "sluice did not write") || strings.HasPrefix(err.Error(), "WRONGTYPE")):
			refused++
			continue
		case !other && (strings.Contains(err.Error(), "sluice: corrupt state") || strings.Contains(err.Error(), "sluice did not write")):
			corrupt++
			continue
		default:
			t.Fatalf("%v, value %x (another algorithm's: %v): %v; want a decision, a corrupt-state error for its own values, or a refusal of what is no algorithm's", alg, v, other, err)
		}
		if _, err := call.Decision(reply); err != nil {
			// As for the token bucket: a state within every bound but far
			// ahead can give waits beyond what a reply may hold.
			if other || !strings.Contains(err.Error(), "not a decision") {
				t.Fatalf("%v, value %x (another algorithm's: %v): %v", alg, v, other, err)
			}
			farOff++
			continue
		}
		if other {
			foreign++
		} else {
			read++
		}
		stored, err := c.Get(ctx, call.Key).Bytes()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Fatalf("%v: after a decision on another algorithm's state: %v", alg, err)
		}
		if _, _, _, err := gcraDecode(stored, alg); err != nil {
			t.Fatalf("%v, value %x: wrote back %x: %v", alg, v, stored, err)
		}
	}
	t.Logf("3000 values: %d called corrupt, %d read as a state, %d read with waits out of range, %d another algorithm's, %d refused",
		corrupt, read, farOff, foreign, refused)
	if read == 0 || corrupt == 0 || foreign == 0 || refused == 0 {
		t.Errorf("want every outcome among 3000 values")
	}
}

// TestGCRAScriptCorrupt: values in GCRA's layout that it cannot have
// written are corrupt, not read: a fraction not below the rate, a TAT
// after the expiry or before 0, an expiry past 2^53.
func TestGCRAScriptCorrupt(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Algorithm: ratelimit.GCRA, Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(10*time.Microsecond, 3)}}
	now := int64(1_700_000_000_000_000)
	// value is a state of cfg: a 7-byte expiry, one bandwidth whose pairs
	// are 7 bytes wide, (frac, back) and (0, 0), and no ID.
	value := func(frac, back, expiry int64) []byte {
		v := []byte{16 * byte(ratelimit.GCRA+1)}
		v = append(v, gcraLE(cfg.Fingerprint(), 8)...)
		v = append(v, gcraLE(uint64(expiry), 7)...)
		v = append(v, 0x77)
		v = append(v, gcraLE(uint64(frac), 7)...)
		v = append(v, gcraLE(uint64(back), 7)...)
		return append(v, make([]byte, 15)...)
	}
	for _, tc := range []struct {
		name               string
		frac, back, expiry int64
		corrupt            bool
	}{
		{"a state", 2, 5, now + 10, false},
		{"a fraction of the rate", 3, 5, now + 10, true},
		{"a TAT after the expiry", 0, -1, now + 10, true},
		{"a TAT before 0", 0, now + 11, now + 10, true},
		{"an expiry past 2^53", 0, 0, 1<<53 + 2, true},
	} {
		key := fmt.Sprintf("gcra-corrupt:%d:%s", time.Now().UnixNano(), tc.name)
		call := redisscript.NewCall("", key, cfg, ratelimit.Request{Op: ratelimit.Inspect}, now)
		c.Set(ctx, call.Key, value(tc.frac, tc.back, tc.expiry), 0)
		err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Err()
		if got := err != nil && strings.Contains(err.Error(), "sluice: corrupt state"); got != tc.corrupt {
			t.Errorf("%s: %v; want corrupt: %v", tc.name, err, tc.corrupt)
		}
	}
}

// gcraLE is v's n low bytes, little-endian.
func gcraLE(v uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	return b
}

// TestGCRAScriptAddFarBehind: Add on a clock far behind the TAT, where the
// TAT is more than 2^53 scaled units ahead and the refund too, so that the
// script splits tokens × scale by digits: its TATs must be Apply's.
func TestGCRAScriptAddFarBehind(t *testing.T) {
	c := newClient(t)
	const year = 366 * 24 * time.Hour
	for i, bw := range []ratelimit.Bandwidth{
		ratelimit.Every(1<<40*time.Microsecond, 1<<40-1).WithBurst(1000),
		ratelimit.Every(year, int64(year/time.Microsecond)-7).WithBurst(3),
		ratelimit.Every(year-time.Microsecond, 1<<44+1).WithBurst(9),
	} {
		cfg := ratelimit.Config{Algorithm: ratelimit.GCRA, Bandwidths: []ratelimit.Bandwidth{bw}}
		key := fmt.Sprintf("gcra-add:%d:%d", time.Now().UnixNano(), i)
		var state ratelimit.State
		now := int64(1 << 51)
		gcraRun(t, c, key, cfg, ratelimit.Request{Op: ratelimit.Reserve, Tokens: bw.Capacity, MaxWait: time.Duration(math.MaxInt64)}, now, &state)
		gcraRun(t, c, key, cfg, ratelimit.Request{Op: ratelimit.Reserve, Tokens: bw.Capacity, MaxWait: time.Duration(math.MaxInt64)}, now, &state)
		for _, n := range []int64{100000, 1 << 20, 3<<21 + 5, 1 << 30, 1 << 40} {
			gcraRun(t, c, key, cfg, ratelimit.Request{Op: ratelimit.Add, Tokens: n}, now-1<<32, &state)
			gcraRun(t, c, key, cfg, ratelimit.Request{Op: ratelimit.Reserve, Tokens: bw.Capacity, MaxWait: time.Duration(math.MaxInt64)}, now, &state)
		}
	}
}

// TestGCRAScriptDebtLimit reserves one token at a time, with no limit on
// the wait, until each bandwidth's debt limit refuses, comparing every
// decision and state with Apply's: random sequences seldom land on the
// limit. A config change then brings the TATs within the new limits.
func TestGCRAScriptDebtLimit(t *testing.T) {
	c := newClient(t)
	const year = 366 * 24 * time.Hour
	for i, bws := range [][]ratelimit.Bandwidth{
		{ratelimit.Every(year, 1)},
		{ratelimit.Every(year, 3).WithBurst(200)},
		{ratelimit.Every(100*24*time.Hour, 3).WithBurst(5), ratelimit.Every(year, 7).WithID("y")},
	} {
		cfg := ratelimit.Config{Algorithm: ratelimit.GCRA, Bandwidths: bws}
		var state ratelimit.State
		key := fmt.Sprintf("gcra-debt:%d:%d", time.Now().UnixNano(), i)
		now := int64(1_700_000_000_000_000)
		denied := 0
		for step := 0; denied < 3; step++ {
			req := ratelimit.Request{Op: ratelimit.Reserve, Tokens: 1 + int64(step%2)*bws[0].Capacity/2, MaxWait: time.Duration(math.MaxInt64)}
			if !gcraRun(t, c, key, cfg, req, now, &state).Allowed {
				denied++
			}
			now++
		}
		faster := ratelimit.Config{Algorithm: ratelimit.GCRA, Bandwidths: slices.Clone(bws)}
		faster.Bandwidths[0] = ratelimit.Every(1<<20*time.Microsecond, 1<<20-1).WithBurst(1).WithID(bws[0].ID)
		gcraRun(t, c, key, faster, ratelimit.Request{Op: ratelimit.Inspect}, now, &state)
	}
}
