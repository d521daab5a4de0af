package httplimit

import (
	"net/url"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ratelimit"
)

// FuzzBucketKey checks the key layout for any segment values: a valid
// key, no hash-tag braces, exactly the six segments, each reading back as
// the value it came from (or its digest), so no two callers share a key.
func FuzzBucketKey(f *testing.F) {
	f.Add("acme", "pro", "GET /v1/items/{id}", "2001:db8::/64")
	f.Add("", "", "", "")
	f.Add("-", "a:b", "%", "x:{y}")
	f.Add(strings.Repeat("t", 97), "p", "~r", "\x00\x7f ")
	f.Fuzz(func(t *testing.T, tenant, plan, route, id string) {
		key := bucketKey(DefaultKeyPrefix, tenant, plan, route, kindIP, id)
		if err := ratelimit.CheckRequest(key, ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1)}},
			ratelimit.Request{Tokens: 1}); err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		if strings.ContainsAny(key, "{}") {
			t.Fatalf("key %q has a brace", key)
		}
		parts := strings.SplitN(key, ":", 6)
		if len(parts) != 6 || parts[0] != DefaultKeyPrefix || parts[4] != kindIP {
			t.Fatalf("key %q: segments %q", key, parts)
		}
		for i, want := range map[int]string{1: tenant, 2: plan, 3: route, 5: id} {
			got := parts[i]
			if i < 5 && strings.Contains(got, ":") {
				t.Fatalf("segment %d of %q has a colon", i+1, key)
			}
			if got == noValue {
				if want != "" {
					t.Fatalf("segment %q of %q reads as empty", want, key)
				}
				continue
			}
			if strings.HasPrefix(got, "~") {
				if len(want) <= maxSegment/3 {
					t.Fatalf("short segment %q digested in %q", want, key)
				}
				continue
			}
			back, err := url.PathUnescape(got)
			if err != nil || back != want {
				t.Fatalf("segment %q of %q reads back as %q (%v)", want, key, back, err)
			}
		}
	})
}
