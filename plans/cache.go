package plans

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	// golang-lru is well kept, generic (no interface{} boxing on the hot
	// path) and starts no goroutine. Its expirable package is not used: it
	// starts a goroutine that cannot be stopped, and a TTL is a per-entry
	// field here anyway.
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/sluicehq/sluice/ratelimit"
)

// Defaults of a [Cache], each changed by the option of the same name.
const (
	// DefaultSize is how many subjects a cache holds: past it, the least
	// recently used is dropped.
	DefaultSize = 10000
	// DefaultTTL is how long a subject's plan is used before it is read
	// again. The lookup that finds it older does not wait for that read:
	// it is served the plan it finds, and so is every lookup until the
	// read lands. A change feed ([Invalidator]) makes changes apply sooner;
	// the TTL bounds how long a missed notification can go unseen.
	DefaultTTL = 30 * time.Second
	// DefaultNegativeTTL is how long a subject with no plan is served the
	// default plan before the store is asked again (as the TTL, without
	// waiting). It is shorter than the TTL so that a newly created tenant
	// gets its plan soon, even with no change feed; it is long enough that
	// traffic from unknown keys costs the store one read per key per 10s.
	DefaultNegativeTTL = 10 * time.Second
	// DefaultRetryBackoff is how long after a failed read a subject's
	// store read is retried: in between, the last good plan (or the
	// default plan) is served with no store call, so a database that is
	// down is not asked again on every request.
	DefaultRetryBackoff = time.Second
	// DefaultLoadTimeout bounds one store read. A read runs in the
	// background, shared by every lookup of the subject, without any
	// caller's deadline: this bounds it instead. No lookup waits for it
	// longer than the read wait ([DefaultReadWait]).
	DefaultLoadTimeout = 5 * time.Second
	// DefaultReadWait bounds how long a lookup waits for a store read. Only
	// two kinds of lookup wait at all: that of a subject the cache holds
	// nothing for, and that of a subject whose plan a change notification
	// ([Cache.Invalidate], [Cache.Resync]) has said may be out of date.
	// Every other lookup is served from the cache at once, and refreshes
	// it in the background when it is due. When the wait runs out, the new
	// subject is served the default plan and the notified one its old
	// plan, and so is every later lookup of it, without waiting, until the
	// read lands and fills the cache.
	//
	// 50ms is failpolicy's default deadline for a rate-limit decision: with
	// the plan store hung, a request waits for its plan no longer than it
	// may wait for the decision itself, and only once per new subject or
	// notification. A healthy store is far inside it (plans/postgres's
	// lookup takes 80-150µs, docs/plans.md says), so a subject's first
	// request, and the first after a plan change, get the plan the store
	// holds. A longer wait trades latency while the store is hung for fewer
	// requests decided on the default or old plan while it is slow; a wait
	// longer than the load timeout waits for every read to end.
	DefaultReadWait = 50 * time.Millisecond
)

// maxPlanNames bounds how many plan names a cache tracks for
// [PlanChanged] invalidation. Past it, the cache forgets them all and
// refreshes every subject, as [Cache.Resync] does.
const maxPlanNames = 4096

// DefaultPlan returns the plan a [Cache] supplies, unless [WithDefault]
// says otherwise, for subjects with no plan and for subjects whose plan
// cannot be read while no earlier read succeeded: "default", 60 requests a
// minute (a burst of 60, then one a second) with a [ratelimit.TokenBucket],
// at Version 0. That is enough for a person trying an API by hand and
// little enough that keys no plan covers, or a store outage at startup,
// cannot overload the service.
//
// Version 0 is below every stored version, so a subject's config version
// while it is served the default plan is its assignment's version: that
// of the unassignment for a subject that had a plan. A bucket built from a
// stored plan is thus never converted to the default plan at an older
// version (see [Assignment.ConfigVersion]).
func DefaultPlan() Plan {
	return Plan{Name: "default", Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(60)}}
}

// Hooks are called by a [Cache], for logs and metrics. Every field may be
// nil. They are called synchronously, possibly from many goroutines at
// once: they must be quick and safe for concurrent use.
//
// Hit and Miss count lookups: each call of [Cache.Lookup] or [Cache.Config]
// (and so of a [Cache.Supplier] func) calls exactly one of them, once, on
// the caller's goroutine, so Hit/(Hit+Miss) is the cache's hit ratio.
// Loaded, StaleServed and LoadFailed count store reads: one of them is
// called once per read (not per lookup, since lookups share a read) by
// the goroutine that read, which is the cache's, never a caller's.
type Hooks struct {
	// Hit is called for a lookup served from the cache with no store read
	// due: the subject's entry is within its TTL (or negative TTL), with
	// no invalidation or resync since its read; or a read of the subject
	// failed and its retry ([WithRetryBackoff]) is not due, so the last
	// good plan, or the default plan, is served as after the failure. It
	// is on the hot path: unset, it costs a nil check; set, the cache adds
	// no allocation to the call.
	Hit func(subject string)
	// Miss is called for a lookup that found the subject due for a store
	// read: the subject is new, or was dropped from a full cache; its TTL
	// (or negative TTL) has passed; an invalidation or a resync came since
	// its read; or a failed read's retry is due. Such a lookup starts the
	// read, or finds the subject's read in flight; it is a Miss whether it
	// then waits for the read ([WithReadWait]) or is served what the cache
	// holds at once, and also when a read ended just before it asked,
	// leaving an entry it serves with no read of its own, and when its ctx
	// ends while it waits and it returns ctx's error. So while the store
	// hangs, the lookups of a subject whose TTL has passed are misses,
	// each served its cached plan at once, until the read ends. Miss is
	// called before the lookup starts a read, so before that read's
	// Loaded, StaleServed or LoadFailed.
	Miss func(subject string)
	// Loaded is called after a read that succeeded, with the assignment the
	// store returned.
	Loaded func(subject string, a Assignment)
	// StaleServed is called after a read failed, or returned a plan that is
	// not valid (err wraps [ErrInvalidPlan]), for a subject that had been
	// read before: its last good plan is served until the read is retried.
	StaleServed func(subject string, err error)
	// LoadFailed is called after a read failed, or returned a plan that is
	// not valid, for a subject with no good read yet: the default plan is
	// served until the read is retried.
	LoadFailed func(subject string, err error)
}

func (h *Hooks) hit(subject string) {
	if h.Hit != nil {
		h.Hit(subject)
	}
}

func (h *Hooks) miss(subject string) {
	if h.Miss != nil {
		h.Miss(subject)
	}
}

func (h *Hooks) loaded(subject string, a Assignment) {
	if h.Loaded != nil {
		h.Loaded(subject, a)
	}
}

func (h *Hooks) staleServed(subject string, err error) {
	if h.StaleServed != nil {
		h.StaleServed(subject, err)
	}
}

func (h *Hooks) loadFailed(subject string, err error) {
	if h.LoadFailed != nil {
		h.LoadFailed(subject, err)
	}
}

// CacheOption configures a [Cache].
type CacheOption func(*cacheOptions) error

type cacheOptions struct {
	size         int
	ttl          time.Duration
	negativeTTL  time.Duration
	retryBackoff time.Duration
	loadTimeout  time.Duration
	readWait     time.Duration
	def          Plan
	hooks        Hooks
}

// WithSize sets how many subjects the cache holds, at least 1; the
// default is [DefaultSize].
func WithSize(n int) CacheOption {
	return func(o *cacheOptions) error {
		if n < 1 {
			return fmt.Errorf("plans: WithSize: size must be at least 1, got %d", n)
		}
		o.size = n
		return nil
	}
}

// WithTTL sets how long a subject's plan is used before it is read again,
// more than 0; the default is [DefaultTTL].
func WithTTL(d time.Duration) CacheOption {
	return func(o *cacheOptions) error {
		if d <= 0 {
			return fmt.Errorf("plans: WithTTL: TTL must be more than 0, got %v", d)
		}
		o.ttl = d
		return nil
	}
}

// WithNegativeTTL sets how long a subject with no plan is served the
// default plan before it is read again, more than 0; the default is
// [DefaultNegativeTTL].
func WithNegativeTTL(d time.Duration) CacheOption {
	return func(o *cacheOptions) error {
		if d <= 0 {
			return fmt.Errorf("plans: WithNegativeTTL: TTL must be more than 0, got %v", d)
		}
		o.negativeTTL = d
		return nil
	}
}

// WithRetryBackoff sets how long after a failed read the subject is read
// again, more than 0; the default is [DefaultRetryBackoff].
func WithRetryBackoff(d time.Duration) CacheOption {
	return func(o *cacheOptions) error {
		if d <= 0 {
			return fmt.Errorf("plans: WithRetryBackoff: backoff must be more than 0, got %v", d)
		}
		o.retryBackoff = d
		return nil
	}
}

// WithLoadTimeout bounds one store read, more than 0; the default is
// [DefaultLoadTimeout].
func WithLoadTimeout(d time.Duration) CacheOption {
	return func(o *cacheOptions) error {
		if d <= 0 {
			return fmt.Errorf("plans: WithLoadTimeout: timeout must be more than 0, got %v", d)
		}
		o.loadTimeout = d
		return nil
	}
}

// WithReadWait bounds how long a lookup waits for a store read, more than
// 0; the default is [DefaultReadWait], which says which lookups wait. A
// wait longer than the load timeout ([WithLoadTimeout]) waits for every
// read to end.
func WithReadWait(d time.Duration) CacheOption {
	return func(o *cacheOptions) error {
		if d <= 0 {
			return fmt.Errorf("plans: WithReadWait: wait must be more than 0, got %v", d)
		}
		o.readWait = d
		return nil
	}
}

// WithDefault sets the plan for subjects with no plan, and for subjects
// whose plan could never be read; the default is [DefaultPlan]. p must be
// valid as [Plan.Validate] says, except that its Version may be 0 (see
// [DefaultPlan] for why 0 is a good choice). The cache keeps a copy of
// p.Bandwidths.
func WithDefault(p Plan) CacheOption {
	return func(o *cacheOptions) error {
		if err := p.validate(0); err != nil {
			return fmt.Errorf("plans: WithDefault: %w", err)
		}
		p.Bandwidths = append([]ratelimit.Bandwidth(nil), p.Bandwidths...)
		o.def = p
		return nil
	}
}

// WithHooks sets the functions called as the cache serves lookups and
// reads its store.
func WithHooks(h Hooks) CacheOption {
	return func(o *cacheOptions) error {
		o.hooks = h
		return nil
	}
}

// Cache supplies each subject's plan from a [Store], reading the store only
// when a subject is new, its entry is older than the TTL, or a change
// notification ([Cache.Invalidate], [Cache.Resync]) says it may be out of
// date. Serving a cached subject takes no I/O and allocates nothing.
//
// A lookup never waits on the store for a subject it holds a plan for,
// unless a change notification came since that plan was read: past the
// TTL, the lookup is served the plan it finds (stale while revalidate),
// and the read runs in the background. A lookup of a new subject, or of
// one notified since its read, waits for the read, but only up to
// [WithReadWait]: then the default plan, or the old one, is served until
// the read lands. So a plan change applies on the subject's next lookup
// when the store answers within the read wait; when it does not, that
// lookup and those during the read get the old plan, and the first after
// it lands the new one.
//
// A subject is read once however many lookups want it at the same time:
// they share one read, which runs without their contexts' cancellation
// (bounded by [WithLoadTimeout]), so one caller giving up does not fail
// the others. When a read fails, or returns a plan that is not valid, the
// subject keeps its last good plan (stale-if-error), or gets the default
// plan if it never had one, and the read is retried after
// [WithRetryBackoff]. Callers therefore only see errors from their own
// contexts.
//
// A Cache is safe for concurrent use. It needs no Close: the only
// goroutines it starts are its store reads, one per subject at a time,
// each ending with its read, so within the load timeout (a Store's Lookup
// returns when its ctx ends).
type Cache struct {
	store   Store
	opts    cacheOptions
	entries *lru.Cache[string, *entry]
	// epoch counts resyncs; an entry from an earlier epoch is stale. It is
	// read without mu, on every lookup.
	epoch atomic.Uint64

	// mu orders invalidations against the entries that reads commit, so
	// that a read that was in flight when an invalidation came is never
	// committed as fresh; and it orders the start of a read against the
	// end of the last, so that a subject has one read at a time.
	mu sync.Mutex
	// gen counts invalidations and resyncs; a read that sees it change
	// while the store is asked commits its entry as stale.
	gen uint64
	// plans holds the invalidation state of each plan name that cached
	// entries were read with, up to maxPlanNames.
	plans map[string]*planState
	// flights holds each subject's read in flight, until the read commits:
	// one per read, each ending within the load timeout.
	flights map[string]*flight
}

var _ Invalidator = (*Cache)(nil)

// planState is what PlanChanged notifications have said about one plan.
type planState struct {
	// min is the highest version notified: entries read at a lower
	// version are stale.
	min atomic.Uint64
}

// raise sets min to at least v.
func (p *planState) raise(v uint64) {
	for {
		old := p.min.Load()
		if old >= v || p.min.CompareAndSwap(old, v) {
			return
		}
	}
}

// entry is one subject's cached plan. Entries are replaced, never changed,
// except for their atomic flags. An entry replaced in the cache never
// returns to it.
type entry struct {
	// served is the assignment in effect: as read, or with the default plan.
	served Assignment
	cfg    ratelimit.Config
	// good says served is from a successful read, not the default plan
	// served after failed reads or while the first read is slow.
	good bool
	// expires is when the entry is no longer fresh: zero for an entry that
	// a failed read or a slow first read left.
	expires time.Time
	// retryAt, after a failed read, is when the store may be asked again.
	retryAt time.Time
	epoch   uint64
	// plan is the invalidation state of the served plan, nil for the
	// default plan; the entry is stale once plan.min exceeds planMark.
	plan     *planState
	planMark uint64
	// invalid marks an entry that an assignment change, or a change during
	// its read, has made stale.
	invalid atomic.Bool
	// refreshing says a read of the subject is in flight that will replace
	// this entry, and that lookups serve it meanwhile without waiting.
	refreshing atomic.Bool
}

// flight is one store read of a subject, shared by the lookups that want
// it while it runs.
type flight struct {
	done chan struct{} // closed once e is set
	e    *entry        // the entry the read committed
}

// NewCache returns a cache in front of store. A nil store or a bad option
// is an error naming it.
func NewCache(store Store, opts ...CacheOption) (*Cache, error) {
	if store == nil {
		return nil, errors.New("plans: NewCache: store is nil")
	}
	o := cacheOptions{
		size:         DefaultSize,
		ttl:          DefaultTTL,
		negativeTTL:  DefaultNegativeTTL,
		retryBackoff: DefaultRetryBackoff,
		loadTimeout:  DefaultLoadTimeout,
		readWait:     DefaultReadWait,
		def:          DefaultPlan(),
	}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	entries, err := lru.New[string, *entry](o.size)
	if err != nil {
		return nil, fmt.Errorf("plans: NewCache: %w", err)
	}
	return &Cache{store: store, opts: o, entries: entries, plans: make(map[string]*planState), flights: make(map[string]*flight)}, nil
}

// Lookup returns the assignment in effect for subject: as the store last
// returned it, or, for a subject with no plan, whose plan could never be
// read, or whose first read has not landed within the read wait, with the
// default plan as its Plan (and the store's assignment version, 0 if
// none). Its ConfigVersion is the version of the config [Cache.Config]
// returns. The plan's Bandwidths are shared with the cache: callers must
// not modify them. The only errors are ctx's, when the lookup must wait
// for a read (see [WithReadWait]) and ctx ends first.
func (c *Cache) Lookup(ctx context.Context, subject string) (Assignment, error) {
	e, err := c.entry(ctx, subject)
	if err != nil {
		return Assignment{}, err
	}
	return e.served, nil
}

// Config returns the config for subject's bucket: the plan [Cache.Lookup]
// returns, at the assignment's ConfigVersion. For a cached subject it
// allocates nothing. The config shares its Bandwidths with the cache:
// callers must not modify them. The only errors are ctx's, when the lookup
// must wait for a read (see [WithReadWait]) and ctx ends first.
func (c *Cache) Config(ctx context.Context, subject string) (ratelimit.Config, error) {
	e, err := c.entry(ctx, subject)
	if err != nil {
		return ratelimit.Config{}, err
	}
	return e.cfg, nil
}

// Supplier returns a config supplier for subject, for
// [ratelimit.Limiter.Bucket]: it calls [Cache.Config].
func (c *Cache) Supplier(subject string) func(context.Context) (ratelimit.Config, error) {
	return func(ctx context.Context) (ratelimit.Config, error) { return c.Config(ctx, subject) }
}

// Bucket returns l's bucket at key, limited by subject's plan. Several keys
// may share one subject: a tenant's plan may limit each of its API keys.
func (c *Cache) Bucket(l *ratelimit.Limiter, key, subject string) *ratelimit.Bucket {
	return l.Bucket(key, c.Supplier(subject))
}

// Invalidate makes cached entries that ch says are out of date read again
// at their next use, which waits for the read up to [WithReadWait]: for
// [PlanChanged], every subject on plan ch.ID read at a version below
// ch.Version; for [AssignmentChanged], subject ch.ID if read at an
// assignment version below ch.Version. It takes constant time. Duplicate
// and out-of-order changes are harmless. A change of an unknown kind is
// taken as [Cache.Resync].
func (c *Cache) Invalidate(ch Change) {
	switch ch.Kind {
	case PlanChanged:
		c.mu.Lock()
		defer c.mu.Unlock()
		c.gen++
		if p := c.plans[ch.ID]; p != nil {
			p.raise(ch.Version)
		}
	case AssignmentChanged:
		c.mu.Lock()
		defer c.mu.Unlock()
		c.gen++
		if e, ok := c.entries.Peek(ch.ID); ok && e.served.Version < ch.Version {
			e.invalid.Store(true)
		}
	default:
		c.Resync()
	}
}

// Resync makes every cached entry read again at its next use, which waits
// for the read up to [WithReadWait], as after a change feed reconnects
// and may have missed changes. An entry whose read then fails, or does not
// land within the wait, is still served, as stale.
func (c *Cache) Resync() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resyncLocked()
}

func (c *Cache) resyncLocked() {
	c.gen++
	c.epoch.Add(1)
}

// entry returns the entry to serve subject now, starting a read of it if
// one is due.
func (c *Cache) entry(ctx context.Context, subject string) (*entry, error) {
	now := time.Now()
	e, ok := c.entries.Get(subject)
	if ok && c.usable(e, now) {
		c.opts.hooks.hit(subject)
		return e, nil
	}
	c.opts.hooks.miss(subject)
	if ok && !c.mustWait(e) {
		return c.revalidate(ctx, subject, e), nil
	}
	return c.wait(ctx, subject, e)
}

// usable reports whether e may be served at now with no store read due:
// it is fresh, or a read failed and its retry is not due.
func (c *Cache) usable(e *entry, now time.Time) bool {
	return c.fresh(e, now) || now.Before(e.retryAt)
}

// fresh reports whether e is within its TTL at now, with no invalidation
// or resync since its read saying that it may be out of date.
func (c *Cache) fresh(e *entry, now time.Time) bool {
	return now.Before(e.expires) && !c.notified(e)
}

// notified reports whether an invalidation or a resync since e was
// committed says that it may be out of date.
func (c *Cache) notified(e *entry) bool {
	return e.invalid.Load() || e.epoch != c.epoch.Load() || (e.plan != nil && e.plan.min.Load() > e.planMark)
}

// mustWait reports whether a lookup that finds e due for a read waits for
// it: when a notification says e may be out of date, unless lookups are to
// serve e without waiting until a read in flight replaces it (one started
// before the notification, or one a lookup has waited for in vain).
func (c *Cache) mustWait(e *entry) bool {
	return c.notified(e) && !e.refreshing.Load()
}

// revalidate returns e, which is due for a read, to be served while the
// read runs, starting it unless it is in flight. If a read has landed
// since e was found, its entry is returned instead.
func (c *Cache) revalidate(ctx context.Context, subject string, e *entry) *entry {
	if e.refreshing.Load() {
		return e
	}
	if landed, _ := c.refresh(ctx, subject); landed != nil {
		return landed
	}
	// The read will replace e, or has already: later lookups that find e
	// need not start another.
	e.refreshing.Store(true)
	return e
}

// wait returns subject's entry once its read lands, waiting no longer than
// the read wait: after it, the entry found (old, nil for a subject the
// cache holds nothing for) is served until the read lands. ctx ending
// returns ctx's error to this caller only.
func (c *Cache) wait(ctx context.Context, subject string, old *entry) (*entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	landed, f := c.refresh(ctx, subject)
	if landed != nil {
		return landed, nil
	}
	timer := time.NewTimer(c.opts.readWait)
	defer timer.Stop()
	select {
	case <-f.done:
		return f.e, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer.C:
		return c.waitedOut(subject, old), nil
	}
}

// refresh returns subject's read in flight, starting one if none is. If
// a usable entry has landed since the caller looked, it returns that
// instead, and starts nothing: reading again would make two reads of one
// stampede.
func (c *Cache) refresh(ctx context.Context, subject string) (*entry, *flight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.flights[subject]; f != nil {
		return nil, f
	}
	if e, ok := c.entries.Peek(subject); ok && c.usable(e, time.Now()) {
		return e, nil
	}
	f := &flight{done: make(chan struct{})}
	c.flights[subject] = f
	// The read is shared: it must not end with this caller's ctx, but it
	// keeps its values (trace spans).
	go c.read(context.WithoutCancel(ctx), subject, c.gen, f)
	return nil, f
}

// waitedOut returns what to serve subject when a lookup has waited the
// read wait for its read in vain, old being the entry the lookup found:
// the entry now cached, or, for a subject with none, the default plan,
// cached until the read lands. Either way, later lookups do not wait for
// this read.
func (c *Cache) waitedOut(subject string, old *entry) *entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries.Peek(subject); ok {
		if e == old {
			e.refreshing.Store(true)
		}
		return e
	}
	e := &entry{served: c.withDefault(subject, 0), epoch: c.epoch.Load()}
	e.cfg = e.served.Config()
	// Unless the read has ended (and the entry it committed been dropped
	// from a full cache), it will replace this one.
	e.refreshing.Store(c.flights[subject] != nil)
	c.entries.Add(subject, e)
	return e
}

// read asks the store for subject, commits the entry to serve from now on
// and ends f with it. gen is c.gen when the read began.
func (c *Cache) read(ctx context.Context, subject string, gen uint64, f *flight) {
	defer close(f.done)
	ctx, cancel := context.WithTimeout(ctx, c.opts.loadTimeout)
	a, err := c.store.Lookup(ctx, subject)
	cancel()
	if err == nil {
		err = checkAssignment(subject, a)
	}
	now := time.Now()
	if err != nil {
		f.e = c.commitFailure(subject, err, now)
		return
	}
	f.e = c.commitRead(subject, a, gen, now)
	c.opts.hooks.loaded(subject, a)
}

// checkAssignment rejects an assignment that the store should not have
// returned, so that a bad row never reaches a limiter.
func checkAssignment(subject string, a Assignment) error {
	if a.Version > MaxVersion {
		return fmt.Errorf("%w: subject %q: assignment Version must be at most 2^53-1, got %d", ErrInvalidPlan, subject, a.Version)
	}
	if a.Plan.Name == "" {
		return nil
	}
	return a.Plan.Validate()
}

// commitRead caches what a successful read returned, ending the subject's
// flight. gen is c.gen when the read began: if it changed, an invalidation
// may have come between the store's answer and now, so the entry is
// committed stale.
func (c *Cache) commitRead(subject string, a Assignment, gen uint64, now time.Time) *entry {
	e := &entry{good: true, expires: now.Add(c.opts.ttl)}
	named := a.Plan.Name != ""
	if !named {
		a = c.withDefault(subject, a.Version)
		e.expires = now.Add(c.opts.negativeTTL)
	}
	e.served = a
	e.cfg = a.Config()

	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		e.invalid.Store(true)
	}
	if named {
		e.plan = c.planState(a.Plan.Name)
		// A notified version above the one read came before the read
		// began (gen would have changed otherwise): the store's answer is
		// the newer one, and must not be read again on every use.
		e.planMark = max(a.Plan.Version, e.plan.min.Load())
	}
	e.epoch = c.epoch.Load()
	c.entries.Add(subject, e)
	delete(c.flights, subject)
	return e
}

// commitFailure caches what a failed read leaves, ending the subject's
// flight: the last good entry, or the default plan, to be served until the
// retry. The notifications before it are answered: the read that failed
// was their read, so the retry does not wait.
func (c *Cache) commitFailure(subject string, err error, now time.Time) *entry {
	e := &entry{retryAt: now.Add(c.opts.retryBackoff)}

	c.mu.Lock()
	prev, ok := c.entries.Peek(subject)
	stale := ok && prev.good
	if stale {
		e.served, e.cfg, e.good = prev.served, prev.cfg, true
		if prev.plan != nil {
			e.plan, e.planMark = prev.plan, max(prev.planMark, prev.plan.min.Load())
		}
	} else {
		e.served = c.withDefault(subject, 0)
		e.cfg = e.served.Config()
	}
	e.epoch = c.epoch.Load()
	c.entries.Add(subject, e)
	delete(c.flights, subject)
	c.mu.Unlock()

	if stale {
		c.opts.hooks.staleServed(subject, err)
	} else {
		c.opts.hooks.loadFailed(subject, err)
	}
	return e
}

// withDefault is subject's assignment to the default plan, at the
// assignment version the store gave.
func (c *Cache) withDefault(subject string, version uint64) Assignment {
	return Assignment{Subject: subject, Version: version, Plan: c.opts.def}
}

// planState returns the invalidation state of plan name, starting to track
// it if need be. Tracking more than maxPlanNames plans starts afresh with a
// resync. c.mu must be held.
func (c *Cache) planState(name string) *planState {
	if p := c.plans[name]; p != nil {
		return p
	}
	if len(c.plans) >= maxPlanNames {
		clear(c.plans)
		c.resyncLocked()
	}
	p := new(planState)
	c.plans[name] = p
	return p
}
