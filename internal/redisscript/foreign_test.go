package redisscript_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// everyOp is one request of each op.
var everyOp = []ratelimit.Request{
	{Op: ratelimit.Consume, Tokens: 1},
	{Op: ratelimit.Estimate, Tokens: 1},
	{Op: ratelimit.Reserve, Tokens: 1, MaxWait: time.Second},
	{Op: ratelimit.ConsumeUpTo, Tokens: 5},
	{Op: ratelimit.Add, Tokens: 1},
	{Op: ratelimit.Reset},
	{Op: ratelimit.Replace, Strategy: ratelimit.AsIs},
	{Op: ratelimit.Inspect},
}

// ops are the requests of everyOp that cfg's algorithm takes: not all of
// them reserve.
func ops(cfg ratelimit.Config) []ratelimit.Request {
	var reqs []ratelimit.Request
	for _, req := range everyOp {
		if ratelimit.CheckRequest("k", cfg, req) == nil {
			reqs = append(reqs, req)
		}
	}
	return reqs
}

// foreignSets are sorted sets that no sliding log holds, some close to
// one: a log's two first members are "" and its 8-byte fingerprint, each
// scored -1 - a whole number below 2^53 (see slidinglog.lua).
var foreignSets = map[string][]redis.Z{
	"a member '' scored 5":         {{Score: 5, Member: ""}},
	"no member ''":                 {{Score: 1, Member: "m"}},
	"'' alone":                     {{Score: -1, Member: ""}},
	"no fingerprint":               {{Score: -2, Member: ""}, {Score: 3, Member: "12345678"}},
	"a 7-byte fingerprint":         {{Score: -2, Member: ""}, {Score: -3, Member: "1234567"}, {Score: 7, Member: "0"}},
	"'' scored between integers":   {{Score: -2.5, Member: ""}, {Score: -3, Member: "12345678"}, {Score: 7, Member: "0"}},
	"a fingerprint scored -inf":    {{Score: -2, Member: ""}, {Score: math.Inf(-1), Member: "12345678"}, {Score: 7, Member: "0"}},
	"an expiry past 2^53":          {{Score: -2, Member: ""}, {Score: -(1 << 60), Member: "12345678"}, {Score: 7, Member: "0"}},
	"another member ranked before": {{Score: -2, Member: ""}, {Score: -3, Member: "12345678"}, {Score: -4, Member: "x"}, {Score: 7, Member: "0"}},
}

// TestScriptsRefuseForeignSortedSets: every algorithm refuses, for every
// op (Reset too), a sorted set that is not a sliding log's, with or
// without a member "", as a value sluice did not write, and leaves it as
// it was; and every other algorithm still takes a sliding log's set as
// another algorithm's state, which it replaces.
func TestScriptsRefuseForeignSortedSets(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	now := int64(1_700_000_000_000_000)
	base := fmt.Sprintf("foreign-zset:%d", time.Now().UnixNano())
	for alg := range ratelimit.LeakyBucket + 1 {
		cfg := ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}}
		for name, set := range foreignSets {
			for _, req := range ops(cfg) {
				call := redisscript.NewCall("", fmt.Sprintf("%s:%v:%s:%v", base, alg, name, req.Op), cfg, req, now)
				if err := c.ZAdd(ctx, call.Key, set...).Err(); err != nil {
					t.Fatal(err)
				}
				before := c.ZRangeWithScores(ctx, call.Key, 0, -1).Val()
				err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Err()
				if err == nil || !strings.Contains(err.Error(), "sluice did not write") {
					t.Errorf("%v %v on a sorted set with %s: %v; want a foreign-value error", alg, req.Op, name, err)
				}
				if after, ttl := c.ZRangeWithScores(ctx, call.Key, 0, -1).Val(), c.PTTL(ctx, call.Key).Val(); !slices.Equal(after, before) || ttl != -1 {
					t.Errorf("%v %v on a sorted set with %s: it became %v with TTL %v; want it left as %v", alg, req.Op, name, after, ttl, before)
				}
			}
		}
		if alg == ratelimit.SlidingWindowLog {
			continue
		}
		log := ratelimit.Config{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: cfg.Bandwidths}
		for _, req := range ops(cfg) {
			key := fmt.Sprintf("%s:%v:log:%v", base, alg, req.Op)
			call := redisscript.NewCall("", key, log, ratelimit.Request{Tokens: 3}, now)
			if err := logScript.Run(ctx, c, []string{call.Key}, call.Arg).Err(); err != nil {
				t.Fatal(err)
			}
			call = redisscript.NewCall("", key, cfg, req, now)
			reply, err := scripts[call.Script].Run(ctx, c, []string{call.Key}, call.Arg).Text()
			if err != nil {
				t.Errorf("%v %v on a sliding log's set: %v; want it started afresh", alg, req.Op, err)
				continue
			}
			if _, err := call.Decision(reply); err != nil {
				t.Errorf("%v %v on a sliding log's set: %v", alg, req.Op, err)
			}
			if typ := c.Type(ctx, call.Key).Val(); typ == "zset" {
				t.Errorf("%v %v on a sliding log's set left it a sorted set; want it replaced", alg, req.Op)
			}
		}
	}
}
