package sharding

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
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

// TestNamesOnTarget: on a backend with slots, every sub-key lies on the
// centre of its target window, has the form key NUL i.n.t with t six
// octal digits, and the names are the same on every call and in every
// Backend, and differ with n. Keys with the bytes the Redis key escapes
// ('{', '}', '%') land on their targets too.
func TestNamesOnTarget(t *testing.T) {
	mem := newMemory(t, newClock())
	rules := make([]Rule, len(namingNs))
	for j, n := range namingNs {
		rules[j] = Keys(n, "hot"+strconv.Itoa(n), "{other}%"+strconv.Itoa(n))
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
			if tag, ok := strings.CutPrefix(name, prefix); !ok || !isTag(tag) {
				t.Errorf("%q: sub-key %d is %q; want %q and six octal digits", key, i, name, prefix)
			}
			lo, hi := target(n, i)
			if s := (slotted{}).slot(name); s != lo+(hi-lo)/2 {
				t.Errorf("%q: sub-key %d (%q) is on slot %d; its target is the centre of [%d, %d)", key, i, name, s, lo, hi)
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
		check("{other}%"+strconv.Itoa(n), n)
	}
	check("tenant:42", 6)
	check("tenant:43", 6)
}

// isTag reports whether s is a tag: tagLen octal digits.
func isTag(s string) bool {
	return len(s) == tagLen && strings.Trim(s, "01234567") == ""
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

// TestTagForEverySlot: for every slot x, appendTag appends a tag whose
// CRC16 is on slot x.
func TestTagForEverySlot(t *testing.T) {
	for x := range ratelimit.NumSlots {
		if tag := string(appendTag([]byte("p"), x)[1:]); !isTag(tag) || crcSlot(tag) != x {
			t.Fatalf("appendTag(%d) = %q, on slot %d; want six octal digits on slot %d", x, tag, crcSlot(tag), x)
		}
	}
}

// TestNamesFitMaxKeyLen: a sub-key adds at most maxSuffix bytes to a key
// it keeps whole; a longer key's sub-keys, with the longest suffix, have
// MaxKeyLen bytes at most; and every tag the search tries has tagLen
// digits.
func TestNamesFitMaxKeyLen(t *testing.T) {
	longestSuffix := len("63.64.") + tagLen
	if got := len(sep) + longestSuffix; got != maxSuffix || maxWholeLen+maxSuffix != ratelimit.MaxKeyLen {
		t.Errorf("a sub-key adds up to %d bytes; maxSuffix is %d, maxWholeLen %d", got, maxSuffix, maxWholeLen)
	}
	if got := cutLen + len(sep) + digestLen + len(".") + longestSuffix; got != ratelimit.MaxKeyLen {
		t.Errorf("a longer key's longest sub-key has %d bytes; want MaxKeyLen, %d", got, ratelimit.MaxKeyLen)
	}
	if maxWholeLen != 499 || cutLen != 458 || digestLen != 40 {
		t.Errorf("the package doc and docs/sharding.md say a key is kept whole up to 499 bytes, and a longer one cut to 458 and a 40-digit digest: %d, %d, %d", maxWholeLen, cutLen, digestLen)
	}
	var mostTries int
	for n := 2; n <= MaxSubBuckets; n++ {
		lo, hi := target(n, 0)
		mostTries = max(mostTries, maxTries*ratelimit.NumSlots/(hi-lo))
	}
	if mostTries > 1<<(3*tagLen) {
		t.Errorf("the search tries up to %d tags; %d octal digits make %d", mostTries, tagLen, 1<<(3*tagLen))
	}
}

// longKey returns a key of l bytes that starts with prefix and ends with
// last, the bytes between them x.
func longKey(prefix string, l int, last byte) string {
	return prefix + strings.Repeat("x", l-len(prefix)-1) + string(last)
}

// TestLongKeys: every key of up to MaxKeyLen bytes that a rule matches is
// split, with or without slots: its sub-keys have MaxKeyLen bytes at
// most, lie on their targets, and are rejected as keys of their own; a
// key too long to keep whole is named by its first cutLen bytes and a
// digest of it all, so two keys that differ only past those bytes have
// sub-keys of their own and limits of their own.
func TestLongKeys(t *testing.T) {
	cfg := config(ratelimit.PerHour(640))
	for _, slots := range []bool{false, true} {
		for _, n := range []int{2, 6, MaxSubBuckets} {
			var next ratelimit.Backend = newMemory(t, newClock())
			if slots {
				next = slotted{next}
			}
			seen := map[string]string{} // sub-key -> whose
			check := func(b *Backend, key string) {
				t.Helper()
				what := fmt.Sprintf("slots %v, n = %d, a key of %d bytes ending in %q", slots, n, len(key), key[len(key)-1:])
				d, err := b.Do(context.Background(), key, cfg, consume(1))
				if err != nil || !d.Allowed {
					t.Fatalf("%s: Consume: %+v, %v; want allowed", what, d, err)
				}
				if d := do(t, b, key, cfg, inspect()); d.Remaining != 639 {
					t.Errorf("%s: %d left after one Consume; want 639", what, d.Remaining)
				}
				for i, name := range subKeys(t, b, key) {
					h := key + sep
					if len(key) > maxWholeLen {
						h = key[:cutLen] + sep
						if digest, _, _ := strings.Cut(name[len(h):], "."); len(digest) != digestLen || strings.Trim(digest, "0123456789") != "" {
							t.Errorf("%s: sub-key %d is %q; want its first %d bytes, NUL, a digest of %d digits and a dot", what, i, name[cutLen:], cutLen, digestLen)
						}
						h += name[len(h) : len(h)+digestLen+1]
					}
					suffix, ok := strings.CutPrefix(name, h+strconv.Itoa(i)+"."+strconv.Itoa(n))
					if !ok || slots && (!strings.HasPrefix(suffix, ".") || !isTag(suffix[1:])) || !slots && suffix != "" {
						t.Errorf("%s: sub-key %d ends %q", what, i, name[min(len(name), cutLen):])
					}
					if len(name) > ratelimit.MaxKeyLen {
						t.Errorf("%s: sub-key %d has %d bytes", what, i, len(name))
					}
					if lo, hi := target(n, i); slots && (slotted{}).slot(name) != lo+(hi-lo)/2 {
						t.Errorf("%s: sub-key %d is on slot %d; its target is the centre of [%d, %d)", what, i, (slotted{}).slot(name), lo, hi)
					}
					if _, err := b.Do(context.Background(), name, cfg, inspect()); !isInvalidKey(err) {
						t.Errorf("%s: Inspect of sub-key %d: %v; want ErrInvalidKey", what, i, err)
					}
					if whose, ok := seen[name]; ok {
						t.Errorf("%s: sub-key %d is %s's too", what, i, whose)
					}
					seen[name] = what
				}
			}
			b := mustNew(t, next, Prefix(n, "p:"), Match(n, func(k string) bool { return strings.HasPrefix(k, "m") }))
			for l := maxWholeLen - 1; l <= ratelimit.MaxKeyLen; l++ {
				check(b, longKey("p:", l, 'a'))
				check(b, longKey("p:", l, 'b'))
				check(b, longKey("m", l, 'a'))
			}
			longest := longKey("k", ratelimit.MaxKeyLen, 'a')
			check(mustNew(t, next, Keys(n, longest)), longest)
		}
	}
}

// TestLongSubKeysReserved: where a rule may split a key too long to keep
// whole, a key of its sub-keys' form (cutLen bytes, NUL, 40 digits, a dot,
// digits and dots) is an ErrInvalidKey that reaches no bucket, whatever
// its first bytes, for no rule can tell which keys start with them; keys
// not quite of the form pass, and with no such rule, all of them do.
func TestLongSubKeysReserved(t *testing.T) {
	cfg := config(ratelimit.PerHour(10))
	digits := strings.Repeat("7", digestLen)
	head := strings.Repeat("c", cutLen)
	reserved := []string{head + sep + digits + ".0.2", head + sep + digits + ".1.6.012345", head + sep + digits + "."}
	others := []string{
		head + "c" + sep + digits + ".0.2", // NUL a byte later
		head[1:] + sep + digits + ".0.2",   // a byte earlier
		head + sep + digits[1:] + ".0.2",   // 39 digits
		head + sep + digits + "7.0.2",      // 41
		head + sep + digits + ".0.2x",      // not digits and dots
		head + sep + digits + sep + "0.2",  // the last NUL later
	}
	for _, tt := range []struct {
		rules []Option
		cuts  bool
	}{
		{[]Option{Keys(2, "hot")}, false},
		{[]Option{Keys(2, "hot", longKey("k", maxWholeLen+1, 'a'))}, true},
		{[]Option{Keys(2, "hot"), Prefix(2, "p:")}, true},
		{[]Option{Match(2, func(k string) bool { return k == "m" })}, true},
	} {
		rec := newRecorder(newMemory(t, newClock()))
		b := mustNew(t, slotted{rec}, tt.rules...)
		for _, key := range append(reserved, others...) {
			want := tt.cuts && slices.Contains(reserved, key)
			rec.calls()
			_, err := b.Do(context.Background(), key, cfg, consume(1))
			calls := rec.calls()
			switch {
			case want && (!isInvalidKey(err) || !strings.Contains(err.Error(), "names a sub-bucket of a hot key") || len(calls) != 0):
				t.Errorf("%d rules, cuts %v: Consume on %q: %v, calls %q; want ErrInvalidKey and no call", len(tt.rules), tt.cuts, key[cutLen-2:], err, calls)
			case !want && (err != nil || len(calls) != 1 || calls[0] != key):
				t.Errorf("%d rules, cuts %v: Consume on %q: %v, calls %q; want it passed through", len(tt.rules), tt.cuts, key[cutLen-2:], err, calls)
			}
		}
	}
}

// TestNamesSearch: over a SlotMapper that does not hash keys as Redis
// Cluster does, every sub-key still lies in its target window, found by
// the search, with the same form and the same names in every Backend;
// over one that cannot tell a sub-key's slot, they still have the form,
// the same in every Backend, and naming them searches nothing.
func TestNamesSearch(t *testing.T) {
	mem := newMemory(t, newClock())
	for _, n := range []int{2, 3, 6, 16} {
		b1, b2 := mustNew(t, fnvSlots{mem}, Keys(n, "hot")), mustNew(t, fnvSlots{mem}, Keys(n, "hot"))
		names := subKeys(t, b1, "hot")
		for i, name := range names {
			tag, ok := strings.CutPrefix(name, fmt.Sprintf("hot\x00%d.%d.", i, n))
			s, _ := fnvSlots{}.Slot(name)
			if lo, hi := target(n, i); !ok || !isTag(tag) || s < lo || s >= hi {
				t.Errorf("n = %d: sub-key %d is %q, on slot %d; want hot NUL %d.%d. and a tag, in [%d, %d)", n, i, name, s, i, n, lo, hi)
			}
		}
		if again := subKeys(t, b2, "hot"); !equal(again, names) {
			t.Errorf("n = %d: a second Backend names the sub-buckets %q; the first %q", n, again, names)
		}
		blind := &blindSlots{Backend: mem}
		names = subKeys(t, mustNew(t, blind, Keys(n, "hot")), "hot")
		for i, name := range names {
			if tag, ok := strings.CutPrefix(name, fmt.Sprintf("hot\x00%d.%d.", i, n)); !ok || !isTag(tag) {
				t.Errorf("n = %d: a SlotMapper blind to sub-keys names sub-key %d %q", n, i, name)
			}
		}
		if again := subKeys(t, mustNew(t, &blindSlots{Backend: mem}, Keys(n, "hot")), "hot"); !equal(again, names) {
			t.Errorf("n = %d, blind: a second Backend names the sub-buckets %q; the first %q", n, again, names)
		}
		// New asks once; naming twice for each length of suffix, one or
		// two; Slots of each name: no search.
		if calls := blind.calls.Load(); calls > int64(1+4+n) {
			t.Errorf("n = %d, blind: %d Slot calls; want at most %d", n, calls, 1+4+n)
		}
	}
}

// fnvSlots is a SlotMapper that hashes keys with 32-bit FNV-1a.
type fnvSlots struct{ ratelimit.Backend }

func (fnvSlots) Slot(key string) (int, bool) {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % ratelimit.NumSlots), true
}

// blindSlots is a SlotMapper that hashes as slotted does but cannot tell
// the slot of a key with a NUL byte, as if a rule of a sharding Backend
// below split those.
type blindSlots struct {
	ratelimit.Backend
	calls atomic.Int64
}

func (b *blindSlots) Slot(key string) (int, bool) {
	b.calls.Add(1)
	if strings.IndexByte(key, 0) >= 0 {
		return 0, false
	}
	return (slotted{}).slot(key), true
}

// FuzzNames: for any key of 1 to MaxKeyLen bytes that is not itself of a
// sub-key's form, and any n, a rule that matches every key splits it into
// n sub-keys that are distinct, at most MaxKeyLen bytes long, each on the
// centre of its target, each rejected as a key of its own, and the same
// in a second Backend.
func FuzzNames(f *testing.F) {
	for _, key := range []string{"k", "global", "{x}%", "a\x00b", strings.Repeat("p", maxWholeLen), longKey("q", ratelimit.MaxKeyLen, '{')} {
		f.Add(key, uint8(6))
	}
	f.Add("tenant:42", uint8(MaxSubBuckets))
	f.Fuzz(func(t *testing.T, key string, nn uint8) {
		n := 2 + int(nn)%(MaxSubBuckets-1)
		all := Match(n, func(string) bool { return true })
		b1, b2 := mustNew(t, slotted{}, all), mustNew(t, slotted{}, all)
		if key == "" || len(key) > ratelimit.MaxKeyLen || b1.isSubKey(key) {
			if _, err := b1.Slots(context.Background(), key); !isInvalidKey(err) {
				t.Fatalf("Slots of %q: %v; want ErrInvalidKey", key, err)
			}
			return
		}
		names := subKeys(t, b1, key)
		if len(names) != n {
			t.Fatalf("%q: %d sub-keys; want %d", key, len(names), n)
		}
		seen := map[string]bool{key: true}
		for i, name := range names {
			if lo, hi := target(n, i); len(name) > ratelimit.MaxKeyLen || seen[name] || (slotted{}).slot(name) != lo+(hi-lo)/2 || !b1.isSubKey(name) {
				t.Fatalf("%q split %d ways: sub-key %d is %q (%d bytes, slot %d; its target [%d, %d), seen %v, a sub-key's form %v)",
					key, n, i, name, len(name), (slotted{}).slot(name), lo, hi, seen[name], b1.isSubKey(name))
			}
			seen[name] = true
		}
		if again := subKeys(t, b2, key); !equal(again, names) {
			t.Fatalf("%q: a second Backend names the sub-buckets %q; the first %q", key, again, names)
		}
	})
}
