package harness

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// InstanceEnv names the environment variable that makes a program an
// instance: [Start] sets it to the instance's index, and a program that
// finds it set hands its process to [InstanceMain].
const InstanceEnv = "SLUICE_HARNESS_INSTANCE"

// IsInstance says whether this process was started by [Start] as an
// instance.
func IsInstance() bool {
	_, ok := os.LookupEnv(InstanceEnv)
	return ok
}

// A Connector builds the backend an instance decides with, from the
// [Spec] the harness sent it, in the instance's own process: [Connect]
// builds sluice's own (the instance program of internal/test/servers and
// sluice-verify pass it), and testkit's two-instance check a test's own
// backend, with the test's client and decorators ([NewConn]).
type Connector func(spec Spec) (*Conn, error)

// InstanceMain is the whole of an instance: one sluice client process of a
// distributed run, started by [Start], that decides with the backend
// connect builds. It never returns.
//
// It reads a [Spec] as one JSON line on stdin, connects and writes
// {"Ready":true}; on the line "go" it runs the spec's goroutines, writing a
// [Line] as each call starts and as it returns, then {"Done":true}, and
// exits 0. At each of the spec's holds it writes {"Held":true} and waits
// for another "go". If it cannot go on, it writes {"Fatal":"why"} and
// exits 1. Each line goes to stdout after [LinePrefix], so that whatever
// else the program writes there (a test binary's own lines) is told apart.
func InstanceMain(connect Connector) {
	var o out
	if err := runInstance(&o, connect); err != nil {
		o.line(Line{Fatal: err.Error()})
		os.Exit(1)
	}
	o.line(Line{Done: true})
	os.Exit(0)
}

// out writes the lines the harness reads on stdout, or on w if set; each
// line in one write, so a kill never leaves half a line, and no other
// write on stdout splits one (a pipe takes a write of up to 4KiB whole).
type out struct {
	mu sync.Mutex
	w  io.Writer
}

func (o *out) line(l Line) {
	b, err := json.Marshal(l)
	if err != nil {
		panic(err) // every value written is plain data
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.w
	if w == nil {
		w = os.Stdout
	}
	_, _ = w.Write(slices.Concat([]byte(LinePrefix), b, []byte{'\n'})) // a closed stdout means the harness is gone
}

func runInstance(o *out, connect Connector) error {
	index, err := strconv.Atoi(os.Getenv(InstanceEnv))
	if err != nil {
		return fmt.Errorf("$%s, the instance's index: %w", InstanceEnv, err)
	}
	in := bufio.NewReader(os.Stdin)
	specLine, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var spec Spec
	if err := json.Unmarshal(specLine, &spec); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	if spec.Goroutines < 1 || spec.Attempts < 0 {
		return fmt.Errorf("spec: Goroutines %d, Attempts %d", spec.Goroutines, spec.Attempts)
	}
	if err := checkHolds(spec); err != nil {
		return err
	}
	if err := checkPermits(spec); err != nil {
		return err
	}
	if len(spec.Requests) == 0 {
		spec.Requests = []ratelimit.Request{{Op: ratelimit.Consume, Tokens: 1}}
	}
	if spec.Timeout == 0 {
		spec.Timeout = 10 * time.Second
	}

	conn, err := connect(spec)
	if err != nil {
		return err
	}
	defer conn.Close()
	backend := conn.Backend
	if backend, err = withPolicy(backend, spec.Policy); err != nil {
		return err
	}
	if backend, err = withShard(backend, spec.Key, spec.Shard); err != nil {
		return err
	}
	leased, err := withLease(backend, spec.Key, spec.Lease)
	if err != nil {
		return err
	}
	if leased != nil {
		defer leased.Close() // before conn.Close: its refills in flight use the client
		backend = leased
	}
	if err := warm(conn); err != nil {
		return err
	}
	clients, err := newClients(spec, backend, index)
	if err != nil {
		return err
	}
	defer clients.close()
	o.line(Line{Ready: true})

	if err := awaitGo(in); err != nil {
		return err
	}
	g := newGate(spec, func() { o.line(Line{Held: true}) })
	go g.serve(in)
	if err := runClients(o, g, clients, spec); err != nil {
		return err
	}
	if spec.Settle {
		return settle(backend, spec)
	}
	return nil
}

// runClients runs spec's goroutines, each making the attempts g hands it
// with its client and writing a Line of each call, until g has none left
// or a client fails.
func runClients(o *out, g *gate, cs clients, spec Spec) error {
	var (
		wg   sync.WaitGroup
		errs = make([]error, spec.Goroutines)
	)
	for gi := range spec.Goroutines {
		wg.Go(func() {
			client := cs.client(gi)
			for {
				i, ok := g.take(gi)
				if !ok {
					return
				}
				c, err := client(o, g, i)
				if err != nil {
					errs[gi] = err
					return
				}
				o.line(Line{Call: c})
				time.Sleep(spec.Pause)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// A client makes a goroutine's attempts: attempt i's call, reported as it
// starts, returned once done; or an error that ends the instance.
type client func(o *out, g *gate, i int) (*Call, error)

// clients make the goroutines of an instance: calls on the bucket, or
// the clients of a permits run.
type clients struct {
	client func(gi int) client
	close  func()
}

// newClients returns the clients of spec's goroutines, on backend.
func newClients(spec Spec, backend ratelimit.Backend, index int) (clients, error) {
	if spec.Permits != nil {
		return newPermitClients(spec, backend, index)
	}
	return clients{
		client: func(gi int) client {
			return func(o *out, g *gate, i int) (*Call, error) {
				return call(o, g, backend, spec, index, gi, i), nil
			}
		},
		close: func() {},
	}, nil
}

// settle makes Estimate calls until the store decides one; see
// Spec.Settle.
func settle(b ratelimit.Backend, spec Spec) error {
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
func withPolicy(b ratelimit.Backend, p *Policy) (ratelimit.Backend, error) {
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
	return failpolicy.Wrap(b, mode, opts...)
}

// withShard splits key in b's store as s says, if s is set.
func withShard(b ratelimit.Backend, key string, s *Shard) (ratelimit.Backend, error) {
	if s == nil {
		return b, nil
	}
	return sharding.New(b, sharding.Keys(s.N, key).WithRetries(s.Retries))
}

// withLease leases key's tokens in b as l says, if l is set; else it
// returns nil.
func withLease(b ratelimit.Backend, key string, l *Lease) (*lease.Backend, error) {
	if l == nil {
		return nil, nil
	}
	opts := []lease.Option{lease.Keys(key)}
	if l.Target != 0 {
		opts = append(opts, lease.WithTarget(l.Target))
	}
	if l.MaxShare != 0 {
		opts = append(opts, lease.WithMaxShare(l.MaxShare))
	}
	return lease.New(b, opts...)
}

// warm makes a first round trip, so that connecting is not part of the
// run. It tries again for up to 10s: a LowLatency client gives a call 50ms,
// which a first dial on a loaded machine may miss.
func warm(c *Conn) error {
	err := retry(10*time.Second, 10*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return c.Ping(ctx)
	})
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// awaitGo reads the next line on stdin, which must be the harness's go.
func awaitGo(in *bufio.Reader) error {
	if line, err := in.ReadString('\n'); err != nil || line != GoLine {
		return fmt.Errorf("waiting for go: read %q, %v", line, err)
	}
	return nil
}

// gate hands out the attempts to the goroutines and keeps them from
// passing a hold until the harness releases it; see
// Spec.Holds.
type gate struct {
	attempts int
	holds    []Hold
	timeout  time.Duration // the spec's: of the calls in a phase without one
	held     func()        // reports that the instance holds

	mu       sync.Mutex
	released sync.Cond // signalled when a hold is released
	// next are the next attempts to hand out: one shared by every
	// goroutine, or, in a permits run, one a goroutine, each stepping by
	// the goroutines (see Permits).
	next    []int
	started int // the attempts whose start has been reported
	passed  int // the holds released so far
}

func newGate(spec Spec, held func()) *gate {
	g := &gate{attempts: spec.Attempts, holds: spec.Holds, timeout: spec.Timeout, held: held, next: []int{0}}
	if spec.Permits != nil {
		g.next = make([]int, spec.Goroutines)
		for gi := range g.next {
			g.next[gi] = gi
		}
	}
	g.released.L = &g.mu
	return g
}

// take returns goroutine gi's next attempt, waiting at a hold until it is
// released, or false once every attempt it may make has been handed out.
func (g *gate) take(gi int) (int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	next := &g.next[0]
	if len(g.next) > 1 {
		next = &g.next[gi]
	}
	for g.passed < len(g.holds) && *next >= g.holds[g.passed].At {
		g.released.Wait()
	}
	i := *next
	if i >= g.attempts {
		return 0, false
	}
	*next += len(g.next)
	return i, true
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
func checkHolds(spec Spec) error {
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
func call(o *out, g *gate, b ratelimit.Backend, spec Spec, index, gi, i int) *Call {
	req := spec.Requests[i%len(spec.Requests)]
	c := &Call{Instance: index, Goroutine: gi, Attempt: i, Tokens: tokens(req)}
	timed(o, g, c, func(ctx context.Context) error {
		var err error
		c.Decision, err = b.Do(ctx, spec.Key, spec.Config, req)
		return err
	})
	return c
}

// timed makes c's call with do, which sets c's decision: it reports the
// start, bounds the call by the timeout of its attempt's phase, and sets
// its end and error.
func timed(o *out, g *gate, c *Call, do func(ctx context.Context) error) {
	c.Start = time.Now().UnixNano()
	started := *c
	if c.Permit != nil {
		p := *c.Permit
		started.Permit = &p
	}
	o.line(Line{Started: &started})
	ctx, cancel := context.WithTimeout(context.Background(), g.start(c.Attempt))
	defer cancel()
	err := do(ctx)
	c.End = time.Now().UnixNano()
	c.fail(err)
}

// record sets c's outcome from what its call returned: its decision, or
// its error and whether that error leaves the bucket alone.
func (c *Call) record(d ratelimit.Decision, err error) {
	c.Decision = d
	c.fail(err)
}

// fail sets c's error, if its call returned one, and whether that error
// leaves the store alone.
func (c *Call) fail(err error) {
	if err != nil {
		c.Err = err.Error()
		c.Refused = refused(err)
	}
}

// tokens are what req takes if admitted: see [Call].Tokens.
func tokens(req ratelimit.Request) int64 {
	switch req.Op {
	case ratelimit.Consume, ratelimit.ConsumeUpTo:
		return req.Tokens
	}
	return 0
}

// refused says whether err is one a backend returns without changing the
// bucket: bad input, or a key the store rejects (its script leaves the key
// alone). A timeout or a lost connection is not: the command may have run.
func refused(err error) bool {
	for _, e := range []error{
		ratelimit.ErrInvalidConfig, ratelimit.ErrInvalidKey, ratelimit.ErrInvalidRequest, ratelimit.ErrKeyRejected,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
