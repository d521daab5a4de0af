package sharding

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/ratelimit"
)

// Rule chooses hot keys and how to split them. Make one with [Keys],
// [Prefix] or [Match]; [Rule.WithRetries] and [Rule.WithAffinity] refine
// it. The zero Rule matches nothing and is rejected by [New].
type Rule struct {
	keys     []string
	prefix   string
	match    func(key string) bool
	n        int
	retries  int
	affinity func(ctx context.Context, key string) uint64
}

// Keys returns a rule that splits each of keys into n sub-buckets.
func Keys(n int, keys ...string) Rule {
	return Rule{keys: keys, n: n, retries: DefaultRetries}
}

// Prefix returns a rule that splits every key starting with prefix into n
// sub-buckets.
func Prefix(n int, prefix string) Rule {
	return Rule{prefix: prefix, n: n, retries: DefaultRetries}
}

// Match returns a rule that splits every key for which match returns true
// into n sub-buckets. match is called on every decision of a key no
// [Keys] or [Prefix] rule took, so it must be fast, safe for concurrent
// use, and the same for a key in every process.
func Match(n int, match func(key string) bool) Rule {
	return Rule{match: match, n: n, retries: DefaultRetries}
}

// WithRetries returns r trying up to k other sub-buckets after the first
// one rejects a request, before the request is rejected (default
// [DefaultRetries]); k must be between 0 and n-1. More retries mean fewer
// false rejections (a request denied while another sub-bucket had the
// tokens) and, for a key short of tokens, more round trips: a rejected
// request costs k+1. docs/sharding.md gives the rates.
func (r Rule) WithRetries(k int) Rule {
	r.retries = k
	return r
}

// WithAffinity returns r choosing the first sub-bucket of a request by
// affinity's hash of it, modulo the sub-buckets, instead of at random: a
// process that hashes its own ID keeps to one sub-bucket, say, and a
// hash of the client spreads clients. The retries go on to the next
// sub-buckets in turn. affinity must be safe for concurrent use.
func (r Rule) WithAffinity(affinity func(ctx context.Context, key string) uint64) Rule {
	r.affinity = affinity
	return r
}

// check returns what is wrong with rule i, or nil.
func (r *Rule) check(i int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: sharding: rule %d: "+format, append([]any{ratelimit.ErrInvalidConfig, i}, args...)...)
	}
	kinds := 0
	for _, set := range []bool{r.keys != nil, r.prefix != "", r.match != nil} {
		if set {
			kinds++
		}
	}
	switch {
	case kinds == 0:
		return bad("it matches no key: make it with Keys (with at least one key), Prefix (with a non-empty prefix) or Match (with a non-nil func)")
	case kinds > 1:
		return bad("it has more than one of keys, prefix and match")
	case r.n < 2 || r.n > MaxSubBuckets:
		return bad("n must be between 2 and %d sub-buckets, got %d", MaxSubBuckets, r.n)
	case r.retries < 0 || r.retries >= r.n:
		return bad("WithRetries must be between 0 and n-1 (%d), got %d", r.n-1, r.retries)
	case r.keys != nil && len(r.keys) == 0:
		return bad("Keys has no key")
	}
	for j, k := range r.keys {
		if err := checkKey(k); err != nil {
			return bad("key %d: %w", j, err)
		}
	}
	if len(r.prefix) > ratelimit.MaxKeyLen {
		return bad("Prefix is %d bytes; a key may have at most %d", len(r.prefix), ratelimit.MaxKeyLen)
	}
	return nil
}

// checkKey returns what keeps key from being split, or nil: what keeps it
// from being a bucket's key. Every key of 1 to MaxKeyLen bytes can be
// split (see head).
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: sharding: the key is empty", ratelimit.ErrInvalidKey)
	case len(key) > ratelimit.MaxKeyLen:
		return fmt.Errorf("%w: sharding: key of %d bytes is longer than a key may be, %d", ratelimit.ErrInvalidKey, len(key), ratelimit.MaxKeyLen)
	}
	return nil
}

// matches reports whether a Prefix or Match rule takes key.
func (r *Rule) matches(key string) bool {
	if r.prefix != "" {
		return strings.HasPrefix(key, r.prefix)
	}
	return r.match(key)
}
