package redisscript_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
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

// permitScript is the permits' script, the last of redisscript.Scripts.
var permitScript = scripts[len(scripts)-1]

// permitFunction is the permits' function in the library.
var permitFunction = redisscript.Functions.Functions[len(redisscript.Functions.Functions)-1]

// permitStep is one request of a permit sequence, what ApplyPermit made
// of it, and the commands that run it and read what it left.
type permitStep struct {
	lim    ratelimit.Concurrency
	req    ratelimit.PermitRequest
	now    int64
	want   ratelimit.PermitDecision
	holds  map[string]ratelimit.Hold // ApplyPermit's state after the step
	ttl    int64                     // the PTTL the key must have, in ms, if it exists
	call   redisscript.PermitCall
	run    *redis.Cmd
	card   *redis.IntCmd
	pttl   *redis.DurationCmd
	all    *redis.ZSliceCmd  // every member, for a small set
	probes []*redis.FloatCmd // else ZSCORE of each holder's first, last and one-past-last
}

// TestPermitScriptMatchesApplyPermit runs seeded random sequences of
// acquires, releases, renews and inspects, from a few holders (names with
// '#' and binary bytes among them), with weights, limits raised and
// lowered below the permits held, and leases from the shortest to the
// longest, through both
// ratelimit.ApplyPermit and the permits' script on a real server, on a
// clock that moves ahead, lands on lease ends, stands still and now and
// then steps back. Every decision must be equal; after every step the
// sorted set must hold ApplyPermit's holds member for member (a holder of
// weight w: holder#1 to holder#w, scored with its lease's end), with the
// TTL a caller's clock gets (a minute past the last lease's end), or be
// gone when nothing is held. A few sequences take weights in the
// thousands, across the script's chunks (TestPermitScriptWeights takes
// the largest). Even seeds run the script
// (EVALSHA), odd ones the library's function (FCALL).
func TestPermitScriptMatchesApplyPermit(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	if err := permitScript.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	loadFunctions(t, c)
	sequences, steps := 1500, 40
	if testing.Short() {
		sequences = 200
	}
	run := time.Now().UnixNano()
	for seed := range uint64(sequences) {
		r := rand.New(rand.NewPCG(seed, 0x9e3))
		key := fmt.Sprintf("permits:%d:%d", run, seed)
		seq := permitSequence(r, key, steps)
		pipe := c.Pipeline()
		for i := range seq {
			queuePermitStep(ctx, pipe, &seq[i], seed%2 == 0)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for i := range seq {
			if err := checkPermitStep(&seq[i]); err != nil {
				t.Fatalf("seed %d, step %d: %+v under %+v at %dµs:\n%v\nsteps so far:\n%s", seed, i, seq[i].req, seq[i].lim, seq[i].now, err, permitHistory(seq[:i+1]))
			}
		}
	}
}

// permitSequence makes steps random requests on key, each with
// ApplyPermit's decision and state, and the script's call packed but
// not run.
func permitSequence(r *rand.Rand, key string, steps int) []permitStep {
	holders := permitHolders(r)
	base := 1 + r.Int64N(6)
	switch r.IntN(40) {
	case 0:
		base = 2990 + r.Int64N(10_000) // across the script's chunks
	case 1, 2, 3, 4, 5, 6:
		base = 1 + r.Int64N(300)
	}
	lease := randLease(r)
	now := 1_700_000_000_000_000 + r.Int64N(1_000_000)
	var st ratelimit.PermitState
	ttl := int64(0)
	seq := make([]permitStep, steps)
	for i := range seq {
		s := &seq[i]
		now = permitAdvance(r, now, lease, &st)
		lim := ratelimit.Concurrency{Limit: base, Lease: lease}
		switch r.IntN(8) {
		case 0:
			lim.Limit = 1 + r.Int64N(base) // lowered, maybe below what is held
		case 1:
			lim.Limit = min(base+1+r.Int64N(base), ratelimit.MaxPermits)
		case 2:
			lim.Lease = randLease(r)
		}
		req := randPermitRequest(r, holders, lim, &st)
		if err := ratelimit.CheckPermit(key, lim, req); err != nil {
			panic(fmt.Sprintf("generated a bad call: %v", err))
		}
		// Whether the call writes: an acquire that adds a holder or a
		// release that frees one, or a lease that moves.
		before, held := st.Holds[req.Holder]
		held = held && before.Expires > now
		s.lim, s.req, s.now = lim, req, now
		s.want = ratelimit.ApplyPermit(&st, lim, req, now)
		moved := held && before.Expires != now+lim.LeaseMicros()
		writes := s.want.Granted && (req.Op == ratelimit.PermitAcquire && (!held || moved) ||
			req.Op == ratelimit.PermitRelease || req.Op == ratelimit.PermitRenew && moved)
		if writes {
			ms := st.ExpiresAt() - now
			ttl = (ms+999)/1000 + 60_000
		}
		s.holds, s.ttl = maps.Clone(st.Holds), ttl
		s.call = redisscript.NewPermitCall("", key, lim, req, now)
	}
	return seq
}

// permitHolders are a sequence's holders: plain, with '#' where the
// script's members put it, with bytes of every kind, and of the longest.
func permitHolders(r *rand.Rand) []string {
	pool := []string{"a", "b", "a#1", "a#", "#", "#1", "x#2#3", "\x00", strings.Repeat("h", ratelimit.MaxHolderLen)}
	r.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	holders := pool[:2+r.IntN(4)]
	raw := make([]byte, 1+r.IntN(ratelimit.MaxHolderLen))
	for i := range raw {
		raw[i] = byte(r.IntN(256))
	}
	return append(holders, string(raw))
}

// randLease is a lease from the shortest to the longest, in whole µs.
func randLease(r *rand.Rand) time.Duration {
	switch r.IntN(4) {
	case 0:
		return ratelimit.MinPermitLease
	case 1:
		return ratelimit.MaxPermitLease
	}
	return ratelimit.MinPermitLease + time.Duration(r.Int64N(int64(10*time.Second/time.Microsecond)))*time.Microsecond
}

// permitAdvance moves the clock: a little, by about a lease, onto a
// held lease's end or just before it, not at all, or back.
func permitAdvance(r *rand.Rand, now int64, lease time.Duration, st *ratelimit.PermitState) int64 {
	µs := int64(lease / time.Microsecond)
	switch k := r.IntN(10); {
	case k < 3:
		return now + r.Int64N(µs/4+1)
	case k < 5:
		return now + r.Int64N(2*µs+1)
	case k < 7 && len(st.Holds) > 0:
		ends := slices.Sorted(maps.Keys(st.Holds))
		end := st.Holds[ends[r.IntN(len(ends))]].Expires
		return max(now, end-r.Int64N(2))
	case k < 8:
		return now
	case k < 9:
		return now - r.Int64N(µs+1) // a store's clock stepped back
	}
	return now + 1
}

// randPermitRequest is an op for one of holders, half the time one that
// holds a permit (its lease may have ended): an acquire of a weight
// up to the limit (mostly 1), or a release or renew that carries the
// weight held, or another (the store goes by what it holds), or an
// inspect.
func randPermitRequest(r *rand.Rand, holders []string, lim ratelimit.Concurrency, st *ratelimit.PermitState) ratelimit.PermitRequest {
	req := ratelimit.PermitRequest{Holder: holders[r.IntN(len(holders))]}
	if held := slices.Sorted(maps.Keys(st.Holds)); len(held) > 0 && r.IntN(2) == 0 {
		req.Holder = held[r.IntN(len(held))] // mostly one that holds, or held
	}
	switch k := r.IntN(20); {
	case k < 9:
		req.Op, req.Weight = ratelimit.PermitAcquire, 1
		if r.IntN(2) == 0 {
			req.Weight = 1 + r.Int64N(lim.Limit)
		}
	case k < 17:
		req.Op = ratelimit.PermitRelease
		if k >= 13 {
			req.Op = ratelimit.PermitRenew
		}
		req.Weight = st.Holds[req.Holder].Weight
		switch r.IntN(4) {
		case 0:
			req.Weight = r.Int64N(1<<20) - 1<<10
		case 1:
			req.Weight = 1 + r.Int64N(max(1, req.Weight))
		}
	default:
		req.Op = ratelimit.PermitInspect
		if r.IntN(2) == 0 {
			req.Holder = ""
		}
	}
	return req
}

// probeMax is the most members a step reads whole; a larger set is
// checked by its cardinality and each holder's first, last and
// one-past-last member.
const probeMax = 300

func queuePermitStep(ctx context.Context, pipe redis.Pipeliner, s *permitStep, eval bool) {
	k := s.call.Call.Key
	if eval {
		s.run = permitScript.EvalSha(ctx, pipe, []string{k}, s.call.Call.Arg)
	} else {
		s.run = pipe.FCall(ctx, permitFunction, []string{k}, s.call.Call.Arg)
	}
	s.card = pipe.ZCard(ctx, k)
	s.pttl = pipe.PTTL(ctx, k)
	if s.want.InFlight <= probeMax {
		s.all = pipe.ZRangeWithScores(ctx, k, 0, -1)
		return
	}
	for _, holder := range slices.Sorted(maps.Keys(s.holds)) {
		w := s.holds[holder].Weight
		for _, i := range []int64{1, w, w + 1} {
			s.probes = append(s.probes, pipe.ZScore(ctx, k, holder+"#"+strconv.FormatInt(i, 10)))
		}
	}
}

// checkPermitStep compares what the script did in s with ApplyPermit.
func checkPermitStep(s *permitStep) error {
	reply, err := s.run.Text()
	if err != nil {
		return fmt.Errorf("script: %v", err)
	}
	got, err := s.call.Decision(reply)
	if err != nil {
		return err
	}
	if got != s.want {
		return fmt.Errorf(" got %+v\nwant %+v", got, s.want)
	}
	if n := s.card.Val(); n != s.want.InFlight {
		return fmt.Errorf("the set holds %d members; want the %d permits held", n, s.want.InFlight)
	}
	if len(s.holds) == 0 {
		if s.pttl.Val() != -2*time.Nanosecond {
			return fmt.Errorf("nothing is held, yet the key exists (PTTL %v)", s.pttl.Val())
		}
		return nil
	}
	if ms := s.pttl.Val().Milliseconds(); ms > s.ttl || ms < s.ttl-pttlSlack {
		return fmt.Errorf("PTTL %dms; want %dms, a minute past the last lease's end", ms, s.ttl)
	}
	if s.all != nil {
		return checkPermitMembers(s.all.Val(), s.holds)
	}
	return checkPermitProbes(s.probes, s.holds)
}

// checkPermitMembers compares a set's members with holds.
func checkPermitMembers(members []redis.Z, holds map[string]ratelimit.Hold) error {
	want := map[string]float64{}
	for holder, h := range holds {
		for i := int64(1); i <= h.Weight; i++ {
			want[holder+"#"+strconv.FormatInt(i, 10)] = float64(h.Expires)
		}
	}
	got := map[string]float64{}
	for _, z := range members {
		got[z.Member.(string)] = z.Score
	}
	if !maps.Equal(got, want) {
		return fmt.Errorf("members\n %v\nwant\n %v", got, want)
	}
	return nil
}

// checkPermitProbes reads the probes queuePermitStep queued for holds.
func checkPermitProbes(probes []*redis.FloatCmd, holds map[string]ratelimit.Hold) error {
	for i, holder := range slices.Sorted(maps.Keys(holds)) {
		h := holds[holder]
		first, last, past := probes[3*i], probes[3*i+1], probes[3*i+2]
		if first.Val() != float64(h.Expires) || last.Val() != float64(h.Expires) || !errors.Is(past.Err(), redis.Nil) {
			return fmt.Errorf("holder %q of weight %d: scores %v, %v, %v; want %d, %d and none", holder, h.Weight, first.Val(), last.Val(), past.Err(), h.Expires, h.Expires)
		}
	}
	return nil
}

func permitHistory(seq []permitStep) string {
	var b strings.Builder
	for i, s := range seq {
		fmt.Fprintf(&b, "  %2d at %dµs, limit %d lease %v: %v %q weight %d → %+v\n", i, s.now, s.lim.Limit, s.lim.Lease, s.req.Op, s.req.Holder, s.req.Weight, s.want)
	}
	return b.String()
}

// permitRun runs req under lim on the permits at key, at now, through the
// library's function (or, with eval, the script) and through ApplyPermit
// on st, and wants equal decisions and a set of st's size.
func permitRun(t *testing.T, c *redis.Client, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest, now int64, st *ratelimit.PermitState, eval bool) ratelimit.PermitDecision {
	t.Helper()
	ctx := context.Background()
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		t.Fatal(err)
	}
	want := ratelimit.ApplyPermit(st, lim, req, now)
	call := redisscript.NewPermitCall("", key, lim, req, now)
	var reply string
	var err error
	if eval {
		reply, err = permitScript.Run(ctx, c, []string{call.Call.Key}, call.Call.Arg).Text()
	} else {
		reply, err = c.FCall(ctx, permitFunction, []string{call.Call.Key}, call.Call.Arg).Text()
	}
	if err != nil {
		t.Fatalf("%+v at %d: %v", req, now, err)
	}
	got, err := call.Decision(reply)
	if err != nil || got != want {
		t.Fatalf("%+v at %d: got %+v, %v; want %+v", req, now, got, err, want)
	}
	if n := c.ZCard(ctx, call.Call.Key).Val(); n != want.InFlight {
		t.Fatalf("%+v at %d: the set holds %d members; want %d", req, now, n, want.InFlight)
	}
	return got
}

// TestPermitScriptWeights takes weights on and around the script's chunks
// of 3000 members, up to ratelimit.MaxPermits, and releases and renews
// them with hints of the weight that are right, short, long and absurd:
// the script must find every member, whatever the hint.
func TestPermitScriptWeights(t *testing.T) {
	c := newClient(t)
	loadFunctions(t, c)
	ctx := context.Background()
	lease := 10 * time.Second
	for i, w := range []int64{1, 2, 2999, 3000, 3001, 6000, 6001, 9002, ratelimit.MaxPermits} {
		eval := i%2 == 0
		key := fmt.Sprintf("permit-weights:%d:%d", time.Now().UnixNano(), w)
		lim := ratelimit.Concurrency{Limit: ratelimit.MaxPermits, Lease: lease}
		now := int64(1_700_000_000_000_000)
		var st ratelimit.PermitState
		acquire := ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "w", Weight: w}
		if d := permitRun(t, c, key, lim, acquire, now, &st, eval); !d.Granted || d.InFlight != w {
			t.Fatalf("weight %d: acquire %+v; want granted, all held", w, d)
		}
		other := ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "o", Weight: ratelimit.MaxPermits - w + 1}
		if d := permitRun(t, c, key, lim, other, now, &st, eval); d.Granted {
			t.Fatalf("weight %d: acquire past the limit %+v; want denied", w, d)
		}
		for j, hint := range []int64{w, 1, w - 1, w + 1, 0, -5, ratelimit.MaxPermits, 1 << 40} {
			now += 1000
			renew := ratelimit.PermitRequest{Op: ratelimit.PermitRenew, Holder: "w", Weight: hint}
			if d := permitRun(t, c, key, lim, renew, now, &st, eval); !d.Granted {
				t.Fatalf("weight %d, renew %d with hint %d: %+v; want granted", w, j, hint, d)
			}
			want := float64(now + lease.Microseconds())
			for _, m := range []int64{1, w} {
				if s := c.ZScore(ctx, redisscript.PermitKey("", key), "w#"+strconv.FormatInt(m, 10)).Val(); s != want {
					t.Fatalf("weight %d, renew with hint %d: member %d scored %v; want %v", w, hint, m, s, want)
				}
			}
		}
		release := ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: "w", Weight: 1 + w/2}
		if d := permitRun(t, c, key, lim, release, now, &st, eval); !d.Granted || d.InFlight != 0 {
			t.Fatalf("weight %d: release %+v; want granted, none held", w, d)
		}
		if n := c.Exists(ctx, redisscript.PermitKey("", key)).Val(); n != 0 {
			t.Fatalf("weight %d: the key outlived its last permit", w)
		}
	}
}

// TestPermitScriptServerClock: on the server's clock, a lease ends a
// lease after the server's TIME at the call, and the key expires at the
// millisecond the last lease ends (rounded up): later when a longer
// lease is taken, earlier when it is released, and gone with the last.
func TestPermitScriptServerClock(t *testing.T) {
	c := newClient(t)
	loadFunctions(t, c)
	ctx := context.Background()
	key := fmt.Sprintf("permit-clock:%d", time.Now().UnixNano())
	rkey := redisscript.PermitKey("", key)
	serverTime := func() int64 {
		t.Helper()
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now.UnixMicro()
	}
	// do runs req and returns the decision and the bounds of the server's
	// time at the call.
	do := func(lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, int64, int64) {
		t.Helper()
		before := serverTime()
		call := redisscript.NewPermitCall("", key, lim, req, redisscript.ServerClock)
		reply, err := c.FCall(ctx, permitFunction, []string{call.Call.Key}, call.Call.Arg).Text()
		if err != nil {
			t.Fatal(err)
		}
		after := serverTime()
		d, err := call.Decision(reply)
		if err != nil {
			t.Fatal(err)
		}
		return d, before, after
	}
	expiresAt := func() int64 {
		t.Helper()
		ms, err := c.Do(ctx, "PEXPIRETIME", rkey).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	ceilMs := func(µs int64) int64 { return (µs + 999) / 1000 }
	// inLease checks that the key expires a lease after a time within
	// [before, after], and that member m is scored so.
	inLease := func(what string, lease time.Duration, before, after int64, m string) {
		t.Helper()
		l := lease.Microseconds()
		if at := expiresAt(); at < ceilMs(before+l) || at > ceilMs(after+l) {
			t.Fatalf("%s: the key expires at %dms; want %d to %d", what, at, ceilMs(before+l), ceilMs(after+l))
		}
		if s := int64(c.ZScore(ctx, rkey, m).Val()); s < before+l || s > after+l {
			t.Fatalf("%s: %s's lease ends at %dµs; want %d to %d", what, m, s, before+l, after+l)
		}
	}
	short := ratelimit.Concurrency{Limit: 3, Lease: 30 * time.Second}
	long := ratelimit.Concurrency{Limit: 3, Lease: time.Hour}
	d, before, after := do(short, ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "a", Weight: 1})
	if !d.Granted || d.InFlight != 1 {
		t.Fatalf("acquire: %+v", d)
	}
	inLease("acquire", short.Lease, before, after, "a#1")
	aBefore, aAfter := before, after
	d, before, after = do(long, ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "b", Weight: 2})
	if !d.Granted || d.InFlight != 3 {
		t.Fatalf("acquire of a longer lease: %+v", d)
	}
	inLease("acquire of a longer lease", long.Lease, before, after, "b#2")
	d, _, after = do(long, ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "c", Weight: 1})
	if d.Granted || d.RetryAfter > short.Lease || d.RetryAfter < short.Lease-time.Duration(after-aBefore)*time.Microsecond {
		t.Fatalf("acquire past the limit: %+v; want denied until a's lease ends", d)
	}
	d, _, _ = do(long, ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: "b"})
	if !d.Granted || d.InFlight != 1 {
		t.Fatalf("release: %+v", d)
	}
	inLease("release of the longer lease", short.Lease, aBefore, aAfter, "a#1")
	d, before, after = do(long, ratelimit.PermitRequest{Op: ratelimit.PermitRenew, Holder: "a"})
	if !d.Granted || d.InFlight != 1 {
		t.Fatalf("renew: %+v", d)
	}
	inLease("renew for longer", long.Lease, before, after, "a#1")
	d, _, _ = do(long, ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: "a"})
	if !d.Granted || d.InFlight != 0 {
		t.Fatalf("release of the last: %+v", d)
	}
	if c.Exists(ctx, rkey).Val() != 0 {
		t.Fatal("the key outlived its last permit")
	}
}

// TestPermitScriptForeignValues: a key that holds another type, or a
// sorted set larger than any permits' (so not one), is refused with an
// error Error maps to ratelimit.ErrKeyRejected, and left as it is.
func TestPermitScriptForeignValues(t *testing.T) {
	c := newClient(t)
	loadFunctions(t, c)
	ctx := context.Background()
	req := ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "h", Weight: 1}
	lim := ratelimit.Concurrency{Limit: 10, Lease: time.Second}
	call := redisscript.NewPermitCall("", fmt.Sprintf("permit-foreign:%d", time.Now().UnixNano()), lim, req, 1_700_000_000_000_000)
	k := call.Call.Key
	members := make([]redis.Z, ratelimit.MaxPermits+1)
	for i := range members {
		members[i] = redis.Z{Score: 1, Member: i}
	}
	for _, tc := range []struct {
		name  string
		store func() error
		want  string
	}{
		{"string", func() error { return c.Set(ctx, k, "hello", 0).Err() }, "WRONGTYPE"},
		{"huge sorted set", func() error { return c.ZAdd(ctx, k, members...).Err() }, "sluice: corrupt state at key " + k},
	} {
		if err := c.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
		if err := tc.store(); err != nil {
			t.Fatal(err)
		}
		dump := c.Dump(ctx, k).Val()
		_, err := c.FCall(ctx, permitFunction, []string{k}, call.Call.Arg).Result()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v; want an error saying %q", tc.name, err, tc.want)
		}
		if mapped := redisscript.Error(ctx, err, "test"); !errors.Is(mapped, ratelimit.ErrKeyRejected) {
			t.Errorf("%s: %v maps to %v; want ErrKeyRejected", tc.name, err, mapped)
		}
		if c.Dump(ctx, k).Val() != dump {
			t.Errorf("%s: the value changed", tc.name)
		}
	}
}

// TestPermitKey: a key's permits live beside its bucket, on its slot, at
// the bucket's key and ":permits".
func TestPermitKey(t *testing.T) {
	for _, key := range []string{"user:1", "{victim}", "a}b{c", "%", "x"} {
		for _, prefix := range []string{"", "rl:"} {
			pk, bk := redisscript.PermitKey(prefix, key), redisscript.Key(prefix, key)
			if pk != bk+":permits" {
				t.Errorf("PermitKey(%q, %q) = %q; want %q", prefix, key, pk, bk+":permits")
			}
			if got, want := redisscript.KeySlot(pk), redisscript.Slot(prefix, key); got != want {
				t.Errorf("PermitKey(%q, %q) = %q is on slot %d; want the bucket's, %d", prefix, key, pk, got, want)
			}
		}
	}
}

// TestPermitDecision decodes replies as the script packs them, and
// refuses, naming the key, those no script sends.
func TestPermitDecision(t *testing.T) {
	lim := ratelimit.Concurrency{Limit: 5, Lease: time.Second}
	call := func(op ratelimit.PermitOp) redisscript.PermitCall {
		return redisscript.NewPermitCall("", "k", lim, ratelimit.PermitRequest{Op: op, Holder: "h", Weight: 1}, redisscript.ServerClock)
	}
	for _, tc := range []struct {
		op    ratelimit.PermitOp
		reply string
		want  ratelimit.PermitDecision // Limit 5 added
		ok    bool
	}{
		{ratelimit.PermitAcquire, packPermitReply(1, 3, 0), ratelimit.PermitDecision{Granted: true, InFlight: 3}, true},
		{ratelimit.PermitAcquire, packPermitReply(0, 5, 1500), ratelimit.PermitDecision{InFlight: 5, RetryAfter: 1500 * time.Microsecond}, true},
		{ratelimit.PermitAcquire, packPermitReply(1, 9, 0), ratelimit.PermitDecision{Granted: true, InFlight: 9}, true}, // the limit lowered
		{ratelimit.PermitRelease, packPermitReply(1, 0, 0), ratelimit.PermitDecision{Granted: true}, true},
		{ratelimit.PermitRenew, packPermitReply(0, 2, 0), ratelimit.PermitDecision{InFlight: 2}, true},
		{ratelimit.PermitInspect, packPermitReply(1, 4, 0), ratelimit.PermitDecision{Granted: true, InFlight: 4}, true},
		{ratelimit.PermitInspect, packPermitReply(0, 5, 0), ratelimit.PermitDecision{InFlight: 5}, true},
		{ratelimit.PermitAcquire, packPermitReply(1, 0, 0), ratelimit.PermitDecision{}, false},     // granted, yet none held
		{ratelimit.PermitAcquire, packPermitReply(0, 5, 0), ratelimit.PermitDecision{}, false},     // denied, no wait
		{ratelimit.PermitAcquire, packPermitReply(1, 3, 7), ratelimit.PermitDecision{}, false},     // granted, with a wait
		{ratelimit.PermitRelease, packPermitReply(0, 3, 7), ratelimit.PermitDecision{}, false},     // a release waits
		{ratelimit.PermitInspect, packPermitReply(1, 5, 0), ratelimit.PermitDecision{}, false},     // full, yet room
		{ratelimit.PermitAcquire, packPermitReply(2, 3, 0), ratelimit.PermitDecision{}, false},     // granted is a byte 0 or 1
		{ratelimit.PermitAcquire, packPermitReply(1, 1.5, 0), ratelimit.PermitDecision{}, false},   // not whole
		{ratelimit.PermitAcquire, packPermitReply(1, -1, 0), ratelimit.PermitDecision{}, false},    // negative
		{ratelimit.PermitAcquire, packPermitReply(1, 1<<17, 0), ratelimit.PermitDecision{}, false}, // more than MaxPermits
		{ratelimit.PermitAcquire, packPermitReply(0, 1, 1<<60), ratelimit.PermitDecision{}, false}, // past 2^53
		{ratelimit.PermitAcquire, packPermitReply(1, 3, 0)[:16], ratelimit.PermitDecision{}, false},
		{ratelimit.PermitAcquire, "", ratelimit.PermitDecision{}, false},
		{ratelimit.PermitAcquire, packReply(1, 1, 10, 9, 0, 100, 100, 0), ratelimit.PermitDecision{}, false}, // a rate decision
	} {
		got, err := call(tc.op).Decision(tc.reply)
		if !tc.ok {
			if err == nil || !errors.Is(err, ratelimit.ErrBackendUnavailable) || !strings.Contains(err.Error(), `key "{k}:permits"`) {
				t.Errorf("%v, reply %q: %+v, %v; want ErrBackendUnavailable naming the key", tc.op, tc.reply, got, err)
			}
			continue
		}
		tc.want.Limit = lim.Limit
		if err != nil || got != tc.want {
			t.Errorf("%v, reply %q: %+v, %v; want %+v", tc.op, tc.reply, got, err, tc.want)
		}
	}
}

// TestNewPermitCall: the packed request, byte by byte, as permits.lua
// reads it: an inspect sends no holder, a release's or renew's weight is
// clamped to 1 to MaxPermits, and a time before 1970 is 1970's.
func TestNewPermitCall(t *testing.T) {
	lim := ratelimit.Concurrency{Limit: 7, Lease: 1500 * time.Microsecond}
	for _, tc := range []struct {
		req        ratelimit.PermitRequest
		now        int64
		weight     float64
		wantNow    float64
		wantHolder string
	}{
		{ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "h#1", Weight: 3}, 42, 3, 42, "h#1"},
		{ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: "h", Weight: 0}, redisscript.ServerClock, 1, -1, "h"},
		{ratelimit.PermitRequest{Op: ratelimit.PermitRenew, Holder: "h", Weight: 1 << 40}, -5, ratelimit.MaxPermits, 0, "h"},
		{ratelimit.PermitRequest{Op: ratelimit.PermitInspect, Holder: "ignored"}, 9, 1, 9, ""},
	} {
		c := redisscript.NewPermitCall("rl:", "k", lim, tc.req, tc.now)
		num := func(i int) float64 {
			return math.Float64frombits(binary.LittleEndian.Uint64([]byte(c.Call.Arg[1+8*i:])))
		}
		if c.Call.Key != "rl:{k}:permits" || c.Call.Arg[0] != byte(tc.req.Op) || num(0) != 7 || num(1) != 1500 || num(2) != tc.weight ||
			num(3) != tc.wantNow || c.Call.Arg[33:] != tc.wantHolder || redisscript.Scripts[c.Call.Script].Name != "permits" {
			t.Errorf("%+v at %d: key %q, arg %q; want op, limit 7, lease 1500, weight %v, now %v, holder %q, the permits' script",
				tc.req, tc.now, c.Call.Key, c.Call.Arg, tc.weight, tc.wantNow, tc.wantHolder)
		}
	}
}

// packPermitReply packs a reply as permits.lua does.
func packPermitReply(granted byte, inFlight, retry float64) string {
	b := []byte{granted}
	for _, n := range []float64{inFlight, retry} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(n))
	}
	return string(b)
}
