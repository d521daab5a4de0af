// Package redisscript is the one implementation of sluice's Redis
// decisions that both Redis backends (backend/redis over go-redis and
// backend/rueidis) run: the Lua scripts, the key layout, the packing of a
// request into the scripts' arguments, the decoding of their reply, the
// mapping of client errors onto ratelimit's sentinels, and the server check.
// The adapters only move bytes through their client.
//
// # The scripts
//
// Each algorithm's script is [ratelimit.Apply] for that algorithm in Lua,
// after prelude.lua, which they share: the request's layout, the clock, the
// string layout of a stored state, reading and storing it with its TTL, and
// the inheritance rules. One call is one EVALSHA on one key: it reads the
// state, applies the request on the server's clock (TIME, in microseconds)
// or on the time the caller passes, writes the state back, or deletes it
// when it already equals a new bucket's, and returns the decision. The key
// expires at the end of the second in which the state comes to equal a new
// bucket's.
//
// The token bucket, GCRA, the fixed window and the sliding window counter
// keep a string of a few dozen bytes (26 for a token bucket of one
// bandwidth of 10 or 100 a second): a format byte (which also tells the
// algorithm), the config's 8-byte fingerprint, the expiry in µs, then per
// bandwidth two pairs of integers in as few bytes as they need, and its ID.
// Keeping what a config change needs lets the script convert the bucket
// when the config's fingerprint changes, with no second round trip. The
// sliding log keeps a sorted set of request times. prelude.lua and each
// algorithm's file document their layout byte by byte.
package redisscript

import (
	_ "embed" // for the scripts

	"github.com/sluicehq/sluice/ratelimit"
)

// A Script is one of the Lua scripts.
type Script struct {
	// Name is the script's file name without .lua.
	Name string
	// Source is the Lua source. KEYS[1] is the bucket's key (see [Key]);
	// ARGV[1] is a request packed by [NewCall]. The reply is decoded by
	// [Call.Decision].
	Source string
}

var (
	//go:embed prelude.lua
	prelude string
	//go:embed tokenbucket.lua
	tokenBucket string
	//go:embed gcra.lua
	gcra string
	//go:embed fixedwindow.lua
	fixedWindow string
	//go:embed slidinglog.lua
	slidingLog string
	//go:embed slidingcounter.lua
	slidingCounter string
)

// Scripts are the scripts, one per algorithm but for LeakyBucket, which is
// GCRA in its continuous-state form and runs GCRA's. Each is prelude.lua,
// what they share, followed by the algorithm's file. [Call.Script] indexes
// it; a backend loads them all.
var Scripts = []Script{
	{"tokenbucket", prelude + tokenBucket},
	{"gcra", prelude + gcra},
	{"fixedwindow", prelude + fixedWindow},
	{"slidinglog", prelude + slidingLog},
	{"slidingcounter", prelude + slidingCounter},
}

// scriptFor maps each algorithm to its script in Scripts.
var scriptFor = [...]int{
	ratelimit.TokenBucket:          0,
	ratelimit.GCRA:                 1,
	ratelimit.FixedWindow:          2,
	ratelimit.SlidingWindowLog:     3,
	ratelimit.SlidingWindowCounter: 4,
	ratelimit.LeakyBucket:          1,
}
