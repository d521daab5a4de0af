package redisscript_test

import (
	"bytes"
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

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/redistest"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newClient connects to a throwaway server (or $SLUICE_REDIS_ADDR).
func newClient(t *testing.T) *redis.Client {
	t.Helper()
	addr, _ := servers.StandaloneAddr(t)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

var script = redis.NewScript(redisscript.Scripts[0].Source)

// scripts are redisscript.Scripts, ready to run.
var scripts = func() []*redis.Script {
	s := make([]*redis.Script, len(redisscript.Scripts))
	for i, src := range redisscript.Scripts {
		s[i] = redis.NewScript(src.Source)
	}
	return s
}()

// loadFunctions loads redisscript.Functions on c's server, unless a test
// sharing the server has.
func loadFunctions(t *testing.T, c *redis.Client) {
	t.Helper()
	err := c.FunctionLoad(context.Background(), redisscript.Functions.Source).Err()
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
}

// A stateCheck compares what an algorithm's script stored with Apply's
// state: read queues the command that fetches the key's value, and check
// compares its result with state at now, which has not expired.
type stateCheck struct {
	read  func(ctx context.Context, pipe redis.Pipeliner, key string) redis.Cmder
	check func(stored redis.Cmder, state ratelimit.State, now int64) error
}

// stateChecks holds each algorithm's check; each algorithm's test file
// registers its own in an init function.
var stateChecks = map[ratelimit.Algorithm]stateCheck{
	ratelimit.TokenBucket: {readString, checkTokenBucket},
}

func readString(ctx context.Context, pipe redis.Pipeliner, key string) redis.Cmder {
	return pipe.Get(ctx, key)
}

func checkTokenBucket(stored redis.Cmder, state ratelimit.State, now int64) error {
	v, err := stored.(*redis.StringCmd).Bytes()
	if err != nil {
		return fmt.Errorf("GET: %w", err)
	}
	gotState, err := decodeState(v)
	if err != nil {
		return err
	}
	if wantState := storedForm(state); !equalState(gotState, wantState) {
		return fmt.Errorf("stored state\n %+v\nwant\n %+v", gotState, wantState)
	}
	return nil
}

// pttlSlack is how far, in ms, a PTTL read after a script may fall short of
// the TTL the script set: the server's clock runs on between the two, by
// seconds when a loaded machine starves it (seen under go test -race ./...
// on two cores). A script that set the wrong TTL misses by more: a minute's
// grace, or whole seconds of rounding.
const pttlSlack = 10_000

// step is one request of a sequence and what the server did with it.
type step struct {
	cfg    ratelimit.Config
	req    ratelimit.Request
	now    int64
	call   redisscript.Call
	run    *redis.Cmd
	ttl    *redis.DurationCmd
	exists *redis.IntCmd
	stored redis.Cmder
}

// TestScriptMatchesApply runs, for every algorithm, seeded random sequences
// of requests, on configs from tiny to the limits of the accepted range,
// with the clock jumping ahead and now and then back, through both
// ratelimit.Apply and the algorithm's script on a real server (on the
// caller's clock). Every decision must be equal, and after every step the
// stored value must match Apply's state, with a TTL to match its expiry,
// or the key be gone once the state equals a new bucket's. Even seeds
// run the scripts (EVALSHA), odd ones the library's functions (FCALL).
func TestScriptMatchesApply(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	for _, s := range scripts {
		if err := s.Load(ctx, c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	loadFunctions(t, c)
	for alg, check := range stateChecks {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			matchApply(t, c, alg, check)
		})
	}
}

func matchApply(t *testing.T, c *redis.Client, alg ratelimit.Algorithm, check stateCheck) {
	ctx := context.Background()
	sequences, steps := 3000, 40
	if testing.Short() {
		sequences = 300
	}
	for seed := range uint64(sequences) {
		r := rand.New(rand.NewPCG(seed, 0x1ea))
		big := r.IntN(3) == 0
		cfgs := [2]ratelimit.Config{redistest.RandConfig(r, alg, big), redistest.RandConfig(r, alg, big)}
		redistest.RandVersions(r, cfgs[:])
		key := fmt.Sprintf("seq:%v:%d", alg, seed)
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
			if seed%2 == 0 {
				s.run = scripts[s.call.Script].EvalSha(ctx, pipe, []string{s.call.Key}, s.call.Arg)
			} else {
				s.run = pipe.FCall(ctx, redisscript.Functions.Functions[s.call.Script], []string{s.call.Key}, s.call.Arg)
			}
			s.ttl = pipe.PTTL(ctx, s.call.Key)
			s.exists = pipe.Exists(ctx, s.call.Key)
			s.stored = check.read(ctx, pipe, s.call.Key)
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
			reply, err := s.run.Text()
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
			if state.ExpiresAt <= s.now {
				if s.exists.Val() != 0 {
					fail("the state equals a new bucket's, yet the key exists")
				}
				state = ratelimit.State{}
				continue
			}
			if err := check.check(s.stored, state, s.now); err != nil {
				fail("%v", err)
			}
			if v, ok := s.stored.(*redis.StringCmd); ok {
				raw, _ := v.Bytes()
				_, _, _, version, packed, err := decodeVersioned(raw, alg)
				if err == nil {
					err = checkVersion(version, packed, state)
				}
				if err != nil {
					fail("%v", err)
				}
			}
			ttl := ceilDiv(state.ExpiresAt-s.now, 1000) + 60_000
			// A stale call that the bucket's newer config cannot decide
			// writes nothing, so the key keeps the TTL set before.
			unwritten := state.Version > s.cfg.Version && !want.Allowed && want.RetryAfter == ratelimit.StaleRetry
			if got := s.ttl.Val().Milliseconds(); !unwritten && (got > ttl || got < ttl-pttlSlack) {
				fail("PTTL %dms, want %dms", got, ttl)
			}
		}
	}
}

// storedForm is s as the script stores it: with no rate.
func storedForm(s ratelimit.State) ratelimit.State {
	out := s
	out.Bands = slices.Clone(s.Bands)
	for i := range out.Bands {
		out.Bands[i].Rate = 0
	}
	return out
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
	parts := []string{cfg.Algorithm.String()}
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

// TestScriptGarbageState stores random values where a bucket lives, most
// shaped like a state and some of those damaged: the script must call them
// corrupt or foreign and leave them alone, or read them as a state and
// reply with a decision Call.Decision accepts; never fail inside Lua, and
// what it writes back must decode.
func TestScriptGarbageState(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10), ratelimit.PerHour(100).WithID("hourly")}}
	r := rand.New(rand.NewPCG(1, 2))
	corrupt, read := 0, 0
	for i := range 3000 {
		v := garbage(r)
		key := fmt.Sprintf("garbage:%d", i)
		call := redisscript.NewCall("", key, cfg, ratelimit.Request{Tokens: 1, Strategy: ratelimit.Inheritance(i % 4)}, 1_700_000_000_000_000)
		c.Set(ctx, call.Key, v, 0)
		reply, err := script.Run(ctx, c, []string{call.Key}, call.Arg).Text()
		if err != nil {
			if !strings.Contains(err.Error(), "sluice: corrupt state") && !strings.Contains(err.Error(), "sluice did not write") {
				t.Fatalf("value %x: %v; want a corrupt-state or foreign-value error, or a decision", v, err)
			}
			if left, _ := c.Get(ctx, call.Key).Bytes(); !bytes.Equal(left, v) {
				t.Fatalf("value %x: %v, yet the script wrote %x", v, err, left)
			}
			corrupt++
			continue
		}
		if _, err := call.Decision(reply); err != nil {
			t.Fatalf("value %x: %v; want a corrupt-state error or a decision", v, err)
		}
		if stored, err := c.Get(ctx, call.Key).Bytes(); err == nil {
			if _, err := decodeState(stored); err != nil {
				t.Fatalf("value %x: wrote back %x: %v", v, stored, err)
			}
		}
		read++
	}
	t.Logf("3000 random values: %d called corrupt or foreign, %d read as a state", corrupt, read)
	if read == 0 || corrupt == 0 {
		t.Errorf("want both outcomes among 3000 random values")
	}
}

// garbage returns a value laid out as a state of 1 to 3 bandwidths with
// random fields, then, half the time, damaged: a byte changed, or bytes cut
// off or added.
func garbage(r *rand.Rand) []byte {
	n := 1 + r.IntN(3)
	v := []byte{byte(15 + n)}
	v = append(v, make([]byte, 15)...)
	for i := 1; i < 16; i++ {
		v[i] = byte(r.IntN(256))
	}
	v[15] = byte(r.IntN(8)) // an expiry within 2^51µs
	var bands []byte
	for range n {
		wu, ws := 1+r.IntN(7), 1+r.IntN(7)
		v = append(v, byte(wu<<4|ws))
		field := make([]byte, 2*wu+2*ws)
		for i := range field {
			field[i] = byte(r.IntN(256))
		}
		field[wu-1] &= 0x3f // keep capacity and scale within 2^50 or so
		field[2*wu-1] &= 0x3f
		idlen := r.IntN(3)
		bands = append(append(append(bands, field...), byte(idlen)), "abc"[:idlen]...)
	}
	v = append(v, bands...)
	switch r.IntN(6) {
	case 0:
		v[r.IntN(len(v))] = byte(r.IntN(256))
	case 1:
		v = v[:r.IntN(len(v))+1]
	case 2:
		v = append(v, byte(r.IntN(256)))
	}
	return v
}

// TestScriptDebtLimit reserves one token at a time, with no limit on the
// wait, until each bandwidth's debt limit refuses: random sequences seldom
// land on the limit itself.
func TestScriptDebtLimit(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	const year = 366 * 24 * time.Hour
	for i, cfg := range []ratelimit.Config{
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(year, 1).WithBurst(10).WithRefill(ratelimit.Interval)}},
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(year, 1)}},
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(100*24*time.Hour, 3).WithBurst(5), ratelimit.Every(year, 7).WithID("y")}},
	} {
		var state ratelimit.State
		key := fmt.Sprintf("debt:%d:%d", time.Now().UnixNano(), i)
		now := int64(1_700_000_000_000_000)
		denied := 0
		for step := 0; denied < 3; step++ {
			req := ratelimit.Request{Op: ratelimit.Reserve, Tokens: 1, MaxWait: time.Duration(math.MaxInt64)}
			want := ratelimit.Apply(&state, cfg, req, now)
			call := redisscript.NewCall("", key, cfg, req, now)
			reply, err := script.Run(ctx, c, []string{call.Key}, call.Arg).Text()
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

// TestScriptTTL: on the server's clock a key expires at the end of the
// second in which its state's expiry falls, or later (when a call kept the
// TTL of an earlier state), never earlier and never by more than a second.
func TestScriptTTL(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(20).WithBurst(5)}}
	key := fmt.Sprintf("ttl:%d", time.Now().UnixNano())
	kept := 0
	var last int64
	for i := range 40 {
		req := ratelimit.Request{Tokens: 1}
		if i%7 == 6 {
			req = ratelimit.Request{Op: ratelimit.Add, Tokens: 2}
		}
		call := redisscript.NewCall("", key, cfg, req, redisscript.ServerClock)
		if err := script.Run(ctx, c, []string{call.Key}, call.Arg).Err(); err != nil {
			t.Fatal(err)
		}
		stored, err := c.Get(ctx, call.Key).Bytes()
		if errors.Is(err, redis.Nil) {
			last = 0
			continue // full again: no key
		}
		s, err := decodeState(stored)
		if err != nil {
			t.Fatal(err)
		}
		at, err := c.Do(ctx, "PEXPIRETIME", call.Key).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if at%1000 != 0 || at*1000 < s.ExpiresAt || at*1000 >= s.ExpiresAt+2_000_000 {
			t.Fatalf("call %d: key expires at %dms; want the end of a second, at or after the state's expiry %dµs and within a second of it", i, at, s.ExpiresAt)
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

// TestScriptReadsLegacyState stores a token bucket in the layout before
// the scale was stored, (capacity, whole tokens), (fraction, back), 1.8
// tokens of PerHour(10), and runs calls on it: the script must decide as
// Apply does on the state it stands for, exactly when the call's config is
// the one the bucket was built for (it gives the scale), in whole tokens
// when not, and store the result in its own layout.
func TestScriptReadsLegacyState(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	const now = 1_700_000_000_000_000
	const scale = 360_000_000 // PerHour(10): a token every 6 minutes
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10).WithID("main")}}
	bigger := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(200).WithID("main")}}
	expiry := int64(now + 8_200*scale/1000) // 8.2 tokens short
	legacy := redistest.EncodeState(redistest.LegacyFormat, cfg.Fingerprint(), expiry, []storedBand{{U1: 10, S1: 1, U2: 8 * scale / 10, S2: expiry - now, ID: "main"}}, 0, nil)
	// What the value stands for: exactly 1.8 tokens when read for cfg,
	// 1 whole token for another config.
	exact := ratelimit.State{Fingerprint: cfg.Fingerprint(), ExpiresAt: expiry,
		Bands: []ratelimit.BandState{{ID: "main", Capacity: 10, Scale: scale, Rate: 1, Level: 18 * scale / 10, Stamp: now}}}
	whole := exact
	whole.Bands = []ratelimit.BandState{{ID: "main", Capacity: 10, Scale: 1, Rate: 1, Level: 1, Stamp: now}}
	proportionally := ratelimit.Request{Op: ratelimit.Replace, Strategy: ratelimit.Proportionally}
	for i, tc := range []struct {
		cfg   ratelimit.Config
		req   ratelimit.Request
		state ratelimit.State
		want  int64 // Remaining
	}{
		{cfg, ratelimit.Request{Op: ratelimit.Inspect}, exact, 1},
		{cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}, exact, 0},
		{cfg, proportionally, exact, 1},
		{bigger, proportionally, whole, 20},
		{bigger, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}, whole, 0},
	} {
		call := redisscript.NewCall("", fmt.Sprintf("legacy:%d", i), tc.cfg, tc.req, now)
		if err := c.Set(ctx, call.Key, legacy, 0).Err(); err != nil {
			t.Fatal(err)
		}
		reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Text()
		if err != nil {
			t.Fatalf("case %d: %+v on a legacy value: %v", i, tc.req, err)
		}
		got, err := call.Decision(reply)
		if err != nil {
			t.Fatal(err)
		}
		state := tc.state
		state.Bands = slices.Clone(tc.state.Bands)
		want := ratelimit.Apply(&state, tc.cfg, tc.req, now)
		if got != want || got.Remaining != tc.want {
			t.Fatalf("case %d: %+v on a legacy value:\n got %+v\nwant %+v (Remaining %d)", i, tc.req, got, want, tc.want)
		}
		if err := checkTokenBucket(c.Get(ctx, call.Key), state, now); err != nil {
			t.Fatalf("case %d: %+v on a legacy value: %v", i, tc.req, err)
		}
	}
}
