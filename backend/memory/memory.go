// Package memory is the in-process [ratelimit.Backend]: buckets in sharded
// maps, one lock per shard, for a single process or as the local fallback of
// a distributed limiter.
//
// A bucket that has refilled equals an absent one (see
// [ratelimit.State.ExpiresAt]), so it is dropped: at once when a call leaves
// it so, otherwise by a background sweep once it has expired. The number of
// stored buckets is capped (see [WithMaxKeys]).
//
// # Concurrency
//
// A Backend is safe for concurrent use. Calls on keys in different shards
// never contend; an existing key's decision does not allocate.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

const (
	// DefaultMaxKeys is the most buckets a Backend stores unless
	// [WithMaxKeys] says otherwise.
	DefaultMaxKeys = 1 << 20
	// DefaultSweepInterval is how often the background sweep drops expired
	// buckets unless [WithSweepInterval] says otherwise.
	DefaultSweepInterval = time.Minute
)

var (
	// ErrTooManyKeys is returned for a new key when the Backend holds
	// [WithMaxKeys] buckets and none of them has expired. The Backend never
	// forgets a bucket before it expires: that would let a client reset its
	// own limit by flooding the limiter with new keys. It wraps
	// [ratelimit.ErrKeyRejected]: the keys already held are decided as
	// before, so fail policies do not count it as the store failing.
	ErrTooManyKeys = fmt.Errorf("%w: memory: too many keys", ratelimit.ErrKeyRejected)

	// ErrClosed is returned by calls after [Backend.Close]. It wraps
	// [ratelimit.ErrBackendUnavailable].
	ErrClosed = fmt.Errorf("%w: memory: backend closed", ratelimit.ErrBackendUnavailable)
)

// Backend is the in-process store. Create one with [New]; stop its
// background sweep with [Backend.Close].
type Backend struct {
	shards []shard
	mask   uint64
	seed   maphash.Seed

	maxKeys int64
	keys    atomic.Int64 // buckets held, never above maxKeys
	// expiryHint is a time before which no held bucket expires, learned by
	// a sweep; until then a new key at the cap is refused without sweeping
	// again. Lowered by every decision that stores an earlier expiry.
	expiryHint atomic.Int64
	roomMu     sync.Mutex // one sweep for room at a time

	clock        ratelimit.Clock // nil: the monotonic clock below
	origin       time.Time
	originMicros int64

	closed    atomic.Bool
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// shard is one lock and the buckets it guards, padded to its own cache
// lines so that neighbouring shards' locks do not contend.
type shard struct {
	mu      sync.Mutex
	buckets map[string]*entry
	_       [128 - 16]byte
}

type entry struct {
	state ratelimit.State
	bands [2]ratelimit.BandState // state.Bands' storage for small configs
}

type options struct {
	clock   ratelimit.Clock
	maxKeys int
	sweep   time.Duration
}

// Option configures a [Backend].
type Option func(*options)

// WithClock makes the Backend read time from c instead of the process's
// monotonic clock; tests pass a fake clock.
func WithClock(c ratelimit.Clock) Option {
	return func(o *options) { o.clock = c }
}

// WithMaxKeys caps the buckets held at n (at least 1; default
// [DefaultMaxKeys]). When a new key arrives at the cap, the Backend drops
// every bucket that has expired; if none has, the call fails with
// [ErrTooManyKeys]. A call that leaves a new bucket the same as an absent
// one (an Estimate or Inspect, or a full Add) stores nothing, so it is never
// refused.
func WithMaxKeys(n int) Option {
	return func(o *options) { o.maxKeys = max(1, n) }
}

// WithSweepInterval sets how often the background sweep drops expired
// buckets (default [DefaultSweepInterval]); 0 or less turns it off, leaving
// expired buckets to be dropped when a new key meets the cap.
func WithSweepInterval(d time.Duration) Option {
	return func(o *options) { o.sweep = d }
}

// New returns an empty Backend. If the sweep is on, call [Backend.Close]
// when done to stop it.
func New(opts ...Option) *Backend {
	o := options{maxKeys: DefaultMaxKeys, sweep: DefaultSweepInterval}
	for _, opt := range opts {
		opt(&o)
	}
	n := shardCount()
	m := &Backend{
		shards:  make([]shard, n),
		mask:    uint64(n - 1),
		seed:    maphash.MakeSeed(),
		maxKeys: int64(o.maxKeys),
		clock:   o.clock,
		origin:  time.Now(),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	m.originMicros = m.origin.UnixMicro()
	for i := range m.shards {
		m.shards[i].buckets = make(map[string]*entry)
	}
	if o.sweep > 0 {
		go m.sweepEvery(o.sweep)
	} else {
		close(m.done)
	}
	return m
}

// shardCount is a power of two, 64 shards per CPU, 256 to 4096: enough
// that goroutines on different keys seldom meet on a lock.
func shardCount() int {
	n := 1 << bits.Len(uint(64*runtime.GOMAXPROCS(0)-1))
	return min(max(n, 256), 4096)
}

// errNoRoom tells Do that a new key met the cap and a sweep may make room.
var errNoRoom = errors.New("memory: no room")

// Do implements [ratelimit.Backend]. It never blocks but on a shard's
// lock, so it reads ctx once, first: a call whose context is done returns
// the context's error and takes nothing. A new bucket keeps key as passed:
// a key sliced from a large buffer keeps that buffer alive as long as the
// bucket, so pass a copy ([strings.Clone]) of such a key.
func (m *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (d ratelimit.Decision, err error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return d, err
	}
	if ctx.Err() != nil {
		return d, ctxerr.Caller(ctx, fmt.Sprintf("memory: %v on key %q", req.Op, key), nil)
	}
	if m.closed.Load() {
		return d, ErrClosed
	}
	now := m.now()
	sh := &m.shards[maphash.String(m.seed, key)&m.mask]
	sh.mu.Lock()
	err = m.apply(&d, sh, key, cfg, req, now)
	sh.mu.Unlock()
	if err == errNoRoom {
		m.makeRoom(now)
		sh.mu.Lock()
		err = m.apply(&d, sh, key, cfg, req, now)
		sh.mu.Unlock()
		if err == errNoRoom {
			err = fmt.Errorf("%w: key %q is new, and the Backend holds WithMaxKeys(%d) buckets", ErrTooManyKeys, key, m.maxKeys)
		}
	}
	return d, err
}

// apply decides req on the bucket at key into d. Called with sh.mu held.
func (m *Backend) apply(d *ratelimit.Decision, sh *shard, key string, cfg ratelimit.Config, req ratelimit.Request, now int64) error {
	e := sh.buckets[key]
	if e == nil {
		return m.create(d, sh, key, cfg, req, now)
	}
	*d = ratelimit.Apply(&e.state, cfg, req, now)
	if e.state.ExpiresAt <= now {
		delete(sh.buckets, key) // the same as absent
		m.keys.Add(-1)
		return nil
	}
	m.lowerExpiryHint(e.state.ExpiresAt)
	return nil
}

// create decides req on an absent bucket, storing it unless it is still the
// same as absent (full, and no InitialTokens below capacity). It reads
// closed under the shard's lock, which Close takes to empty the shard
// after setting closed, so that no call racing Close stores a bucket after
// it.
func (m *Backend) create(d *ratelimit.Decision, sh *shard, key string, cfg ratelimit.Config, req ratelimit.Request, now int64) error {
	if m.closed.Load() {
		return ErrClosed
	}
	var fresh entry
	fresh.state.Bands = fresh.bands[:0]
	*d = ratelimit.Apply(&fresh.state, cfg, req, now)
	if fresh.state.ExpiresAt <= now {
		return nil
	}
	if m.keys.Add(1) > m.maxKeys {
		m.keys.Add(-1)
		*d = ratelimit.Decision{}
		return errNoRoom
	}
	e := new(entry)
	*e = fresh
	if len(fresh.state.Bands) <= len(e.bands) {
		e.state.Bands = e.bands[:len(fresh.state.Bands)]
	}
	m.lowerExpiryHint(e.state.ExpiresAt)
	sh.buckets[key] = e
	return nil
}

// lowerExpiryHint keeps expiryHint at or below expiresAt.
func (m *Backend) lowerExpiryHint(expiresAt int64) {
	for {
		hint := m.expiryHint.Load()
		if expiresAt >= hint || m.expiryHint.CompareAndSwap(hint, expiresAt) {
			return
		}
	}
}

// makeRoom drops every expired bucket, unless a sweep already found that
// none expires before expiryHint.
func (m *Backend) makeRoom(now int64) {
	m.roomMu.Lock()
	defer m.roomMu.Unlock()
	if now < m.expiryHint.Load() {
		return
	}
	m.sweep(now)
}

// now reads the clock in µs.
func (m *Backend) now() int64 {
	if m.clock != nil {
		return m.clock.Now().UnixMicro()
	}
	return m.originMicros + int64(time.Since(m.origin)/time.Microsecond)
}

func (m *Backend) sweepEvery(interval time.Duration) {
	defer close(m.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.sweep(m.now())
		}
	}
}

// sweep drops every bucket expired at now, one shard at a time, and sets
// expiryHint to the earliest time a remaining one expires.
func (m *Backend) sweep(now int64) {
	m.expiryHint.Store(math.MaxInt64)
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, e := range sh.buckets {
			if e.state.ExpiresAt <= now {
				delete(sh.buckets, k)
				m.keys.Add(-1)
			} else {
				m.lowerExpiryHint(e.state.ExpiresAt)
			}
		}
		sh.mu.Unlock()
	}
}

// Len returns how many buckets the Backend holds.
func (m *Backend) Len() int { return int(m.keys.Load()) }

// Close stops the background sweep and drops every bucket; later calls
// return [ErrClosed]. It is safe to call more than once.
func (m *Backend) Close() error {
	m.closeOnce.Do(func() {
		m.closed.Store(true)
		close(m.stop)
		<-m.done
		for i := range m.shards {
			sh := &m.shards[i]
			sh.mu.Lock()
			m.keys.Add(-int64(len(sh.buckets)))
			clear(sh.buckets)
			sh.mu.Unlock()
		}
	})
	return nil
}

var _ ratelimit.Backend = (*Backend)(nil)
