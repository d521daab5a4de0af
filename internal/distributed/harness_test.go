package distributed_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// build is the instance program, built by the first run that needs it.
var build testkit.InstanceBuild

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		build.Remove()
		os.Exit(code)
	}))
}

// skipShort skips the distributed runs under -short: each takes seconds.
func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: distributed runs take seconds each")
	}
}

// topology is where a run's Redis is.
type topology struct {
	addrs   []string
	cluster bool
	nodes   []*testkit.Redis // the cluster's masters, for faults
}

// standalone is a standalone server: $SLUICE_REDIS_ADDR, or a new one.
func standalone(t *testing.T) topology {
	addr, _ := testkit.StandaloneAddr(t)
	return topology{addrs: []string{addr}}
}

// cluster is a new 3-master cluster.
func cluster(t *testing.T) topology {
	c := testkit.StartCluster(t)
	return topology{addrs: c.Addrs(), cluster: true, nodes: c.Nodes()}
}

// topologies start the Redis of each kind of run.
var topologies = []struct {
	name  string
	start func(*testing.T) topology
}{{"Standalone", standalone}, {"Cluster", cluster}}

// onEachTopology runs body in a parallel subtest for each topology, on a
// new Redis of its kind and a client of it.
func onEachTopology(t *testing.T, body func(t *testing.T, top topology, c client)) {
	for _, tk := range topologies {
		t.Run(tk.name, func(t *testing.T) {
			t.Parallel()
			top := tk.start(t)
			body(t, top, newClient(t, top))
		})
	}
}

var adapters = []string{testkit.BackendGoRedis, testkit.BackendRueidis}

// noRefill is a token bucket that refills one token an hour: a thousandth
// of a token within a run, so that it admits no more than its capacity.
func noRefill(capacity int64) ratelimit.Bandwidth {
	return ratelimit.PerHour(1).WithBurst(capacity)
}

// newKey returns a bucket key no other run uses.
func newKey(t *testing.T) string {
	return fmt.Sprintf("distributed:%s:%d", t.Name(), time.Now().UnixNano())
}

// client is the test's own view of the Redis of top: a plain client for
// TIME, and the go-redis backend for Inspect.
type client struct {
	raw     redis.UniversalClient
	backend *redisbackend.Backend
}

func newClient(t *testing.T, top topology) client {
	var c redis.UniversalClient
	if top.cluster {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: top.addrs, MaxRetries: -1, ContextTimeoutEnabled: true})
	} else {
		c = redis.NewClient(&redis.Options{Addr: top.addrs[0], MaxRetries: -1, ContextTimeoutEnabled: true})
	}
	t.Cleanup(func() { c.Close() })
	b, err := redisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return client{c, b}
}

// node returns a client of the server that holds the bucket at key: c.raw
// itself on a standalone server, the key's master on a cluster.
func (c client) node(ctx context.Context, t *testing.T, key string) *redis.Client {
	t.Helper()
	cc, ok := c.raw.(*redis.ClusterClient)
	if !ok {
		return c.raw.(*redis.Client)
	}
	master, err := cc.MasterForKey(ctx, redisscript.Key("", key))
	if err != nil {
		t.Fatal(err)
	}
	return master
}

// serverTime reads the clock of the server that holds the bucket at key:
// the clock its script reads.
func (c client) serverTime(t *testing.T, key string) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now, err := c.node(ctx, t, key).Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// inspect returns the whole tokens left in the bucket.
func (c client) inspect(t *testing.T, key string, cfg ratelimit.Config) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := c.backend.Do(ctx, key, cfg, ratelimit.Request{Op: ratelimit.Inspect})
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// tally is what a run's calls add up to.
type tally struct {
	calls, admitted, denied, failed int
	degraded                        int           // decided by a fail policy (counted by addCall only)
	first, last                     int64         // the earliest start, the latest end, ns
	longest                         time.Duration // of the calls that returned
}

func count(calls []testkit.Call) tally {
	var n tally
	for _, c := range calls {
		if n.calls == 0 || c.Start < n.first {
			n.first = c.Start
		}
		n.last = max(n.last, c.End)
		if c.End != 0 {
			n.longest = max(n.longest, time.Duration(c.End-c.Start))
		}
		n.calls++
		switch {
		case c.Err != "":
			n.failed++
		case c.Decision.Allowed:
			n.admitted++
		default:
			n.denied++
		}
	}
	return n
}

func (n tally) rate() float64 {
	return float64(n.calls) / time.Duration(n.last-n.first).Seconds()
}

// run is one distributed run on a bucket of one bandwidth.
type run struct {
	top        topology
	backend    string
	algorithm  ratelimit.Algorithm
	bandwidth  ratelimit.Bandwidth
	processes  int
	goroutines int
	attempts   int    // in all, shared evenly
	fault      *fault // strikes mid-run, or nil
	// faultAfter is how many calls, shared evenly, start before the
	// fault; faultCalls, how many each goroutine makes while it is in
	// place, each bounded by faultTimeout (0: the instance's default, as
	// for every other call).
	faultAfter, faultCalls int
	faultTimeout           time.Duration
	refill                 bool // linearizability: check with refillModel
}

// fault strikes a run between two of its phases; see execute.
type fault struct {
	name string
	// quiet says that the fault strikes only once no call is in flight,
	// so that no call of the first phase meets it.
	quiet bool
	// inject strikes, and returns once the fault is in place, with the
	// function that ends it and returns once it is over.
	inject func(t *testing.T, c client, r run, key string, in *testkit.Instances) (heal func())
	// during returns an error if call c, which started while the fault
	// was in place, shows that it was not.
	during func(c testkit.Call, m marks) error
}

// marks are the times, in ns on the instances' clock, between a run's
// phases.
type marks struct {
	struck  int64 // the fault was in place
	healing int64 // every call during the fault had started; heal began
	healed  int64 // the fault was over
}

// execute starts r's instances on spec, releases them, and returns their
// calls. before runs just before the release.
//
// A run with a fault has three phases, which no call can run past: each
// instance holds once faultAfter/processes of its calls have started,
// until the fault is in place; then makes faultCalls calls a goroutine
// during the fault, and holds again until the fault is over; then makes
// the rest. The marks say when the phases changed.
func execute(t *testing.T, c client, r run, spec testkit.InstanceSpec, before func()) ([]testkit.Call, marks) {
	t.Helper()
	bin := build.Bin(t)
	if r.fault != nil {
		at := r.faultAfter / r.processes
		spec.Holds = []testkit.Hold{{At: at, Timeout: r.faultTimeout}, {At: at + r.faultCalls*r.goroutines}}
	}
	in := testkit.StartInstances(t, bin, r.processes, spec)
	if before != nil {
		before()
	}
	in.Go(t)
	if r.fault == nil {
		return in.Wait(t), marks{}
	}
	var m marks
	in.WaitHeld(t)
	if r.fault.quiet {
		in.WaitIdle(t)
	}
	heal := r.fault.inject(t, c, r, spec.Key, in)
	m.struck = time.Now().UnixNano()
	in.Go(t)
	in.WaitHeld(t)
	m.healing = time.Now().UnixNano()
	heal()
	m.healed = time.Now().UnixNano()
	in.Go(t)
	return in.Wait(t), m
}

// checkFault returns an error unless r's calls show its fault in place
// from m.struck to m.healing (some started then, and none shows it was
// not), and over from m.healed: some call started after, and every one of
// them decided.
func checkFault(r run, calls []testkit.Call, m marks) error {
	during, after := m.split(calls)
	var errs []error
	for _, c := range during {
		if err := r.fault.during(c, m); err != nil && len(errs) < 3 {
			errs = append(errs, err)
		}
	}
	afterFailed := 0
	for _, c := range after {
		if c.Err != "" {
			afterFailed++
			if afterFailed <= 3 {
				errs = append(errs, fmt.Errorf("instance %d, attempt %d, after the fault: %s", c.Instance, c.Attempt, c.Err))
			}
		}
	}
	if len(during) == 0 {
		errs = append(errs, errors.New("no call started while the fault was in place"))
	}
	if len(after) == 0 || afterFailed > 0 {
		errs = append(errs, fmt.Errorf("%d calls started after the fault, %d failed; want some, none failed", len(after), afterFailed))
	}
	return errors.Join(errs...)
}

// split returns the calls that started while the fault was in place, and
// those that started once it was over.
func (m marks) split(calls []testkit.Call) (during, after []testkit.Call) {
	for _, c := range calls {
		switch {
		case c.Start > m.healed:
			after = append(after, c)
		case c.Start > m.struck && c.Start < m.healing:
			during = append(during, c)
		}
	}
	return during, after
}

func (r run) spec(key string) testkit.InstanceSpec {
	return testkit.InstanceSpec{
		Backend:    r.backend,
		Addrs:      r.top.addrs,
		Cluster:    r.top.cluster,
		Key:        key,
		Config:     ratelimit.Config{Algorithm: r.algorithm, Bandwidths: []ratelimit.Bandwidth{r.bandwidth}},
		Goroutines: r.goroutines,
		Attempts:   r.attempts / r.processes,
	}
}

// master returns the cluster master that holds the bucket at key.
func (c client) master(t *testing.T, top topology, key string) *testkit.Redis {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := c.node(ctx, t, key).Options().Addr
	for _, n := range top.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	t.Fatalf("no node of %v is %s", top.addrs, addr)
	return nil
}
