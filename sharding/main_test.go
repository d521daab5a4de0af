package sharding

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// epoch is where every test's fake clock starts.
var epoch = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// newMemory returns a memory backend on clock with no background sweep,
// closed when the test ends.
func newMemory(t testing.TB, clock ratelimit.Clock) *memory.Backend {
	m := memory.New(memory.WithClock(clock), memory.WithSweepInterval(0))
	t.Cleanup(func() { m.Close() })
	return m
}

// mustNew is New that fails the test on error.
func mustNew(t testing.TB, next ratelimit.Backend, opts ...Option) *Backend {
	t.Helper()
	b, err := New(next, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// options is rules as New's options.
func options(rules []Rule) []Option {
	opts := make([]Option, len(rules))
	for i, r := range rules {
		opts[i] = r
	}
	return opts
}

func config(bws ...ratelimit.Bandwidth) ratelimit.Config {
	return ratelimit.Config{Bandwidths: bws}
}

func consume(n int64) ratelimit.Request  { return ratelimit.Request{Op: ratelimit.Consume, Tokens: n} }
func estimate(n int64) ratelimit.Request { return ratelimit.Request{Op: ratelimit.Estimate, Tokens: n} }
func upTo(n int64) ratelimit.Request     { return ratelimit.Request{Op: ratelimit.ConsumeUpTo, Tokens: n} }
func add(n int64) ratelimit.Request      { return ratelimit.Request{Op: ratelimit.Add, Tokens: n} }
func inspect() ratelimit.Request         { return ratelimit.Request{Op: ratelimit.Inspect} }
func reset() ratelimit.Request           { return ratelimit.Request{Op: ratelimit.Reset} }

func reserve(n int64, maxWait time.Duration) ratelimit.Request {
	return ratelimit.Request{Op: ratelimit.Reserve, Tokens: n, MaxWait: maxWait}
}

func replace(s ratelimit.Inheritance) ratelimit.Request {
	return ratelimit.Request{Op: ratelimit.Replace, Strategy: s}
}

// do applies req and fails the test on error.
func do(t testing.TB, b ratelimit.Backend, key string, cfg ratelimit.Config, req ratelimit.Request) ratelimit.Decision {
	t.Helper()
	d, err := b.Do(context.Background(), key, cfg, req)
	if err != nil {
		t.Fatalf("Do(%q, %v %d): %v", key, req.Op, req.Tokens, err)
	}
	return d
}

// fixed is an affinity that sends every request first to sub-bucket h
// modulo the sub-buckets.
func fixed(h uint64) func(context.Context, string) uint64 {
	return func(context.Context, string) uint64 { return h }
}

// slotted is a Backend with slots, as the Redis backends lay keys out
// (redisscript.Slot), over a memory backend.
type slotted struct{ ratelimit.Backend }

func (slotted) Slot(key string) (int, bool) { return redisscript.Slot("", key), true }

var _ ratelimit.SlotMapper = slotted{}

// cluster is a Backend with all three optional capabilities: slots as
// slotted has them, and a fixed topology of masters.
type cluster struct {
	slotted
	masters []ratelimit.Master
}

func (c *cluster) Node(key string) string {
	if m := ratelimit.Owner(c.masters, redisscript.Slot("", key)); m >= 0 {
		return c.masters[m].Addr
	}
	return ""
}

func (c *cluster) Masters(context.Context) ([]ratelimit.Master, error) { return c.masters, nil }

var (
	_ ratelimit.NodeLocator      = (*cluster)(nil)
	_ ratelimit.TopologyReporter = (*cluster)(nil)
)

// threeMasters splits the slots as redis-cli --cluster create does for
// three masters.
var threeMasters = []ratelimit.Master{
	{Addr: "10.0.0.1:6379", Slots: []ratelimit.SlotRange{{First: 0, Last: 5460}}},
	{Addr: "10.0.0.2:6379", Slots: []ratelimit.SlotRange{{First: 5461, Last: 10922}}},
	{Addr: "10.0.0.3:6379", Slots: []ratelimit.SlotRange{{First: 10923, Last: 16383}}},
}

// recorder is a Backend over another that can fail or deny chosen keys,
// run a hook before each call, and records the keys it was called with.
type recorder struct {
	next ratelimit.Backend

	mu       sync.Mutex
	fail     map[string]error // key -> the error its calls return
	degraded map[string]bool  // key -> a fail policy's Closed denial
	before   func(ctx context.Context, key string)
	log      []string // the keys called, in order
}

func newRecorder(next ratelimit.Backend) *recorder {
	return &recorder{next: next, fail: map[string]error{}, degraded: map[string]bool{}}
}

func (r *recorder) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	r.mu.Lock()
	r.log = append(r.log, key)
	err, degraded, before := r.fail[key], r.degraded[key], r.before
	r.mu.Unlock()
	if before != nil {
		before(ctx, key)
	}
	switch {
	case err != nil:
		return ratelimit.Decision{}, err
	case degraded:
		// What failpolicy's Closed mode answers for a store that failed.
		return ratelimit.Decision{Degraded: true, Limit: cfg.MinCapacity(), RetryAfter: time.Second}, nil
	}
	return r.next.Do(ctx, key, cfg, req)
}

// calls returns the keys called since the last calls, and forgets them.
func (r *recorder) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	log := r.log
	r.log = nil
	return log
}

func (r *recorder) setFail(key string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail[key] = err
}

func (r *recorder) setDegraded(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.degraded[key] = true
}

// subKeys returns the keys of key's sub-buckets in b.
func subKeys(t testing.TB, b *Backend, key string) []string {
	t.Helper()
	subs, err := b.Slots(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(subs))
	for i, s := range subs {
		keys[i] = s.Key
	}
	return keys
}

// remainingEach returns what each of the first n sub-buckets of key holds,
// as an Inspect of it straight in next says.
func remainingEach(t testing.TB, b *Backend, next ratelimit.Backend, key string, cfg ratelimit.Config, n int) []int64 {
	t.Helper()
	keys := subKeys(t, b, key)
	rem := make([]int64, n)
	for i := range n {
		rem[i] = do(t, next, keys[i], subConfig(cfg, n, i), inspect()).Remaining
	}
	return rem
}

func total(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

var (
	errDown     = fmt.Errorf("%w: connection refused", ratelimit.ErrBackendUnavailable)
	errTimeout  = fmt.Errorf("%w: i/o timeout", ratelimit.ErrTimeout)
	errRejected = fmt.Errorf("%w: WRONGTYPE", ratelimit.ErrKeyRejected)
	errOther    = errors.New("a reply the backend could not decode")
)

// newClock is a fake clock at epoch.
func newClock() *ratelimittest.Clock { return ratelimittest.NewClock(epoch) }

func isInvalidKey(err error) bool { return errors.Is(err, ratelimit.ErrInvalidKey) }
