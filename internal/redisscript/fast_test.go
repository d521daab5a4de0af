package redisscript_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestFastPathMatchesApply runs seeded random sequences of the calls the
// token bucket's fast path is for (Consume on one or two greedy
// bandwidths that start full, with no IDs, unversioned) through a script
// that is the fast path alone, and through ratelimit.Apply: the fast path
// must answer every call, with Apply's decision, and store Apply's state.
// (TestScriptMatchesApply runs such calls too, through the whole script,
// where a fast path that declined would go unnoticed.)
func TestFastPathMatchesApply(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	fastOnly := redis.NewScript(redisscript.FastOnly)
	sequences := 400
	if testing.Short() {
		sequences = 50
	}
	for seed := range uint64(sequences) {
		r := rand.New(rand.NewPCG(seed, 0xfa57))
		cfg := fastConfig(r)
		key := fmt.Sprintf("fast:%d", seed)
		now := int64(1_700_000_000_000_000) + r.Int64N(1_000_000)
		var state ratelimit.State
		var steps []string
		for i := range 30 {
			// Mostly forward, by up to a bandwidth's refill of the whole
			// capacity; now and then back a little, as another client's
			// clock may be.
			switch r.IntN(8) {
			case 0:
				now -= r.Int64N(1000)
			default:
				now += r.Int64N(cfg.Bandwidths[0].PeriodMicros()/max(1, cfg.Bandwidths[0].RefillTokens)*2 + 1)
			}
			req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1 + r.Int64N(cfg.MinCapacity())}
			if r.IntN(3) > 0 {
				req.Tokens = 1
			}
			steps = append(steps, fmt.Sprintf("  %2d at %dµs: %+v", i, now, req))
			call := redisscript.NewCall("", key, cfg, req, now)
			want := ratelimit.Apply(&state, cfg, req, now)
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d, step %d on %s:\n%s\nsteps:\n%s", seed, i, describe(cfg), fmt.Sprintf(format, args...), strings.Join(steps, "\n"))
			}
			reply, err := fastOnly.Run(ctx, c, []string{call.Key}, call.Arg).Text()
			if err != nil {
				fail("the fast path: %v", err)
			}
			got, err := call.Decision(reply)
			if err != nil {
				fail("%v", err)
			}
			if got != want {
				fail(" got %+v\nwant %+v", got, want)
			}
			v, err := c.Get(ctx, call.Key).Bytes()
			if err != nil {
				fail("GET: %v", err)
			}
			stored, err := decodeState(v)
			if err != nil {
				fail("%v", err)
			}
			if w := storedForm(state); !equalState(stored, w) {
				fail("stored state\n %+v\nwant\n %+v", stored, w)
			}
		}
	}
}

// fastConfig is a random config of the fast path's kind that Validate
// accepts: one or two greedy bandwidths with no ID, from a token a day to
// a million a millisecond.
func fastConfig(r *rand.Rand) ratelimit.Config {
	for {
		if cfg := randFastConfig(r); cfg.Validate() == nil {
			return cfg
		}
	}
}

func randFastConfig(r *rand.Rand) ratelimit.Config {
	band := func() ratelimit.Bandwidth {
		period := time.Duration(1+r.Int64N(86_400_000_000)) * time.Microsecond
		if r.IntN(2) == 0 {
			period = []time.Duration{time.Millisecond, time.Second, time.Minute, time.Hour}[r.IntN(4)]
		}
		b := ratelimit.Every(period, 1+r.Int64N(1_000_000))
		return b.WithBurst(1 + r.Int64N(2_000_000))
	}
	bws := []ratelimit.Bandwidth{band()}
	if r.IntN(2) == 0 {
		second := band()
		if r.IntN(2) == 0 {
			// The same capacity: the two tie for the binding bandwidth
			// until one refills faster.
			second = second.WithBurst(bws[0].Capacity)
		}
		bws = append(bws, second)
	}
	return ratelimit.Config{Bandwidths: bws}
}
