package ratelimit

import (
	"errors"
	"testing"
)

func TestAlgorithmText(t *testing.T) {
	for a := range numAlgorithms {
		text, err := a.MarshalText()
		if err != nil {
			t.Fatalf("%v.MarshalText: %v", a, err)
		}
		if string(text) != a.String() {
			t.Errorf("%v.MarshalText = %q, want %q", a, text, a.String())
		}
		var got Algorithm
		if err := got.UnmarshalText(text); err != nil || got != a {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, got, err, a)
		}
	}
}

func TestRefillKindText(t *testing.T) {
	for _, k := range []RefillKind{Greedy, Interval, IntervalAligned} {
		text, err := k.MarshalText()
		if err != nil {
			t.Fatalf("%v.MarshalText: %v", k, err)
		}
		if string(text) != k.String() {
			t.Errorf("%v.MarshalText = %q, want %q", k, text, k.String())
		}
		got := RefillKind(99)
		if err := got.UnmarshalText(text); err != nil || got != k {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, got, err, k)
		}
	}
}

func TestTextErrors(t *testing.T) {
	tests := []struct {
		name string
		err  func() error
		want string
	}{
		{"Algorithm.UnmarshalText unknown", func() error { a := GCRA; return a.UnmarshalText([]byte("gcra")) },
			`ratelimit: invalid config: Algorithm "gcra" is not a known Algorithm (TokenBucket, GCRA, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket)`},
		{"Algorithm.UnmarshalText empty", func() error { var a Algorithm; return a.UnmarshalText(nil) },
			`ratelimit: invalid config: Algorithm "" is not a known Algorithm (TokenBucket, GCRA, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket)`},
		{"Algorithm.MarshalText unknown", func() error { _, err := Algorithm(9).MarshalText(); return err },
			`ratelimit: invalid config: Algorithm 9 is not a known Algorithm`},
		{"RefillKind.UnmarshalText unknown", func() error { var k RefillKind; return k.UnmarshalText([]byte("Algorithm(1)")) },
			`ratelimit: invalid config: RefillKind "Algorithm(1)" is not a known RefillKind (Greedy, Interval, IntervalAligned)`},
		{"RefillKind.MarshalText unknown", func() error { _, err := RefillKind(3).MarshalText(); return err },
			`ratelimit: invalid config: RefillKind 3 is not a known RefillKind`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err()
			if err == nil || err.Error() != tt.want {
				t.Fatalf("error = %v, want %s", err, tt.want)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

func TestUnmarshalTextLeavesValueOnError(t *testing.T) {
	a, k := SlidingWindowLog, IntervalAligned
	if a.UnmarshalText([]byte("nope")) == nil || a != SlidingWindowLog {
		t.Errorf("Algorithm changed to %v on error", a)
	}
	if k.UnmarshalText([]byte("nope")) == nil || k != IntervalAligned {
		t.Errorf("RefillKind changed to %v on error", k)
	}
}
