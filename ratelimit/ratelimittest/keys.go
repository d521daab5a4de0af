package ratelimittest

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// keyScenarios check that every key is its own bucket.
var keyScenarios = []scenario{
	{name: "Independent", run: testKeysIndependent},
	{name: "DistinctBytes", run: testKeysDistinctBytes},
	{name: "MaxKeyLen", run: testMaxKeyLen},
}

// testKeysIndependent: draining or resetting one key leaves another alone.
func testKeysIndependent(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(5))
	full := dec{Allowed: true, Limit: 5, Remaining: 5, Bandwidth: "0"}
	drained := dec{Allowed: true, Limit: 5, Consumed: 5, ResetAfter: time.Hour, Bandwidth: "0"}
	empty := dec{Limit: 5, RetryAfter: 12 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}
	a, b := e.key("a"), e.key("b")
	e.steps(t, a, cfg, []step{{req: consume(5), want: drained}})
	e.steps(t, b, cfg, []step{{req: inspect(), want: full}, {req: consume(5), want: drained}})
	e.steps(t, a, cfg, []step{{req: inspect(), want: empty}, {req: reset(), want: full}})
	e.steps(t, b, cfg, []step{{req: inspect(), want: empty}})
}

// testKeysDistinctBytes: keys are compared byte for byte: no case folding,
// trimming or normalising, and braces (a Redis hash tag's delimiters), NUL
// bytes and non-ASCII bytes are ordinary bytes.
func testKeysDistinctBytes(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(1))
	names := []string{"k", "K", "k ", " k", "k\n", "{k}", "{k", "k}", "}k{", "{}", "k\x00", "k\x00x", "ключ", "\xff"}
	for _, n := range names {
		e.steps(t, e.key(n), cfg, []step{{req: consume(1), want: dec{Allowed: true, Limit: 1, Consumed: 1, ResetAfter: time.Hour, Bandwidth: "0"}}})
	}
	for _, n := range names {
		e.steps(t, e.key(n), cfg, []step{{req: inspect(), want: dec{Limit: 1, RetryAfter: time.Hour, ResetAfter: time.Hour, Bandwidth: "0"}}})
	}
}

// testMaxKeyLen: a key of MaxKeyLen bytes is valid, and every byte of it
// counts.
func testMaxKeyLen(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(1))
	long := e.key("")
	long += strings.Repeat("x", ratelimit.MaxKeyLen-1-len(long))
	for _, k := range []string{long + "a", long + "b"} {
		e.steps(t, k, cfg, []step{{req: consume(1), want: dec{Allowed: true, Limit: 1, Consumed: 1, ResetAfter: time.Hour, Bandwidth: "0"}}})
	}
}
