package failpolicy

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// debtSlots is how many admission times a debt keeps. A charge sends a
// request a slot, so it is also the most round trips a charge takes
// (before a slot larger than the smallest capacity is split).
const debtSlots = 4

// slot is tokens a key's local shares admitted, at or before at (ns on the
// Backend's clock).
type slot struct {
	at, tokens int64
}

// debt is what a key's local shares admitted that the store has not been
// charged for, with when: slots[:n], in time order. Admissions that do not
// fit are merged into the slot after them, as if admitted later, which
// charges the store at least as much as their own times would (a token
// taken later has had less time to refill).
type debt struct {
	slots   [debtSlots]slot
	n       int
	expires int64 // ns on the Backend's clock; after it the debt is forgiven
}

// tokens is the whole debt.
func (d *debt) tokens() int64 {
	var sum int64
	for _, s := range d.slots[:d.n] {
		sum += s.tokens
	}
	return sum
}

// admit adds s, keeping the slots in time order and at most debtSlots of
// them, and then at most limit tokens: the earliest go first, the ones the
// store is likeliest to have refilled past.
func (d *debt) admit(s slot, limit int64) {
	i := d.n
	for i > 0 && d.slots[i-1].at > s.at {
		i--
	}
	switch {
	case i > 0 && d.slots[i-1].at == s.at:
		d.slots[i-1].tokens += s.tokens
	case d.n < debtSlots:
		copy(d.slots[i+1:d.n+1], d.slots[i:d.n])
		d.slots[i] = s
		d.n++
	default:
		// Full: merge the adjacent two that hold the fewest tokens
		// between them, the earliest such, into the later one. A slot's
		// tokens charged at once, later than some were admitted, cost a
		// client that kept to the refill rate at most the slot's tokens
		// beyond what the store would have held, so the slots are kept
		// even: the largest holds at most twice the debt over debtSlots.
		var all [debtSlots + 1]slot
		copy(all[:i], d.slots[:i])
		all[i] = s
		copy(all[i+1:], d.slots[i:])
		best, fewest := 0, int64(math.MaxInt64)
		for j := range debtSlots {
			if n := all[j].tokens + all[j+1].tokens; n < fewest {
				best, fewest = j, n
			}
		}
		all[best+1].tokens += all[best].tokens
		copy(d.slots[:best], all[:best])
		copy(d.slots[best:], all[best+1:])
	}
	for excess := d.tokens() - limit; excess > 0; {
		take := min(excess, d.slots[0].tokens)
		d.slots[0].tokens -= take
		excess -= take
		if d.slots[0].tokens == 0 {
			copy(d.slots[:], d.slots[1:d.n])
			d.n--
		}
	}
}

// ledger keeps the Local mode's debts, for at most max keys, each key as
// the local store keeps it: as passed (see [memory.Backend.Do]). A debt is
// forgiven once the store would have refilled past it (see fillTime): the
// excess it paid for then lies outside any interval the bound speaks of.
// A debt that finds the ledger full of unexpired ones is forgiven at once,
// as its share was denied at the same cap.
type ledger struct {
	max  int
	size atomic.Int64 // len(debts), for the lock-free check of an empty ledger

	mu    sync.Mutex
	debts map[string]debt
	// soonest is a time before which no debt expires, so that a full
	// ledger looks for expired ones only once one may be.
	soonest int64
}

func newLedger(max int) *ledger {
	return &ledger{max: max, debts: make(map[string]debt), soonest: math.MaxInt64}
}

// take removes and returns key's debt, if it has one that is due at now.
func (l *ledger) take(key string, now int64) debt {
	if l.size.Load() == 0 {
		return debt{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.debts[key]
	if !ok {
		return debt{}
	}
	delete(l.debts, key)
	l.size.Store(int64(len(l.debts)))
	if d.expires <= now {
		return debt{}
	}
	return d
}

// add adds the slots of d to key's debt, which never exceeds limit tokens,
// the most the ledger charges for a key.
func (l *ledger) add(key string, d debt, limit, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	old, ok := l.debts[key]
	if !ok {
		if len(l.debts) >= l.max && !l.dropExpired(now) {
			return
		}
	}
	for _, s := range d.slots[:d.n] {
		old.admit(s, limit)
	}
	old.expires = max(old.expires, d.expires)
	l.debts[key] = old
	l.soonest = min(l.soonest, old.expires)
	l.size.Store(int64(len(l.debts)))
}

// dropExpired forgives every debt expired at now, and reports whether it
// made room.
func (l *ledger) dropExpired(now int64) bool {
	if now < l.soonest {
		return false
	}
	l.soonest = math.MaxInt64
	for k, d := range l.debts {
		if d.expires <= now {
			delete(l.debts, k)
		} else {
			l.soonest = min(l.soonest, d.expires)
		}
	}
	return len(l.debts) < l.max
}

// fillTime is how long cfg's slowest bandwidth takes to refill from empty
// to full, at most about 292 years.
func fillTime(cfg ratelimit.Config) time.Duration {
	var longest float64
	for _, bw := range cfg.Bandwidths {
		longest = max(longest, float64(bw.RefillPeriod)*float64(bw.Capacity)/float64(bw.RefillTokens))
	}
	return time.Duration(min(longest, math.MaxInt64/2))
}
