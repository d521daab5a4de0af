package benchmarks

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululememory "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

// limit is one limit every implementation enforces: a burst of Burst
// requests, and then Refill requests every Period.
type limit struct {
	Burst  int64
	Refill int64
	Period time.Duration
}

// window is the time the limit takes to refill from empty. Fixed-window
// peers (sethvargo, ulule), which have no separate burst, get Burst requests
// per window: the same long-run rate and the same burst.
func (l limit) window() time.Duration {
	return l.Period * time.Duration(l.Burst) / time.Duration(l.Refill)
}

// allowFunc makes one decision for key.
type allowFunc func(ctx context.Context, key string) (allowed bool, err error)

// impl is one implementation under test; start builds a fresh limiter
// enforcing l on every key, and stops it when the benchmark ends.
type impl struct {
	name  string
	start func(b *testing.B, l limit) allowFunc
}

// impls lists the implementations; the first is the baseline benchstat
// compares against.
var impls = []impl{
	{"xrate", startXRate},
	{"sluice", startSluice},
	{"sethvargo", startSethvargo},
	{"ulule", startUlule},
	{"throttled", startThrottled},
}

// startSluice is sluice's public path: ratelimit.New(memory.New()).Allow
// with a config built once.
func startSluice(b *testing.B, l limit) allowFunc {
	backend := memory.New()
	b.Cleanup(func() { backend.Close() })
	lim := ratelimit.New(backend)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.Every(l.Period, l.Refill).WithBurst(l.Burst),
	}}
	return func(ctx context.Context, key string) (bool, error) {
		d, err := lim.Allow(ctx, key, cfg)
		return d.Allowed, err
	}
}

// xrateMap is how Go services commonly limit per key with the standard
// extended library: one x/time/rate.Limiter per key in a sync.Map, created
// on first use. Load comes first so that a known key allocates nothing;
// LoadOrStore settles the race between two first uses.
type xrateMap struct {
	m     sync.Map
	limit rate.Limit
	burst int
}

func (x *xrateMap) allow(key string) bool {
	v, ok := x.m.Load(key)
	if !ok {
		v, _ = x.m.LoadOrStore(key, rate.NewLimiter(x.limit, x.burst))
	}
	return v.(*rate.Limiter).Allow()
}

func startXRate(b *testing.B, l limit) allowFunc {
	x := &xrateMap{
		limit: rate.Every(l.Period / time.Duration(l.Refill)),
		burst: int(l.Burst),
	}
	return func(_ context.Context, key string) (bool, error) {
		return x.allow(key), nil
	}
}

// startSethvargo is github.com/sethvargo/go-limiter's memorystore: Burst
// tokens per window, all returned at each window's end.
func startSethvargo(b *testing.B, l limit) allowFunc {
	store, err := memorystore.New(&memorystore.Config{
		Tokens:   uint64(l.Burst),
		Interval: l.window(),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close(context.Background()) })
	return func(ctx context.Context, key string) (bool, error) {
		_, _, _, ok, err := store.Take(ctx, key)
		return ok, err
	}
}

// startUlule is github.com/ulule/limiter/v3 with its memory store: a fixed
// window counter of Burst requests per window.
func startUlule(b *testing.B, l limit) allowFunc {
	return ululeAllow(ululememory.NewStore(), l)
}

// ululeAllow is ulule's limiter on store with a window of l.Burst requests.
func ululeAllow(store ulule.Store, l limit) allowFunc {
	lim := ulule.New(store, ulule.Rate{Period: l.window(), Limit: l.Burst})
	return func(ctx context.Context, key string) (bool, error) {
		c, err := lim.Get(ctx, key)
		return !c.Reached, err
	}
}

// startThrottled is github.com/throttled/throttled/v2's GCRA limiter on its
// memory store without a key cap (a map under one RWMutex, its faster form;
// with a cap it is an LRU under one lock).
func startThrottled(b *testing.B, l limit) allowFunc {
	store, err := memstore.NewCtx(0)
	if err != nil {
		b.Fatal(err)
	}
	return throttledAllow(b, store, l)
}

// throttledAllow is throttled's GCRA limiter on store enforcing l. Its
// MaxBurst counts the requests beyond the first.
func throttledAllow(b *testing.B, store throttled.GCRAStoreCtx, l limit) allowFunc {
	lim, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{
		MaxRate:  throttled.PerDuration(int(l.Refill), l.Period),
		MaxBurst: int(l.Burst) - 1,
	})
	if err != nil {
		b.Fatal(err)
	}
	// Its default of 10 compare-and-swap attempts fails calls when
	// goroutines share one key (keys=1 with more than one goroutine);
	// uncontended calls never retry, so the raise changes nothing else.
	lim.SetMaxCASAttemptsLimit(1 << 20)
	return func(ctx context.Context, key string) (bool, error) {
		limited, _, err := lim.RateLimitCtx(ctx, key, 1)
		return !limited, err
	}
}
