package failpolicy_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// adapters build a Redis backend on a client set up by its LowLatency
// helper, as docs/operations.md recommends.
var adapters = []struct {
	name    string
	connect func(t testing.TB, addr string) ratelimit.Backend
}{
	{"goredis", func(t testing.TB, addr string) ratelimit.Backend {
		opts := &redis.Options{Addr: addr}
		redisbackend.LowLatency(opts)
		c := redis.NewClient(opts)
		t.Cleanup(func() { c.Close() })
		b, err := redisbackend.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}},
	{"rueidis", func(t testing.TB, addr string) ratelimit.Backend {
		opt := rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true}
		rueidisbackend.LowLatency(&opt)
		c, err := rueidis.NewClient(opt)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		b, err := rueidisbackend.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}},
}

// faults stop a server and bring it back.
var faults = []struct {
	name          string
	stop, restart func(r *testkit.Redis, t testing.TB)
}{
	{"Paused", (*testkit.Redis).Pause, (*testkit.Redis).Resume},
	{"Killed", (*testkit.Redis).Kill, (*testkit.Redis).Restart},
}

const (
	stallTimeout  = failpolicy.DefaultTimeout
	stallCoolDown = 200 * time.Millisecond
	stallCalls    = 10_000
	stallWorkers  = 8
	// stallSlack is how far past the deadline the test lets a decision
	// run before it fails: enough for a starved scheduler under -race on
	// 2 cores, far short of any client's own timeout. The closing figure
	// is the p100 the test logs, against the 2 ms target.
	stallSlack = 50 * time.Millisecond
)

// TestStallIntegration stops Redis (SIGSTOP, or SIGKILL) under 10,000
// decisions from 8 goroutines, for each adapter and mode: every decision
// must come back with the mode's answer, well within the deadline plus
// slack, and the p100 is logged. Then Redis comes back (SIGCONT, or a
// restart on the same port), and decisions must be the store's again
// within a cool-down (or two, on a busy machine).
func TestStallIntegration(t *testing.T) {
	for _, a := range adapters {
		for _, f := range faults {
			for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed, failpolicy.Local} {
				t.Run(fmt.Sprintf("%s/%s/%v", a.name, f.name, mode), func(t *testing.T) {
					t.Parallel()
					server := testkit.StartRedis(t)
					store := a.connect(t, server.Addr())
					cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6)}}
					key := "stall:" + t.Name()
					warm(t, store, key, cfg)
					policy := newPolicy(t, store, mode, failpolicy.WithBreaker(3, stallCoolDown), failpolicy.WithInstances(2))

					f.stop(server, t)
					lat := stall(t, policy, key, cfg, mode)
					slices.Sort(lat)
					p100, p99 := lat[len(lat)-1], lat[len(lat)*99/100]
					over := len(lat) - sortedCount(lat, stallTimeout+2*time.Millisecond)
					t.Logf("%d decisions with Redis %s: p50 %v, p99 %v, p100 %v; %d over timeout+2ms (%v)",
						len(lat), f.name, lat[len(lat)/2], p99, p100, over, stallTimeout+2*time.Millisecond)
					if p100 > stallTimeout+stallSlack {
						t.Errorf("p100 %v; want at most the %v deadline + %v", p100, stallTimeout, stallSlack)
					}

					f.restart(server, t)
					back := time.Now()
					for {
						d, err := policy.Do(context.Background(), key, cfg, consume)
						if err != nil {
							t.Fatal(err)
						}
						if !d.Degraded {
							break
						}
						if time.Since(back) > 5*time.Second {
							t.Fatalf("still degraded 5s after Redis came back")
						}
						time.Sleep(time.Millisecond)
					}
					recovered := time.Since(back)
					t.Logf("the store decided again %v after Redis came back (cool-down %v)", recovered.Round(time.Millisecond), stallCoolDown)
					// The breaker probes once a cool-down, and the probe has
					// a cool-down to answer, time enough for a new connection
					// and the script. The closing figures are the times
					// logged above; the bound leaves a busy machine a second
					// cool-down.
					limit := 2*stallCoolDown + stallSlack
					if recovered > limit {
						t.Errorf("recovered after %v; want within %v", recovered, limit)
					}
				})
			}
		}
	}
}

// warm makes a first decision with the store, without the policy's
// deadline: it dials and loads the script, which a loaded machine may take
// more than 5ms to do.
func warm(t *testing.T, store ratelimit.Backend, key string, cfg ratelimit.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := store.Do(ctx, key, cfg, consume); err != nil {
		t.Fatal(err)
	}
}

// stall makes stallCalls decisions from stallWorkers goroutines, each
// pausing 100µs between calls so that the run spans several cool-downs,
// and returns their latencies. Each must be degraded with the mode's
// answer.
func stall(t *testing.T, p *failpolicy.Backend, key string, cfg ratelimit.Config, mode failpolicy.Mode) []time.Duration {
	var (
		mu  sync.Mutex
		lat = make([]time.Duration, 0, stallCalls)
		wg  sync.WaitGroup
	)
	for range stallWorkers {
		wg.Go(func() {
			mine := make([]time.Duration, 0, stallCalls/stallWorkers)
			for range stallCalls / stallWorkers {
				start := time.Now()
				d, err := p.Do(context.Background(), key, cfg, consume)
				mine = append(mine, time.Since(start))
				switch {
				case err != nil:
					t.Error(err)
					return
				case !d.Degraded:
					t.Errorf("%+v with Redis stopped; want Degraded", d)
					return
				case mode == failpolicy.Closed && d.Allowed:
					t.Errorf("%+v in Closed mode; want denied", d)
					return
				case mode != failpolicy.Closed && !d.Allowed:
					t.Errorf("%+v in %v mode, under a limit of 1e6/s; want allowed", d, mode)
					return
				}
				time.Sleep(100 * time.Microsecond)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(lat) != stallCalls {
		t.FailNow()
	}
	return lat
}

// sortedCount returns how many of the sorted durations are at most d.
func sortedCount(sorted []time.Duration, d time.Duration) int {
	n, _ := slices.BinarySearch(sorted, d+1)
	return n
}

// TestLocalShareIntegration: with Redis killed, the Local mode of one of 4
// instances admits its share of a bucket of 100 that refills one token an
// hour, 25, and no more.
func TestLocalShareIntegration(t *testing.T) {
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			server := testkit.StartRedis(t)
			policy := newPolicy(t, a.connect(t, server.Addr()), failpolicy.Local, failpolicy.WithInstances(4))
			cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(1).WithBurst(100)}}
			server.Kill(t)
			admitted := 0
			for range 1000 {
				d, err := policy.Do(context.Background(), "share", cfg, consume)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Degraded || d.Limit != 25 {
					t.Fatalf("%+v; want Degraded, Limit 25", d)
				}
				if d.Allowed {
					admitted++
				}
			}
			t.Logf("Redis down, 1000 calls: %d admitted locally (share of 100 by 4 instances: 25)", admitted)
			if admitted != 25 {
				t.Errorf("admitted %d; want the share, 25", admitted)
			}
		})
	}
}
