package lease

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// lease is one key's leased tokens in this instance, under mu.
type lease struct {
	// checked is the config the key's Consumes were last checked on.
	checked atomic.Pointer[checked]
	// split says whether sharding splits the key.
	split bool

	mu   sync.Mutex
	fp   uint64 // the config fingerprint the segments were taken for
	segs [2]segment
	// call is the refill in flight, or nil.
	call *refill
	// denyUntil is when the store said its next token comes, after a
	// refill that took none; deny is that refill's decision.
	denyUntil int64
	deny      ratelimit.Decision
	// last is the last refill's decision that took tokens.
	last ratelimit.Decision
	// short says the last refill got fewer tokens than it asked for: the
	// store is running dry, and refills go out only when a call needs
	// them, not ahead.
	short bool
	// k is the size the last refill asked for; rate the tokens a µs the
	// key was asked for here, smoothed over refills; demand the tokens
	// asked for since the refill before, sent at since.
	k      int64
	rate   float64
	demand int64
	since  int64
	used   int64 // when a call last asked, in µs
	dead   bool  // the sweep dropped it
	c      counts
}

// segment is the tokens one refill leased: left of them unspent, taken
// by a call sent at at (µs). Each lapses as the store could have refilled
// past it (see the package doc): its usable tokens at now are at most
// heads[i] minus what bandwidth i refills in now−at, for each bandwidth
// (a greedy algorithm), and none from until on (FixedWindow, whose heads
// is nil). Before whole, all that is left is usable: the lapse is worked
// out again only from then.
type segment struct {
	left     int64
	at       int64
	until    int64
	whole    int64
	heads    []int64
	degraded bool
}

// refill is one store call that takes a lease. A call that needed tokens
// (need > 0) gets them first when it lands: answer is its decision.
type refill struct {
	done   chan struct{}
	need   int64 // 0 once the call that needed them has gone
	asked  int64
	landed bool
	err    error
	answer ratelimit.Decision
}

// settle lets what has lapsed of s by now go, and returns how many
// tokens that was.
func (s *segment) settle(bws []ratelimit.Bandwidth, now int64) int64 {
	if s.left <= 0 || now < s.whole {
		return 0
	}
	n := int64(0)
	if now < s.until {
		n = s.left
		for i, h := range s.heads {
			n = min(n, h-decay(&bws[i], now-s.at))
		}
		n = max(n, 0)
	}
	lapsed := s.left - n
	s.left = n
	s.whole = s.until
	for i, h := range s.heads {
		s.whole = min(s.whole, s.at+lasts(&bws[i], h-n)+1)
	}
	return lapsed
}

// held is the tokens l can spend at now, the lapsed let go.
func (l *lease) held(cfg *ratelimit.Config, now int64) int64 {
	var n int64
	for i := range l.segs {
		s := &l.segs[i]
		l.c.lapsed += s.settle(cfg.Bandwidths, now)
		n += s.left
	}
	return n
}

// take spends n tokens at now, the older segment's first, and returns
// the decision, if l holds them.
func (l *lease) take(cfg *ratelimit.Config, n, now int64) (ratelimit.Decision, bool) {
	held := l.held(cfg, now)
	if held < n {
		return ratelimit.Decision{}, false
	}
	degraded := false
	for i, left := 0, n; left > 0; i++ {
		s := &l.segs[i]
		t := min(s.left, left)
		s.left -= t
		left -= t
		degraded = degraded || (t > 0 && s.degraded)
	}
	l.c.spent += n
	d := l.last
	d.Allowed, d.Degraded, d.Consumed, d.RetryAfter = true, degraded, n, 0
	d.Remaining = min(d.Limit, d.Remaining+held-n)
	return d, true
}

// denial is the decision for n tokens at now, before denyUntil.
func (l *lease) denial(cfg *ratelimit.Config, n, now int64) ratelimit.Decision {
	d := l.deny
	d.Allowed, d.Consumed = false, 0
	wait := max(1, l.denyUntil-now)
	if n > 1 {
		wait = max(wait, refillTime(cfg, n-l.held(cfg, now)))
	}
	d.RetryAfter = time.Duration(wait) * time.Microsecond
	return d
}

// refillTime is the µs the slowest bandwidth of cfg takes to refill n
// tokens: the wait a denial of n tokens reports, an estimate.
func refillTime(cfg *ratelimit.Config, n int64) int64 {
	var t int64
	for i := range cfg.Bandwidths {
		bw := &cfg.Bandwidths[i]
		t = max(t, int64(math.Ceil(float64(n)*float64(bw.PeriodMicros())/float64(bw.RefillTokens))))
	}
	return t
}

// size is how many tokens the next refill asks for: what this instance
// asked for in the target time at its smoothed rate, at least need and 1,
// at most most.
func (l *lease) size(need, most int64, target time.Duration, now int64) int64 {
	if l.since > 0 {
		r := float64(l.demand) / float64(max(now-l.since, 1))
		if l.rate == 0 {
			l.rate = r
		} else {
			l.rate = (l.rate + r) / 2
		}
		l.demand = 0
	}
	l.since = max(now, 1)
	// At most twice the last ask (and what the call needs): a key that
	// just got busy, or many instances starting at once, do not each
	// take a share of the capacity before their rates are known.
	k := int64(math.Ceil(min(l.rate*float64(target.Microseconds()), float64(2*l.k+1))))
	l.k = min(max(k, need, 1), most)
	return l.k
}

// land records what the refill call, sent at at for the config own of
// fingerprint fp, took: d, or err. Called with l.mu held.
func (l *lease) land(call *refill, own *ratelimit.Config, fp uint64, d ratelimit.Decision, err error, at int64, split bool) {
	call.err, call.landed = err, true
	if err != nil {
		return
	}
	got := d.Consumed
	if l.short = got < call.asked; l.short {
		// The store ran dry: until it could have refilled what this
		// refill missed, a call the lease cannot cover is denied here
		// rather than sent to the store, where the instances would take
		// its tokens one or two at a time.
		l.deny = d
		l.denyUntil = at + max(1, micros(d.RetryAfter), refillTime(own, call.asked-got))
	}
	if got <= 0 {
		call.answer = l.denial(own, max(call.need, 1), at)
		return
	}
	if call.need > 0 {
		// The call that needed tokens gets them first, as a Consume of
		// its own would have: the store has just been charged.
		if got >= call.need {
			call.answer = d
			call.answer.Allowed, call.answer.Consumed, call.answer.RetryAfter = true, call.need, 0
			got -= call.need
			l.c.spent += call.need
		} else {
			call.answer = d
			call.answer.Allowed, call.answer.Consumed = false, 0
			call.answer.RetryAfter = time.Duration(refillTime(own, call.need-got)) * time.Microsecond
		}
	}
	l.c.leased += d.Consumed
	if l.fp != fp {
		l.c.lapsed += got // taken for a config no longer asked for
		return
	}
	l.last = d
	if got == 0 {
		return
	}
	s := segment{left: got, at: at, until: math.MaxInt64, whole: at, degraded: d.Degraded}
	if own.Algorithm == ratelimit.FixedWindow {
		s.until = at + d.ResetAfter.Microseconds() - 1
	} else {
		s.heads = make([]int64, len(own.Bandwidths))
		for i := range s.heads {
			// The store was at least d.Consumed tokens short of full
			// once the call took them.
			s.heads[i] = d.Consumed
		}
		if !d.Degraded && !split {
			// The binding bandwidth held less than Remaining+1 tokens:
			// it was at least Capacity−Remaining−1 short of full.
			for i := range own.Bandwidths {
				if own.BandwidthName(i) == d.Bandwidth && own.Bandwidths[i].Capacity == d.Limit {
					s.heads[i] = max(s.heads[i], d.Limit-d.Remaining-1)
					break
				}
			}
		}
	}
	if l.segs[0].left > 0 && l.segs[1].left > 0 {
		l.c.lapsed += l.segs[0].left
		l.segs[0].left = 0
	}
	if l.segs[0].left == 0 {
		l.segs[0] = l.segs[1]
	}
	l.segs[1] = s
}

// leave records that the call that needed call's tokens has gone: if it
// has not landed, its tokens all go to the lease; if it has, those it
// gave the call were lost. Called with l.mu held.
func (l *lease) leave(call *refill) {
	if !call.landed {
		call.need = 0
	} else if call.answer.Allowed {
		l.c.spent -= call.need
		l.c.lapsed += call.need
	}
}

// dropAll lets every token l holds lapse.
func (l *lease) dropAll() {
	for i := range l.segs {
		l.c.lapsed += l.segs[i].left
		l.segs[i] = segment{}
	}
	l.denyUntil = 0
}
