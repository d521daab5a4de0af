// Package redisscript is the one implementation of sluice's Redis
// decisions that both Redis backends (backend/redis over go-redis and
// backend/rueidis) run: the Lua scripts, the key layout, the packing of a
// request into the scripts' arguments, the decoding of their reply, the
// mapping of client errors onto ratelimit's sentinels, and the server check.
// The adapters only move bytes through their client.
//
// # The scripts
//
// Each algorithm's file is [ratelimit.Apply] for that algorithm in Lua,
// after prelude.lua, which they share: the request's layout, the clock, the
// string layout of a stored state, reading and storing it with its TTL, and
// the inheritance rules. One call is one FCALL (or, see below, one
// EVALSHA) on one key: it reads the state, applies the request on the
// server's clock (TIME, in microseconds) or on the time the caller passes,
// writes the state back, or deletes it when it already equals a new
// bucket's, and returns the decision. The key expires at the end of the
// second in which the state comes to equal a new bucket's.
//
// # Functions and scripts
//
// The files are put together two ways, from the same Lua. [Functions] is a
// Redis Functions library (Redis 7.0 and later) holding a function per
// algorithm, and the permits' (see below): FUNCTION LOAD runs the prelude
// and every file once, and each
// FCALL runs only the decision, so the prelude's helpers, tables and
// struct formats (and every algorithm's helpers but the sliding log's) are
// made once per server instead of on every call.
// Its name and its functions' names carry a hash of the Lua source, so two
// versions of sluice on one server or cluster each keep their own library
// and never replace the other's. [Runner] loads the library on a server
// that lacks it, on first use, and falls back to [Scripts], one script per
// algorithm run by EVALSHA, once a server refuses Redis Functions.
//
// The token bucket, GCRA, the fixed window and the sliding window counter
// keep a string of a few dozen bytes (28 for a token bucket of one
// bandwidth of 100 a second after one request, 30 of 10 a second): a
// format byte (which also tells the algorithm), the config's 8-byte
// fingerprint, the expiry in µs, then per bandwidth two pairs of integers
// in as few bytes as they need, and its ID.
// Keeping what a config change needs lets the script convert the bucket
// when the config's fingerprint changes, with no second round trip. The
// sliding log keeps a sorted set of request times. prelude.lua and each
// algorithm's file document their layout byte by byte.
//
// # Permits
//
// permits.lua is [ratelimit.ApplyPermit] in Lua: the concurrency permits
// of [ratelimit.PermitBackend], one FCALL (or EVALSHA) per acquire,
// release, renew or inspect, packed by [NewPermitCall] and decoded by
// [PermitCall.Decision]. It needs no prelude. A key's permits are a sorted
// set at [PermitKey], the bucket's key and ":permits": the same hash tag,
// so the same cluster slot, and never a bucket's key. The set holds a
// member per permit held, holder#1 to holder#w for a holder of weight w,
// each scored with the end of its lease in µs, so it never holds more
// members than its largest limit; every call first removes the members
// whose lease has ended on the clock the call decides on (the server's
// TIME, or the caller's), and the key expires when its last lease ends.
// permits.lua documents the layout and the commands.
package redisscript

import (
	_ "embed" // for the scripts

	"github.com/sluicehq/sluice/ratelimit"
)

// A Script is one of the Lua scripts, each algorithm's decision on its own
// for EVALSHA, which a backend runs where the server refuses [Functions].
type Script struct {
	// Name is the script's file name without .lua.
	Name string
	// Source is the Lua source: prelude.lua, the algorithm's file, and a
	// call of its fast path, then, unless that answered, of its run (see
	// entry). KEYS[1] is the bucket's key (see [Key]); ARGV[1] is a
	// request packed by [NewCall]. The reply is decoded by
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
	//go:embed permits.lua
	permits string
)

// algorithms are the algorithms' files, one per algorithm but for
// LeakyBucket, which is GCRA in its continuous-state form and runs GCRA's.
// Each defines its decision as the Lua function run, after prelude.lua,
// and may define a fast path for a common case as the function fast.
var algorithms = []Script{
	{"tokenbucket", tokenBucket},
	{"gcra", gcra},
	{"fixedwindow", fixedWindow},
	{"slidinglog", slidingLog},
	{"slidingcounter", slidingCounter},
}

// Scripts are the scripts, one per entry of algorithms: prelude.lua, the
// algorithm's file, then fast, and unless it answered begin and run, on
// KEYS and ARGV; then the permits' script (see [PermitCall]): permits.lua,
// which needs no prelude, and its call. [Call.Script] indexes it.
var Scripts = func() []Script {
	s := make([]Script, len(algorithms), len(algorithms)+1)
	for i, a := range algorithms {
		s[i] = Script{a.Name, prelude + a.Source + "\n" + entry("KEYS", "ARGV")}
	}
	return append(s, Script{permitsName, permits + "\nreturn permits(KEYS, ARGV)\n"})
}()

// permitsName names the permits' script and function.
const permitsName = "permits"

// permitScript is the index of the permits' script in Scripts, and of its
// function in [Functions], after the algorithms'.
var permitScript = len(algorithms)

// entry is the Lua that decides a call on the keys and args named: the
// algorithm's fast path, and unless it answered, begin and run. A script
// ends with it; a library's function is it.
func entry(keys, args string) string {
	return "local reply = fast(" + keys + ", " + args + ")\nif reply then\n  return reply\nend\n" +
		"begin(" + keys + ", " + args + ")\nreturn run()\n"
}

// scriptFor maps each algorithm to its script in Scripts, and to its
// function in [Functions].
var scriptFor = [...]int{
	ratelimit.TokenBucket:          0,
	ratelimit.GCRA:                 1,
	ratelimit.FixedWindow:          2,
	ratelimit.SlidingWindowLog:     3,
	ratelimit.SlidingWindowCounter: 4,
	ratelimit.LeakyBucket:          1,
}
