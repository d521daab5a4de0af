package sharding

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestTargetCoversEvenSplits: on a cluster of m ≤ n masters that split the
// slots evenly in m contiguous ranges, every range holds at least one
// sub-bucket's target window whole, so every master serves a sub-bucket.
// The ranges start at round(j·16384/m), as redis-cli --cluster create
// makes them, or at floor(j·16384/m).
func TestTargetCoversEvenSplits(t *testing.T) {
	splits := map[string]func(j, m int) int{
		"round": func(j, m int) int { return int(math.Round(float64(j) * ratelimit.NumSlots / float64(m))) },
		"floor": func(j, m int) int { return j * ratelimit.NumSlots / m },
	}
	for name, first := range splits {
		for n := 2; n <= MaxSubBuckets; n++ {
			for i := range n {
				if lo, hi := target(n, i); lo < 0 || hi > ratelimit.NumSlots || lo >= hi {
					t.Fatalf("target(%d, %d) = [%d, %d): not a window of slots", n, i, lo, hi)
				}
			}
			for m := 1; m <= n; m++ {
				for j := range m {
					lo, hi := first(j, m), first(j+1, m)
					if !holdsTarget(n, lo, hi) {
						t.Errorf("%s: %d masters, n = %d: master %d's slots [%d, %d) hold no target window whole", name, m, n, j, lo, hi)
					}
				}
			}
		}
	}
}

// holdsTarget reports whether the slots lo to hi-1 hold some sub-bucket's
// target window of n whole.
func holdsTarget(n, lo, hi int) bool {
	for i := range n {
		if l, h := target(n, i); lo <= l && h <= hi {
			return true
		}
	}
	return false
}

// namingNs are the n the naming tests try: small ones, powers of two and
// their neighbours, and the most.
var namingNs = []int{2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 32, 33, MaxSubBuckets}

// TestNamesOnTarget: on a backend with slots, every sub-key lies in its
// target window, has the form key NUL i.n.t, and the names are the same
// on every call and in every Backend, and differ with n.
func TestNamesOnTarget(t *testing.T) {
	mem := newMemory(t, newClock())
	rules := make([]Rule, len(namingNs))
	for j, n := range namingNs {
		rules[j] = Keys(n, "hot"+strconv.Itoa(n))
		if n <= 16 { // naming costs about 64n² Slot calls a key
			rules[j] = Keys(n, "hot"+strconv.Itoa(n), "other"+strconv.Itoa(n))
		}
	}
	rules = append(rules, Prefix(6, "tenant:"))
	b1, b2 := mustNew(t, slotted{mem}, options(rules)...), mustNew(t, slotted{mem}, options(rules)...)
	seen := map[string]string{} // sub-key -> whose
	check := func(key string, n int) {
		t.Helper()
		names := subKeys(t, b1, key)
		if len(names) != n {
			t.Fatalf("%q: %d sub-keys; want %d", key, len(names), n)
		}
		for i, name := range names {
			prefix := fmt.Sprintf("%s\x00%d.%d.", key, i, n)
			if !strings.HasPrefix(name, prefix) || !isSuffix(name[len(key)+1:]) {
				t.Errorf("%q: sub-key %d is %q; want %q and a number", key, i, name, prefix)
			}
			lo, hi := target(n, i)
			if s := (slotted{}).slot(name); s < lo || s >= hi {
				t.Errorf("%q: sub-key %d (%q) is on slot %d; its target is [%d, %d)", key, i, name, s, lo, hi)
			}
			if whose, ok := seen[name]; ok {
				t.Errorf("%q: sub-key %d (%q) is %s's too", key, i, name, whose)
			}
			seen[name] = fmt.Sprintf("%q's %d", key, i)
		}
		for range 2 {
			if again := subKeys(t, b2, key); !equal(again, names) {
				t.Fatalf("%q: a second Backend names the sub-buckets %q; the first %q", key, again, names)
			}
			if again := subKeys(t, b1, key); !equal(again, names) {
				t.Fatalf("%q: named %q, then %q", key, names, again)
			}
		}
	}
	for _, n := range namingNs {
		check("hot"+strconv.Itoa(n), n)
		if n <= 16 {
			check("other"+strconv.Itoa(n), n)
		}
	}
	check("tenant:42", 6)
	check("tenant:43", 6)
}

func (slotted) slot(key string) int {
	s, _ := slotted{}.Slot(key)
	return s
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestNamesDifferWithN: the same key split n ways and m ways has no
// sub-key in common, with slots or without.
func TestNamesDifferWithN(t *testing.T) {
	mem := newMemory(t, newClock())
	for _, next := range []ratelimit.Backend{mem, slotted{mem}} {
		seen := map[string]int{}
		for _, n := range namingNs {
			for _, name := range subKeys(t, mustNew(t, next, Keys(n, "hot")), "hot") {
				if m, ok := seen[name]; ok {
					t.Errorf("%T: %q is a sub-key split %d ways and %d ways", next, name, m, n)
				}
				seen[name] = n
			}
		}
	}
}

// TestNamesWithoutSlots: without a SlotMapper (or with one that cannot
// tell, as failpolicy over memory), sub-key i of n is key NUL "i.n".
func TestNamesWithoutSlots(t *testing.T) {
	mem := newMemory(t, newClock())
	for _, next := range []ratelimit.Backend{mem, noSlots{mem}} {
		for _, n := range namingNs {
			b := mustNew(t, next, Keys(n, "hot"), Prefix(n, "p:"))
			for _, key := range []string{"hot", "p:1"} {
				for i, name := range subKeys(t, b, key) {
					if want := key + "\x00" + strconv.Itoa(i) + "." + strconv.Itoa(n); name != want {
						t.Errorf("%T, n = %d: sub-key %d of %q is %q; want %q", next, n, i, key, name, want)
					}
				}
			}
		}
	}
}

// noSlots is a SlotMapper that cannot tell, as a decorator over a backend
// without slots is.
type noSlots struct{ ratelimit.Backend }

func (noSlots) Slot(string) (int, bool) { return 0, false }

// TestNamesFitMaxKeyLen: a hot key of maxHotKeyLen bytes has sub-keys of
// at most MaxKeyLen bytes for every n, and one byte more cannot be split:
// a Keys rule with it is refused, and a key a Prefix rule matches gets an
// error wrapping ErrInvalidKey.
func TestNamesFitMaxKeyLen(t *testing.T) {
	// The longest suffix: sep, i and n of two digits, the largest t tried.
	longest := len(sep) + len("63.64.") + len(strconv.Itoa(maxTries*ratelimit.NumSlots-1))
	if longest > maxSuffix {
		t.Fatalf("a sub-key may add %d bytes to its hot key; maxSuffix is %d", longest, maxSuffix)
	}
	mem := newMemory(t, newClock())
	long := strings.Repeat("k", maxHotKeyLen)
	cfg := config(ratelimit.PerHour(6400))
	for _, n := range []int{2, 10, MaxSubBuckets} {
		// Slots of the suffix alone land where a key's would, as far as
		// the tries go, but cost far less for a long key.
		b := mustNew(t, suffixSlots{mem}, Keys(n, long), Prefix(n, "p"))
		for _, key := range []string{long, "p" + long[1:]} {
			for i, name := range subKeys(t, b, key) {
				if len(name) > ratelimit.MaxKeyLen {
					t.Errorf("n = %d: sub-key %d of a key of %d bytes has %d bytes", n, i, len(key), len(name))
				}
			}
			if d := do(t, b, key, cfg, consume(1)); !d.Allowed {
				t.Errorf("n = %d: Consume on a key of %d bytes: %+v", n, len(key), d)
			}
		}
		longer := "p" + long
		if _, err := New(mem, Keys(n, longer)); err == nil || !strings.Contains(err.Error(), "too long to split") {
			t.Errorf("n = %d: Keys with a key of %d bytes: %v; want it too long to split", n, len(longer), err)
		}
		_, err := b.Do(context.Background(), longer, cfg, consume(1))
		if !isInvalidKey(err) || !strings.Contains(err.Error(), fmt.Sprintf("at most %d", maxHotKeyLen)) {
			t.Errorf("n = %d: Consume on a hot key of %d bytes: %v; want ErrInvalidKey naming the most, %d", n, len(longer), err, maxHotKeyLen)
		}
		if _, err := b.Slots(context.Background(), longer); !isInvalidKey(err) {
			t.Errorf("n = %d: Slots of a hot key of %d bytes: %v; want ErrInvalidKey", n, len(longer), err)
		}
	}
}

// suffixSlots is a SlotMapper that hashes only the part of a key after its
// last NUL, as if it were the whole key.
type suffixSlots struct{ ratelimit.Backend }

func (suffixSlots) Slot(key string) (int, bool) {
	return (slotted{}).slot(key[strings.LastIndexByte(key, 0)+1:]), true
}
