package redisscript_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

func init() { stateChecks[ratelimit.FixedWindow] = stateCheck{readString, checkFixedWindow} }

func checkFixedWindow(stored redis.Cmder, state ratelimit.State, now int64) error {
	v, err := stored.(*redis.StringCmd).Bytes()
	if err != nil {
		return fmt.Errorf("GET: %w", err)
	}
	got, err := fixedDecode(v)
	if err != nil {
		return err
	}
	if !equalState(got, state) {
		return fmt.Errorf("stored state\n %+v\nwant\n %+v", got, state)
	}
	return nil
}

// fixedDecode parses a FixedWindow value, whose pairs per bandwidth are
// (expiry - window start, count) and (0, 0), or (0, 0) twice for a
// bandwidth with no count, into the ratelimit.State it stands for.
func fixedDecode(v []byte) (ratelimit.State, error) {
	fp, expiry, bands, err := decodeStored(v, ratelimit.FixedWindow)
	if err != nil {
		return ratelimit.State{}, err
	}
	s := ratelimit.State{Fingerprint: fp, Algorithm: ratelimit.FixedWindow, ExpiresAt: expiry}
	for _, b := range bands {
		if b.U2 != 0 || b.S2 != 0 || b.S1 == 0 && b.U1 != 0 {
			return s, fmt.Errorf("value %x: bandwidth %+v is not (expiry - start, count), (0, 0)", v, b)
		}
		st := ratelimit.BandState{ID: b.ID, Level: b.S1}
		if b.S1 != 0 {
			st.Stamp = expiry - b.U1
		}
		s.Bands = append(s.Bands, st)
	}
	return s, nil
}

// fixedEncode lays out s in prelude.lua's format for FixedWindow, every
// field 7 bytes wide: a value the script reads as it reads its own,
// though it writes its own narrower.
func fixedEncode(s ratelimit.State) []byte {
	le := binary.LittleEndian
	v := []byte{byte(16*(int(ratelimit.FixedWindow)+1) + len(s.Bands) - 1)}
	v = le.AppendUint64(v, s.Fingerprint)
	v = le.AppendUint64(v, uint64(s.ExpiresAt))[:16]
	var bands []byte
	for _, b := range s.Bands {
		v = append(v, 0x77)
		var back int64
		if b.Level != 0 {
			back = s.ExpiresAt - b.Stamp
		}
		for _, f := range []int64{back, b.Level, 0, 0} {
			bands = le.AppendUint64(bands, uint64(f))[:len(bands)+7]
		}
		bands = append(append(bands, byte(len(b.ID))), b.ID...)
	}
	return append(v, bands...)
}

// TestFixedWindowScriptGarbage stores random values where a FixedWindow
// bucket lives: most laid out as its state, with fields in range or not,
// some damaged, some another algorithm's or no sluice value. The script
// must call them corrupt or foreign, or decide and store what Apply does
// on the state they stand for (a new bucket for another algorithm's); a
// damaged value it reads must give a decision and leave a value of its
// own layout. It must never fail inside Lua.
func TestFixedWindowScriptGarbage(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(10),
		ratelimit.PerHour(100).WithID("a").AlignedTo(time.Unix(1_600_000_000, 0)),
	}}
	const now = 1_700_000_000_000_000
	ops := []ratelimit.Op{ratelimit.Consume, ratelimit.ConsumeUpTo, ratelimit.Add, ratelimit.Inspect, ratelimit.Replace}
	r := rand.New(rand.NewPCG(3, 4))
	outcomes := map[string]int{}
	for i := range 3000 {
		v, state, kind := fixedGarbage(r, cfg, now)
		req := ratelimit.Request{Op: ops[i%len(ops)], Tokens: 1 + int64(i%3), Strategy: ratelimit.Inheritance(i % 4)}
		call := redisscript.NewCall("", fmt.Sprintf("fixedgarbage:%d", i), cfg, req, now)
		c.Set(ctx, call.Key, v, 0)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("%s value %x, %+v: %s", kind, v, req, fmt.Sprintf(format, args...))
		}
		reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Text()
		if err != nil {
			if msg := err.Error(); kind == fixedForeign || !strings.Contains(msg, "sluice: corrupt state") && !strings.Contains(msg, "sluice did not write") {
				fail("%v; want a decision, or for a bad value a corrupt-state or foreign-value error", err)
			}
			if kind == fixedShaped && !fixedImpossible(state, cfg) {
				fail("%v; want the state it stands for read", err)
			}
			outcomes[kind+", refused"]++
			continue
		}
		if kind == fixedShaped && state.Fingerprint == cfg.Fingerprint() && req.Op != ratelimit.Reset && req.Op != ratelimit.Replace && now < state.ExpiresAt && fixedImpossible(state, cfg) {
			fail("decided %v; want a corrupt-state error", reply)
		}
		if kind == fixedNotOurs {
			fail("decided %v; want a foreign-value error", reply)
		}
		got, err := call.Decision(reply)
		if err != nil {
			fail("%v", err)
		}
		if kind == fixedForeign {
			state = ratelimit.State{}
		}
		want := ratelimit.Apply(&state, cfg, req, now)
		if got != want && kind != fixedDamaged {
			fail("got %+v, want %+v as Apply on %+v", got, want, state)
		}
		stored, err := c.Get(ctx, call.Key).Bytes()
		if errors.Is(err, redis.Nil) {
			if kind != fixedDamaged && state.ExpiresAt > now {
				fail("the key is gone; want Apply's state %+v", state)
			}
			outcomes[kind+", read, now absent"]++
			continue
		}
		s, decodeErr := fixedDecode(stored)
		switch {
		case err != nil || decodeErr != nil:
			fail("wrote back %x: %v, %v", stored, err, decodeErr)
		case kind != fixedDamaged && !equalState(s, state):
			fail("wrote back %+v; want Apply's state %+v", s, state)
		case len(s.Bands) != len(cfg.Bandwidths) || s.ExpiresAt <= now:
			fail("wrote back %+v, not a state of the config at %d", s, now)
		}
		outcomes[kind+", read"]++
	}
	t.Logf("3000 random values: %v", outcomes)
	if outcomes[fixedShaped+", refused"] == 0 || outcomes[fixedShaped+", read"] == 0 || outcomes[fixedDamaged+", read"] == 0 {
		t.Errorf("want values in the layout both refused and read, and damaged ones read, among 3000")
	}
}

// fixedImpossible reports whether state, as fixedGarbage made it for cfg,
// is one that neither Apply nor the script leaves: an expiry after every
// window's end, a count below 0, or, built for cfg, a count beyond the
// capacity or a window that ends after the expiry.
func fixedImpossible(state ratelimit.State, cfg ratelimit.Config) bool {
	if state.ExpiresAt >= 1<<52+1<<45 {
		return true
	}
	for i, b := range state.Bands {
		if b.Level < 0 {
			return true
		}
		if state.Fingerprint != cfg.Fingerprint() {
			continue
		}
		if bw := cfg.Bandwidths[i]; b.Level > bw.Capacity || b.Level > 0 && b.Stamp+bw.PeriodMicros() > state.ExpiresAt {
			return true
		}
	}
	return false
}

// What fixedGarbage made.
const (
	fixedShaped  = "in the layout"
	fixedDamaged = "damaged"
	fixedForeign = "another algorithm's"
	fixedNotOurs = "not sluice's"
)

// fixedGarbage returns a value for a FixedWindow bucket of cfg at now: a
// state of 1 to 3 bandwidths, with the config's fingerprint or another,
// an expiry around now or anywhere, and random fields, laid out as the
// script's; and now and then damaged, or with another algorithm's header
// or none of sluice's. state is what the value stands for when it is in
// the layout.
func fixedGarbage(r *rand.Rand, cfg ratelimit.Config, now int64) (v []byte, state ratelimit.State, kind string) {
	state = ratelimit.State{Algorithm: ratelimit.FixedWindow, Fingerprint: r.Uint64(), ExpiresAt: now - 1<<40 + r.Int64N(1<<41)}
	if r.IntN(2) == 0 {
		state.Fingerprint = cfg.Fingerprint()
	}
	switch r.IntN(16) {
	case 0, 1:
		state.ExpiresAt = r.Int64N(1 << 56)
	case 2:
		state.ExpiresAt = 1<<52 + 1<<45 - r.Int64N(2) // the latest expiry a state may have, or 1µs later
	}
	for i := range 1 + r.IntN(3) {
		b := ratelimit.BandState{ID: []string{"", "a", "b"}[r.IntN(3)]}
		switch r.IntN(4) {
		case 0: // no count
		case 1:
			b.Level = r.Int64N(15)
		default:
			b.Level = r.Int64N(1<<r.IntN(55)) - r.Int64N(3)
		}
		if b.Level != 0 {
			period := cfg.Bandwidths[min(i, len(cfg.Bandwidths)-1)].PeriodMicros()
			b.Stamp = state.ExpiresAt - period - r.Int64N(1<<r.IntN(55))
			if r.IntN(4) == 0 {
				b.Stamp = state.ExpiresAt - r.Int64N(period)
			}
		}
		state.Bands = append(state.Bands, b)
	}
	same := state.Fingerprint == cfg.Fingerprint() && len(state.Bands) == len(cfg.Bandwidths)
	if same {
		// Built for the config: its IDs are the config's.
		for i := range state.Bands {
			state.Bands[i].ID = cfg.Bandwidths[i].ID
		}
	}
	v = fixedEncode(state)
	if state.Fingerprint == cfg.Fingerprint() && !same {
		// The script converts it, as Apply does a state of another
		// fingerprint.
		state.Fingerprint++
	}
	kind = fixedShaped
	switch r.IntN(10) {
	case 0:
		v[1+r.IntN(len(v)-1)] = byte(r.IntN(256))
		kind = fixedDamaged
	case 1:
		v = v[:1+r.IntN(len(v))] // not to nothing: prelude.lua fails on an empty string
		kind = fixedDamaged
	case 2:
		v = append(v, byte(r.IntN(256)))
		kind = fixedDamaged
	case 3:
		alg := []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter, ratelimit.LeakyBucket}[r.IntN(5)]
		v[0] = byte(redistest.FormatOf(alg) + int(v[0])%16) // the same shape: well formed
		kind = fixedForeign
	case 4:
		v[0] = byte(r.IntN(16) + redistest.VersionedFormat*r.IntN(2)) // below every format, versioned or not
		kind = fixedNotOurs
	}
	return v, state, kind
}

// TestFixedWindowScriptServerClock: on the server's clock, a call that
// changes nothing writes nothing, so that a value laid out wider than the
// script's own stays as it is, with its TTL; a call that counts, refunds,
// finds a window over, converts or resets writes the state anew.
func TestFixedWindowScriptServerClock(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	slow := ratelimit.Every(10*time.Second, 3).WithID("slow")
	fast := ratelimit.Every(200*time.Millisecond, 5).WithID("fast")
	cfg := ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{slow, fast}}
	key := fmt.Sprintf("fixedclock:%d", time.Now().UnixNano())
	rkey := redisscript.Key("", key)
	run := func(cfg ratelimit.Config, req ratelimit.Request) ratelimit.Decision {
		t.Helper()
		call := redisscript.NewCall("", key, cfg, req, redisscript.ServerClock)
		reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Text()
		if err != nil {
			t.Fatal(err)
		}
		d, err := call.Decision(reply)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// get returns the stored value, the state it stands for and when the
	// key expires, in ms.
	get := func() ([]byte, ratelimit.State, int64) {
		t.Helper()
		v, err := c.Get(ctx, rkey).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		s, err := fixedDecode(v)
		if err != nil {
			t.Fatal(err)
		}
		at, err := c.Do(ctx, "PEXPIRETIME", rkey).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if at%1000 != 0 || at*1000 < s.ExpiresAt || at*1000 >= s.ExpiresAt+1_000_000 {
			t.Fatalf("stored %+v expiring at %dms; want the end of the second of the state's expiry", s, at)
		}
		return v, s, at
	}
	// widen stores the state again, laid out wider: a call that writes
	// replaces it with the script's own layout.
	widen := func() ([]byte, ratelimit.State, int64) {
		t.Helper()
		_, s, at := get()
		wide := fixedEncode(s)
		if err := c.Set(ctx, rkey, wide, redis.KeepTTL).Err(); err != nil {
			t.Fatal(err)
		}
		return wide, s, at
	}
	// rewritten checks that the last call wrote the state anew, with
	// slow's count.
	rewritten := func(what string, wide []byte, count int64) ratelimit.State {
		t.Helper()
		v, s, _ := get()
		if string(v) == string(wide) || s.Bands[0].Level != count {
			t.Fatalf("%s left %x (%+v); want it written anew, with a count of %d in slow", what, v, s, count)
		}
		return s
	}

	run(cfg, ratelimit.Request{Tokens: 2})
	wide, _, _ := widen()
	if d := run(cfg, ratelimit.Request{Tokens: 1}); !d.Allowed || d.Remaining != 0 || d.Bandwidth != "slow" {
		t.Fatalf("Consume(1) = %+v, want allowed, none left in slow", d)
	}
	rewritten("an allowed Consume", wide, 3)

	// slow is full; fast's window may end meanwhile, which writes.
	wide, s, at := widen()
	for range 3 {
		d := run(cfg, ratelimit.Request{Tokens: 1})
		v, s2, at2 := get()
		switch {
		case d.Allowed || d.Bandwidth != "slow" || d.RetryAfter != d.ResetAfter || d.RetryAfter > 10*time.Second:
			t.Fatalf("Consume(1) = %+v, want denied by slow until the state's expiry", d)
		case s2.Bands[1].Level > 0 && (string(v) != string(wide) || at2 != at):
			t.Fatalf("a denial with no window over wrote %x, expiring at %dms; want %x as it was, expiring at %dms", v, at2, wide, at)
		case s2.Bands[1].Level == 0 && (string(v) == string(wide) || s2.ExpiresAt != s.ExpiresAt):
			t.Fatalf("a denial that found fast's window over left %x (%+v); want the state written anew, expiring at %d", v, s2, s.ExpiresAt)
		}
	}

	wide, _, _ = widen()
	run(cfg, ratelimit.Request{Op: ratelimit.Add, Tokens: 1})
	rewritten("Add", wide, 2)

	wide, s, _ = widen()
	time.Sleep(250 * time.Millisecond)
	run(cfg, ratelimit.Request{Op: ratelimit.Inspect})
	if s.Bands[1].Level > 0 {
		if s2 := rewritten("Inspect after fast's window", wide, 2); s2.Bands[1].Level != 0 || s2.ExpiresAt != s.ExpiresAt {
			t.Fatalf("Inspect after fast's window stored %+v; want slow's count alone, expiring at %d", s2, s.ExpiresAt)
		}
	}

	wide, _, _ = widen()
	more := ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{slow.WithBurst(5), fast}}
	run(more, ratelimit.Request{Op: ratelimit.Inspect})
	if s := rewritten("a config change", wide, 2); s.Fingerprint != more.Fingerprint() {
		t.Fatalf("a config change stored %+v; want the new config's fingerprint %x", s, more.Fingerprint())
	}

	widen()
	run(more, ratelimit.Request{Op: ratelimit.Reset})
	if n, err := c.Exists(ctx, rkey).Result(); err != nil || n != 0 {
		t.Fatalf("after Reset: EXISTS = %d, %v; want the key gone", n, err)
	}
}
