package otel

import (
	"math/rand/v2"
	"testing"
)

// The sketch's estimate is within 3 standard errors (10%) of the count
// of distinct hashes, for counts from 1 to a million, and within a key or
// two of a few dozen. The hashes are from a seeded generator, so the
// estimates are the same on every run.
func TestSketchEstimate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 5, 10, 30, 100, 1_000, 10_000, 100_000, 1_000_000} {
		s := newSketchForTest()
		for range n {
			h := rng.Uint64()
			s.add(h, 7)
			s.add(h, 7) // a key rejected twice is one key
		}
		got := s.estimate(7)
		slack := max(2, n/10)
		if d := int(got) - n; d < -slack || d > slack {
			t.Errorf("%d distinct: estimate %d", n, got)
		}
		if s.estimate(6) != 0 || s.estimate(8) != 0 {
			t.Errorf("%d distinct: other minutes estimate %d and %d; want 0", n, s.estimate(6), s.estimate(8))
		}
	}
}

// A minute's sketch starts empty, and the last minute's stays readable
// until the one after the next begins.
func TestSketchMinutes(t *testing.T) {
	s := newSketchForTest()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		s.add(rng.Uint64(), 100)
	}
	for range 5 {
		s.add(rng.Uint64(), 101)
	}
	if a, b := s.estimate(100), s.estimate(101); a < 48 || a > 52 || b != 5 {
		t.Fatalf("estimates %d and %d; want about 50 and 5", a, b)
	}
	s.add(rng.Uint64(), 102) // turns minute 100's slot over
	if a, b, c := s.estimate(100), s.estimate(101), s.estimate(102); a != 0 || b != 5 || c != 1 {
		t.Fatalf("after minute 102 began: %d, %d, %d; want 0, 5, 1", a, b, c)
	}
}

func newSketchForTest() *keySketch {
	r := &rejectedKeys{sketches: newBoundedMap[pairKey, *keySketch](maxKeySketches)}
	return r.sketch(pairKey{"c", "r"})
}

// Past maxKeySketches pairs, new pairs are not counted, and nothing grows.
func TestSketchesBounded(t *testing.T) {
	r := &rejectedKeys{sketches: newBoundedMap[pairKey, *keySketch](maxKeySketches)}
	for i := range maxKeySketches + 10 {
		s := r.sketch(pairKey{class: "c", route: string(rune('a' + i))})
		if (s == nil) != (i >= maxKeySketches) {
			t.Fatalf("pair %d: sketch %v", i, s)
		}
	}
	if n := len(r.sketches.all()); n != maxKeySketches {
		t.Fatalf("%d sketches; want %d", n, maxKeySketches)
	}
}

// FuzzSketch: any hashes, in any minutes, never panic, and a minute's
// estimate is never negative nor above what was added in it plus slack.
func FuzzSketch(f *testing.F) {
	f.Add(uint64(0), uint64(1<<63), int64(0), uint8(3))
	f.Add(^uint64(0), uint64(0), int64(-1), uint8(200))
	f.Fuzz(func(t *testing.T, h1, h2 uint64, minute int64, n uint8) {
		if minute == -1<<63 {
			return // the "never made" mark
		}
		s := newSketchForTest()
		for i := range uint64(n) {
			s.add(h1+i*h2, minute)
		}
		got := s.estimate(minute)
		if got < 0 || (n > 0 && got == 0) || got > int64(n)+int64(n)/5+2 {
			t.Fatalf("%d added: estimate %d", n, got)
		}
	})
}
