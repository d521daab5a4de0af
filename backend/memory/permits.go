package memory

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

// semaphores are a Backend's concurrency permits: a key's holds, decided
// by [ratelimit.ApplyPermit] under the key's lock. A key whose permits are
// all released or whose every lease has ended is dropped by the sweep, or
// by a new key at the cap: a key whose permits come and go, as a busy
// key's do, keeps its state between them instead of making it anew for
// each acquire. They are capped as buckets are, at WithMaxKeys keys of
// their own.
type semaphores struct {
	m    *xsync.Map[string, *semaphore]
	keys atomic.Int64
}

// semaphore is one key's permits.
type semaphore struct {
	mu   sync.Mutex
	st   ratelimit.PermitState
	now  int64 // the time the last call decided as of, µs
	dead bool  // left the map; a call that found it looks the key up again
}

// DoPermit implements [ratelimit.PermitBackend]: the permits of key, as
// [ratelimit.ApplyPermit] decides, on the Backend's clock. Like Do, it
// reads ctx once, first. A key's state is at most its Limit holders. A new
// key at the WithMaxKeys cap of permit keys, when the sweep finds none
// whose leases have all ended, fails with [ErrTooManyKeys].
func (m *Backend) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	if ctx.Err() != nil {
		return ratelimit.PermitDecision{}, ctxerr.Caller(ctx, fmt.Sprintf("memory: %v on key %q", req.Op, key), nil)
	}
	if m.closed.Load() {
		return ratelimit.PermitDecision{}, ErrClosed
	}
	for {
		s, ok := m.sems.m.Load(key)
		if !ok {
			if req.Op != ratelimit.PermitAcquire {
				// Nothing held: decided on an empty state, nothing kept.
				var st ratelimit.PermitState
				return ratelimit.ApplyPermit(&st, lim, req, m.now()), nil
			}
			var err error
			if s, err = m.newSemaphore(key); err != nil {
				return ratelimit.PermitDecision{}, err
			}
		}
		// The clock is read before the lock, to keep it out of the
		// calls' turns on a busy key; a call that read it before the last
		// one to decide decides as of that one's time.
		now := m.now()
		s.mu.Lock()
		if s.dead {
			s.mu.Unlock()
			continue
		}
		now = max(now, s.now)
		s.now = now
		d := ratelimit.ApplyPermit(&s.st, lim, req, now)
		s.mu.Unlock()
		return d, nil
	}
}

// newSemaphore returns key's semaphore, stored new unless another call
// stored one first, within the cap.
func (m *Backend) newSemaphore(key string) (*semaphore, error) {
	if m.sems.keys.Add(1) > m.maxKeys {
		m.sems.keys.Add(-1)
		m.sweepPermits(m.now())
		if m.sems.keys.Add(1) > m.maxKeys {
			m.sems.keys.Add(-1)
			return nil, fmt.Errorf("%w: key %q is new, and the Backend holds permits for WithMaxKeys(%d) keys", ErrTooManyKeys, key, m.maxKeys)
		}
	}
	s, loaded := m.sems.m.LoadOrStore(key, new(semaphore))
	if loaded {
		m.sems.keys.Add(-1)
	}
	return s, nil
}

// dropSemaphore removes key's semaphore s, whose lock the caller holds.
func (m *Backend) dropSemaphore(key string, s *semaphore) {
	s.dead = true
	m.sems.m.Delete(key)
	m.sems.keys.Add(-1)
}

// sweepPermits drops every semaphore whose leases have all ended at now.
func (m *Backend) sweepPermits(now int64) {
	m.sems.m.Range(func(key string, s *semaphore) bool {
		s.mu.Lock()
		if !s.dead && s.st.ExpiresAt() <= now {
			m.dropSemaphore(key, s)
		}
		s.mu.Unlock()
		return true
	})
}

var _ ratelimit.PermitBackend = (*Backend)(nil)

// PermitKeys returns how many keys the Backend keeps concurrency permits
// for: those holding permits, and those whose permits have all been
// released or have ended since the last sweep.
func (m *Backend) PermitKeys() int { return int(m.sems.keys.Load()) }
