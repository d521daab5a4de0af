// Package memory is the in-process [ratelimit.Backend]: buckets in a
// concurrent hash map whose reads take no lock, one lock per bucket, for a
// single process or as the local fallback of a distributed limiter. A
// token bucket of one greedy bandwidth that starts full, the common limit,
// is decided by a Consume without the lock, with one compare-and-swap.
//
// A bucket that has refilled equals an absent one (see
// [ratelimit.State.ExpiresAt]), so it is dropped: at once when a call leaves
// it so, otherwise by a background sweep once it has expired. The number of
// stored buckets is capped (see [WithMaxKeys]).
//
// The Backend also holds concurrency permits ([ratelimit.PermitBackend]):
// each key's holders, decided by [ratelimit.ApplyPermit] under that key's
// lock, dropped by the sweep once the last is released or its lease ends.
//
// # Concurrency
//
// A Backend is safe for concurrent use. Calls on different keys never wait
// for each other; calls on one key take turns on that bucket's lock, which
// each holds only while it decides, except the Consumes on a token bucket
// of one greedy bandwidth that starts full, with the config the bucket was
// built for: those meet only on one word,
// which each updates with a compare-and-swap, and decide as the calls
// under the lock do. An existing key's decision does not allocate.
package memory

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

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
	// buckets maps each key to its bucket. Its reads take no lock, so
	// calls on one hot key meet only on that bucket.
	buckets *xsync.Map[string, *bucket]
	// shapes are the shapes new buckets took last, for the next ones on
	// the same configs to share without a lookup table; next is the slot
	// the next new shape goes to.
	shapes [ringShapes]atomic.Pointer[shape]
	next   atomic.Uint32

	maxKeys int64
	keys    atomic.Int64 // buckets held, never above maxKeys
	sems    semaphores   // the concurrency permits (see DoPermit)
	// expiryHint is a time before which no held bucket expires, learned by
	// a sweep; until then neither the periodic sweep nor a new key at the
	// cap sweeps again (the key is refused). Lowered by every decision
	// that stores an earlier expiry.
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

// bucket is one key's bucket, in one 64-byte cache line: its lock, its
// word and its state. A hot key's decisions pass that one line between
// CPUs and no other.
type bucket struct {
	// mu is held by every call that decides on the entry, which holds the
	// state unless the bucket is published.
	mu sync.Mutex
	// word is a published bucket's v (see Published buckets), or
	// unpublished, held or dead; dead once the bucket has left the map,
	// when a call that found it before then looks the key up again.
	word atomic.Int64
	entry
}

// newBucket returns an empty bucket, not published.
func newBucket() *bucket {
	b := new(bucket)
	b.word.Store(unpublished)
	return b
}

// compactBands is the most bandwidths a compact entry holds.
const compactBands = 2

// ringShapes is how many shapes a Backend remembers for its new buckets to
// share: a few configs in turn share without a lookup table.
const ringShapes = 8

// entry is one bucket's state, in 48 bytes: small, so that a service's
// hundred thousand keys take a few MB rather than the 22 MB of whole
// states. A bucket of at most compactBands bandwidths whose state is only
// their levels and stamps (a token bucket, GCRA, LeakyBucket, a fixed
// window, a sliding window counter whose previous windows are empty) keeps
// those and its expiry here, and what its config fixes (the fingerprint,
// version and config, each bandwidth's ID, capacity, scale and rate) in
// shape, which the buckets on one config share. Any other bucket has a
// shape of its own that holds its whole state in full.
type entry struct {
	shape     *shape
	expiresAt int64
	level     [compactBands]int64
	stamp     [compactBands]int64
}

// scratch is the whole state of a compact bucket, its Bands in bands: as
// it is decided, and, levels, stamps and expiry zero, in its shape.
type scratch struct {
	st    ratelimit.State
	bands [compactBands]ratelimit.BandState
}

// shape is what a config fixes in a bucket's state: proto, and the line
// of the buckets that may be published. A shape with full set is instead
// one bucket's whole state. A shared shape is never written once
// published.
type shape struct {
	proto scratch
	line  line
	full  *ratelimit.State
}

// scratches recycles the scratch space of decisions, so that none
// allocates: Apply's state cannot live on the caller's stack, as the
// compiler cannot prove that Apply keeps no pointer to it. Each CPU reuses
// its own, which stays in its cache.
var scratches = sync.Pool{New: func() any { return new(scratch) }}

// expires is when the bucket becomes the same as an absent one. Called by
// the bucket's owner.
func (e *entry) expires() int64 {
	if full := e.shape.full; full != nil {
		return full.ExpiresAt
	}
	return e.expiresAt
}

// load makes sc the state of the compact bucket e, for Apply.
func (e *entry) load(sc *scratch) {
	*sc = e.shape.proto
	n := len(sc.st.Bands)
	for i := range n {
		sc.bands[i].Level, sc.bands[i].Stamp = e.level[i], e.stamp[i]
	}
	sc.st.Bands, sc.st.ExpiresAt = sc.bands[:n], e.expiresAt
}

// save stores st, which Apply left after a call with cfg, in b, key's
// bucket, which the caller owns: compact when it fits, in a shape m's
// buckets share, else whole; and publishes it if it may be. A bucket that
// has been published keeps its shape: when st needs another, a new bucket
// takes b's place.
func (m *Backend) save(key string, b *bucket, st *ratelimit.State, cfg *ratelimit.Config) {
	sh := b.shape
	switch {
	case !fits(st):
		full := *st
		full.Bands = slices.Clone(st.Bands)
		sh = &shape{full: &full}
	case sh == nil || !sh.holds(st):
		sh = m.shapeOf(st, cfg)
	}
	if sh != b.shape && b.word.Load() == held {
		m.replace(key, b, st, sh)
		return
	}
	b.set(st, sh)
}

// set makes st, of shape sh, b's state, and publishes it if it may be.
// Called by the owner of b, which has not been published or has shape sh.
func (b *bucket) set(st *ratelimit.State, sh *shape) {
	if sh.full != nil {
		b.entry = entry{shape: sh}
		return
	}
	if b.shape != sh { // a published bucket's calls read it without the lock
		b.shape = sh
	}
	b.expiresAt = st.ExpiresAt
	for i := range st.Bands {
		b.level[i], b.stamp[i] = st.Bands[i].Level, st.Bands[i].Stamp
	}
	b.publish()
}

// replace puts a new bucket holding st, of shape sh, in the map at key in
// place of b, which the caller owns and which then has left the map. As in
// create, a replacement racing Close does not stay in the map after it.
func (m *Backend) replace(key string, b *bucket, st *ratelimit.State, sh *shape) {
	nb := newBucket()
	nb.mu.Lock()
	defer nb.mu.Unlock()
	m.buckets.Store(key, nb)
	b.word.Store(dead)
	if m.closed.Load() {
		m.drop(key, nb)
		return
	}
	nb.set(st, sh)
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
	pr := &p.proto.st
	if p.full != nil || pr.Fingerprint != st.Fingerprint || pr.Algorithm != st.Algorithm || pr.Version != st.Version ||
		pr.Config != st.Config || len(pr.Bands) != len(st.Bands) || !p.line.near(st) {
		return false
	}
	for i := range st.Bands {
		a, b := &p.proto.bands[i], &st.Bands[i]
		if a.ID != b.ID || a.Capacity != b.Capacity || a.Scale != b.Scale || a.Rate != b.Rate {
			return false
		}
	}
	return true
}

// shapeOf returns a shape holding st, which Apply left after a call with
// cfg: one of the last ringShapes that m made, or a new one, which
// replaces the oldest of them.
func (m *Backend) shapeOf(st *ratelimit.State, cfg *ratelimit.Config) *shape {
	for i := range m.shapes {
		if p := m.shapes[i].Load(); p != nil && p.adopts(st) {
			return p
		}
	}
	p := new(shape)
	p.proto.st = *st
	p.proto.st.ExpiresAt = 0
	for i := range st.Bands {
		p.proto.bands[i] = st.Bands[i]
		p.proto.bands[i].Level, p.proto.bands[i].Stamp = 0, 0
	}
	p.proto.st.Bands = p.proto.bands[:len(st.Bands)]
	p.line = newLine(st, cfg)
	m.shapes[m.next.Add(1)%ringShapes].Store(p)
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
	c, pc := st.Config, p.proto.st.Config
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
// [DefaultMaxKeys]), and the keys that hold concurrency permits, counted
// apart, at n too (see [Backend.DoPermit]). When a new key arrives at the cap, the Backend drops
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
	m := &Backend{
		buckets: xsync.NewMap[string, *bucket](),
		sems:    semaphores{m: xsync.NewMap[string, *semaphore]()},
		maxKeys: int64(o.maxKeys),
		clock:   o.clock,
		origin:  time.Now(),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	m.originMicros = m.origin.UnixMicro()
	m.expiryHint.Store(math.MaxInt64) // no bucket yet
	if o.sweep > 0 {
		go m.sweepEvery(o.sweep)
	} else {
		close(m.done)
	}
	return m
}

// errNoRoom tells Do that a new key met the cap and a sweep may make room.
var errNoRoom = errors.New("memory: no room")

// Do implements [ratelimit.Backend]. It never blocks but on a bucket's
// lock, so it reads ctx once, first: a call whose context is done returns
// the context's error and takes nothing. A new bucket keeps key as passed:
// a key sliced from a large buffer keeps that buffer alive as long as the
// bucket, so pass a copy ([strings.Clone]) of such a key.
func (m *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (d ratelimit.Decision, err error) {
	// The clock first, so that a Consume on a published bucket reads the
	// bucket's word just before it commits: other CPUs' calls take that
	// cache line away as they commit.
	clock := m.now()
	var b *bucket
	var l *line
	var v int64
	if req.Op == ratelimit.Consume {
		if b, _ = m.buckets.Load(key); b != nil {
			l, v = b.publishedFor(&cfg)
		}
	}
	switch {
	case l != nil && l.takes(&req):
		// A plain Consume with the config the bucket was drawn for.
	case l != nil:
		err = ratelimit.CheckOp(cfg, req) // a key held and a config its bucket was drawn for are good
	default:
		err = ratelimit.CheckRequest(key, cfg, req)
	}
	if err != nil {
		return d, err
	}
	if ctx.Err() != nil {
		return d, ctxerr.Caller(ctx, fmt.Sprintf("memory: %v on key %q", req.Op, key), nil)
	}
	if m.closed.Load() {
		return d, ErrClosed
	}
	now := clock
	if req.Ago > 0 {
		now = max(0, clock-req.Ago.Microseconds()) // decided as of then
	}
	err = m.decide(&d, key, found{b, l, v}, &cfg, &req, now)
	if err == errNoRoom {
		m.makeRoom(clock) // what has expired by now, not by then
		err = m.decide(&d, key, found{}, &cfg, &req, now)
		if err == errNoRoom {
			err = fmt.Errorf("%w: key %q is new, and the Backend holds WithMaxKeys(%d) buckets", ErrTooManyKeys, key, m.maxKeys)
		}
	}
	return d, err
}

// found is what a lookup of a key found: its bucket b, or nil; and for a
// Consume on b published for the call's config, b's line and v, else a
// nil l.
type found struct {
	b *bucket
	l *line
	v int64
}

// decide decides req on the bucket at key into d, starting from f, what a
// lookup of key found.
func (m *Backend) decide(d *ratelimit.Decision, key string, f found, cfg *ratelimit.Config, req *ratelimit.Request, now int64) error {
	for ; ; f = (found{}) {
		if f.b == nil {
			var ok bool
			if f.b, ok = m.buckets.Load(key); !ok {
				var err error
				if f.b, err = m.create(d, key, cfg, req, now); f.b == nil {
					return err
				}
				// Another call created the bucket meanwhile: decide on it.
			}
			if req.Op == ratelimit.Consume {
				f.l, f.v = f.b.publishedFor(cfg)
			}
		}
		if f.l != nil {
			switch decideFast(d, f.b, f.l, f.v, req.Tokens, now) {
			case decided:
				return nil
			case gone:
				continue
			}
		}
		if m.decideOn(d, key, f.b, cfg, req, now) {
			return nil
		}
		// The bucket left the map since the lookup: the key is absent
		// again, or another call has made it a new bucket.
	}
}

// decideOn decides req on b, which the map held at key, into d, under b's
// lock, unless b has left the map since; it reports whether it decided.
func (m *Backend) decideOn(d *ratelimit.Decision, key string, b *bucket, cfg *ratelimit.Config, req *ratelimit.Request, now int64) bool {
	sc := scratches.Get().(*scratch)
	defer scratches.Put(sc)
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.own() {
		return false
	}
	m.apply(d, key, b, sc, cfg, req, now)
	return true
}

// apply decides req on b, key's bucket, into d, in sc, and drops b if it
// is then the same as an absent one. Called by the owner of b.
func (m *Backend) apply(d *ratelimit.Decision, key string, b *bucket, sc *scratch, cfg *ratelimit.Config, req *ratelimit.Request, now int64) {
	st := b.shape.full
	if st != nil {
		*d = ratelimit.Apply(st, *cfg, *req, now)
	} else {
		b.load(sc)
		st = &sc.st
		*d = ratelimit.Apply(st, *cfg, *req, now)
	}
	if st.ExpiresAt <= now {
		m.drop(key, b)
		return
	}
	if st == &sc.st {
		m.save(key, b, st, cfg)
	}
	// After save, which may put a new bucket in b's place: a sweep that
	// resets expiryHint after this finds that bucket in the map.
	m.lowerExpiryHint(st.ExpiresAt)
}

// drop takes b, key's bucket, out of the map. Called by the owner of b,
// which holds b.mu: while b is not dead, the map holds it at key, as only
// drop and replace change a key's bucket, and each under its lock.
func (m *Backend) drop(key string, b *bucket) {
	b.word.Store(dead)
	m.buckets.Delete(key)
	m.keys.Add(-1)
}

// create decides req for key, whose bucket was absent, into d, and stores
// the bucket unless it is still the same as an absent one (full, and no
// InitialTokens below capacity). If another call stored key's bucket
// first, create decides nothing and returns that bucket. A call racing
// Close stores no bucket after it: create checks closed again once its
// bucket is in the map, and Close, which sets closed first, then drops
// every bucket in the map.
func (m *Backend) create(d *ratelimit.Decision, key string, cfg *ratelimit.Config, req *ratelimit.Request, now int64) (*bucket, error) {
	if m.closed.Load() {
		return nil, ErrClosed
	}
	sc := scratches.Get().(*scratch)
	defer scratches.Put(sc)
	st := &sc.st
	*st = ratelimit.State{Bands: sc.bands[:0]}
	*d = ratelimit.Apply(st, *cfg, *req, now)
	if st.ExpiresAt <= now {
		return nil, nil // the same as absent: nothing to store
	}
	if m.keys.Add(1) > m.maxKeys {
		m.keys.Add(-1)
		*d = ratelimit.Decision{}
		return nil, errNoRoom
	}
	nb := newBucket()
	nb.mu.Lock()
	defer nb.mu.Unlock()
	if b, loaded := m.buckets.LoadOrStore(key, nb); loaded {
		m.keys.Add(-1)
		*d = ratelimit.Decision{}
		return b, nil
	}
	if m.closed.Load() {
		m.drop(key, nb)
		*d = ratelimit.Decision{}
		return nil, ErrClosed
	}
	m.save(key, nb, st, cfg)
	m.lowerExpiryHint(st.ExpiresAt)
	return nil, nil
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
			now := m.now()
			if now >= m.expiryHint.Load() {
				m.sweep(now) // else none can have expired yet
			}
			m.sweepPermits(now)
		}
	}
}

// sweep drops every bucket expired at now, one at a time under its own
// lock, and sets expiryHint to the earliest time a remaining one expires.
// A published bucket that has not expired is passed over without its lock,
// so that its calls go on deciding without it: its expiry, read from its
// word, only moves later until a call that owns it lowers expiryHint.
func (m *Backend) sweep(now int64) {
	m.expiryHint.Store(math.MaxInt64)
	m.buckets.Range(func(key string, b *bucket) bool {
		if v := b.word.Load(); v > dead {
			if expires := b.shape.line.expiry(v); expires > now {
				m.lowerExpiryHint(expires)
				return true
			}
		}
		b.mu.Lock()
		if b.own() {
			if expires := b.expires(); expires <= now {
				m.drop(key, b)
			} else {
				m.lowerExpiryHint(expires)
				b.publish()
			}
		}
		b.mu.Unlock()
		return true
	})
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
		m.buckets.Range(func(key string, b *bucket) bool {
			b.mu.Lock()
			if b.own() {
				m.drop(key, b)
			}
			b.mu.Unlock()
			return true
		})
		m.sems.m.Range(func(key string, s *semaphore) bool {
			s.mu.Lock()
			if !s.dead {
				m.dropSemaphore(key, s)
			}
			s.mu.Unlock()
			return true
		})
	})
	return nil
}

var _ ratelimit.Backend = (*Backend)(nil)
