package redisscript_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

var tagUnescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")

// FuzzKey: every user key becomes one hash tag around the whole key, with
// no brace inside it, and the key can be read back, so distinct keys never
// share a bucket.
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
	})
}

// FuzzDecision: any reply decodes to a decision within the config's
// bounds, or to an error; never a panic.
func FuzzDecision(f *testing.F) {
	f.Add(int64(1), int64(1), int64(10), int64(9), int64(0), int64(100000), int64(100000), int64(0))
	f.Add(int64(0), int64(0), int64(10), int64(0), int64(5), int64(5), int64(5), int64(1))
	f.Add(int64(2), int64(-1), int64(0), int64(11), int64(-5), int64(-5), int64(-5), int64(-1))
	f.Add(int64(0), int64(0), int64(10), int64(0), int64(1)<<62, int64(1)<<62, int64(1)<<62, int64(1))
	f.Add(int64(1), int64(1), int64(10), int64(9), int64(0), int64(100), int64(101), int64(0))
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10), ratelimit.PerHour(100).WithID("hourly")}}
	f.Fuzz(func(t *testing.T, allowed, consumed, limit, remaining, retry, reset, refill, binding int64) {
		call := redisscript.NewCall("", "k", cfg, ratelimit.Request{Tokens: 1}, redisscript.ServerClock)
		d, err := call.Decision([]int64{allowed, consumed, limit, remaining, retry, reset, refill, binding})
		if err != nil {
			return
		}
		if d.Bandwidth != "0" && d.Bandwidth != "hourly" || d.Remaining < 0 || d.Remaining > d.Limit || d.RetryAfter < 0 || d.ResetAfter < 0 ||
			d.RefillAfter < 0 || d.RefillAfter > d.ResetAfter ||
			d.RetryAfter != time.Duration(retry)*time.Microsecond || d.ResetAfter != time.Duration(reset)*time.Microsecond ||
			d.RefillAfter != time.Duration(refill)*time.Microsecond ||
			d.RetryAfter/time.Microsecond != time.Duration(retry) || d.ResetAfter/time.Microsecond != time.Duration(reset) {
			t.Fatalf("decoded %+v from a bad reply", d)
		}
	})
}
