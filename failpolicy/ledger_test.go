package failpolicy

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestDebtAdmit admits random runs of tokens at random times, in and out of
// order, into a debt and checks after each: the slots are in strictly
// increasing time order and at most debtSlots; they hold what was admitted
// up to the limit, the earliest dropped first; and no token is charged at a
// time before it was admitted (for every time x, the slots at or before x
// hold no more than was admitted at or before x, less what was dropped),
// which is what makes a charge as of the slots' times take no less than
// the store would have.
func TestDebtAdmit(t *testing.T) {
	for seed := range uint64(2000) {
		r := rand.New(rand.NewPCG(seed, 7))
		limit := 1 + r.Int64N(60)
		var d debt
		var admitted []slot // every admission, whatever the debt kept
		var total int64     // what the debt must hold
		for range 1 + r.IntN(30) {
			s := slot{at: r.Int64N(1000), tokens: 1 + r.Int64N(8)}
			if r.IntN(3) > 0 && len(admitted) > 0 {
				s.at = admitted[len(admitted)-1].at + r.Int64N(50) // mostly in order
			}
			d.admit(s, limit)
			admitted = append(admitted, s)
			total = min(total+s.tokens, limit)

			if d.n < 1 || d.n > debtSlots {
				t.Fatalf("seed %d: %d slots", seed, d.n)
			}
			for i := 1; i < d.n; i++ {
				if d.slots[i-1].at >= d.slots[i].at {
					t.Fatalf("seed %d: slots out of order: %v", seed, d.slots[:d.n])
				}
			}
			if got := d.tokens(); got != total {
				t.Fatalf("seed %d: the debt holds %d tokens, want %d (limit %d): %v", seed, got, total, limit, d.slots[:d.n])
			}
			// Dropped tokens are the earliest, so the debt's tokens at or
			// before x are at most those admitted at or before x, less
			// all that was ever dropped, and never below zero.
			var sum int64
			for _, a := range admitted {
				sum += a.tokens
			}
			dropped := sum - total
			for _, x := range d.slots[:d.n] {
				var kept, before int64
				for _, s := range d.slots[:d.n] {
					if s.at <= x.at {
						kept += s.tokens
					}
				}
				for _, a := range admitted {
					if a.at <= x.at {
						before += a.tokens
					}
				}
				if kept > max(0, before-dropped) {
					t.Fatalf("seed %d: %d tokens charged at or before %d, but only %d admitted by then (%d dropped): slots %v, admitted %v",
						seed, kept, x.at, before, dropped, d.slots[:d.n], admitted)
				}
			}
		}
		if d.slots[d.n-1].at != maxAt(admitted) {
			t.Fatalf("seed %d: the latest admission's time %d is not kept: %v", seed, maxAt(admitted), d.slots[:d.n])
		}
	}
}

func maxAt(ss []slot) int64 {
	var m int64
	for _, s := range ss {
		m = max(m, s.at)
	}
	return m
}

// TestDebtSlotsEven: a client at a bucket's refill rate, one token a
// second, admitted for a minute. Each slot is charged at once, at its
// latest admission, which costs such a client at most the slot's tokens
// beyond what the store would have held, so the slots are kept even: none
// holds more than twice the debt over debtSlots; and the latest admission
// keeps its own time.
func TestDebtSlotsEven(t *testing.T) {
	for _, limit := range []int64{20, 1000} {
		var d debt
		sec := int64(time.Second)
		for i := range int64(60) {
			d.admit(slot{at: i * sec, tokens: 1}, limit)
		}
		total := d.tokens()
		if total != min(60, limit) {
			t.Fatalf("limit %d: the debt holds %d tokens; want %d", limit, total, min(60, limit))
		}
		for _, s := range d.slots[:d.n] {
			if s.tokens > 2*total/debtSlots {
				t.Errorf("limit %d: slots %v: one holds %d, more than 2×%d/%d", limit, d.slots[:d.n], s.tokens, total, debtSlots)
			}
		}
		if d.slots[d.n-1].at != 59*sec {
			t.Errorf("limit %d: slots %v: the latest is not at the last admission, 59s", limit, d.slots[:d.n])
		}
	}
}

// TestChargeRequest: a slot is charged with Reserve on credit where the
// algorithm lends, ConsumeUpTo where it cannot; at most the smallest
// capacity a request; as of the slot's time, at most MaxAgo back, never
// ahead.
func TestChargeRequest(t *testing.T) {
	bws := []ratelimit.Bandwidth{{Capacity: 7, RefillTokens: 7, RefillPeriod: 7 * time.Second}, ratelimit.PerHour(100)}
	now := int64(10 * time.Hour)
	for _, tc := range []struct {
		alg  ratelimit.Algorithm
		s    slot
		want ratelimit.Request
	}{
		{ratelimit.TokenBucket, slot{at: now - int64(3*time.Second), tokens: 5},
			ratelimit.Request{Op: ratelimit.Reserve, Tokens: 5, MaxWait: time.Duration(1<<63 - 1), Ago: 3 * time.Second}},
		{ratelimit.GCRA, slot{at: now, tokens: 9},
			ratelimit.Request{Op: ratelimit.Reserve, Tokens: 7, MaxWait: time.Duration(1<<63 - 1)}},
		{ratelimit.SlidingWindowLog, slot{at: now - int64(2*ratelimit.MaxAgo), tokens: 2},
			ratelimit.Request{Op: ratelimit.ConsumeUpTo, Tokens: 2, Ago: ratelimit.MaxAgo}},
		{ratelimit.FixedWindow, slot{at: now + 1, tokens: 1},
			ratelimit.Request{Op: ratelimit.ConsumeUpTo, Tokens: 1}},
	} {
		cfg := ratelimit.Config{Algorithm: tc.alg, Bandwidths: bws}
		if got := chargeRequest(cfg, tc.s, now); got != tc.want {
			t.Errorf("%v: chargeRequest(%+v) = %+v; want %+v", tc.alg, tc.s, got, tc.want)
		}
		if err := ratelimit.CheckRequest("k", cfg, chargeRequest(cfg, tc.s, now)); err != nil {
			t.Errorf("%v: the charge is refused: %v", tc.alg, err)
		}
	}
}
