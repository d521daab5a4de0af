// Package redisscript is the one implementation of sluice's Redis
// decisions that both Redis backends (backend/redis over go-redis and
// backend/rueidis) run: the Lua scripts, the key layout, the packing of a
// request into the script's arguments, the decoding of its reply, the
// mapping of client errors onto ratelimit's sentinels, and the server check.
// The adapters only move bytes through their client.
//
// # The token-bucket script
//
// [TokenBucket] is [ratelimit.Apply] in Lua. One call is one EVALSHA on one
// key: it reads the state, applies the request on the server's clock (TIME,
// in microseconds) or on the time the caller passes, writes the state back
// with a TTL of the time until it equals a new bucket's (or deletes it when
// it already does), and returns the decision.
//
// The stored value is a string of a few dozen bytes: a format byte (1), the
// config's 8-byte fingerprint, the expiry in µs as a varint, then for each
// bandwidth its capacity and scale as varints, its level and its distance
// from the expiry to its stamp as zigzag varints, and its ID (a length byte
// and the bytes). Keeping capacity, scale and ID lets the script convert
// the bucket when the config's fingerprint changes, with no second round
// trip.
package redisscript

import (
	_ "embed" // for the scripts
)

// TokenBucket is the Lua source of the token-bucket script. KEYS[1] is the
// bucket's key (see [Key]); ARGV[1] is a request packed by [NewCall]. The
// reply is decoded by [Call.Decision].
//
//go:embed tokenbucket.lua
var TokenBucket string
