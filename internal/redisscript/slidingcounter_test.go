package redisscript_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

func init() {
	stateChecks[ratelimit.SlidingWindowCounter] = stateCheck{readString, checkCounter}
}

func checkCounter(stored redis.Cmder, state ratelimit.State, now int64) error {
	v, err := stored.(*redis.StringCmd).Bytes()
	if err != nil {
		return fmt.Errorf("GET: %w", err)
	}
	got, err := counterDecode(v)
	if err != nil {
		return err
	}
	if want := counterStoredForm(state); !equalState(got, want) {
		return fmt.Errorf("stored state\n %+v\nwant\n %+v", got, want)
	}
	return nil
}

// counterDecode parses a sliding window counter's stored value, whose
// pairs are (cur, prev) and (period, expiry − stamp), into the state it
// stands for, but for Capacity, which is not stored.
func counterDecode(v []byte) (s ratelimit.State, err error) {
	fp, expiry, bands, err := decodeStored(v, ratelimit.SlidingWindowCounter)
	if err != nil {
		return s, err
	}
	s.Fingerprint, s.ExpiresAt, s.Algorithm = fp, expiry, ratelimit.SlidingWindowCounter
	for _, b := range bands {
		s.Bands = append(s.Bands, ratelimit.BandState{ID: b.ID, Scale: b.U2, Level: b.U1, Prev: b.S1, Stamp: expiry - b.S2})
	}
	return s, nil
}

// counterStoredForm is s less what the script does not store.
func counterStoredForm(s ratelimit.State) ratelimit.State {
	out := s
	out.Bands = make([]ratelimit.BandState, len(s.Bands))
	for i, b := range s.Bands {
		b.Capacity = 0
		out.Bands[i] = b
	}
	return out
}

// counterBand is one bandwidth of a value counterGarbage writes.
type counterBand struct {
	cur, prev, period, stamp int64
	id                       string
}

// counterEncode writes a value in prelude.lua's layout, each pair in the
// fewest bytes that hold it (or 7 if none do: a damaged value).
func counterEncode(fp uint64, expiry int64, bands []counterBand) []byte {
	v := []byte{byte(16*(int(ratelimit.SlidingWindowCounter)+1) + len(bands) - 1)}
	v = binary.LittleEndian.AppendUint64(v, fp)
	v = binary.LittleEndian.AppendUint64(v, uint64(expiry))[:16]
	var fields []byte
	for _, b := range bands {
		w1, w2 := counterWidth(b.cur, b.prev), counterWidth(b.period, expiry-b.stamp)
		v = append(v, byte(w1<<4|w2))
		fields = counterPut(fields, b.cur, w1)
		fields = counterPut(fields, b.prev, w1)
		fields = counterPut(fields, b.period, w2)
		fields = counterPut(fields, expiry-b.stamp, w2)
		fields = append(append(fields, byte(len(b.id))), b.id...)
	}
	return append(v, fields...)
}

func counterWidth(u, s int64) int {
	if s < 0 {
		s = -s - 1
	}
	m := max(u, 2*s)
	w := 1
	for w < 7 && m >= 1<<(8*w) {
		w++
	}
	return w
}

func counterPut(b []byte, x int64, w int) []byte {
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(x))
	return append(b, buf[:w]...)
}

// counterGarbage returns a value shaped like a sliding window counter's
// state for cfg at now, with fields from plausible to absurd; damaged
// (a byte changed, bytes cut off or added) when damaged is set. Half are
// near cfg's own: its fingerprint, bandwidth count and IDs, now and then
// a field off.
func counterGarbage(r *rand.Rand, cfg ratelimit.Config, now int64, damaged bool) []byte {
	near := r.IntN(2) == 0
	fp, n := r.Uint64(), 1+r.IntN(3)
	if near {
		fp, n = cfg.Fingerprint(), len(cfg.Bandwidths)
	}
	expiry := now + r.Int64N(8e9) - 4e9
	if r.IntN(8) == 0 {
		expiry = r.Int64N(1 << 53)
	}
	bands := make([]counterBand, n)
	for i := range bands {
		b := &bands[i]
		b.period = []int64{1e6, 3600e6, 1 + r.Int64N(1<<45)}[r.IntN(3)]
		b.id = []string{"", "hourly", "x"}[r.IntN(3)]
		most := int64(120)
		if near {
			bw := cfg.Bandwidths[i]
			most = bw.Capacity + 2
			if r.IntN(8) > 0 {
				b.period = bw.PeriodMicros()
			}
			if r.IntN(8) > 0 {
				b.id = bw.ID
			}
		}
		b.cur, b.prev = r.Int64N(most), r.Int64N(most)
		if r.IntN(8) == 0 {
			b.cur, b.prev = r.Int64N(1<<52), r.Int64N(1<<52)-1<<51
		}
		b.stamp = now + r.Int64N(8e9) - 4e9
		if r.IntN(8) > 0 {
			b.stamp -= b.stamp % b.period
		}
	}
	v := counterEncode(fp, expiry, bands)
	if damaged {
		switch r.IntN(3) {
		case 0:
			v[r.IntN(len(v))] = byte(r.IntN(256))
		case 1:
			v = v[:r.IntN(len(v))+1]
		case 2:
			v = append(v, byte(r.IntN(256)))
		}
	}
	return v
}

// TestCounterScriptGarbageState stores random values where a bucket
// lives, most shaped like a sliding window counter's state and some of
// those damaged: the script must call them corrupt or read them as a
// state, never fail inside Lua, and what it writes back must decode.
// Undamaged values it reads must give Apply's decision and state on the
// state they stand for.
func TestCounterScriptGarbageState(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Algorithm: ratelimit.SlidingWindowCounter,
		Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10), ratelimit.PerHour(100).WithID("hourly")}}
	const now = 1_700_000_000_000_000
	r := rand.New(rand.NewPCG(1, 5))
	ops := []ratelimit.Op{ratelimit.Consume, ratelimit.Estimate, ratelimit.ConsumeUpTo, ratelimit.Add, ratelimit.Reset, ratelimit.Replace, ratelimit.Inspect}
	corrupt, read, compared := 0, 0, 0
	for i := range 3000 {
		damaged := r.IntN(2) == 0
		v := counterGarbage(r, cfg, now, damaged)
		if i%50 == 0 {
			v = garbage(r) // a token bucket's, or not sluice's at all
		}
		req := ratelimit.Request{Op: ops[r.IntN(len(ops))], Tokens: 1 + r.Int64N(10), Strategy: ratelimit.Inheritance(r.IntN(4))}
		key := fmt.Sprintf("counter-garbage:%d", i)
		call := redisscript.NewCall("", key, cfg, req, now)
		c.Set(ctx, call.Key, v, 0)
		reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Text()
		if !damaged && i%50 != 0 {
			s, _ := counterDecode(v)
			if want := counterCorrupt(s, cfg, req, now); want != (err != nil) {
				t.Fatalf("value %x, state %+v, %+v: got %v, want corrupt: %v", v, s, req, err, want)
			}
		}
		if err != nil {
			if !strings.Contains(err.Error(), "sluice: corrupt state") && !strings.Contains(err.Error(), "sluice did not write") {
				t.Fatalf("value %x: %v; want a corrupt-state or foreign-value error, or a decision", v, err)
			}
			corrupt++
			continue
		}
		got, err := call.Decision(reply)
		if err != nil {
			t.Fatalf("value %x: %v", v, err)
		}
		read++
		stored, err := c.Get(ctx, call.Key).Bytes()
		var after ratelimit.State
		if err == nil {
			if after, err = counterDecode(stored); err != nil {
				t.Fatalf("value %x: wrote back %x: %v", v, stored, err)
			}
		}
		if damaged || i%50 == 0 {
			continue
		}
		// The state v stands for, as Apply keeps it.
		s, err := counterDecode(v)
		if err != nil {
			t.Fatalf("value %x: %v", v, err)
		}
		for j := range s.Bands {
			if j < len(cfg.Bandwidths) {
				s.Bands[j].Capacity = cfg.Bandwidths[j].Capacity
			}
		}
		want := ratelimit.Apply(&s, cfg, req, now)
		if got != want {
			t.Fatalf("value %x, %+v: got %+v, want %+v", v, req, got, want)
		}
		if s.ExpiresAt <= now {
			s = ratelimit.State{}
		}
		if !equalState(after, counterStoredForm(s)) {
			t.Fatalf("value %x, %+v: stored %+v, want %+v", v, req, after, counterStoredForm(s))
		}
		compared++
	}
	t.Logf("3000 random values: %d called corrupt or foreign, %d read as a state, %d of those compared with Apply", corrupt, read, compared)
	if read == 0 || corrupt == 0 || compared == 0 {
		t.Errorf("want every outcome among 3000 random values")
	}
}

// counterCorrupt reports whether the script must call s corrupt: a count
// or period out of range or a window start off the period's grid, or, if
// it is to be kept as is, a period, count or ID its config would not give.
func counterCorrupt(s ratelimit.State, cfg ratelimit.Config, req ratelimit.Request, now int64) bool {
	const maxPeriod = int64(ratelimit.MaxRefillPeriod / time.Microsecond)
	for _, b := range s.Bands {
		if b.Level > ratelimit.MaxCapacity || b.Prev < 0 || b.Prev > ratelimit.MaxCapacity || b.Scale < 1 || b.Scale > maxPeriod ||
			b.Stamp < 0 || b.Stamp >= 1<<52 || b.Stamp%b.Scale != 0 {
			return true
		}
	}
	if now >= s.ExpiresAt || req.Op == ratelimit.Reset || req.Op == ratelimit.Replace ||
		s.Fingerprint != cfg.Fingerprint() || len(s.Bands) != len(cfg.Bandwidths) {
		return false
	}
	for i, b := range cfg.Bandwidths {
		if st := s.Bands[i]; st.Scale != b.PeriodMicros() || st.Level > b.Capacity || st.Prev > b.Capacity || st.ID != b.ID {
			return true
		}
	}
	return false
}

// TestCounterScriptServerClock runs the classic example on the server's
// clock: with 8 of 10 taken, the key expires at the end of the second in
// which both windows have rolled out, and the stored window starts are
// aligned to the epoch.
func TestCounterScriptServerClock(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	cfg := ratelimit.Config{Algorithm: ratelimit.SlidingWindowCounter, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(10)}}
	key := fmt.Sprintf("counter-clock:%d", time.Now().UnixNano())
	call := redisscript.NewCall("", key, cfg, ratelimit.Request{Tokens: 8}, redisscript.ServerClock)
	reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Text()
	if err != nil {
		t.Fatal(err)
	}
	d, err := call.Decision(reply)
	if err != nil || !d.Allowed || d.Remaining != 2 || d.ResetAfter <= time.Minute || d.ResetAfter > 2*time.Minute {
		t.Fatalf("got %+v, %v; want 8 taken, 2 left, full again within 1 to 2 minutes", d, err)
	}
	stored, err := c.Get(ctx, call.Key).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	s, err := counterDecode(stored)
	if err != nil {
		t.Fatal(err)
	}
	const minute = int64(time.Minute / time.Microsecond)
	if b := s.Bands[0]; b.Level != 8 || b.Prev != 0 || b.Scale != minute || b.Stamp%minute != 0 || s.ExpiresAt != b.Stamp+2*minute {
		t.Fatalf("stored %+v; want 8 in a window aligned to the minute, expiring two windows on", s)
	}
	at, err := c.Do(ctx, "PEXPIRETIME", call.Key).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if want := (s.ExpiresAt + 999_999) / 1_000_000 * 1000; at != want {
		t.Fatalf("key expires at %dms; want %dms, the end of the second of the state's expiry %dµs", at, want, s.ExpiresAt)
	}
}
