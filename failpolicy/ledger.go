package failpolicy

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// debt is what a key's local shares admitted that the store has not been
// charged for.
type debt struct {
	tokens  int64
	expires int64 // ns on the Backend's clock; after it the debt is forgiven
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

// add adds d to key's debt, which never exceeds limit, the most one
// charge can take.
func (l *ledger) add(key string, d debt, limit, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	old, ok := l.debts[key]
	if !ok {
		if len(l.debts) >= l.max && !l.dropExpired(now) {
			return
		}
	}
	d.tokens = min(old.tokens+d.tokens, limit)
	d.expires = max(old.expires, d.expires)
	l.debts[key] = d
	l.soonest = min(l.soonest, d.expires)
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
