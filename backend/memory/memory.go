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
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
	shapes  [ringShapes]*shape // the shapes its buckets took last
	next    uint8              // the ring's slot for the next new shape
	// st and bands hold the state of the bucket being decided, which the
	// lock guards: scratch space that no call allocates.
	st    ratelimit.State
	bands [compactBands]ratelimit.BandState
	_     [128 - (8+unsafe.Sizeof(map[string]*entry{})+8*ringShapes+8+unsafe.Sizeof(ratelimit.State{})+compactBands*unsafe.Sizeof(ratelimit.BandState{}))%128]byte
}

// compactBands is the most bandwidths a compact entry holds.
const compactBands = 2

// ringShapes is how many shapes a shard remembers for its new buckets to
// share: a few configs in turn share without a lookup table.
const ringShapes = 4

// entry is one bucket, in 48 bytes: small, so that a service's hundred
// thousand keys take 5 MB rather than the 22 MB of whole states. A bucket of
// at most compactBands bandwidths whose state is only their levels and
// stamps (a token bucket, GCRA, LeakyBucket, a fixed window, a sliding
// window counter whose previous windows are empty) keeps those and its
// expiry here, and what its config fixes (the fingerprint, version and
// config, each bandwidth's ID, capacity, scale and rate) in shape, which
// the buckets of a shard on one config share. Any other bucket has a shape
// of its own that holds its whole state in full.
type entry struct {
	shape     *shape
	expiresAt int64
	level     [compactBands]int64
	stamp     [compactBands]int64
}

// shape is what a config fixes in a bucket's state: proto is such a state
// whose levels, stamps and expiry are zero, its Bands in bands. A shape
// with full set is instead one bucket's whole state.
type shape struct {
	proto ratelimit.State
	bands [compactBands]ratelimit.BandState
	full  *ratelimit.State
}

// expires is when the bucket becomes the same as an absent one.
func (e *entry) expires() int64 {
	if full := e.shape.full; full != nil {
		return full.ExpiresAt
	}
	return e.expiresAt
}

// load makes sh.st the state of the compact bucket e, for Apply. Called
// with sh.mu held.
func (sh *shard) load(e *entry) {
	sh.st = e.shape.proto
	n := len(sh.st.Bands)
	sh.bands = e.shape.bands
	for i := range n {
		sh.bands[i].Level, sh.bands[i].Stamp = e.level[i], e.stamp[i]
	}
	sh.st.Bands, sh.st.ExpiresAt = sh.bands[:n], e.expiresAt
}

// save stores st, which Apply left, in e: compact when it fits, in a shape
// of the shard's, else whole.
func (sh *shard) save(e *entry, st *ratelimit.State) {
	if !fits(st) {
		full := *st
		full.Bands = slices.Clone(st.Bands)
		*e = entry{shape: &shape{full: &full}}
		return
	}
	if e.shape == nil || !e.shape.holds(st) {
		e.shape = sh.shapeOf(st)
	}
	e.expiresAt = st.ExpiresAt
	for i := range st.Bands {
		e.level[i], e.stamp[i] = st.Bands[i].Level, st.Bands[i].Stamp
	}
}

// fits reports whether st can be kept compact.
func fits(st *ratelimit.State) bool {
	if len(st.Bands) > compactBands || st.Log != nil {
		return false
	}
	for i := range st.Bands {
		if st.Bands[i].Prev != 0 {
			return false
		}
	}
	return true
}

// holds reports whether st's fixed fields are p's: the same config
// (fingerprint, algorithm, version and the kept config) and bandwidths.
func (p *shape) holds(st *ratelimit.State) bool {
	pr := &p.proto
	if p.full != nil || pr.Fingerprint != st.Fingerprint || pr.Algorithm != st.Algorithm || pr.Version != st.Version ||
		pr.Config != st.Config || len(pr.Bands) != len(st.Bands) {
		return false
	}
	for i := range st.Bands {
		a, b := &p.bands[i], &st.Bands[i]
		if a.ID != b.ID || a.Capacity != b.Capacity || a.Scale != b.Scale || a.Rate != b.Rate {
			return false
		}
	}
	return true
}

// shapeOf returns a shape holding st: one the shard used last, or a new
// one, which it remembers instead of its oldest. Called with sh.mu held.
func (sh *shard) shapeOf(st *ratelimit.State) *shape {
	for _, p := range sh.shapes {
		if p != nil && p.adopts(st) {
			return p
		}
	}
	p := new(shape)
	p.proto = *st
	p.proto.ExpiresAt = 0
	for i := range st.Bands {
		p.bands[i] = st.Bands[i]
		p.bands[i].Level, p.bands[i].Stamp = 0, 0
	}
	p.proto.Bands = p.bands[:len(st.Bands)]
	sh.shapes[sh.next] = p
	sh.next = (sh.next + 1) % ringShapes
	return p
}

// adopts reports whether a bucket whose state is st may take p as its
// shape: p holds st, but for a config kept as another copy of the same
// version and fingerprint (each bucket that Apply starts on a versioned
// config copies it), which p's own copy then stands for.
func (p *shape) adopts(st *ratelimit.State) bool {
	if p.holds(st) {
		return true
	}
	c, pc := st.Config, p.proto.Config
	if c == nil || pc == nil || c.Version != pc.Version || c.Fingerprint() != pc.Fingerprint() {
		return false
	}
	q := *st
	q.Config = pc
	return p.holds(&q)
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
	clock := m.now()
	now := clock
	if req.Ago > 0 {
		now = max(0, clock-req.Ago.Microseconds()) // decided as of then
	}
	sh := &m.shards[maphash.String(m.seed, key)&m.mask]
	sh.mu.Lock()
	err = m.apply(&d, sh, key, cfg, req, now)
	sh.mu.Unlock()
	if err == errNoRoom {
		m.makeRoom(clock) // what has expired by now, not by then
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
	if full := e.shape.full; full != nil {
		*d = ratelimit.Apply(full, cfg, req, now)
	} else {
		sh.load(e)
		*d = ratelimit.Apply(&sh.st, cfg, req, now)
		sh.save(e, &sh.st)
	}
	if expires := e.expires(); expires > now {
		m.lowerExpiryHint(expires)
		return nil
	}
	delete(sh.buckets, key) // the same as absent
	m.keys.Add(-1)
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
	st := &sh.st
	*st = ratelimit.State{Bands: sh.bands[:0]}
	*d = ratelimit.Apply(st, cfg, req, now)
	if st.ExpiresAt <= now {
		return nil
	}
	if m.keys.Add(1) > m.maxKeys {
		m.keys.Add(-1)
		*d = ratelimit.Decision{}
		return errNoRoom
	}
	e := new(entry)
	sh.save(e, st)
	sh.buckets[key] = e
	m.lowerExpiryHint(st.ExpiresAt)
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
			if expires := e.expires(); expires <= now {
				delete(sh.buckets, k)
				m.keys.Add(-1)
			} else {
				m.lowerExpiryHint(expires)
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
