package ratelimit

import "testing"

// benchConfig is one greedy bandwidth that admits every timed call: a
// burst larger than testing ever sets b.N to, refilled at one a second.
var benchConfig = Config{Bandwidths: []Bandwidth{PerSecond(1).WithBurst(1e9)}}

// BenchmarkApply measures the reference math alone on a bucket that
// exists: one Consume of one token, allowed, a microsecond after the last.
func BenchmarkApply(b *testing.B) {
	var s State
	req := Request{Op: Consume, Tokens: 1}
	now := int64(1_700_000_000_000_000)
	Apply(&s, benchConfig, req, now)
	b.ReportAllocs()
	for b.Loop() {
		now++
		if d := Apply(&s, benchConfig, req, now); !d.Allowed {
			b.Fatal("denied")
		}
	}
}

// BenchmarkCheckRequest measures the validation every backend runs first.
func BenchmarkCheckRequest(b *testing.B) {
	req := Request{Op: Consume, Tokens: 1}
	b.ReportAllocs()
	for b.Loop() {
		if err := CheckRequest("user:1", benchConfig, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFingerprint measures Config.Fingerprint of one bandwidth.
func BenchmarkFingerprint(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		benchConfig.Fingerprint()
	}
}
