// Package memory is the in-process [ratelimit.Backend]: buckets in sharded
// maps, one lock per shard, for a single process or as the local fallback of
// a distributed limiter.
//
// A bucket that is full again equals an absent one, so it is dropped: at
// once when a call leaves it full, otherwise by a background sweep once it
// has refilled. The number of stored buckets is capped (see [WithMaxKeys]).
//
// # Concurrency
//
// A Backend is safe for concurrent use. Calls on keys in different shards
// never contend; an existing key's decision does not allocate.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

const (
	// DefaultMaxKeys is the most buckets a Backend stores unless
	// [WithMaxKeys] says otherwise.
	DefaultMaxKeys = 1 << 20
	// DefaultSweepInterval is how often the background sweep drops refilled
	// buckets unless [WithSweepInterval] says otherwise.
	DefaultSweepInterval = time.Minute
)

var (
	// ErrTooManyKeys is returned for a new key when the Backend holds
	// [WithMaxKeys] buckets and none of them has refilled. The Backend never
	// forgets a bucket that is not full: that would let a client reset its
	// own limit by flooding the limiter with new keys. It wraps
	// [ratelimit.ErrBackendUnavailable], so fail policies treat it as a store
	// that cannot decide.
	ErrTooManyKeys = fmt.Errorf("%w: memory: too many keys", ratelimit.ErrBackendUnavailable)

	// ErrClosed is returned by calls after [Backend.Close]. It wraps
	// [ratelimit.ErrBackendUnavailable].
	ErrClosed = fmt.Errorf("%w: memory: backend closed", ratelimit.ErrBackendUnavailable)
)

// Backend is the in-process store. Create one with [New]; stop its
// background sweep with [Backend.Close].
type Backend struct {
	shards   []shard
	mask     uint64
	seed     maphash.Seed
	perShard int

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
	// noneFullBefore is, once the shard reached its cap, the earliest time
	// at which one of its buckets is full and may be dropped.
	noneFullBefore int64
	_              [128 - 24]byte
}

type entry struct {
	state  ratelimit.State
	fullAt int64 // µs on the backend's clock
	bands  [2]ratelimit.BandState
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
// [DefaultMaxKeys]). The keys are spread over shards that each hold
// n/shards, so the total never exceeds n. When a new key's shard is full,
// the Backend drops the shard's refilled buckets; if none has refilled the
// call fails with [ErrTooManyKeys].
func WithMaxKeys(n int) Option {
	return func(o *options) { o.maxKeys = max(1, n) }
}

// WithSweepInterval sets how often the background sweep drops refilled
// buckets (default [DefaultSweepInterval]); 0 or less turns it off, leaving
// refilled buckets to be dropped when a shard reaches its cap.
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
	n := min(shardCount(), 1<<(bits.Len(uint(o.maxKeys))-1))
	m := &Backend{
		shards:   make([]shard, n),
		mask:     uint64(n - 1),
		seed:     maphash.MakeSeed(),
		perShard: o.maxKeys / n,
		clock:    o.clock,
		origin:   time.Now(),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
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

// shardCount is a power of two, eight shards per CPU, 16 to 256.
func shardCount() int {
	n := 1 << bits.Len(uint(8*runtime.GOMAXPROCS(0)-1))
	return min(max(n, 16), 256)
}

// Do implements [ratelimit.Backend].
func (m *Backend) Do(_ context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	if m.closed.Load() {
		return ratelimit.Decision{}, ErrClosed
	}
	now := m.now()
	sh := &m.shards[maphash.String(m.seed, key)&m.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.buckets[key]
	if e == nil {
		if len(sh.buckets) >= m.perShard && !sh.makeRoom(now, m.perShard) {
			return ratelimit.Decision{}, ErrTooManyKeys
		}
		e = &entry{}
		e.state.Bands = e.bands[:0]
		key = strings.Clone(key) // the map must not pin the caller's memory
		sh.buckets[key] = e
	}
	d := ratelimit.Apply(&e.state, cfg, req, now)
	if d.ResetAfter == 0 {
		delete(sh.buckets, key)
	} else {
		e.fullAt = now + d.ResetAfter.Microseconds()
	}
	return d, nil
}

// now reads the clock in µs.
func (m *Backend) now() int64 {
	if m.clock != nil {
		return m.clock.Now().UnixMicro()
	}
	return m.originMicros + int64(time.Since(m.origin)/time.Microsecond)
}

// makeRoom drops the shard's refilled buckets and reports whether it is then
// below limit. Called with sh.mu held.
func (sh *shard) makeRoom(now int64, limit int) bool {
	if now < sh.noneFullBefore {
		return false
	}
	sh.noneFullBefore = sh.dropFull(now)
	return len(sh.buckets) < limit
}

// dropFull deletes the buckets full at now and returns the earliest time a
// remaining one will be. Called with sh.mu held.
func (sh *shard) dropFull(now int64) (next int64) {
	next = int64(1<<63 - 1)
	for k, e := range sh.buckets {
		if e.fullAt <= now {
			delete(sh.buckets, k)
		} else {
			next = min(next, e.fullAt)
		}
	}
	return next
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
			m.sweep()
		}
	}
}

// sweep drops every refilled bucket, one shard at a time.
func (m *Backend) sweep() {
	now := m.now()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.dropFull(now)
		sh.mu.Unlock()
	}
}

// Len returns how many buckets the Backend holds: those not yet full again.
func (m *Backend) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.buckets)
		sh.mu.Unlock()
	}
	return n
}

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
			clear(sh.buckets)
			sh.mu.Unlock()
		}
	})
	return nil
}

var _ ratelimit.Backend = (*Backend)(nil)
