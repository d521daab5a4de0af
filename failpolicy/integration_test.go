package failpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// adapters build a Redis backend on a client set up by its LowLatency
// helper, as docs/operations.md recommends.
var adapters = []struct {
	name string
	// connect's client is set up by the backend's LowLatency, as
	// failpolicy's users are told to; patient's keeps the client's default
	// timeouts, for a test of what the policy makes of the store's answers,
	// which a loaded machine must not turn into failures.
	connect, patient func(t testing.TB, addr string) ratelimit.Backend
}{
	{
		"goredis",
		func(t testing.TB, addr string) ratelimit.Backend { return goRedisStore(t, addr, true) },
		func(t testing.TB, addr string) ratelimit.Backend { return goRedisStore(t, addr, false) },
	},
	{
		"rueidis",
		func(t testing.TB, addr string) ratelimit.Backend { return rueidisStore(t, addr, true) },
		func(t testing.TB, addr string) ratelimit.Backend { return rueidisStore(t, addr, false) },
	},
}

// goRedisStore is the go-redis backend on a client of the server at addr,
// set up by LowLatency if lowLatency.
func goRedisStore(t testing.TB, addr string, lowLatency bool) ratelimit.Backend {
	opts := &redis.Options{Addr: addr}
	if lowLatency {
		redisbackend.LowLatency(opts)
	}
	return goRedisBackend(t, redis.NewClient(opts))
}

// goRedisBackend is the go-redis backend on c, which the test closes.
func goRedisBackend(t testing.TB, c redis.UniversalClient) ratelimit.Backend {
	t.Cleanup(func() { c.Close() })
	b, err := redisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rueidisStore is the rueidis backend on a client of the server at addr,
// set up by LowLatency if lowLatency.
func rueidisStore(t testing.TB, addr string, lowLatency bool) ratelimit.Backend {
	opt := rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true}
	if lowLatency {
		rueidisbackend.LowLatency(&opt)
	}
	// NewClient dials within LowLatency's timeouts, which a loaded machine
	// running -race can miss: retry, as warm does.
	var c rueidis.Client
	err := retrySetup(func() (err error) {
		c, err = rueidis.NewClient(opt)
		return err
	}, always)
	if err != nil {
		t.Fatal(err)
	}
	return rueidisBackend(t, c)
}

// rueidisBackend is the rueidis backend on c, which the test closes.
func rueidisBackend(t testing.TB, c rueidis.Client) ratelimit.Backend {
	t.Cleanup(c.Close)
	b, err := rueidisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// faults stop a server and bring it back.
var faults = []struct {
	name          string
	stop, restart func(r *servers.Redis, t testing.TB)
}{
	{"Paused", (*servers.Redis).Pause, (*servers.Redis).Resume},
	{"Killed", (*servers.Redis).Kill, (*servers.Redis).Restart},
}

const (
	stallTimeout  = failpolicy.DefaultTimeout
	stallCoolDown = 200 * time.Millisecond
	stallCalls    = 10_000
	stallWorkers  = 8
	// stallSlack is how far past the deadline, beyond the scheduling
	// delays measured meanwhile, the test lets a decision run before it
	// fails: room for the policy's own work under the race detector, far
	// short of any client's own timeout. The closing figure is the p100
	// the test logs, against the 2 ms target.
	stallSlack = 20 * time.Millisecond
	// decisionWakeups bounds the times a degraded decision waits to be
	// scheduled: its deadline's timer firing, and its goroutine running
	// again once woken (or once preempted).
	decisionWakeups = 2
)

// TestStallIntegration stops Redis (SIGSTOP, or SIGKILL) under 10,000
// decisions from 8 goroutines, for each adapter and mode: every decision
// must come back with the mode's answer, within the deadline plus twice
// the worst scheduling delay this process saw meanwhile (watchScheduling)
// plus slack, and the p100 is logged. Then Redis comes back (SIGCONT, or a
// restart on the same port), and decisions must be the store's again:
// each step of the breaker on the way (checkRecovery) within its
// cool-down, and the time it took is logged.
func TestStallIntegration(t *testing.T) {
	for _, a := range adapters {
		for _, f := range faults {
			for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed, failpolicy.Local} {
				t.Run(fmt.Sprintf("%s/%s/%v", a.name, f.name, mode), func(t *testing.T) {
					t.Parallel()
					server := servers.StartRedis(t)
					store := a.connect(t, server.Addr())
					cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1e6)}}
					key := "stall:" + t.Name()
					warm(t, store, key, cfg)
					var log hookLog
					policy := newPolicy(t, store, mode, failpolicy.WithBreaker(3, stallCoolDown), failpolicy.WithInstances(2), failpolicy.WithHooks(log.hooks()))

					f.stop(server, t)
					stopWatch := watchScheduling()
					lat := stall(t, policy, key, cfg, mode)
					late := stopWatch()
					slices.Sort(lat)
					p100, p99 := lat[len(lat)-1], lat[len(lat)*99/100]
					over := len(lat) - sortedCount(lat, stallTimeout+2*time.Millisecond)
					t.Logf("%d decisions with Redis %s: p50 %v, p99 %v, p100 %v; %d over timeout+2ms (%v); goroutines woke up to %v late meanwhile",
						len(lat), f.name, lat[len(lat)/2], p99, p100, over, stallTimeout+2*time.Millisecond, late)
					if limit := stallTimeout + decisionWakeups*late + stallSlack; p100 > limit {
						t.Errorf("p100 %v; want at most %v: the %v deadline, %d × %v of scheduling delay, and %v",
							p100, limit, stallTimeout, decisionWakeups, late, stallSlack)
					}

					f.restart(server, t)
					stopWatch = watchScheduling()
					back := time.Now()
					for {
						d, err := policy.Do(context.Background(), key, cfg, consume)
						if err != nil {
							t.Fatal(err)
						}
						if !d.Degraded {
							break
						}
						if time.Since(back) > recoveryCap {
							t.Fatalf("still degraded %v after Redis came back", recoveryCap)
						}
						time.Sleep(time.Millisecond)
					}
					recovered, late := time.Since(back), stopWatch()
					probes := checkRecovery(t, &log, back, probeTrips*late+stallSlack)
					t.Logf("the store decided again %v after Redis came back, at probe %d (cool-down %v); goroutines woke up to %v late meanwhile",
						recovered.Round(time.Millisecond), probes, stallCoolDown, late)
				})
			}
		}
	}
}

// recoveryCap bounds the wait for the store's decisions once Redis is
// back: far more than the handful of cool-downs it takes.
const recoveryCap = 10 * time.Second

// checkRecovery checks the breaker's changes since back, when Redis came
// back and the decisions began again, as log recorded them, and returns how
// many probes they made. Each change must come within a cool-down, plus
// margin, of entering the state it leaves: a probe is judged when its
// store call ends, or when its cool-down has passed, whichever is first;
// and an open breaker lets the next decision probe once its cool-down is
// over, the decisions coming 1ms apart from back on. The last change
// closes the breaker.
func checkRecovery(t *testing.T, log *hookLog, back time.Time, margin time.Duration) (probes int) {
	t.Helper()
	log.mu.Lock()
	defer log.mu.Unlock()
	for i, change := range log.changes {
		if i == 0 || !log.at[i].After(back) {
			continue
		}
		entered := log.at[i-1]
		limit := stallCoolDown + margin
		if from, _, _ := strings.Cut(change, ">"); from == failpolicy.BreakerOpen.String() {
			// No decision could probe before back.
			entered = later(entered, back)
			limit = stallCoolDown + time.Millisecond + margin
			probes++
		}
		if gap := log.at[i].Sub(entered); gap > limit {
			t.Errorf("%s %v after %s or Redis's return, whichever was later; want within %v", change, gap, log.changes[i-1], limit)
		}
	}
	if n := len(log.changes); n == 0 || log.changes[n-1] != "BreakerHalfOpen>BreakerClosed" {
		t.Errorf("breaker changes %v; want the last to close it", log.changes)
	}
	return probes
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// probeTrips bounds the round trips of a probe once Redis is back, each
// of which may wait to be scheduled: a dial, the handshake, the script
// (refused with NOSCRIPT on a restarted server), and the script again.
const probeTrips = 4

// watchScheduling measures how late this process's goroutines wake up:
// until the function it returns is called, schedWatchers goroutines each
// sleep 1ms at a time. That function returns the most any sleep overran.
// A loaded machine delays every goroutine of the process alike, a
// decision's included, so the stall test's bounds add what it measured.
func watchScheduling() (stop func() time.Duration) {
	var (
		wg   sync.WaitGroup
		done = make(chan struct{})
		mu   sync.Mutex
		late time.Duration
	)
	for range schedWatchers {
		wg.Go(func() {
			var worst time.Duration
			for {
				start := time.Now()
				select {
				case <-done:
					mu.Lock()
					late = max(late, worst)
					mu.Unlock()
					return
				case <-time.After(time.Millisecond):
				}
				worst = max(worst, time.Since(start)-time.Millisecond)
			}
		})
	}
	return func() time.Duration {
		close(done)
		wg.Wait()
		return late
	}
}

// schedWatchers is how many goroutines watchScheduling runs: as many as
// the stall test's workers, so that a delay any of them meets is likely
// met by a watcher too.
const schedWatchers = stallWorkers

// warm makes a first decision with the store, without the policy's
// deadline: it dials and loads the script, which a loaded machine may take
// more than 5ms to do, and more than the client's LowLatency timeouts
// under -race, so a timeout is tried again.
func warm(t *testing.T, store ratelimit.Backend, key string, cfg ratelimit.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := retrySetup(func() error {
		_, err := store.Do(ctx, key, cfg, consume)
		return err
	}, storeFailed)
	if err != nil {
		t.Fatal(err)
	}
}

// retrySetup calls f until it returns nil, or an error retry refuses, for
// up to 10s: a step of a test's setup that a loaded machine can fail by a
// client's timeout. It returns f's last error.
func retrySetup(f func() error, retry func(error) bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil || !retry(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// storeFailed reports whether err is the store failing.
func storeFailed(err error) bool {
	return errors.Is(err, ratelimit.ErrTimeout) || errors.Is(err, ratelimit.ErrBackendUnavailable)
}

// always reports true: every error is tried again.
func always(error) bool { return true }

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
			server := servers.StartRedis(t)
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

// TestImpatientCallersIntegration: with Redis healthy, callers whose own
// contexts are already past their deadline, or have 50µs, each get their
// context's error or Redis's decision, never a degraded one, and leave the
// breaker closed, in Open and Closed mode with the defaults; then a
// bucket of 3 admits 3 of 6, each decided by Redis (issue 12, 1 and 4).
func TestImpatientCallersIntegration(t *testing.T) {
	for _, a := range adapters {
		for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed} {
			t.Run(a.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				server := servers.StartRedis(t)
				store := a.connect(t, server.Addr())
				warm(t, store, "warm", perMinute)
				var log hookLog
				policy := newPolicy(t, store, mode, failpolicy.WithHooks(log.hooks()))
				var refused, decided int
				for range 20 {
					for _, ctx := range impatient(t) {
						d, err := policy.Do(ctx, "attacker:"+t.Name(), perMinute, consume)
						switch {
						case d.Degraded:
							t.Fatalf("an impatient caller: %+v, %v; want no degraded decision", d, err)
						case err == nil:
							decided++
						case errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ratelimit.ErrTimeout) && !errors.Is(err, ratelimit.ErrBackendUnavailable):
							refused++
						default:
							t.Fatalf("an impatient caller: %v; want context.DeadlineExceeded and no store sentinel", err)
						}
					}
				}
				t.Logf("40 impatient callers: %d got their context's error, %d a decision by Redis; breaker changes %v", refused, decided, log.changes)
				if policy.Breaker() != failpolicy.BreakerClosed || len(log.changes) != 0 {
					t.Fatalf("breaker %v, changes %v; want BreakerClosed, untouched", policy.Breaker(), log.changes)
				}
				victim := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3)}}
				admitted := 0
				for range 6 {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					d, err := policy.Do(ctx, "victim:"+t.Name(), victim, consume)
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					if d.Degraded {
						// On a loaded machine Redis may miss the default
						// deadline; that is the store's failure, which
						// the caller's context is not.
						t.Logf("a patient caller's decision was degraded: %+v", d)
					}
					if d.Allowed {
						admitted++
					}
				}
				if mode == failpolicy.Closed && admitted > 3 || mode == failpolicy.Open && admitted < 3 {
					t.Errorf("the victim's bucket of 3 admitted %d of 6", admitted)
				}
				if len(log.degraded) == 0 && admitted != 3 {
					t.Errorf("the victim's bucket of 3 admitted %d of 6, each decided by Redis; want 3", admitted)
				}
			})
		}
	}
}

// TestKeyRejectedIntegration: a key holding a value sluice did not write
// gets ErrKeyRejected, 20 times over, and the breaker stays closed: a
// victim's drained bucket of 3 stays drained, decided by Redis (issue 12,
// 5).
func TestKeyRejectedIntegration(t *testing.T) {
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			server := servers.StartRedis(t)
			// The client's default timeouts: LowLatency's 50ms, which a
			// loaded machine can miss, would make a store failure of a
			// call this test needs Redis to answer.
			store := a.patient(t, server.Addr())
			raw := redis.NewClient(&redis.Options{Addr: server.Addr()})
			defer raw.Close()
			if err := raw.Set(context.Background(), "{foreign}", "not a bucket", 0).Err(); err != nil {
				t.Fatal(err)
			}
			var log hookLog
			policy := newPolicy(t, store, failpolicy.Open, failpolicy.WithTimeout(time.Second), failpolicy.WithHooks(log.hooks()))
			victim := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(3)}}
			for range 3 {
				if d, err := policy.Do(context.Background(), "victim", victim, consume); err != nil || !d.Allowed || d.Degraded {
					t.Fatalf("draining the victim: %+v, %v", d, err)
				}
			}
			for range 20 {
				d, err := policy.Do(context.Background(), "foreign", perMinute, consume)
				if !errors.Is(err, ratelimit.ErrKeyRejected) || errors.Is(err, ratelimit.ErrBackendUnavailable) || d.Degraded {
					t.Fatalf("the foreign key: %+v, %v; want ErrKeyRejected, not ErrBackendUnavailable, not Degraded", d, err)
				}
			}
			if policy.Breaker() != failpolicy.BreakerClosed || len(log.changes) != 0 {
				t.Fatalf("breaker %v, changes %v; want BreakerClosed", policy.Breaker(), log.changes)
			}
			for range 3 {
				if d, err := policy.Do(context.Background(), "victim", victim, consume); err != nil || d.Allowed || d.Degraded {
					t.Fatalf("the drained victim: %+v, %v; want denied by Redis", d, err)
				}
			}
		})
	}
}
