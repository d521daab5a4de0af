package testkit

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend/redischeck"
	"github.com/sluicehq/sluice/internal/redisconn"
	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/ratelimit"
)

// EnvInstance is set in the environment of the processes that
// [CheckInstances] starts as its instances: the test binary, run again.
// A TestMain can skip setup of its own there, which the instances do not
// need.
const EnvInstance = "SLUICE_TESTKIT_INSTANCE"

// The defaults of an [InstanceCheck]: those of sluice-verify.
const (
	DefaultInstanceProcesses  = 2
	DefaultInstanceGoroutines = 64
	DefaultInstanceCalls      = 5000
	DefaultInstanceCapacity   = 1000
)

// instanceKeyPrefix starts the key of a check that names none.
const instanceKeyPrefix = "sluice-testkit:"

// cleanTimeout bounds the look for keys before the runs and the clean-up
// after each.
const cleanTimeout = 30 * time.Second

// InstanceCheck is what [CheckInstances] checks: the backend that Backend
// builds, on the Redis that Redis starts, with a bucket of Config.
type InstanceCheck struct {
	// Redis starts, or finds, the Redis the instances share, and returns
	// its addresses: one for a standalone server, or a Redis Cluster's
	// nodes, as go-redis's NewUniversalClient takes them (more than one
	// address is a cluster). It is called in the test's own process only,
	// never in an instance; the check reads the clock of the server that
	// holds the bucket through these addresses, and deletes its keys.
	// Required.
	Redis func(t testing.TB) []string
	// Backend builds the backend to check on the servers at addrs, as
	// the service builds it: its own client and options, sluice's
	// backend, its decorators. It is called once in each instance's
	// process, and once in the test's own, which reads the bucket after
	// each run (Inspect) and runs the backend's Check, if it or a backend
	// it wraps (Unwrap) has one. close, if not nil, releases what it
	// built. Required.
	Backend func(ctx context.Context, addrs []string) (b ratelimit.Backend, close func(), err error)
	// Config is the bucket's, with one bandwidth. The check's bound is a
	// token bucket's over the run's span of server time, which GCRA and
	// the leaky bucket keep too, and the window algorithms only while a
	// run lies within a window: give them a period far longer than the
	// run, an hour, as the default buckets do. The zero Config means
	// every bucket sluice-verify checks, of capacity
	// DefaultInstanceCapacity: one run each.
	Config ratelimit.Config
	// Key is the bucket's key, as the backend's decorators see it (a
	// sharding rule's key, say). Empty means a key of the check's own,
	// "sluice-testkit:" and random letters. The server must hold no key
	// that contains it when the check starts, and the check deletes
	// every one that does after each run. It must not hold '{', '}' or
	// '%', which the Redis backends escape in the keys they make.
	Key string
	// Processes are the instances; 0 means DefaultInstanceProcesses.
	Processes int
	// Goroutines make calls in each instance; 0 means
	// DefaultInstanceGoroutines.
	Goroutines int
	// Calls are the calls on each bucket, shared evenly by the
	// instances, each a Consume of one token; 0 means
	// DefaultInstanceCalls.
	Calls int
	// Timeout bounds each call; 0 means 10s.
	Timeout time.Duration
}

// CheckInstances runs the two-instance check on the test's own backend,
// the check that sluice-verify runs on sluice's: c.Processes processes,
// each with c.Goroutines goroutines, make c.Calls calls in all on one new
// bucket through the backend c.Backend builds in each of them, and the
// test fails, with the report sluice-verify prints, unless the calls
// admitted plus the tokens the bucket holds after them are exactly what
// the bucket allows over the run's span of the server's time (its
// capacity, plus what it refilled), and every call was decided. The
// report goes to the test's log when the check passes.
//
// The instances are the test binary itself, run again with -test.run
// naming t's test and [EnvInstance] set: there the test runs up to its
// call of CheckInstances, which becomes the instance and ends the
// process. So t must be the T of a test (or subtest), not a benchmark's,
// and what the test does before the call is done again in each
// instance: start servers in c.Redis, which only the test's own process
// calls, not before. A test may make several checks; each instance runs
// the one it was started for.
func CheckInstances(t testing.TB, c InstanceCheck) {
	t.Helper()
	id := nextCheck(t)
	if want, ok := os.LookupEnv(EnvInstance); ok {
		// An instance, which runs the test's checks up to its own and
		// makes none of the others. InstanceMain ends the process with
		// os.Exit, which the testing package lets a test call with 0
		// unless -test.paniconexit0 says otherwise: go test passes that
		// flag, and instanceArgs does not.
		if want == id {
			harness.InstanceMain(c.connect) // never returns
		}
		return
	}
	switch t.(type) {
	case *testing.B, *testing.F:
		t.Fatalf("testkit: CheckInstances: the instances run the test again by its name, which only a test can be; call it from a test, not from a %T", t)
	}
	runs, err := c.runs()
	if err != nil {
		t.Fatalf("testkit: CheckInstances: %v", err)
	}
	c = c.withDefaults()
	addrs := c.Redis(t)
	if len(addrs) == 0 {
		t.Fatal("testkit: CheckInstances: InstanceCheck.Redis returned no address")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("testkit: CheckInstances: finding the test binary to start its instances: %v", err)
	}
	ch := &instanceRuns{
		c:      c,
		prog:   harness.Program{Path: self, Args: instanceArgs(t.Name()), Env: []string{EnvInstance + "=" + id}},
		server: harness.Server{Server: redisconn.Server{Addrs: addrs, Cluster: len(addrs) > 1}},
	}
	rep, err := ch.check(t.Context(), runs)
	if err != nil {
		t.Fatalf("testkit: CheckInstances: %v", err)
	}
	var table strings.Builder
	if err := rep.WriteTable(&table); err != nil {
		t.Fatalf("testkit: CheckInstances: writing the report: %v", err)
	}
	if !rep.Passed() || rep.CleanError != "" || rep.KeysLeft > 0 {
		t.Errorf("testkit: CheckInstances: the limit did not hold across the instances, or the check could not tell:\n\n%s", table.String())
		return
	}
	t.Logf("testkit: CheckInstances:\n\n%s", table.String())
}

// checks counts the calls of CheckInstances in each test, by name, so that
// an instance (a run of the test of its own) knows which of them it is.
var checks struct {
	mu sync.Mutex
	n  map[string]int
}

// nextCheck returns the id of t's next check: its test's name and how
// many checks that test made before, counted afresh in each run of the
// test (-count).
func nextCheck(t testing.TB) string {
	name := t.Name()
	checks.mu.Lock()
	defer checks.mu.Unlock()
	if checks.n == nil {
		checks.n = map[string]int{}
	}
	n, ok := checks.n[name]
	if !ok {
		t.Cleanup(func() {
			checks.mu.Lock()
			defer checks.mu.Unlock()
			delete(checks.n, name)
		})
	}
	checks.n[name] = n + 1
	return fmt.Sprintf("%s#%d", name, n)
}

// instanceArgs are the arguments that run the test named name, alone and
// once, in the test binary: -test.run matches each element of a subtest's
// name exactly, as t.Name() gives it.
func instanceArgs(name string) []string {
	elems := strings.Split(name, "/")
	for i, e := range elems {
		elems[i] = "^" + regexp.QuoteMeta(e) + "$"
	}
	args := []string{"-test.run=" + strings.Join(elems, "/"), "-test.count=1"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	return args
}

// connect builds an instance's backend with c.Backend: the
// [harness.Connector] of the check. The instance warms it with an Inspect
// of the bucket.
func (c InstanceCheck) connect(spec harness.Spec) (*harness.Conn, error) {
	if c.Backend == nil {
		return nil, errors.New("InstanceCheck.Backend is nil")
	}
	b, closeB, err := c.Backend(context.Background(), spec.Addrs)
	if err != nil {
		return nil, fmt.Errorf("InstanceCheck.Backend: %w", err)
	}
	ping := func(ctx context.Context) error {
		_, err := b.Do(ctx, spec.Key, spec.Config, ratelimit.Request{Op: ratelimit.Inspect})
		return err
	}
	return harness.NewConn(b, ping, closeB), nil
}

// instanceRun is one run of a check: a bucket, by name, and its config.
type instanceRun struct {
	bucket harness.Bucket
	config ratelimit.Config
}

// runs checks c and returns its runs: one of c.Config, or one of each
// default bucket.
func (c InstanceCheck) runs() ([]instanceRun, error) {
	switch {
	case c.Redis == nil:
		return nil, errors.New("InstanceCheck.Redis is nil: it starts or finds the servers")
	case c.Backend == nil:
		return nil, errors.New("InstanceCheck.Backend is nil: it builds the backend to check")
	case strings.ContainsAny(c.Key, "{}%"):
		return nil, fmt.Errorf("InstanceCheck.Key %q holds '{', '}' or '%%'", c.Key)
	case c.Processes < 0 || c.Goroutines < 0 || c.Calls < 0 || c.Timeout < 0:
		return nil, fmt.Errorf("InstanceCheck: Processes %d, Goroutines %d, Calls %d, Timeout %v: want none negative", c.Processes, c.Goroutines, c.Calls, c.Timeout)
	}
	if d := c.withDefaults(); d.Calls < d.Processes {
		return nil, fmt.Errorf("InstanceCheck: Calls %d: want at least one for each of the %d processes", d.Calls, d.Processes)
	}
	cfg := c.Config
	if cfg.Algorithm == ratelimit.TokenBucket && cfg.Bandwidths == nil && cfg.Version == 0 {
		var runs []instanceRun
		for _, b := range harness.Buckets(DefaultInstanceCapacity) {
			runs = append(runs, instanceRun{b, b.Config()})
		}
		return runs, nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("InstanceCheck.Config: %w", err)
	}
	if len(cfg.Bandwidths) != 1 {
		return nil, fmt.Errorf("InstanceCheck.Config has %d bandwidths; the check's bound is of one", len(cfg.Bandwidths))
	}
	return []instanceRun{{harness.Bucket{Name: cfg.Algorithm.String(), Algorithm: cfg.Algorithm, Bandwidth: cfg.Bandwidths[0]}, cfg}}, nil
}

// withDefaults is c with its zero counts set to their defaults, and a key
// of its own if it names none.
func (c InstanceCheck) withDefaults() InstanceCheck {
	if c.Processes == 0 {
		c.Processes = DefaultInstanceProcesses
	}
	if c.Goroutines == 0 {
		c.Goroutines = DefaultInstanceGoroutines
	}
	if c.Calls == 0 {
		c.Calls = DefaultInstanceCalls
	}
	if c.Key == "" {
		c.Key = instanceKeyPrefix + rand.Text()
	}
	return c
}

// instanceRuns makes the runs of a check, in the test's own process.
type instanceRuns struct {
	c      InstanceCheck // with its defaults
	prog   harness.Program
	server harness.Server
}

// check makes the runs, each followed by the clean-up of its keys, until
// one cannot be made, and returns their report. An error means that the check could not be made:
// no report.
func (ch *instanceRuns) check(ctx context.Context, runs []instanceRun) (*harness.Report, error) {
	c := ch.c
	client, err := harness.NewGoRedis(ch.server)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	setup, cancel := context.WithTimeout(ctx, cleanTimeout)
	found, err := harness.KeysContaining(setup, client, c.Key, 3)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("looking for keys that contain the key %q: %w", c.Key, err)
	}
	if len(found) > 0 {
		return nil, fmt.Errorf("refusing to run: the server already holds keys that contain the key %q (%s), which the check would delete; remove them, or choose another InstanceCheck.Key", c.Key, strings.Join(found, ", "))
	}
	b, closeB, err := c.Backend(ctx, ch.server.Addrs)
	if err != nil {
		return nil, fmt.Errorf("InstanceCheck.Backend: %w", err)
	}
	if closeB != nil {
		defer closeB()
	}
	observer := harness.NewConn(b, nil, nil)
	observer.Redis = client

	attempts := c.Calls / c.Processes
	rep := &harness.Report{
		Title:      "testkit.CheckInstances",
		Server:     describe(ch.server),
		Prefix:     c.Key,
		Processes:  c.Processes,
		Goroutines: c.Goroutines,
		Calls:      attempts * c.Processes,
		Capacity:   runs[0].bucket.Bandwidth.Capacity,
	}
	name := fmt.Sprintf("%T", b)
	if check := findCheck(b); check != nil {
		checkCtx, cancel := context.WithTimeout(ctx, cleanTimeout)
		rep.Adapters = append(rep.Adapters, harness.CheckAdapter(checkCtx, name, nil, check))
		cancel()
	}
	for _, r := range runs {
		spec := harness.Spec{
			Server:     ch.server,
			Key:        c.Key,
			Config:     r.config,
			Goroutines: c.Goroutines,
			Attempts:   attempts,
			Timeout:    c.Timeout,
		}
		res, err := harness.Measure(ctx, harness.Run{Program: ch.prog, Processes: c.Processes, Spec: spec, Observer: observer})
		rep.Runs = append(rep.Runs, harness.NewRunReport(name, r.bucket, res, err))
		// A run that could not be made (instances that do not start)
		// says what the next would: stop.
		if rep.CleanError = ch.clean(ctx, client, rep); rep.CleanError != "" || err != nil {
			break
		}
	}
	return rep, nil
}

// clean deletes the keys of a run, every key that contains the check's
// key, adds them up in rep and counts those left; if it fails, it says
// why.
func (ch *instanceRuns) clean(ctx context.Context, client redis.UniversalClient, rep *harness.Report) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanTimeout)
	defer cancel()
	deleted, err := harness.CleanContaining(ctx, client, ch.c.Key)
	rep.KeysDeleted += deleted
	if err != nil {
		return err.Error()
	}
	left, err := harness.KeysContaining(ctx, client, ch.c.Key, 0)
	if err != nil {
		return err.Error()
	}
	rep.KeysLeft = len(left)
	return ""
}

// describe says where s is, in words, as sluice-verify does.
func describe(s harness.Server) string {
	if s.Cluster {
		return "cluster " + strings.Join(s.Addrs, ",")
	}
	return "standalone " + s.Addrs[0]
}

// checker is the Check of sluice's Redis backends: the servers they reach
// and the settings that can break the limits.
type checker interface {
	Check(ctx context.Context) (redischeck.Report, error)
}

// findCheck returns the Check of b, or of the first backend it wraps
// (Unwrap, as sluice's decorators do) that has one, or nil.
func findCheck(b ratelimit.Backend) func(context.Context) (redischeck.Report, error) {
	for b != nil {
		if c, ok := b.(checker); ok {
			return c.Check
		}
		u, ok := b.(interface{ Unwrap() ratelimit.Backend })
		if !ok {
			return nil
		}
		b = u.Unwrap()
	}
	return nil
}
