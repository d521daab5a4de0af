package sharding

import (
	"strconv"
	"sync"

	"github.com/sluicehq/sluice/ratelimit"
)

// sep ends a hot key in its sub-buckets' keys: sub-bucket i of a key k
// split n ways is k + sep + "i.n", plus ".t" on a backend with slots,
// where t is the first number that puts the sub-key on its target slots
// (see target). A sub-key's last NUL byte is always the one sep put there.
const sep = "\x00"

// maxSuffix bounds the bytes a sub-key adds to its hot key: sep, i and n
// (at most 2 digits each), t (at most 7) and two dots.
const maxSuffix = 1 + 2 + 1 + 2 + 1 + 7

// maxTries bounds the numbers t tried per sub-key, as a multiple of the
// tries it takes on average to land on the target (NumSlots over the
// target's width): all of them miss with chance below e^-32. If they do,
// t is 0, still the same name in every process.
const maxTries = 32

// maxCachedKeys bounds how many keys matched by a Prefix or Match rule
// keep their sub-keys cached; beyond it, one is dropped for each added.
const maxCachedKeys = 4096

// namer names sub-buckets. Names depend on the hot key, the rule's n and
// the backend's key layout (through Slot) alone, never on the cluster's
// topology: every process names them alike, and a resharding or a
// failover moves them without renaming them, which would reset their
// counts.
type namer struct {
	slots ratelimit.SlotMapper // nil: the backend has no slots

	mu    sync.RWMutex
	cache map[string][]string
}

// names returns the n sub-keys of key, from the cache if cache is set.
func (nm *namer) names(key string, n int, cache bool) []string {
	if !cache {
		return nm.place(key, n)
	}
	nm.mu.RLock()
	names, ok := nm.cache[key]
	nm.mu.RUnlock()
	if ok && len(names) == n {
		return names
	}
	names = nm.place(key, n)
	nm.mu.Lock()
	defer nm.mu.Unlock()
	if nm.cache == nil {
		nm.cache = make(map[string][]string)
	}
	if len(nm.cache) >= maxCachedKeys {
		for k := range nm.cache { // an arbitrary one
			delete(nm.cache, k)
			break
		}
	}
	nm.cache[key] = names
	return names
}

// place names the n sub-keys of key: without slots, key + sep + "i.n";
// with them, each also gets the first ".t" that puts it on its target.
func (nm *namer) place(key string, n int) []string {
	names := make([]string, n)
	for i := range names {
		base := key + sep + strconv.Itoa(i) + "." + strconv.Itoa(n)
		names[i] = base
		if nm.slots == nil {
			continue
		}
		lo, hi := target(n, i)
		names[i] = base + ".0"
		for t := range maxTries * ratelimit.NumSlots / (hi - lo) {
			name := base + "." + strconv.Itoa(t)
			if s, _ := nm.slots.Slot(name); lo <= s && s < hi {
				names[i] = name
				break
			}
		}
	}
	return names
}

// target is the slots sub-bucket i of n aims for, lo to hi-1: a window
// of NumSlots/(n·(n−1)) slots (at least one) at the centre of the i-th of
// n equal parts of the slot space. On a cluster of m ≤ n masters that
// split the slots evenly, in m ranges (as redis-cli --cluster create
// does), each range then holds at least one window whole, so every master
// gets a sub-bucket: the centres are at most a part apart, no further
// than a range is long, and the windows are narrow enough that rounding
// cannot carry the only one inside a range over its edge.
// TestTargetCoversEvenSplits checks every m ≤ n ≤ MaxSubBuckets. A
// window of width w takes NumSlots/w tries to hit on average: n·(n−1),
// 30 per sub-key for n = 6.
func target(n, i int) (lo, hi int) {
	centre := (2*i + 1) * ratelimit.NumSlots / (2 * n)
	width := max(1, ratelimit.NumSlots/(n*(n-1)))
	lo = centre - width/2
	return lo, lo + width
}
