// Command instance is one sluice client process of a distributed test run,
// started by testkit.StartInstances; it is not meant to be run by hand.
//
// Usage: instance INDEX. It reads a testkit.InstanceSpec as one JSON line
// on stdin, connects to Redis and writes {"Ready":true}; on the line "go"
// it runs the spec's goroutines, writing a testkit.InstanceLine on stdout
// as each call starts and as it returns, then {"Done":true}, and exits. At
// each of the spec's holds it writes {"Held":true} and waits for another
// "go". If it cannot go on, it writes {"Fatal":"why"} and exits 1.
package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// out writes the lines the harness reads; each line in one write, so a kill
// never leaves half a line.
type out struct {
	mu sync.Mutex
}

func (o *out) line(l testkit.InstanceLine) {
	b, err := json.Marshal(l)
	if err != nil {
		panic(err) // every value written is plain data
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = os.Stdout.Write(append(b, '\n')) // a closed stdout means the harness is gone
}

func main() {
	var o out
	if err := run(&o); err != nil {
		o.line(testkit.InstanceLine{Fatal: err.Error()})
		os.Exit(1)
	}
	o.line(testkit.InstanceLine{Done: true})
}

func run(o *out) error {
	if len(os.Args) != 2 {
		return errors.New("usage: instance INDEX")
	}
	index, err := strconv.Atoi(os.Args[1])
	if err != nil {
		return fmt.Errorf("INDEX: %w", err)
	}
	in := bufio.NewReader(os.Stdin)
	specLine, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var spec testkit.InstanceSpec
	if err := json.Unmarshal(specLine, &spec); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	if spec.Goroutines < 1 || spec.Attempts < 0 {
		return fmt.Errorf("spec: Goroutines %d, Attempts %d", spec.Goroutines, spec.Attempts)
	}
	if err := checkHolds(spec); err != nil {
		return err
	}
	if len(spec.Requests) == 0 {
		spec.Requests = []ratelimit.Request{{Op: ratelimit.Consume, Tokens: 1}}
	}
	if spec.Timeout == 0 {
		spec.Timeout = 10 * time.Second
	}

	backend, closeClient, err := connect(spec)
	if err != nil {
		return err
	}
	defer closeClient()
	if backend, err = withPolicy(backend, spec.Policy); err != nil {
		return err
	}
	if backend, err = withShard(backend, spec.Key, spec.Shard); err != nil {
		return err
	}
	if err := warm(backend); err != nil {
		return err
	}
	o.line(testkit.InstanceLine{Ready: true})

	if err := awaitGo(in); err != nil {
		return err
	}
	g := newGate(spec, func() { o.line(testkit.InstanceLine{Held: true}) })
	go g.serve(in)
	var wg sync.WaitGroup
	for gi := range spec.Goroutines {
		wg.Go(func() {
			for {
				i, ok := g.take()
				if !ok {
					return
				}
				o.line(testkit.InstanceLine{Call: call(o, g, backend, spec, index, gi, i)})
				time.Sleep(spec.Pause)
			}
		})
	}
	wg.Wait()
	if spec.Settle {
		return settle(backend, spec)
	}
	return nil
}

// settle makes Estimate calls until the store decides one; see
// testkit.InstanceSpec.Settle.
func settle(b backend, spec testkit.InstanceSpec) error {
	const patience = 30 * time.Second
	decided := retry(patience, 50*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), spec.Timeout)
		defer cancel()
		d, err := b.Do(ctx, spec.Key, spec.Config, ratelimit.Request{Op: ratelimit.Estimate, Tokens: 1})
		if err == nil && d.Degraded {
			err = errors.New("degraded")
		}
		return err
	})
	if decided != nil {
		return fmt.Errorf("settle: no call was decided by the store within %v: %w", patience, decided)
	}
	return nil
}

// retry calls f, every apart, until it returns nil or patience has passed,
// and returns its last error.
func retry(patience, every time.Duration, f func() error) error {
	start := time.Now()
	for {
		err := f()
		if err == nil || time.Since(start) >= patience {
			return err
		}
		time.Sleep(every)
	}
}

// withPolicy puts b behind the fail policy p, if p is set.
func withPolicy(b backend, p *testkit.InstancePolicy) (backend, error) {
	if p == nil {
		return b, nil
	}
	mode := failpolicy.Open
	for mode.String() != p.Mode {
		if mode++; mode > failpolicy.Local {
			return nil, fmt.Errorf("spec: Policy.Mode %q is not Open, Closed or Local", p.Mode)
		}
	}
	var opts []failpolicy.Option
	if p.Timeout != 0 {
		opts = append(opts, failpolicy.WithTimeout(p.Timeout))
	}
	if p.Instances != 0 {
		opts = append(opts, failpolicy.WithInstances(p.Instances))
	}
	policy, err := failpolicy.Wrap(unwrap(b), mode, opts...)
	if err != nil {
		return nil, err
	}
	return pinger{policy, b.ping}, nil
}

// unwrap returns the Backend inside a pinger, which has the Redis
// backends' optional capabilities (slots, nodes) that a decorator looks
// for and the pinger would hide; any other b as it is.
func unwrap(b backend) ratelimit.Backend {
	if p, ok := b.(pinger); ok {
		return p.Backend
	}
	return b
}

// withShard splits key in b's store as s says, if s is set.
func withShard(b backend, key string, s *testkit.InstanceShard) (backend, error) {
	if s == nil {
		return b, nil
	}
	split, err := sharding.New(unwrap(b), sharding.Keys(s.N, key).WithRetries(s.Retries))
	if err != nil {
		return nil, err
	}
	return pinger{split, b.ping}, nil
}

// warm makes a first round trip, so that connecting is not part of the
// run. It tries again for up to 10s: a LowLatency client gives a call 50ms,
// which a first dial on a loaded machine may miss.
func warm(b backend) error {
	err := retry(10*time.Second, 10*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return b.ping(ctx)
	})
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// awaitGo reads the next line on stdin, which must be the harness's go.
func awaitGo(in *bufio.Reader) error {
	if line, err := in.ReadString('\n'); err != nil || line != testkit.InstanceGo {
		return fmt.Errorf("waiting for go: read %q, %v", line, err)
	}
	return nil
}

// gate hands out the attempts to the goroutines and keeps them from
// passing a hold until the harness releases it; see
// testkit.InstanceSpec.Holds.
type gate struct {
	attempts int
	holds    []testkit.Hold
	timeout  time.Duration // the spec's: of the calls in a phase without one
	held     func()        // reports that the instance holds

	mu       sync.Mutex
	released sync.Cond // signalled when a hold is released
	next     int       // the next attempt to hand out
	started  int       // the attempts whose start has been reported
	passed   int       // the holds released so far
}

func newGate(spec testkit.InstanceSpec, held func()) *gate {
	g := &gate{attempts: spec.Attempts, holds: spec.Holds, timeout: spec.Timeout, held: held}
	g.released.L = &g.mu
	return g
}

// take returns the next attempt, waiting at a hold until it is released,
// or false once every attempt has been handed out.
func (g *gate) take() (int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.passed < len(g.holds) && g.next == g.holds[g.passed].At {
		g.released.Wait()
	}
	if g.next >= g.attempts {
		return 0, false
	}
	g.next++
	return g.next - 1, true
}

// start records that attempt i's start has been reported, and returns the
// timeout of its call. Once every attempt before a hold has started, the
// instance reports that it holds there.
func (g *gate) start(i int) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.started++
	// Once: started grows by one, and no attempt past the hold starts
	// before its release.
	if g.passed < len(g.holds) && g.started == g.holds[g.passed].At {
		g.held()
	}
	timeout := g.timeout
	for _, h := range g.holds {
		if i >= h.At {
			timeout = cmp.Or(h.Timeout, g.timeout)
		}
	}
	return timeout
}

// serve releases a hold for each go the harness writes on stdin. When
// stdin closes the harness is gone: an instance held then would wait for
// ever, so it exits.
func (g *gate) serve(in *bufio.Reader) {
	for {
		if err := awaitGo(in); err != nil {
			g.mu.Lock()
			held := g.passed < len(g.holds)
			g.mu.Unlock()
			if held {
				fmt.Fprintf(os.Stderr, "instance: %v\n", err)
				os.Exit(1)
			}
			return
		}
		g.mu.Lock()
		g.passed++
		g.released.Broadcast()
		g.mu.Unlock()
	}
}

// checkHolds checks that spec's holds are within its attempts, in order.
func checkHolds(spec testkit.InstanceSpec) error {
	last := 0
	for k, h := range spec.Holds {
		if h.At <= last || h.At >= spec.Attempts || h.Timeout < 0 {
			return fmt.Errorf("spec: Holds[%d] {At %d, Timeout %v}: want At after the last hold's (%d) and before Attempts (%d), and Timeout not negative",
				k, h.At, h.Timeout, last, spec.Attempts)
		}
		last = h.At
	}
	return nil
}

// call makes attempt i: it reports the start, and returns the call to
// report once done.
func call(o *out, g *gate, b backend, spec testkit.InstanceSpec, index, gi, i int) *testkit.Call {
	c := &testkit.Call{Instance: index, Goroutine: gi, Attempt: i}
	c.Start = time.Now().UnixNano()
	started := *c
	o.line(testkit.InstanceLine{Started: &started})
	ctx, cancel := context.WithTimeout(context.Background(), g.start(i))
	defer cancel()
	d, err := b.Do(ctx, spec.Key, spec.Config, spec.Requests[i%len(spec.Requests)])
	c.End = time.Now().UnixNano()
	c.Decision = d
	if err != nil {
		c.Err = err.Error()
	}
	return c
}

// backend is a ratelimit.Backend that can also check its connection.
type backend interface {
	ratelimit.Backend
	ping(ctx context.Context) error
}

// connect builds spec's backend on a new client, set up as the Redis
// backends' docs recommend: no retries, the context's deadline obeyed.
func connect(spec testkit.InstanceSpec) (backend, func(), error) {
	if len(spec.Addrs) == 0 {
		return nil, nil, errors.New("spec: no Addrs")
	}
	switch spec.Backend {
	case testkit.BackendGoRedis, testkit.BackendRacy:
		var c redis.UniversalClient
		if spec.Cluster {
			opts := &redis.ClusterOptions{Addrs: spec.Addrs, MaxRetries: -1, ContextTimeoutEnabled: true}
			if spec.LowLatency {
				redisbackend.LowLatencyCluster(opts)
			}
			c = redis.NewClusterClient(opts)
		} else {
			opts := &redis.Options{Addr: spec.Addrs[0], MaxRetries: -1, ContextTimeoutEnabled: true}
			if spec.LowLatency {
				redisbackend.LowLatency(opts)
			}
			c = redis.NewClient(opts)
		}
		closeClient := func() { _ = c.Close() }
		ping := func(ctx context.Context) error { return c.Ping(ctx).Err() }
		if spec.Backend == testkit.BackendRacy {
			return racy{c, ping}, closeClient, nil
		}
		b, err := redisbackend.New(c)
		if err != nil {
			closeClient()
			return nil, nil, err
		}
		return pinger{b, ping}, closeClient, nil
	case testkit.BackendRueidis:
		opt := rueidis.ClientOption{InitAddress: spec.Addrs, ForceSingleClient: !spec.Cluster, DisableCache: true}
		if spec.LowLatency {
			rueidisbackend.LowLatency(&opt)
		}
		c, err := rueidis.NewClient(opt)
		if err != nil {
			return nil, nil, err
		}
		b, err := rueidisbackend.New(c)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		ping := func(ctx context.Context) error { return c.Do(ctx, c.B().Ping().Build()).Error() }
		return pinger{b, ping}, c.Close, nil
	}
	return nil, nil, fmt.Errorf("spec: Backend %q is not %q, %q or %q", spec.Backend, testkit.BackendGoRedis, testkit.BackendRueidis, testkit.BackendRacy)
}

// pinger pairs a backend with its client's PING.
type pinger struct {
	ratelimit.Backend
	pingFunc func(ctx context.Context) error
}

func (p pinger) ping(ctx context.Context) error { return p.pingFunc(ctx) }

// racy keeps a bucket's ratelimit.State as JSON in a plain key, and applies
// a request by GET, ratelimit.Apply on the local clock, then SET: a lost
// update whenever two calls overlap. It exists to show that the
// linearizability check fails on a limiter that is not atomic.
type racy struct {
	c        redis.UniversalClient
	pingFunc func(ctx context.Context) error
}

func (r racy) ping(ctx context.Context) error { return r.pingFunc(ctx) }

// Do reads, decides in Go and writes back, in three steps.
func (r racy) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	var s ratelimit.State
	stored, err := r.c.Get(ctx, "racy:"+key).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, err)
	default:
		if err := json.Unmarshal(stored, &s); err != nil {
			return ratelimit.Decision{}, err
		}
	}
	d := ratelimit.Apply(&s, cfg, req, time.Now().UnixMicro())
	state, err := json.Marshal(s)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	if err := r.c.Set(ctx, "racy:"+key, state, 0).Err(); err != nil {
		return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, err)
	}
	return d, nil
}
