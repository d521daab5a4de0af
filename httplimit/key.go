package httplimit

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// DefaultKeyPrefix is the first segment of every bucket key unless
// [WithKeyPrefix] says otherwise.
const DefaultKeyPrefix = "rl"

// The kinds of caller identity, the fifth segment of a key: the auth
// layer's validated API key ID, its authenticated principal, or the client
// address. Only the middleware writes them, so a value cannot pose as
// another kind.
const (
	kindAPIKey    = "key"
	kindPrincipal = "user"
	kindIP        = "ip"
)

// noValue stands for an empty segment (a caller with no tenant, a request
// that matched no route), so that no segment is ever empty.
const noValue = "-"

// maxSegment is the longest segment kept as it is, after escaping; a longer
// one is replaced by its digest. With [maxPrefixLen] it keeps every key
// within ratelimit.MaxKeyLen (512 bytes): 64 + 4×(1+97) + 1+4 = 461.
const maxSegment = 96

// maxPrefixLen is the longest [WithKeyPrefix].
const maxPrefixLen = 64

// bucketKey builds rl:{tenant}:{plan}:{route}:{kind}:{id}. Each of tenant,
// plan and route is escaped so that it cannot add a segment or a Redis
// Cluster hash tag; id is the last segment and keeps its colons (an IPv6
// prefix reads as itself), but not braces or control bytes.
func bucketKey(prefix, tenant, plan, route, kind, id string) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(tenant) + len(plan) + len(route) + len(kind) + len(id) + 8)
	b.WriteString(prefix)
	for _, s := range [...]string{tenant, plan, route} {
		b.WriteByte(':')
		writeSegment(&b, s, false)
	}
	b.WriteByte(':')
	b.WriteString(kind)
	b.WriteByte(':')
	writeSegment(&b, id, true)
	return b.String()
}

// writeSegment writes s escaped: "-" for "", and a digest for a segment
// too long to keep.
func writeSegment(b *strings.Builder, s string, last bool) {
	n := escapedLen(s, last)
	switch {
	case s == "":
		b.WriteString(noValue)
	case n > maxSegment:
		sum := sha256.Sum256([]byte(s))
		b.WriteByte('~')
		b.WriteString(hex.EncodeToString(sum[:16]))
	case s == noValue:
		b.WriteString("%2D") // the literal "-" is not the empty marker
	case n == len(s):
		b.WriteString(s) // nothing to escape
	default:
		for i := 0; i < len(s); i++ {
			c := s[i]
			if mustEscape(c, last) {
				const hexDigits = "0123456789ABCDEF"
				b.WriteByte('%')
				b.WriteByte(hexDigits[c>>4])
				b.WriteByte(hexDigits[c&15])
				continue
			}
			b.WriteByte(c)
		}
	}
}

func escapedLen(s string, last bool) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if mustEscape(s[i], last) {
			n += 2
		}
	}
	return n
}

// mustEscape reports the bytes that would break the key's layout: the
// separator (except in the last segment), the escape and digest markers,
// Redis Cluster hash-tag braces, and spaces and control bytes, which make a
// key hard to read and to type in redis-cli.
func mustEscape(c byte, last bool) bool {
	switch c {
	case ':':
		return !last
	case '%', '~', '{', '}':
		return true
	}
	return c <= ' ' || c == 0x7f
}
