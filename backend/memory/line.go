package memory

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Published buckets.
//
// A token bucket of one greedy bandwidth that starts full, the most common
// limit, is decided by most calls without its bucket's lock. Between two
// takes its level rises along a line: at time t it holds
// (t−base)×Rate − v scaled units, capped at its capacity, for one number v
// that only a take changes. v fits in one word, the bucket's word, which a
// Consume updates with one compare-and-swap: the calls on a hot key then
// meet on that word for a few instructions, where they would take turns on
// the bucket's lock for a whole decision.
//
// Apply keeps a bucket's stamp as well, the last time it refilled: a call
// whose time is earlier (a request with an Ago, or a clock read just
// before another call's) is decided as of the stamp, not of its own time.
// A published bucket keeps a stamp in a second word, its hint, which every
// call raises to its own time before it commits: hint is never below the
// stamp of a committed decision, and a call decides as of the later of its
// time and hint, as Apply does. A call that raised hint and then lost its
// compare-and-swap leaves hint at a time at which it was deciding, which
// is Apply's answer with that call's refill ordered first.
//
// Any other call takes the bucket's lock and owns the bucket first: it
// swaps the word for held and writes the line back into the entry as a
// level and stamp at hint, which Apply then decides on; after the call the
// bucket is published again if it still may be. Calls on one key therefore
// decide as Apply would in the order in which they commit, which
// TestPublishedMatchesApply checks call by call.
//
// A published bucket's shape never changes: a call that reads a published
// word reads the shape after it, without the lock. A call that needs
// another shape (a new config) puts a new bucket in the map in its place.

// The word's values other than a published v, which lies within ±2^61.
const (
	unpublished = math.MinInt64 + iota // the state is in the entry, whose shape may change in place
	held                               // the state is in the entry; the shape stays, as the bucket has been published
	dead                               // the bucket has left the map
)

const (
	// lineRange bounds (t−base)×Rate on a published bucket's line, so
	// that v, levels and their sums stay far inside an int64.
	lineRange = 1 << 59
	// minSpan is the shortest span a line may have: a shape of a faster
	// rate is not published, so as not to start new shapes too often.
	minSpan = int64(time.Hour / time.Microsecond)
)

// line is what a shape fixes for its published buckets: the bandwidth's
// numbers, the time base of their lines, and the span of times around it
// within which a line's products fit.
type line struct {
	ok    bool  // the shape's buckets may be published
	base  int64 // µs, on the backend's clock
	span  int64 // |t−base| ≤ span keeps (t−base)×rate within lineRange
	full  int64 // capacity in scaled units
	scale int64
	rate  int64
	name  string // the Bandwidth of the shape's decisions
	// band and version are the config the shape was drawn for, which
	// passed ratelimit.CheckRequest: a call with a config equal to it
	// needs no other check of its config.
	band    ratelimit.Bandwidth
	version uint64
}

// newLine returns the line of a shape holding st, which Apply left after a
// call with cfg: a token bucket of one greedy bandwidth that starts full,
// of a rate slow enough, and based at its stamp; else a line that is not
// ok. The config that built st is its own copy when it has one, else cfg.
func newLine(st *ratelimit.State, cfg *ratelimit.Config) line {
	c := cfg
	if st.Config != nil {
		c = st.Config
	}
	if st.Algorithm != ratelimit.TokenBucket || len(st.Bands) != 1 || len(c.Bandwidths) != 1 ||
		c.Algorithm != st.Algorithm || c.Fingerprint() != st.Fingerprint {
		return line{}
	}
	b, bs := &c.Bandwidths[0], &st.Bands[0]
	span := lineRange / bs.Rate
	if b.Refill != ratelimit.Greedy || b.Initial() != b.Capacity || span < minSpan {
		return line{}
	}
	return line{
		ok: true, base: bs.Stamp, span: span,
		full: bs.Capacity * bs.Scale, scale: bs.Scale, rate: bs.Rate,
		name: c.BandwidthName(0), band: *b, version: st.Version,
	}
}

// serves reports whether a call with cfg may decide on a bucket published
// on l: cfg is the config l was drawn for.
func (l *line) serves(cfg *ratelimit.Config) bool {
	return l.ok && cfg.Algorithm == ratelimit.TokenBucket && cfg.Version == l.version &&
		len(cfg.Bandwidths) == 1 && cfg.Bandwidths[0] == l.band
}

// takes reports whether req is a plain Consume that [ratelimit.CheckOp]
// passes with a config l serves: of 1 to the bandwidth's capacity in
// tokens, no Ago, a known Strategy and no negative MaxWait. It only spares
// the common call CheckOp's call; a request it does not take is checked in
// full (FuzzTakesImpliesCheckOp holds it to CheckOp).
func (l *line) takes(req *ratelimit.Request) bool {
	return req.Op == ratelimit.Consume && req.Ago == 0 && req.Strategy <= ratelimit.Additive &&
		req.MaxWait >= 0 && req.Tokens >= 1 && req.Tokens <= l.band.Capacity
}

// near reports whether a bucket whose state is st, of l's bandwidth, may
// take a shape of line l: stamped within half its span of the base, so
// that it stays published a while.
func (l *line) near(st *ratelimit.State) bool {
	return !l.ok || abs(st.Bands[0].Stamp-l.base) <= l.span/2
}

// expiry is when a bucket on l with v becomes full again.
func (l *line) expiry(v int64) int64 {
	return l.base + ceilDiv(v+l.full, l.rate)
}

// decision fills d as Apply's settle does for a Consume of n tokens on l:
// allowed, leaving level, or denied at level; off is how far the stamp lies
// after the call's time.
func (l *line) decision(d *ratelimit.Decision, allowed bool, n, level, off int64) {
	remaining := max(0, level) / l.scale // level < full: fewer than capacity
	*d = ratelimit.Decision{
		Allowed:     allowed,
		Limit:       l.band.Capacity,
		Remaining:   remaining,
		RefillAfter: micros(ceilDiv((remaining+1)*l.scale-level, l.rate) + off),
		ResetAfter:  micros(ceilDiv(l.full-level, l.rate) + off),
		Bandwidth:   l.name,
	}
	if allowed {
		d.Consumed = n
	} else {
		d.RetryAfter = micros(ceilDiv(n*l.scale-level, l.rate) + off)
	}
}

// fastResult is what decideFast did.
type fastResult uint8

const (
	decided fastResult = iota
	locked             // the call must take the bucket's lock
	gone               // the bucket has left the map: look the key up again
)

// publishedFor returns, if b is published and cfg is the config its line
// was drawn for, the line and b's v: a Consume with cfg may decide on b
// without its lock. Otherwise l is nil.
func (b *bucket) publishedFor(cfg *ratelimit.Config) (l *line, v int64) {
	if v = b.word.Load(); v > dead {
		if l = &b.shape.line; l.serves(cfg) { // the shape stays once published
			return l, v
		}
	}
	return nil, 0
}

// decideFast decides a Consume of n tokens at now without the lock on b,
// published on l with v read last; see Published buckets.
func decideFast(d *ratelimit.Decision, b *bucket, l *line, w, n, now int64) fastResult {
	t := now - l.base
	if abs(t) > l.span {
		return locked
	}
	hint, need := b.hint(), n*l.scale
	for {
		h := atomic.LoadInt64(hint)
		s := max(t, h-l.base) // the stamp Apply decides as of
		level := min(s*l.rate-w, l.full)
		if now > h && !atomic.CompareAndSwapInt64(hint, h, now) {
			continue // another call raised it: decide as of that
		}
		switch {
		case need > level:
			// Denied, which changes nothing but the stamp: decided on
			// the v it read if no other call has committed since.
			if b.word.Load() == w {
				l.decision(d, false, n, level, s-t)
				return decided
			}
		case b.word.CompareAndSwap(w, s*l.rate-(level-need)):
			l.decision(d, true, n, level-need, s-t)
			return decided
		}
		// Another call committed first: decide again on what it left.
		if w = b.word.Load(); w <= dead {
			return unowned(w)
		}
	}
}

// unowned is what decideFast does on a bucket whose word w is not a v.
func unowned(w int64) fastResult {
	if w == dead {
		return gone
	}
	return locked
}

// hint is where a bucket whose shape is published keeps its hint: the
// second stamp of its entry, which its one bandwidth leaves unused. It is
// read and written atomically while calls may meet on it.
func (b *bucket) hint() *int64 { return &b.stamp[1] }

// own makes b's state its entry's, for a call that holds b.mu: it
// unpublishes b if published. It reports false if b has left the map.
func (b *bucket) own() bool {
	for {
		switch w := b.word.Load(); {
		case w == dead:
			return false
		case w < dead:
			return true
		case b.word.CompareAndSwap(w, held):
			b.unpublish(w)
			return true
		}
	}
}

// unpublish writes the published v back into b's entry, as Apply's state:
// its level at hint, stamped hint. Called by the owner of b.
func (b *bucket) unpublish(v int64) {
	l := &b.shape.line
	h := atomic.LoadInt64(b.hint())
	b.stamp[0] = h
	if level := (h-l.base)*l.rate - v; level < l.full {
		b.level[0], b.expiresAt = level, l.expiry(v)
	} else {
		// Full by hint: Apply started it afresh then.
		b.level[0], b.expiresAt = l.full, h
	}
}

// publish publishes b's state, which its entry holds, if its shape's line
// takes it. Called by the owner of b, whose state has not expired.
func (b *bucket) publish() {
	l := &b.shape.line
	stamp, level := b.stamp[0], b.level[0]
	if !l.ok || abs(stamp-l.base) > l.span {
		return
	}
	atomic.StoreInt64(b.hint(), stamp)
	b.word.Store((stamp-l.base)*l.rate - level)
}

// ceilDiv returns a/b rounded up, for b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b > 0 {
		q++
	}
	return q
}

func abs(x int64) int64 { return max(x, -x) }

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
