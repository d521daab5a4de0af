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

// gcraCheck compares what gcra.lua stored for alg with Apply's state: the
// token bucket's pairs, under alg's format byte.
func gcraCheck(alg ratelimit.Algorithm) func(stored redis.Cmder, state ratelimit.State, now int64) error {
	return func(stored redis.Cmder, state ratelimit.State, now int64) error {
		v, err := stored.(*redis.StringCmd).Bytes()
		if err != nil {
			return fmt.Errorf("GET: %w", err)
		}
		got, fractions, err := gcraDecode(v, alg)
		if err != nil {
			return err
		}
		want, wantFractions := storedForm(state)
		if !equalState(got, want) || !slices.Equal(fractions, wantFractions) {
			return fmt.Errorf("stored state\n %+v, fractions %v\nwant\n %+v, fractions %v", got, fractions, want, wantFractions)
		}
		return nil
	}
}

// gcraDecode parses a value gcra.lua stored for alg into the State it
// stands for, as decodeState does a token bucket's: Scale 1 and Level the
// whole tokens, with the fractions alongside.
func gcraDecode(v []byte, alg ratelimit.Algorithm) (s ratelimit.State, fractions []int64, err error) {
	fp, expiry, bands, err := decodeStored(v, alg)
	if err != nil {
		return s, nil, err
	}
	s.Fingerprint, s.ExpiresAt, s.Algorithm = fp, expiry, alg
	for _, b := range bands {
		s.Bands = append(s.Bands, ratelimit.BandState{ID: b.ID, Capacity: b.U1, Scale: 1, Level: b.S1, Stamp: expiry - b.S2})
		fractions = append(fractions, b.U2)
	}
	return s, fractions, nil
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
// some another algorithm's (a token bucket's, the other one of the two,
// a sliding log's sorted set). The script must call its own damaged
// values corrupt or read them as a state, start afresh on another
// algorithm's, never fail inside Lua, and what it writes back must decode.
func TestGCRAScriptGarbageState(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10), ratelimit.PerHour(100).WithID("hourly")}}
	r := rand.New(rand.NewPCG(3, 4))
	corrupt, read, farOff, foreign := 0, 0, 0, 0
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
			c.ZAdd(ctx, call.Key, redis.Z{Score: 1, Member: "x"})
		case other:
			// A token bucket's value, or the other one of the two's.
			head := byte(16)
			if i%3 == 2 {
				head = byte(16 * (ratelimit.GCRA + ratelimit.LeakyBucket - alg + 1))
			}
			v[0] = head + byte(r.IntN(3))
			c.Set(ctx, call.Key, v, 0)
		default:
			if v[0] >= 16 && v[0] < 32 {
				v[0] += byte(16 * alg)
			}
			c.Set(ctx, call.Key, v, 0)
		}
		reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Int64Slice()
		if err != nil {
			if other || !strings.Contains(err.Error(), "sluice: corrupt state") && !strings.Contains(err.Error(), "sluice did not write") {
				t.Fatalf("%v, value %x (another algorithm's: %v): %v; want a decision, or for its own values a corrupt-state or foreign-value error", alg, v, other, err)
			}
			corrupt++
			continue
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
			if other && strings.HasPrefix(err.Error(), "WRONGTYPE") {
				t.Fatalf("%v: a sorted set at the key was left in place", alg)
			}
			t.Fatal(err)
		}
		if _, _, err := gcraDecode(stored, alg); err != nil {
			t.Fatalf("%v, value %x: wrote back %x: %v", alg, v, stored, err)
		}
	}
	t.Logf("3000 values: %d called corrupt or foreign, %d read as a state, %d read with waits out of range, %d another algorithm's", corrupt, read, farOff, foreign)
	if read == 0 || corrupt == 0 || foreign == 0 {
		t.Errorf("want every outcome among 3000 values")
	}
}

// TestGCRAScriptDebtLimit reserves one token at a time, with no limit on
// the wait, until each bandwidth's debt limit refuses, comparing every
// decision with Apply's: random sequences seldom land on the limit.
func TestGCRAScriptDebtLimit(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
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
			if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
				t.Fatal(err)
			}
			want := ratelimit.Apply(&state, cfg, req, now)
			call := redisscript.NewCall("", key, cfg, req, now)
			reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			got, err := call.Decision(reply)
			if err != nil || got != want {
				t.Fatalf("config %d, step %d: got %+v, %v; want %+v", i, step, got, err, want)
			}
			if !got.Allowed {
				denied++
			}
			now++
		}
	}
}
