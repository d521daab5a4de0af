package redisscript_test

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

var tagUnescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")

// FuzzKey: every user key becomes one hash tag around the whole key, with
// no brace inside it, and the key can be read back, so distinct keys never
// share a bucket; its permits key is the bucket's and ":permits", on the
// bucket's slot (but for the empty key, which no call accepts).
func FuzzKey(f *testing.F) {
	for _, k := range []string{"user:12345", "{victim}", "a{b}c", "}{", "%7B", "%", "{}", ""} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		rkey := redisscript.Key("rl:", key)
		tag, ok := strings.CutPrefix(rkey, "rl:{")
		if !ok || !strings.HasSuffix(tag, "}") {
			t.Fatalf("Key(%q) = %q; want rl:{...}", key, rkey)
		}
		tag = strings.TrimSuffix(tag, "}")
		if strings.ContainsAny(tag, "{}") {
			t.Fatalf("Key(%q) = %q: a brace inside the tag", key, rkey)
		}
		if back := tagUnescaper.Replace(tag); back != key {
			t.Fatalf("Key(%q) = %q, which reads back as %q", key, rkey, back)
		}
		if pk := redisscript.PermitKey("rl:", key); pk != rkey+":permits" || key != "" && redisscript.KeySlot(pk) != redisscript.KeySlot(rkey) {
			t.Fatalf("PermitKey(%q) = %q; want %q, on the bucket's slot", key, pk, rkey+":permits")
		}
	})
}

// FuzzDecision: any reply decodes to a decision within the config's
// bounds and equal to the numbers packed in it, or to an error; never a
// panic.
func FuzzDecision(f *testing.F) {
	f.Add(packReply(1, 1, 10, 9, 0, 100000, 100000, 0))
	f.Add(packReply(0, 0, 10, 0, 5, 5, 5, 1))
	f.Add(packReply(2, -1, 0, 11, -5, -5, -5, 255))
	f.Add(packReply(0, 0, 10, 0, 1<<62, 1<<62, 1<<62, 1))
	f.Add(packReply(1, 1, 10, 9, 0, 100, 101, 0))
	f.Add(packReply(1, 1.5, 10, 9, math.NaN(), math.Inf(1), 0, 0))
	f.Add(packReply(1, 1, 10, 9, 0, 100, 100, 0)[:49])
	f.Add("")
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10), ratelimit.PerHour(100).WithID("hourly")}}
	f.Fuzz(func(t *testing.T, reply string) {
		call := redisscript.NewCall("", "k", cfg, ratelimit.Request{Tokens: 1}, redisscript.ServerClock)
		d, err := call.Decision(reply)
		if err != nil {
			return
		}
		if len(reply) != 50 {
			t.Fatalf("decoded %+v from a reply of %d bytes", d, len(reply))
		}
		num := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply[1+8*i:]))) }
		micros := func(i int) time.Duration { return time.Duration(num(i)) * time.Microsecond }
		if d.Bandwidth != "0" && d.Bandwidth != "hourly" || d.Remaining < 0 || d.Remaining > d.Limit || d.RetryAfter < 0 || d.ResetAfter < 0 ||
			d.RefillAfter < 0 || d.RefillAfter > d.ResetAfter || d.Allowed != (reply[0] == 1) ||
			float64(d.Consumed) != num(0) || float64(d.Limit) != num(1) || float64(d.Remaining) != num(2) ||
			d.RetryAfter != micros(3) || d.ResetAfter != micros(4) || d.RefillAfter != micros(5) ||
			d.RetryAfter/time.Microsecond != time.Duration(num(3)) || d.ResetAfter/time.Microsecond != time.Duration(num(4)) {
			t.Fatalf("decoded %+v from a bad reply %q", d, reply)
		}
	})
}

// packReply packs a reply as the scripts do (see prelude.lua).
func packReply(allowed byte, consumed, limit, remaining, retry, reset, refill float64, binding byte) string {
	b := []byte{allowed}
	for _, n := range []float64{consumed, limit, remaining, retry, reset, refill} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(n))
	}
	return string(append(b, binding))
}

// FuzzPermitDecision: any reply decodes, for any op, to a permit decision
// equal to the numbers packed in it and as a script could give it, or to
// an error; never a panic.
func FuzzPermitDecision(f *testing.F) {
	f.Add(packPermitReply(1, 3, 0), uint8(ratelimit.PermitAcquire))
	f.Add(packPermitReply(0, 5, 1500), uint8(ratelimit.PermitAcquire))
	f.Add(packPermitReply(1, 0, 0), uint8(ratelimit.PermitRelease))
	f.Add(packPermitReply(0, 2, 0), uint8(ratelimit.PermitRenew))
	f.Add(packPermitReply(1, 4, 0), uint8(ratelimit.PermitInspect))
	f.Add(packPermitReply(2, -1, math.NaN()), uint8(ratelimit.PermitAcquire))
	f.Add(packPermitReply(0, 1, math.Inf(1)), uint8(ratelimit.PermitAcquire))
	f.Add(packPermitReply(1, 3, 0)[:16], uint8(ratelimit.PermitAcquire))
	f.Add("", uint8(ratelimit.PermitInspect))
	lim := ratelimit.Concurrency{Limit: 5, Lease: time.Second}
	f.Fuzz(func(t *testing.T, reply string, op uint8) {
		req := ratelimit.PermitRequest{Op: ratelimit.PermitOp(op % 4), Holder: "h", Weight: 1}
		call := redisscript.NewPermitCall("", "k", lim, req, redisscript.ServerClock)
		d, err := call.Decision(reply)
		if err != nil {
			if !errors.Is(err, ratelimit.ErrBackendUnavailable) || !strings.Contains(err.Error(), `"{k}:permits"`) {
				t.Fatalf("reply %q: %v; want ErrBackendUnavailable naming the key", reply, err)
			}
			return
		}
		if len(reply) != 17 {
			t.Fatalf("decoded %+v from a reply of %d bytes", d, len(reply))
		}
		num := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply[1+8*i:]))) }
		acquire := req.Op == ratelimit.PermitAcquire
		if d.Granted != (reply[0] == 1) || reply[0] > 1 || d.Degraded || d.Limit != lim.Limit ||
			float64(d.InFlight) != num(0) || d.InFlight < 0 || d.InFlight > ratelimit.MaxPermits ||
			d.RetryAfter != time.Duration(num(1))*time.Microsecond || d.RetryAfter < 0 ||
			(d.RetryAfter > 0) != (acquire && !d.Granted) || acquire && d.InFlight < 1 ||
			req.Op == ratelimit.PermitInspect && d.Granted != (d.InFlight < lim.Limit) {
			t.Fatalf("decoded %+v from a bad reply %q to %v", d, reply, req.Op)
		}
	})
}
