package sharding

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/sluicehq/sluice/ratelimit"
)

// Sub-bucket i of a hot key split n ways has the key head + "i.n", plus
// "." and a tag on a backend with slots (see aimer). The head is the key
// and sep, for a key of at most maxWholeLen bytes; a longer key keeps
// its first cutLen bytes, then sep, a digest of the whole key (digestLen
// digits) and a dot, so that its sub-keys fit in MaxKeyLen too (see head).
// A sub-key's last NUL byte is always the one sep put there.
const sep = "\x00"

const (
	// maxSuffix is the most bytes a sub-key adds to a hot key it keeps
	// whole: sep, i and n (at most 2 digits each), two dots and a tag.
	maxSuffix = len(sep) + len("63.64.") + tagLen
	// maxWholeLen is the longest hot key its sub-keys keep whole.
	maxWholeLen = ratelimit.MaxKeyLen - maxSuffix
	// digestLen is the length of a longer key's digest in its sub-keys:
	// 128 bits of its SHA-256, as two numbers of 20 digits.
	digestLen = 40
	// cutLen is how much of a longer key its sub-keys keep: with sep, the
	// digest, a dot and the longest suffix after the head, they are
	// MaxKeyLen bytes at most.
	cutLen = maxWholeLen - digestLen - 1
)

// maxTries bounds the tags the search tries per sub-key, as a multiple of
// the tries it takes on average to land on the target (NumSlots over the
// target's width): all of them miss with chance below e^-32. If they do,
// the name is the lookup's, still the same in every process.
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

// place names the n sub-keys of key: without slots, head + "i.n"; with
// them, each also gets a dot and the tag that puts it on its target. The
// names are written one after another into one string, which they share.
func (nm *namer) place(key string, n int) []string {
	h := head(key)
	a := aimer{slots: nm.slots, head: h}
	var all strings.Builder
	all.Grow(n * (len(h) + maxSuffix))
	ends := make([]int, n)
	var buf [maxSuffix]byte
	for i := range ends {
		suffix := strconv.AppendInt(buf[:0], int64(i), 10)
		suffix = strconv.AppendInt(append(suffix, '.'), int64(n), 10)
		if nm.slots != nil {
			suffix = a.tag(append(suffix, '.'), n, i)
		}
		all.WriteString(h)
		all.Write(suffix)
		ends[i] = all.Len()
	}
	s, start := all.String(), 0
	names := make([]string, n)
	for i, end := range ends {
		names[i], start = s[start:end], end
	}
	return names
}

// head returns what the sub-keys of key start with: key and sep, if the
// longest sub-key then fits in MaxKeyLen; else the first cutLen bytes of
// key, sep, the first 128 bits of key's SHA-256 as two 20-digit numbers,
// and a dot. Two keys that share a head share their first cutLen bytes
// and 128 bits of SHA-256: a collision no one can find. No head of a
// longer key is a shorter key's (its sub-keys' suffixes start with 40
// digits and a dot, a shorter key's with i, at most 2), and Do rejects
// every key of a longer key's sub-key's form (see isSubKey).
func head(key string) string {
	if len(key) <= maxWholeLen {
		return key + sep
	}
	sum := sha256.Sum256([]byte(key))
	return fmt.Sprintf("%s%s%020d%020d.", key[:cutLen], sep, binary.BigEndian.Uint64(sum[:8]), binary.BigEndian.Uint64(sum[8:16]))
}

// aimer names the sub-keys of one head on a backend with slots: sub-key i
// of n is head + "i.n." + a tag, on the slot at the centre of target(n, i).
//
// Redis Cluster hashes the bytes of a key's hash tag, which for the
// Redis backends is the key, escaped where it holds a brace or '%' (see
// redisscript.Key); a suffix of digits and dots is hashed as it is. CRC16
// is linear, so for two suffixes u and v of one length, the slots of
// head+u and head+v differ by crcSlot(u) ^ crcSlot(v). One Slot call for
// a name with a suffix of each length (one or two lengths per key) thus
// tells the slot of every other name with a suffix of that length, and
// the tag for the target's centre is solved for ([appendTag]), not
// searched. A second call checks the first name so made: over a
// SlotMapper that does not hash keys as Redis Cluster does (none of
// sluice's), it misses (but for a chance of 1 in NumSlots), and the names
// of that length are searched for instead, n·(n−1) Slot calls per name on
// average. Naming n sub-keys of a Redis backend thus costs at most four
// Slot calls, each hashing the key once, and O(1) work per name besides
// writing its bytes: O(n·len(key)) in all.
type aimer struct {
	slots ratelimit.SlotMapper
	head  string
	// By the length of a suffix after the head: what the head adds (by
	// XOR) to the slot of a name with such a suffix, and how such names
	// are found.
	offset [maxSuffix]int
	find   [maxSuffix]finding
}

// finding is how an aimer finds the names with suffixes of one length.
type finding uint8

const (
	unchecked finding = iota // no name of that length yet
	lookup                   // by appendTag: a name so made landed on its aim, or the SlotMapper could not tell
	searching                // by search: a name so made missed its aim
)

// tag appends to p ("i.n.") the tag that puts head + p + tag on the
// centre of target(n, i). It writes over whatever p's array holds past p.
func (a *aimer) tag(p []byte, n, i int) []byte {
	lo, hi := target(n, i)
	aim := lo + (hi-lo)/2
	l := len(p) + tagLen
	zero := append(p, zeroTag...)
	zeroSlot := crcSlot(string(zero))
	if a.find[l] == unchecked {
		slot, _ := a.slots.Slot(a.head + string(zero))
		a.offset[l] = slot ^ zeroSlot
	}
	// head+p+t is on offset ^ crcSlot(p+t), and crcSlot(p+t) is
	// crcSlot(p+zeroTag) ^ crcSlot(t) ^ zeroTagSlot, as p+t and p+zeroTag
	// differ in t's bytes alone.
	x := aim ^ a.offset[l] ^ zeroSlot ^ zeroTagSlot
	if a.find[l] == unchecked {
		a.find[l] = lookup
		if slot, ok := a.slots.Slot(a.head + string(appendTag(p, x))); ok && slot != aim {
			a.find[l] = searching
		}
	}
	if a.find[l] == searching {
		return a.search(p, lo, hi, x)
	}
	return appendTag(p, x)
}

// search appends to p the first tag, counting up from zeroTag, that puts
// head + p + tag in the slots lo to hi-1, trying maxTries times the tags
// it takes on average; if none does, it appends the tag whose crcSlot is
// x, the lookup's.
func (a *aimer) search(p []byte, lo, hi, x int) []byte {
	for t := range maxTries * ratelimit.NumSlots / (hi - lo) {
		try := fmt.Appendf(p, "%0*o", tagLen, t)
		if s, ok := a.slots.Slot(a.head + string(try)); ok && lo <= s && s < hi {
			return try
		}
	}
	return appendTag(p, x)
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
// sub-key's tag puts it on the window's centre, lo + (hi−lo)/2; the
// search, over another SlotMapper, anywhere in the window, which takes
// NumSlots/(hi−lo) tries on average: n·(n−1), 30 per sub-key for n = 6.
func target(n, i int) (lo, hi int) {
	centre := (2*i + 1) * ratelimit.NumSlots / (2 * n)
	width := max(1, ratelimit.NumSlots/(n*(n-1)))
	lo = centre - width/2
	return lo, lo + width
}
