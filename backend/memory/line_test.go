package memory

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// published reports whether key's bucket is published for cfg: a Consume
// with cfg would be decided without the lock.
func (m *Backend) published(key string, cfg *ratelimit.Config) bool {
	b, ok := m.buckets.Load(key)
	if !ok {
		return false
	}
	l, _ := b.publishedFor(cfg)
	return l != nil
}

// TestPublishedMatchesApply runs random calls on one key of a Backend and
// on ratelimit.Apply, and checks that every decision matches. The configs
// are mostly ones whose buckets are published, of rates that do and do not
// divide their periods, with and without IDs and versions, and now and
// then one that is not (two bandwidths, an interval refill, InitialTokens,
// GCRA), which replaces a published bucket or is replaced by one. The
// calls are mostly Consumes, with and without an Ago, between every other
// op; the clock moves forward by steps around a token's time, stands still
// or jumps past a full refill, and now and then steps back. The test fails
// if too few Consumes found the bucket published, so that it cannot pass on
// the lock's path alone.
func TestPublishedMatchesApply(t *testing.T) {
	configs := []ratelimit.Config{
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}},
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(time.Minute, 7).WithBurst(20).WithID("burst")}},
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(997*time.Microsecond, 13).WithBurst(50)}},
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3).WithID("hourly")}, Version: 1},
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3).WithID("hourly")}, Version: 2},
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3).WithID("hourly")}}, // stale once version 2 is in
	}
	others := []ratelimit.Config{
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10).WithID("s"), ratelimit.PerMinute(100).WithID("m")}},
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10).WithRefill(ratelimit.Interval)}},
		{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10).WithInitialTokens(4)}},
		{Algorithm: ratelimit.GCRA, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}},
	}
	ops := []ratelimit.Op{ratelimit.Estimate, ratelimit.Inspect, ratelimit.ConsumeUpTo, ratelimit.Reserve, ratelimit.Add, ratelimit.Reset, ratelimit.Replace}
	ctx := context.Background()
	var consumes, fast int
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 29))
		clock := ratelimittest.NewClock(time.Unix(1_700_000_000, 0))
		m := New(WithClock(clock), WithSweepInterval(0))
		var ref ratelimit.State
		cfg := configs[0]
		for step := range 600 {
			switch r := rng.IntN(100); {
			case r < 3:
				cfg = others[rng.IntN(len(others))]
			case r < 10:
				cfg = configs[rng.IntN(len(configs))]
			}
			period := cfg.Bandwidths[0].RefillPeriod / time.Duration(cfg.Bandwidths[0].RefillTokens)
			switch r := rng.IntN(100); {
			case r < 20: // stands still
			case r < 23:
				clock.Advance(time.Duration(cfg.Bandwidths[0].Capacity+1) * period) // full again
			case r < 26:
				clock.Advance(-time.Duration(rng.Int64N(int64(3 * period))))
			default:
				clock.Advance(time.Duration(rng.Int64N(int64(2*period))) + 1)
			}
			req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1 + rng.Int64N(min(3, cfg.MinCapacity()))}
			if rng.IntN(100) < 30 {
				req.Op = ops[rng.IntN(len(ops))]
				req.MaxWait = time.Duration(rng.Int64N(int64(4 * period)))
				req.Strategy = ratelimit.Inheritance(rng.IntN(int(ratelimit.Additive) + 1))
			}
			if (req.Op == ratelimit.Consume || req.Op == ratelimit.ConsumeUpTo || req.Op == ratelimit.Reserve) && rng.IntN(100) < 15 {
				req.Ago = time.Duration(rng.Int64N(int64(3*period))/1000) * time.Microsecond
			}
			if req.Op == ratelimit.Consume {
				consumes++
				if m.published("k", &cfg) {
					fast++
				}
			}
			now := max(0, clock.Now().UnixMicro()-req.Ago.Microseconds())
			want := ratelimit.Apply(&ref, cfg, req, now)
			if ref.ExpiresAt <= now {
				ref = ratelimit.State{} // the Backend drops a bucket left so
			}
			got, err := m.Do(ctx, "k", cfg, req)
			if err != nil {
				t.Fatalf("seed %d, step %d: %+v with %+v: %v", seed, step, req, cfg, err)
			}
			if got != want {
				t.Fatalf("seed %d, step %d: %+v with %+v:\nDo    = %+v\nApply = %+v", seed, step, req, cfg, got, want)
			}
		}
		m.Close()
	}
	if fast < consumes/3 {
		t.Fatalf("%d of %d Consumes found the bucket published; want at least a third", fast, consumes)
	}
	t.Logf("%d of %d Consumes found the bucket published", fast, consumes)
}

// TestPublishedBucketIsReplaced: a call that changes a published bucket's
// shape (here a new version of its config, with another capacity) puts a
// new bucket in the map in its place, and the old one is dead, so that a
// call that looked it up before looks again rather than decide on it.
func TestPublishedBucketIsReplaced(t *testing.T) {
	m := New(WithClock(fixedClock{time.Unix(1e9, 0)}), WithSweepInterval(0))
	defer m.Close()
	v1 := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3)}, Version: 1}
	v2 := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(5)}, Version: 2}
	ctx := context.Background()
	consume := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	if d, err := m.Do(ctx, "k", v1, consume); err != nil || d.Remaining != 2 {
		t.Fatalf("first Consume: %+v, %v; want 2 left", d, err)
	}
	old, _ := m.buckets.Load("k")
	l, v := old.publishedFor(&v1)
	if l == nil {
		t.Fatal("the bucket is not published after a Consume")
	}
	// Version 2 keeps the 2 tokens left, as they are.
	if d, err := m.Do(ctx, "k", v2, consume); err != nil || d.Remaining != 1 || d.Limit != 5 {
		t.Fatalf("Consume with version 2: %+v, %v; want 1 of 5 left", d, err)
	}
	nb, _ := m.buckets.Load("k")
	if nb == old || old.word.Load() != dead || m.Len() != 1 {
		t.Fatalf("after the change: the same bucket %v, old word %d, Len %d; want a new bucket, the old one dead, Len 1",
			nb == old, old.word.Load(), m.Len())
	}
	var d ratelimit.Decision
	if r := decideFast(&d, old, l, v, 1, m.now()); r != gone {
		t.Fatalf("decideFast on the replaced bucket = %d, want gone", r)
	}
	if !m.published("k", &v2) {
		t.Fatal("the new bucket is not published")
	}
}

// TestPublishedHotKeyIsExact: goroutines take tokens from one hot key with
// Consumes, which decide without the lock, while others call it with
// ConsumeUpTo, Estimate and Inspect, which take the lock and unpublish the
// bucket and publish it again, and sweeps do the same. The clock stands
// still, so no token comes back: whatever the interleaving, exactly the
// capacity is taken, and every Consume's Remaining is one the bucket held.
func TestPublishedHotKeyIsExact(t *testing.T) {
	const capacity = 2000
	m := New(WithClock(fixedClock{time.Unix(1e9, 0)}), WithSweepInterval(0))
	defer m.Close()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(capacity)}}
	ctx := context.Background()
	var taken atomic.Int64
	var seen [capacity]atomic.Bool // each Remaining after an admitted Consume, seen once
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 600 {
				req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
				if g < 2 && i%3 == 0 {
					req.Op = []ratelimit.Op{ratelimit.ConsumeUpTo, ratelimit.Estimate, ratelimit.Inspect}[i%9/3]
				}
				d, err := m.Do(ctx, "hot", cfg, req)
				if err != nil {
					t.Error(err)
					return
				}
				taken.Add(d.Consumed)
				if req.Op == ratelimit.Consume && d.Allowed && seen[d.Remaining].Swap(true) {
					t.Errorf("two Consumes left %d tokens", d.Remaining)
				}
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			m.sweep(m.now())
		}
	})
	wg.Wait()
	if got := taken.Load(); got != capacity {
		t.Fatalf("took %d tokens in all; want exactly the capacity %d", got, capacity)
	}
}

// TestPublishedHotKeyKeepsTheBound: as TestPublishedHotKeyIsExact, but the
// clock moves a microsecond at every reading, so that the calls' times
// interleave and refill as they race, and some take a token back with
// Add: the tokens taken never exceed the capacity, plus what refilled over
// the span of the clock's readings, plus what Add returned.
func TestPublishedHotKeyKeepsTheBound(t *testing.T) {
	clock := new(stepClock)
	clock.t.Store(time.Unix(1e9, 0).UnixMicro())
	m := New(WithClock(clock), WithSweepInterval(0))
	defer m.Close()
	const capacity, perToken = 50, 100 // a token refills every 100µs
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(perToken*time.Microsecond, 1).WithBurst(capacity)}}
	ctx := context.Background()
	start := clock.t.Load()
	var taken, added atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1 + int64(i%2)}
				if g == 0 && i%50 == 0 {
					req = ratelimit.Request{Op: ratelimit.Add, Tokens: 1}
				}
				d, err := m.Do(ctx, "hot", cfg, req)
				if err != nil {
					t.Error(err)
					return
				}
				if req.Op == ratelimit.Add {
					added.Add(1)
				}
				taken.Add(d.Consumed)
			}
		})
	}
	wg.Wait()
	most := capacity + (clock.t.Load()-start)/perToken + 1 + added.Load()
	if got := taken.Load(); got > most {
		t.Fatalf("took %d tokens; the bound is %d", got, most)
	}
}

// TestSweepTakesNoLockItNeedNot: a sweep waits on no bucket that cannot
// have expired. It passes over a published bucket that has not, without
// its lock; and the periodic sweep does not start before the earliest
// expiry that a decision stored. Each is shown with buckets' locks held,
// as calls deciding on them would hold them: the sweep returns, and the
// periodic one goes on to drop an ended permit lease, which it does after
// the buckets' sweep.
func TestSweepTakesNoLockItNeedNot(t *testing.T) {
	clock := ratelimittest.NewClock(time.Unix(1e9, 0))
	m := New(WithClock(clock), WithSweepInterval(time.Millisecond))
	defer m.Close()
	ctx := context.Background()
	one := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}
	two := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10), ratelimit.PerMinute(5)}}
	for key, cfg := range map[string]ratelimit.Config{"published": one, "locked": two} {
		if _, err := m.Do(ctx, key, cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if !m.published("published", &one) || m.published("locked", &two) {
		t.Fatal("want the one-bandwidth bucket published and the two-bandwidth one not")
	}
	pb, _ := m.buckets.Load("published")
	lb, _ := m.buckets.Load("locked")
	waitFor := func(what string, done func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !done(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not done in a minute, so waiting on a bucket's lock", what)
			}
		}
	}

	pb.mu.Lock()
	defer pb.mu.Unlock()
	var swept atomic.Bool
	go func() {
		m.sweep(m.now())
		swept.Store(true)
	}()
	waitFor("a sweep beside a published bucket's held lock", swept.Load)
	if m.Len() != 2 || !m.published("published", &one) {
		t.Fatalf("after the sweep: %d buckets, published %v; want both kept, the one published", m.Len(), m.published("published", &one))
	}

	lb.mu.Lock()
	defer lb.mu.Unlock()
	if _, err := m.DoPermit(ctx, "p", ratelimit.InFlight(1, time.Second), ratelimit.PermitRequest{Holder: "h", Weight: 1}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second) // the lease ends; the buckets expire in minutes
	waitFor("the periodic sweep beside held locks", func() bool { return m.PermitKeys() == 0 })
}

// stepClock moves a microsecond forward at every reading.
type stepClock struct{ t atomic.Int64 }

func (c *stepClock) Now() time.Time { return time.UnixMicro(c.t.Add(1)) }

// TestUnpublishIsApplyAtHint: a bucket unpublished holds the state Apply
// leaves after a refill at its hint (an Inspect then), whether hint is the
// stamp of its last decision or a later time that a call which then lost
// its compare-and-swap raised it to, before the bucket is full again, when
// it is, and after.
func TestUnpublishIsApplyAtHint(t *testing.T) {
	const start = 1_000_000_000_000
	m := New(WithClock(fixedClock{time.UnixMicro(start)}), WithSweepInterval(0))
	defer m.Close()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(3*time.Millisecond, 2).WithBurst(5)}}
	consume := ratelimit.Request{Op: ratelimit.Consume, Tokens: 3}
	var ref ratelimit.State
	ratelimit.Apply(&ref, cfg, consume, start)
	if _, err := m.Do(context.Background(), "k", cfg, consume); err != nil {
		t.Fatal(err)
	}
	b, _ := m.buckets.Load("k")
	v := b.word.Load()
	if v <= dead {
		t.Fatal("the bucket is not published after a Consume")
	}
	full := ref.ExpiresAt // 3 tokens back after 4.5ms
	for _, h := range []int64{start, start + 1, full - 1, full, full + 1, full + 7000} {
		b.word.Store(v)
		atomic.StoreInt64(b.hint(), h)
		b.mu.Lock()
		b.own()
		got := ratelimit.State{ExpiresAt: b.expiresAt, Bands: []ratelimit.BandState{{Level: b.level[0], Stamp: b.stamp[0]}}}
		b.mu.Unlock()
		want := ref
		want.Bands = slices.Clone(ref.Bands)
		ratelimit.Apply(&want, cfg, ratelimit.Request{Op: ratelimit.Inspect}, h)
		if w := want.Bands[0]; got.ExpiresAt != want.ExpiresAt || got.Bands[0].Level != w.Level || got.Bands[0].Stamp != w.Stamp {
			t.Errorf("hint %+d µs: level %d, stamp %+d, expires %+d; Apply: %d, %+d, %+d", h-start,
				got.Bands[0].Level, got.Bands[0].Stamp-start, got.ExpiresAt-start, w.Level, w.Stamp-start, want.ExpiresAt-start)
		}
	}
}

// TestBadRequestOnPublishedBucket: a call whose config is the one a
// published bucket was drawn for skips the config's checks, not the
// request's: each bad request is refused with the field named, and the
// bucket is unchanged.
func TestBadRequestOnPublishedBucket(t *testing.T) {
	m := New(WithClock(fixedClock{time.Unix(1e9, 0)}), WithSweepInterval(0))
	defer m.Close()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(5)}}
	ctx := context.Background()
	if _, err := m.Do(ctx, "k", cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 2}); err != nil {
		t.Fatal(err)
	}
	if !m.published("k", &cfg) {
		t.Fatal("the bucket is not published after a Consume")
	}
	for _, c := range []struct {
		req   ratelimit.Request
		field string
	}{
		{ratelimit.Request{Op: ratelimit.Consume, Tokens: 6}, "Tokens"},
		{ratelimit.Request{Op: ratelimit.Consume, Tokens: 0}, "Tokens"},
		{ratelimit.Request{Op: ratelimit.Consume, Tokens: 1, MaxWait: -1}, "MaxWait"},
		{ratelimit.Request{Op: ratelimit.Consume, Tokens: 1, Ago: -time.Second}, "Ago"},
		{ratelimit.Request{Op: ratelimit.Consume, Tokens: 1, Strategy: 9}, "Strategy"},
	} {
		d, err := m.Do(ctx, "k", cfg, c.req)
		if !errors.Is(err, ratelimit.ErrInvalidRequest) || !strings.Contains(err.Error(), c.field) || d != (ratelimit.Decision{}) {
			t.Errorf("%+v: %+v, %v; want ErrInvalidRequest naming %s", c.req, d, err, c.field)
		}
	}
	if d, err := m.Do(ctx, "k", cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); err != nil || d.Remaining != 2 {
		t.Fatalf("Consume after the bad requests: %+v, %v; want 2 left", d, err)
	}
}

// FuzzTakesImpliesCheckOp: a request that a line takes without
// ratelimit.CheckOp is one CheckOp passes with the line's config. The
// seeds hold a request each check of takes refuses.
func FuzzTakesImpliesCheckOp(f *testing.F) {
	f.Add(int64(5), uint8(ratelimit.Consume), int64(1), int64(0), uint8(ratelimit.AsIs), int64(0))
	f.Add(int64(5), uint8(ratelimit.Consume), int64(6), int64(0), uint8(ratelimit.AsIs), int64(0))
	f.Add(int64(5), uint8(ratelimit.Consume), int64(0), int64(0), uint8(ratelimit.AsIs), int64(0))
	f.Add(int64(5), uint8(ratelimit.Consume), int64(1), int64(-1), uint8(ratelimit.AsIs), int64(0))
	f.Add(int64(5), uint8(ratelimit.Consume), int64(1), int64(0), uint8(9), int64(0))
	f.Add(int64(5), uint8(ratelimit.Consume), int64(1), int64(0), uint8(ratelimit.AsIs), int64(-1))
	f.Add(int64(5), uint8(ratelimit.Consume), int64(1), int64(0), uint8(ratelimit.AsIs), int64(ratelimit.MaxAgo+1))
	f.Add(int64(5), uint8(ratelimit.Reset), int64(1), int64(0), uint8(ratelimit.AsIs), int64(0))
	f.Add(int64(5), uint8(200), int64(1), int64(0), uint8(ratelimit.AsIs), int64(0))
	f.Fuzz(func(t *testing.T, capacity int64, op uint8, tokens, maxWait int64, strategy uint8, ago int64) {
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(capacity)}}
		if cfg.Validate() != nil {
			return
		}
		l := line{ok: true, band: cfg.Bandwidths[0]}
		req := ratelimit.Request{
			Op: ratelimit.Op(op), Tokens: tokens, MaxWait: time.Duration(maxWait),
			Strategy: ratelimit.Inheritance(strategy), Ago: time.Duration(ago),
		}
		if !l.serves(&cfg) {
			t.Fatalf("the line drawn for %+v does not serve it", cfg)
		}
		if err := ratelimit.CheckOp(cfg, req); l.takes(&req) && err != nil {
			t.Fatalf("takes %+v, which CheckOp refuses with %+v: %v", req, cfg, err)
		}
	})
}
