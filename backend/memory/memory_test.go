package memory_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newClock is a settable clock for tests outside a synctest bubble.
func newClock() *ratelimittest.Clock { return ratelimittest.NewClock(time.Unix(1_700_000_000, 0)) }

var tenPerSecond = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}}

func allow(t *testing.T, l *ratelimit.Limiter, key string) ratelimit.Decision {
	t.Helper()
	d, err := l.Allow(context.Background(), key, tenPerSecond)
	if err != nil {
		t.Fatalf("Allow(%q): %v", key, err)
	}
	return d
}

func TestBucketIsDroppedWhenFull(t *testing.T) {
	clk := newClock()
	b := memory.New(memory.WithClock(clk))
	defer b.Close()
	l := ratelimit.New(b)

	allow(t, l, "k")
	if got := b.Len(); got != 1 {
		t.Fatalf("Len after one Allow = %d, want 1", got)
	}
	clk.Advance(100 * time.Millisecond) // one token back: full again
	d, err := l.Bucket("k", func(context.Context) (ratelimit.Config, error) { return tenPerSecond, nil }).Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != 10 || d.ResetAfter != 0 {
		t.Fatalf("Inspect = %+v, want a full bucket", d)
	}
	if got := b.Len(); got != 0 {
		t.Fatalf("Len after the bucket refilled = %d, want 0", got)
	}
}

func TestEstimateOnAbsentKeyStoresNothing(t *testing.T) {
	b := memory.New(memory.WithClock(newClock()))
	defer b.Close()
	if _, err := b.Do(context.Background(), "k", tenPerSecond, ratelimit.Request{Op: ratelimit.Estimate, Tokens: 3}); err != nil {
		t.Fatal(err)
	}
	if got := b.Len(); got != 0 {
		t.Fatalf("Len = %d, want 0", got)
	}
}

func TestSweepDropsRefilledBuckets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.New(memory.WithSweepInterval(time.Second))
		defer b.Close()
		l := ratelimit.New(b)
		for i := range 100 {
			allow(t, l, fmt.Sprint("key-", i))
		}
		if got := b.Len(); got != 100 {
			t.Fatalf("Len = %d, want 100", got)
		}
		time.Sleep(500 * time.Millisecond) // refilled, but no sweep yet
		if got := b.Len(); got != 100 {
			t.Fatalf("Len before the first sweep = %d, want 100", got)
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if got := b.Len(); got != 0 {
			t.Fatalf("Len after the sweep = %d, want 0", got)
		}
	})
}

func TestMaxKeysRefusesNewKeysButNeverForgetsDrainedOnes(t *testing.T) {
	clk := newClock()
	b := memory.New(memory.WithClock(clk), memory.WithMaxKeys(1), memory.WithSweepInterval(0))
	defer b.Close()
	l := ratelimit.New(b)

	for range 4 {
		allow(t, l, "drained")
	}
	_, err := l.Allow(context.Background(), "new", tenPerSecond)
	if !errors.Is(err, memory.ErrTooManyKeys) || !errors.Is(err, ratelimit.ErrKeyRejected) || errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Fatalf("Allow on a new key at the cap: err = %v, want ErrTooManyKeys wrapping ErrKeyRejected, not ErrBackendUnavailable", err)
	}
	if d := allow(t, l, "drained"); d.Remaining != 5 {
		t.Fatalf("the drained bucket was forgotten: Remaining = %d, want 5", d.Remaining)
	}

	clk.Advance(time.Second) // "drained" is full again, so it may go
	if d := allow(t, l, "new"); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("Allow on a new key once the old one refilled = %+v, want allowed, 9 left", d)
	}
	if got := b.Len(); got != 1 {
		t.Fatalf("Len = %d, want 1", got)
	}
}

// TestMaxKeysAgo: a request with an Ago is decided as of then, but a new
// key at the cap makes room of the buckets expired by now, not by then.
func TestMaxKeysAgo(t *testing.T) {
	clk := newClock()
	b := memory.New(memory.WithClock(clk), memory.WithMaxKeys(1), memory.WithSweepInterval(0))
	defer b.Close()
	allow(t, ratelimit.New(b), "old")
	clk.Advance(time.Second) // "old" is full again, so it may go
	d, err := b.Do(context.Background(), "new", tenPerSecond, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1, Ago: time.Hour})
	if err != nil || !d.Allowed {
		t.Fatalf("Consume an hour ago on a new key, the old one refilled by now: %+v, %v; want allowed", d, err)
	}
}

func TestMaxKeysBoundsTheTotal(t *testing.T) {
	const maxKeys = 100
	b := memory.New(memory.WithClock(newClock()), memory.WithMaxKeys(maxKeys), memory.WithSweepInterval(0))
	defer b.Close()
	l := ratelimit.New(b)
	refused := 0
	for i := range 10 * maxKeys {
		if _, err := l.Allow(context.Background(), fmt.Sprint("key-", i), tenPerSecond); errors.Is(err, memory.ErrTooManyKeys) {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if got := b.Len(); got != maxKeys {
		t.Fatalf("Len = %d, want exactly the cap %d", got, maxKeys)
	}
	if refused != 9*maxKeys {
		t.Fatalf("refused %d of %d keys, want %d", refused, 10*maxKeys, 9*maxKeys)
	}
}

func TestMaxKeysHoldsUnderConcurrentNewKeys(t *testing.T) {
	const maxKeys = 64
	clk := newClock()
	b := memory.New(memory.WithClock(clk), memory.WithMaxKeys(maxKeys), memory.WithSweepInterval(0))
	defer b.Close()
	l := ratelimit.New(b)
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				_, err := l.Allow(context.Background(), fmt.Sprint("g", g, "-", i), tenPerSecond)
				switch {
				case err == nil:
					admitted.Add(1)
				case !errors.Is(err, memory.ErrTooManyKeys):
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != maxKeys || b.Len() != maxKeys {
		t.Fatalf("admitted %d new keys, holding %d; want exactly %d", got, b.Len(), maxKeys)
	}
	clk.Advance(time.Second) // all refilled: the next new key sweeps them away
	if _, err := l.Allow(context.Background(), "late", tenPerSecond); err != nil {
		t.Fatalf("a new key after every bucket expired: %v", err)
	}
	if got := b.Len(); got != 1 {
		t.Fatalf("Len after the sweep for room = %d, want 1", got)
	}
}

func TestCloseStopsTheSweepAndRefusesCalls(t *testing.T) {
	b := memory.New(memory.WithSweepInterval(time.Millisecond))
	l := ratelimit.New(b)
	allow(t, l, "k")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Allow(context.Background(), "k", tenPerSecond); !errors.Is(err, memory.ErrClosed) {
		t.Fatalf("Allow after Close: err = %v, want ErrClosed", err)
	}
	// goleak in TestMain checks that the sweep goroutine has ended.
}

func TestBadInputStoresNothing(t *testing.T) {
	b := memory.New(memory.WithClock(newClock()))
	defer b.Close()
	bad := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10).WithBurst(0)}}
	if _, err := b.Do(context.Background(), "k", bad, ratelimit.Request{Tokens: 1}); !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	if got := b.Len(); got != 0 {
		t.Fatalf("Len = %d, want 0", got)
	}
}

func TestExistingKeyDecisionDoesNotAllocate(t *testing.T) {
	two := []ratelimit.Bandwidth{
		ratelimit.PerSecond(1_000_000).WithID("burst"),
		ratelimit.PerHour(1_000_000_000).WithID("hourly"),
	}
	three := append(slices.Clone(two), ratelimit.Every(24*time.Hour, 1_000_000_000).WithID("daily"))
	configs := map[string]ratelimit.Config{
		"token bucket, two bandwidths":   {Bandwidths: two},
		"token bucket, three":            {Bandwidths: three},
		"versioned":                      {Bandwidths: two, Version: 3},
		"GCRA":                           {Algorithm: ratelimit.GCRA, Bandwidths: two},
		"fixed window":                   {Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(1_000_000_000)}},
		"sliding window counter":         {Algorithm: ratelimit.SlidingWindowCounter, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(1_000_000)}},
		"versioned, after a plan change": {Bandwidths: three, Version: 4},
	}
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			b := memory.New(memory.WithClock(newClock()))
			defer b.Close()
			l := ratelimit.New(b)
			ctx := context.Background()
			if name == "versioned, after a plan change" {
				if _, err := l.Allow(ctx, "k", configs["versioned"]); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := l.Allow(ctx, "k", cfg); err != nil {
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(1000, func() {
				if _, err := l.Allow(ctx, "k", cfg); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Fatalf("Allow on an existing key allocates %v times, want 0", allocs)
			}
		})
	}
}

// TestBucketsAgreeWithApply runs one sequence of calls, with config
// changes between the compact shapes and the whole-state form (more
// bandwidths, a sliding log, a sliding window counter's previous window),
// on many keys of one Backend and on ratelimit.Apply, and checks every
// decision matches: however a bucket is stored, it decides as Apply does.
func TestBucketsAgreeWithApply(t *testing.T) {
	clock := newClock()
	b := memory.New(memory.WithClock(clock))
	defer b.Close()
	one := []ratelimit.Bandwidth{ratelimit.PerSecond(5).WithID("s")}
	two := append(slices.Clone(one), ratelimit.PerMinute(20).WithID("m"))
	three := append(slices.Clone(two), ratelimit.PerHour(100).WithID("h"))
	steps := []ratelimit.Config{
		{Bandwidths: one},
		{Bandwidths: two},
		{Bandwidths: two, Version: 1},
		{Bandwidths: three, Version: 2},
		{Bandwidths: two, Version: 1}, // stale: decided on version 2's config
		{Bandwidths: two, Version: 3},
		{Bandwidths: one, Version: 1},
		{Bandwidths: one, Version: 5},   // the same shape but for the version
		{Bandwidths: three, Version: 4}, // stale: decided on version 5's config
		{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(5)}},
		{Algorithm: ratelimit.SlidingWindowCounter, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(5)}},
		{Algorithm: ratelimit.GCRA, Bandwidths: two},
		{Bandwidths: one},
	}
	const keys = 40
	states := make([]ratelimit.State, keys)
	ctx := context.Background()
	for i, cfg := range steps {
		for round := range 8 {
			for k := range keys {
				req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
				got, err := b.Do(ctx, fmt.Sprint("key-", k), cfg, req)
				if err != nil {
					t.Fatal(err)
				}
				if want := ratelimit.Apply(&states[k], cfg, req, clock.Now().UnixMicro()); got != want {
					t.Fatalf("step %d, round %d, key %d: Do = %+v, Apply = %+v", i, round, k, got, want)
				}
			}
			clock.Advance(150 * time.Millisecond)
		}
	}
}

func TestConcurrentKeysAdmitExactlyTheirCapacity(t *testing.T) {
	b := memory.New(memory.WithClock(newClock())) // the clock stands still: no refill
	defer b.Close()
	l := ratelimit.New(b)
	const keys, goroutines, calls = 50, 8, 200
	var allowed [keys]atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range calls {
				k := (g + i) % keys
				d, err := l.Allow(context.Background(), fmt.Sprint("key-", k), tenPerSecond)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					allowed[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for k := range allowed {
		if got := allowed[k].Load(); got != 10 {
			t.Errorf("key-%d admitted %d, want exactly its capacity 10", k, got)
		}
	}
}

// TestResetsRaceDecisions: goroutines take tokens from one key while
// others Reset it, which leaves the bucket full, so it is dropped and
// created again over and over while calls that looked it up wait for its
// lock. The clock stands still, so no token comes back but by a Reset:
// whatever the interleaving, the tokens admitted are at most the capacity
// for each Reset plus one. A decision on a dropped bucket, which no later
// call sees, would admit more when the race goes that way; the internal
// TestDroppedBucketIsNotDecided makes that interleaving by hand.
func TestResetsRaceDecisions(t *testing.T) {
	b := memory.New(memory.WithClock(newClock()), memory.WithSweepInterval(0))
	defer b.Close()
	l := ratelimit.New(b)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(5)}}
	bucket := l.Bucket("hot", func(context.Context) (ratelimit.Config, error) { return cfg, nil })
	ctx := context.Background()
	const takers, calls, resetters, resets = 8, 300, 2, 100
	var admitted, done atomic.Int64
	var wg sync.WaitGroup
	for range takers {
		wg.Go(func() {
			for range calls {
				d, err := l.Allow(ctx, "hot", cfg)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	for range resetters {
		wg.Go(func() {
			for range resets {
				if err := bucket.Reset(ctx); err != nil {
					t.Error(err)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	// Drain what the last Reset left.
	for {
		d, err := l.Allow(ctx, "hot", cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		admitted.Add(1)
	}
	if got, most := admitted.Load(), 5*(done.Load()+1); got > most || got < 5 {
		t.Fatalf("admitted %d tokens with %d Resets: want 5 to %d", got, done.Load(), most)
	}
}
