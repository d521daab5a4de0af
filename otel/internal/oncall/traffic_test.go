package oncall

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
)

// The phases of the run, in order.
type phase int

const (
	baseline phase = iota
	abuse
	misconfigured
	sick
	numPhases
)

var phaseNames = [numPhases]string{"baseline", "abuse", "misconfigured", "sick"}

func (p phase) String() string { return phaseNames[p] }

// The routes, as route templates.
const (
	routeSearch = "/v1/search"
	routeExport = "/v1/export"
)

// The limits. A customer searches at 1/s against 5/s and exports at
// 0.5/s against 60/min: well under them, so the baseline's only
// rejections are the few heavy users'. The misconfigured export limit,
// 24/min in bursts of 4, is below the customers' 30/min, so each is
// rejected about one export in four: a little, but every one of them.
var (
	searchCustomer      = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(5).WithBurst(10)}}
	searchAnonymous     = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(2).WithBurst(5)}}
	exportCustomer      = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(60).WithBurst(10)}}
	exportMisconfigured = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(24).WithBurst(4)}}
)

// The population.
const (
	customers  = 300 // paying customers, keys cust:0000...
	heavyUsers = 4   // the first customers search at 6/s, a little over 5/s
	anonymous  = 100 // callers known by address
	// abuserRate is each abuser's request rate on /v1/search: 16 times a
	// customer's limit, 40 times an address's.
	abuserRate = 80.0
)

// abusers are the keys that hammer /v1/search in the abuse phase: two
// addresses and a customer's key that leaked. That one is an existing
// customer's, so the customer class alone does not give it away.
var abusers = []string{"ip:203.0.113.7", "ip:203.0.113.9", "cust:0150"}

// A source sends one key's requests on one route at a rate that depends
// on the phase.
type source struct {
	key, route string
	rate       [numPhases]float64 // requests per second
}

// population returns the sources, in a fixed order so that the seeded
// draws are the same on every run.
func population() []source {
	var srcs []source
	all := func(r float64) [numPhases]float64 { return [numPhases]float64{r, r, r, r} }
	for i := range customers {
		key := fmt.Sprintf("cust:%04d", i)
		search := 1.0
		if i < heavyUsers {
			search = 6
		}
		srcs = append(srcs,
			source{key: key, route: routeSearch, rate: all(search)},
			source{key: key, route: routeExport, rate: all(0.5)})
	}
	for i := range anonymous {
		srcs = append(srcs, source{key: fmt.Sprintf("ip:192.0.2.%d", i+1), route: routeSearch, rate: all(0.5)})
	}
	for _, key := range abusers {
		srcs = append(srcs, source{key: key, route: routeSearch, rate: [numPhases]float64{abuse: abuserRate}})
	}
	return srcs
}

// configFor is the limit of key on route in phase p: the export limit is
// the misconfigured one in that phase only.
func configFor(key, route string, p phase) ratelimit.Config {
	switch {
	case route == routeExport && p == misconfigured:
		return exportMisconfigured
	case route == routeExport:
		return exportCustomer
	case keyClass(key) == "customer":
		return searchCustomer
	}
	return searchAnonymous
}

// tick is the generator's step: each source's requests of a step are a
// Poisson draw of rate × tick.
const tick = 10 * time.Millisecond

// workers decide the requests; enough that the 50ms waits of a stalled
// store, before the breaker opens, do not hold the generator back.
const workers = 64

// counts are what the generator saw, for the log and the checks.
type counts struct {
	sent, dropped, allowed, rejected, degraded, failed atomic.Int64
}

func (c *counts) String() string {
	return fmt.Sprintf("sent %d, dropped %d, allowed %d, rejected %d, degraded %d, errors %d",
		c.sent.Load(), c.dropped.Load(), c.allowed.Load(), c.rejected.Load(), c.degraded.Load(), c.failed.Load())
}

type job struct {
	key, route string
	cfg        ratelimit.Config
}

// bucketKey is the bucket of key's requests on route: each route has
// limits of its own, so a bucket of its own. keyClass reads the caller's
// prefix, which it keeps.
func bucketKey(key, route string) string { return key + route }

// generate sends the population's requests to l from start until end,
// in the phase that phaseAt gives for each step's time, and returns
// when all are decided. The draws come from a PCG seeded with seed, in a
// fixed order, so the requests of each step are the same on every run;
// only the wall clock of the phase changes (see schedule).
func generate(ctx context.Context, l *ratelimit.Limiter, seed uint64, start, end time.Time, phaseAt func(time.Time) phase, c *counts) {
	srcs := population()
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	jobs := make(chan job, 8192)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				decide(l, j, c)
			}
		})
	}
	defer wg.Wait()
	defer close(jobs)
	for step := 0; ; step++ {
		at := start.Add(time.Duration(step) * tick)
		if !at.Before(end) {
			return
		}
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		p := phaseAt(at)
		for _, s := range srcs {
			n := poisson(rng, s.rate[p]*tick.Seconds())
			for range n {
				c.sent.Add(1)
				select {
				case jobs <- job{s.key, s.route, configFor(s.key, s.route, p)}:
				default:
					// The workers are behind: drop rather than send the
					// step late, so the rates stay those of the phase.
					c.dropped.Add(1)
				}
			}
		}
	}
}

// decide makes one decision as a service's middleware would: the route
// in the context for the metrics, a deadline of its own.
func decide(l *ratelimit.Limiter, j job, c *counts) {
	ctx, cancel := context.WithTimeout(sluiceotel.ContextWithRoute(context.Background(), j.route), time.Second)
	defer cancel()
	d, err := l.Allow(ctx, bucketKey(j.key, j.route), j.cfg)
	switch {
	case err != nil:
		c.failed.Add(1)
	case d.Degraded:
		c.degraded.Add(1)
	case d.Allowed:
		c.allowed.Add(1)
	default:
		c.rejected.Add(1)
	}
}

// poisson draws from the Poisson distribution of mean lambda, by
// inversion: lambda is below 1 here, so it takes a draw or two.
func poisson(rng *rand.Rand, lambda float64) int {
	if lambda <= 0 {
		return 0
	}
	u := rng.Float64()
	p := math.Exp(-lambda)
	k, cum := 0, p
	for u > cum && k < 1000 {
		k++
		p *= lambda / float64(k)
		cum += p
	}
	return k
}
