package redisscript

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
	"go.uber.org/goleak"

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

var script = redis.NewScript(TokenBucket)

// step is one request of a sequence and what the server did with it.
type step struct {
	cfg  ratelimit.Config
	req  ratelimit.Request
	now  int64
	call Call
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
		cfgs := [2]ratelimit.Config{randConfig(r, big), randConfig(r, big)}
		key := fmt.Sprintf("seq:%d", seed)
		now := r.Int64N(1 << 51)
		if !big {
			now = 1_700_000_000_000_000 + r.Int64N(1000)
		}
		pipe := c.Pipeline()
		seq := make([]step, steps)
		cur := 0
		for i := range seq {
			now = advance(r, now, big)
			if r.IntN(6) == 0 {
				cur = 1 - cur
			}
			s := &seq[i]
			s.cfg, s.now = cfgs[cur], now
			s.req = randRequest(r, s.cfg)
			if err := ratelimit.CheckRequest(key, s.cfg, s.req); err != nil {
				t.Fatalf("seed %d: generated a bad call: %v", seed, err)
			}
			s.call = NewCall("", key, s.cfg, s.req, now)
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

// advance moves the clock: mostly a little, sometimes far, now and then back.
func advance(r *rand.Rand, now int64, big bool) int64 {
	switch k := r.IntN(10); {
	case k < 4:
		now += r.Int64N(60)
	case k < 5:
		now += r.Int64N(400)
	case k < 6 && big:
		now += r.Int64N(1 << 50)
	case k < 7 && big:
		now -= r.Int64N(1 << 30)
	}
	return min(max(now, 0), 1<<52-1)
}

// randConfig returns a valid config of 1 to 3 bandwidths of every kind:
// small numbers that refill within a few steps, or (big) numbers near the
// limits of the accepted range, where Lua's doubles would first go wrong.
func randConfig(r *rand.Rand, big bool) ratelimit.Config {
	for {
		var cfg ratelimit.Config
		ids := []string{"", "", "a", "b", "c"}
		for range 1 + r.IntN(3) {
			id := ids[r.IntN(len(ids))]
			for _, b := range cfg.Bandwidths {
				if b.ID == id {
					id = ""
				}
			}
			b := ratelimit.Bandwidth{ID: id, Refill: ratelimit.RefillKind(r.IntN(3))}
			period := 1 + r.Int64N(40)
			b.Capacity = 1 + r.Int64N(8)
			if big {
				period = 1 + r.Int64N(int64(ratelimit.MaxRefillPeriod/time.Microsecond))
				b.Capacity = 1 + r.Int64N(ratelimit.MaxCapacity)>>r.IntN(50)
			}
			b.RefillPeriod = time.Duration(period) * time.Microsecond
			b.RefillTokens = 1 + r.Int64N(period)>>r.IntN(40)
			if b.Refill == ratelimit.IntervalAligned {
				b.AlignedStart = time.UnixMicro(r.Int64N(1 << 51))
			}
			if r.IntN(3) == 0 {
				b = b.WithInitialTokens(r.Int64N(b.Capacity + 1))
			}
			cfg.Bandwidths = append(cfg.Bandwidths, b)
		}
		if cfg.Validate() == nil {
			return cfg
		}
	}
}

// randRequest returns a valid request for cfg, mostly ones that take.
func randRequest(r *rand.Rand, cfg ratelimit.Config) ratelimit.Request {
	limit := int64(ratelimit.MaxCapacity)
	for _, b := range cfg.Bandwidths {
		limit = min(limit, b.Capacity)
	}
	req := ratelimit.Request{Tokens: 1 + r.Int64N(limit)>>r.IntN(50), Strategy: ratelimit.Inheritance(r.IntN(4))}
	switch k := r.IntN(20); {
	case k < 6:
		req.Op = ratelimit.Consume
	case k < 8:
		req.Op = ratelimit.Estimate
	case k < 11:
		req.Op = ratelimit.Reserve
		req.MaxWait = time.Duration(r.Int64N(200)) * time.Microsecond
		switch r.IntN(6) {
		case 0:
			req.MaxWait = time.Duration(math.MaxInt64)
		case 1:
			req.MaxWait = time.Duration(r.Int64N(math.MaxInt64))
		}
	case k < 13:
		req.Op = ratelimit.ConsumeUpTo
		if r.IntN(4) == 0 {
			req.Tokens = math.MaxInt64
		}
	case k < 15:
		req.Op = ratelimit.Add
		if r.IntN(4) == 0 {
			req.Tokens = math.MaxInt64 - r.Int64N(3)
		}
	case k < 16:
		req.Op = ratelimit.Reset
	case k < 17:
		req.Op = ratelimit.Replace
	default:
		req.Op = ratelimit.Inspect
	}
	return req
}
