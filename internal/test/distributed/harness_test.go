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
	"github.com/sluicehq/sluice/internal/redisconn"
	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// build is the instance program, built by the first run that needs it.
var build servers.InstanceBuild

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		build.Remove()
		os.Exit(code)
	}),
		// A rueidis cluster client's refresh may sleep on after Close (as
		// in backend/rueidis's tests): the permit runs' own clients are of
		// the backend under test.
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
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
	nodes   []*servers.Redis // the cluster's masters, for faults
}

// standalone is a standalone server: $SLUICE_REDIS_ADDR, or a new one.
func standalone(t *testing.T) topology {
	addr, _ := servers.StandaloneAddr(t)
	return topology{addrs: []string{addr}}
}

// server is where top's Redis is, for a spec.
func (top topology) server() harness.Server {
	return harness.Server{Server: redisconn.Server{Addrs: top.addrs, Cluster: top.cluster}}
}

// cluster is a new 3-master cluster.
func cluster(t *testing.T) topology {
	c := servers.StartCluster(t)
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

var adapters = []string{harness.BackendGoRedis, harness.BackendRueidis}

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
	c, err := harness.NewGoRedis(top.server())
	if err != nil {
		t.Fatal(err)
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
	n, err := harness.Node(ctx, c.raw, "", key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// serverTime reads the clock of the server that holds the bucket at key:
// the clock its script reads.
func (c client) serverTime(t *testing.T, key string) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now, err := harness.ServerTime(ctx, c.raw, "", key)
	if err != nil {
		t.Fatal(err)
	}
	return now
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
	// for every other call), which only a fault that stalls sets (see
	// faultAdmissionRun).
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
	// stalls says that the fault holds calls up (a paused master) rather
	// than ending them: only its calls get the run's short faultTimeout,
	// so that they fail during it. A fault that does not stall leaves its
	// calls the instance's default timeout (10s), which a busy machine does
	// not reach: a timeout there would make a call's outcome unknown for
	// no reason.
	stalls bool
	// inject strikes, and returns once the fault is in place, with the
	// function that ends it and returns once it is over.
	inject func(t *testing.T, c client, r run, key string, in *servers.Instances) (heal func())
	// during returns an error if call c, which started while the fault
	// was in place, shows that it was not.
	during func(c harness.Call, m marks) error
}

// marks are the times, in ns on the instances' clock, between a run's
// phases.
type marks struct {
	struck  int64 // the fault was in place
	healing int64 // every call during the fault had started; heal began
	healed  int64 // the fault was over
}

// execute starts r's instances on spec, releases them, and returns their
// calls; see drive.
func execute(t *testing.T, c client, r run, spec harness.Spec) ([]harness.Call, marks) {
	t.Helper()
	in := servers.StartInstances(t, build.Bin(t), r.processes, r.withHolds(spec))
	m := r.drive(t, c, spec.Key, in)
	return in.Wait(t), m
}

// withHolds adds to spec the holds of r's fault, if it has one.
//
// A run with a fault has three phases, which no call can run past: each
// instance holds once faultAfter/processes of its calls have started,
// until the fault is in place; then makes faultCalls calls a goroutine
// during the fault, and holds again until the fault is over; then makes
// the rest.
func (r run) withHolds(spec harness.Spec) harness.Spec {
	if r.fault != nil {
		at := r.faultAfter / r.processes
		spec.Holds = []harness.Hold{{At: at, Timeout: r.faultTimeout}, {At: at + r.faultCalls*r.goroutines}}
	}
	return spec
}

// drive releases r's instances, on the bucket at key, and runs the phases
// of its fault, if it has one: it strikes the fault once the instances
// hold at the first hold, and heals it once they hold at the second. The
// marks say when the phases changed.
func (r run) drive(t *testing.T, c client, key string, in *servers.Instances) marks {
	t.Helper()
	in.Go(t)
	if r.fault == nil {
		return marks{}
	}
	var m marks
	in.WaitHeld(t)
	if r.fault.quiet {
		in.WaitIdle(t)
	}
	heal := r.fault.inject(t, c, r, key, in)
	m.struck = time.Now().UnixNano()
	in.Go(t)
	in.WaitHeld(t)
	m.healing = time.Now().UnixNano()
	heal()
	m.healed = time.Now().UnixNano()
	in.Go(t)
	return m
}

// checkFault returns an error unless r's calls show its fault in place
// from m.struck to m.healing (some started then, and none shows it was
// not), and over from m.healed: some call started after, and every one of
// them decided.
func checkFault(r run, calls []harness.Call, m marks) error {
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
func (m marks) split(calls []harness.Call) (during, after []harness.Call) {
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

func (r run) spec(key string) harness.Spec {
	return harness.Spec{
		Backend:    r.backend,
		Server:     r.top.server(),
		Key:        key,
		Config:     ratelimit.Config{Algorithm: r.algorithm, Bandwidths: []ratelimit.Bandwidth{r.bandwidth}},
		Goroutines: r.goroutines,
		Attempts:   r.attempts / r.processes,
	}
}

// master returns the cluster master that holds the bucket at key.
func (c client) master(t *testing.T, top topology, key string) *servers.Redis {
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
