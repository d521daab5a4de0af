package redisscript_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newClient connects to a throwaway server (or $SLUICE_REDIS_ADDR).
func newClient(t *testing.T) *redis.Client {
	t.Helper()
	addr, _ := testkit.StandaloneAddr(t)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

var script = redis.NewScript(redisscript.TokenBucket)

// step is one request of a sequence and what the server did with it.
type step struct {
	cfg  ratelimit.Config
	req  ratelimit.Request
	now  int64
	call redisscript.Call
	run  *redis.Cmd
	ttl  *redis.DurationCmd
	get  *redis.StringCmd
}

// TestScriptMatchesApply runs seeded random sequences of requests, on
// configs from tiny to the limits of the accepted range, with the clock
// jumping ahead and now and then back, through both ratelimit.Apply and the
// script on a real server (the script on the caller's clock). Every decision
// must be equal, and after every step the stored value must decode to
// Apply's state, with a TTL to match its expiry.
func TestScriptMatchesApply(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	if err := script.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	sequences, steps := 3000, 40
	if testing.Short() {
		sequences = 300
	}
	for seed := range uint64(sequences) {
		r := rand.New(rand.NewPCG(seed, 0x1ea))
		big := r.IntN(3) == 0
		cfgs := [2]ratelimit.Config{redistest.RandConfig(r, big), redistest.RandConfig(r, big)}
		key := fmt.Sprintf("seq:%d", seed)
		now := r.Int64N(1 << 51)
		if !big {
			now = 1_700_000_000_000_000 + r.Int64N(1000)
		}
		pipe := c.Pipeline()
		seq := make([]step, steps)
		cur := 0
		for i := range seq {
			now = redistest.Advance(r, now, big)
			if r.IntN(6) == 0 {
				cur = 1 - cur
			}
			s := &seq[i]
			s.cfg, s.now = cfgs[cur], now
			s.req = redistest.RandRequest(r, s.cfg)
			if err := ratelimit.CheckRequest(key, s.cfg, s.req); err != nil {
				t.Fatalf("seed %d: generated a bad call: %v", seed, err)
			}
			s.call = redisscript.NewCall("", key, s.cfg, s.req, now)
			s.run = script.EvalSha(ctx, pipe, []string{s.call.Key}, s.call.Arg)
			s.ttl = pipe.PTTL(ctx, s.call.Key)
			s.get = pipe.Get(ctx, s.call.Key)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("seed %d: %v", seed, err)
		}
		var state ratelimit.State
		for i := range seq {
			s := &seq[i]
			want := ratelimit.Apply(&state, s.cfg, s.req, s.now)
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d, step %d: %+v at %dµs on %s:\n%s\nsteps so far:\n%s", seed, i, s.req, s.now, describe(s.cfg), fmt.Sprintf(format, args...), history(seq[:i+1]))
			}
			reply, err := s.run.Int64Slice()
			if err != nil {
				fail("script: %v", err)
			}
			got, err := s.call.Decision(reply)
			if err != nil {
				fail("%v", err)
			}
			if got != want {
				fail(" got %+v\nwant %+v", got, want)
			}
			stored, err := s.get.Bytes()
			if state.ExpiresAt <= s.now {
				if !errors.Is(err, redis.Nil) {
					fail("the state equals a new bucket's, yet the key holds %x (%v)", stored, err)
				}
				state = ratelimit.State{}
				continue
			}
			if err != nil {
				fail("GET: %v", err)
			}
			gotState, err := decodeState(stored)
			if err != nil {
				fail("%v", err)
			}
			for j := range gotState.Bands {
				if j < len(state.Bands) {
					gotState.Bands[j].Rate = state.Bands[j].Rate
				}
			}
			if !equalState(gotState, state) {
				fail("stored state\n %+v\nwant\n %+v", gotState, state)
			}
			ttl := ceilDiv(state.ExpiresAt-s.now, 1000) + 1 + 60_000
			if got := s.ttl.Val().Milliseconds(); got > ttl || got < ttl-1000 {
				fail("PTTL %dms, want %dms", got, ttl)
			}
		}
	}
}

func equalState(a, b ratelimit.State) bool {
	return a.Fingerprint == b.Fingerprint && a.ExpiresAt == b.ExpiresAt && slices.Equal(a.Bands, b.Bands)
}

func history(seq []step) string {
	var b strings.Builder
	for i, s := range seq {
		fmt.Fprintf(&b, "  %2d at %dµs fp %x: %+v\n", i, s.now, s.cfg.Fingerprint(), s.req)
	}
	return b.String()
}

func describe(cfg ratelimit.Config) string {
	var parts []string
	for _, b := range cfg.Bandwidths {
		p := fmt.Sprintf("{id %q cap %d, %d per %dµs %v initial %d", b.ID, b.Capacity, b.RefillTokens, b.PeriodMicros(), b.Refill, b.Initial())
		if b.Refill == ratelimit.IntervalAligned {
			p += fmt.Sprintf(" from %dµs", b.AlignedStart.UnixMicro())
		}
		parts = append(parts, p+"}")
	}
	return strings.Join(parts, ", ")
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b > 0 {
		q++
	}
	return q
}

// TestScriptGarbageState stores random bytes, after the format byte, where
// a bucket lives: the script must call them corrupt or read them as a
// state, never fail inside Lua, and what it writes back must decode.
func TestScriptGarbageState(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10), ratelimit.PerHour(100).WithID("hourly")}}
	r := rand.New(rand.NewPCG(1, 2))
	corrupt, read := 0, 0
	for i := range 3000 {
		v := make([]byte, 1+r.IntN(40))
		for j := range v {
			v[j] = byte(r.IntN(256))
			if r.IntN(3) == 0 {
				v[j] &= 0x7f // short varints, so that more values parse
			}
		}
		v[0] = 1
		key := fmt.Sprintf("garbage:%d", i)
		call := redisscript.NewCall("", key, cfg, ratelimit.Request{Tokens: 1, Strategy: ratelimit.Inheritance(i % 4)}, 1_700_000_000_000_000)
		c.Set(ctx, call.Key, v, 0)
		reply, err := script.Run(ctx, c, []string{call.Key}, call.Arg).Int64Slice()
		if err != nil {
			if !strings.Contains(err.Error(), "sluice: corrupt state") {
				t.Fatalf("value %x: %v; want a corrupt-state error or a decision", v, err)
			}
			corrupt++
			continue
		}
		if _, err := call.Decision(reply); err != nil {
			t.Fatalf("value %x: %v", v, err)
		}
		if stored, err := c.Get(ctx, call.Key).Bytes(); err == nil {
			if _, err := decodeState(stored); err != nil {
				t.Fatalf("value %x: wrote back %x: %v", v, stored, err)
			}
		}
		read++
	}
	t.Logf("3000 random values: %d called corrupt, %d read as a state", corrupt, read)
	if read == 0 || corrupt == 0 {
		t.Errorf("want both outcomes among 3000 random values")
	}
}
