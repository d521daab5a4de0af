package distributed_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// These runs hold concurrency permits (harness.Spec.Permits) on one key of
// a limit of permitLimit, through both Redis adapters, standalone and on
// the cluster, and check what the permits promise: never more than the
// limit held at once, by porcupine against permitModel and by a count of
// overlapping holds kept on a redis-server of its own (the overlap
// counter, harness.Permits.Counter); a killed holder's permits back
// within their lease, and not before it ends; and a paused store that
// loses no permit and leaks none.

// permitLimit is the limit of every permit run.
const permitLimit = 5

// overlapCounter is a redis-server of a test's own, never faulted, on
// which the holders of its runs count the permits they hold.
type overlapCounter struct {
	addr   string
	client *redis.Client
}

func newOverlapCounter(t *testing.T) overlapCounter {
	addr := servers.StartRedis(t).Addr()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return overlapCounter{addr, c}
}

// value is the counter of the run on key: the permits its holders count
// as held.
func (oc overlapCounter) value(t *testing.T, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := oc.client.Get(ctx, harness.OverlapKey(key)).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}

// permitSpec is a permits run on top through backend: goroutines that
// make attempts each on a new key of permitLimit permits leased for
// lease, counted on counter, with no hold, no re-acquire and no inspect.
func permitSpec(t *testing.T, top topology, backend string, goroutines, attempts int, lease time.Duration, counter string) harness.Spec {
	return harness.Spec{
		Backend: backend, Server: top.server(), Key: newKey(t),
		Goroutines: goroutines, Attempts: attempts * goroutines,
		Permits: &harness.Permits{Concurrency: ratelimit.InFlight(permitLimit, lease), Counter: counter},
	}
}

// linearizablePermits is the run of the linearizability and overlap
// checks: 2 processes × 8 goroutines, 50 calls each, 5ms apart, on a key
// whose leases (5 minutes) outlast the run, so that no lease ends in it.
// A permit is held for 1 to 10ms; one in 8 is acquired again while held,
// one call in 10 of a goroutine holding none is an inspect, and one
// acquire in 4 takes a weight of 2. (With 2 × 16 goroutines, the denied
// acquires in flight at once, each a read that porcupine may place
// before or after any other, sometimes kept its search going past a
// minute; with 2 × 8 it takes milliseconds to seconds.)
func linearizablePermits(t *testing.T, top topology, backend string, counter string, seed uint64) harness.Spec {
	spec := permitSpec(t, top, backend, 8, 50, 5*time.Minute, counter)
	spec.Pause = 5 * time.Millisecond
	p := spec.Permits
	p.Weights = []int64{1, 1, 1, 2}
	p.HoldMin, p.HoldMax = time.Millisecond, 10*time.Millisecond
	p.Reacquire, p.Inspect, p.Seed = 8, 10, seed
	return spec
}

// permitsResult is what a permits run found.
type permitsResult struct {
	calls []harness.Call
	tally harness.PermitTally
	check porcupine.CheckResult
	info  porcupine.LinearizationInfo
	took  time.Duration // porcupine's check
	// counter is the overlap counter after the run.
	counter int64
}

// runLinearizablePermits makes a run of spec on 2 processes, adds up its
// calls and checks its history with porcupine.
func runLinearizablePermits(t *testing.T, spec harness.Spec, oc overlapCounter) permitsResult {
	t.Helper()
	in := servers.StartInstances(t, build.Bin(t), 2, spec)
	in.Go(t)
	var r permitsResult
	r.calls = in.Wait(t)
	r.tally = harness.CountPermits(r.calls, spec.Permits.Concurrency)
	r.counter = oc.value(t, spec.Key)
	start := time.Now()
	r.check, r.info = porcupine.CheckOperationsVerbose(permitModel(permitLimit), permitHistory(spec, r.calls), checkTimeout)
	r.took = time.Since(start)
	return r
}

// logPermits logs what a run's calls add up to.
func logPermits(t *testing.T, what string, n harness.PermitTally) {
	t.Helper()
	t.Logf("%s: %d calls over %v: %d acquires (%d granted, %d denied), %d re-acquires, %d releases (%d granted), %d inspects, %d failed (%d unknown); overlap counter at most %d; %d violations",
		what, n.Calls, n.Span().Round(time.Millisecond), n.Acquires, n.Granted, n.Denied, n.Reacquires, n.Releases, n.Released, n.Inspects, n.Failed, n.Unknown, n.MaxOverlap, n.Violations)
}

// TestPermitsLinearizable makes linearizablePermits through each Redis
// adapter, standalone and on the cluster: every call decides, none
// breaks the limit (harness.CountPermits, the overlap counter included),
// every permit granted is released and the key ends holding none, and
// porcupine finds the history linearizable against permitModel.
func TestPermitsLinearizable(t *testing.T) {
	skipShort(t)
	onEachTopology(t, func(t *testing.T, top topology, c client) {
		oc := newOverlapCounter(t)
		for _, backend := range adapters {
			t.Run(backend, func(t *testing.T) {
				spec := linearizablePermits(t, top, backend, oc.addr, 1)
				var r permitsResult
				res, runs := untilConclusive(func() porcupine.CheckResult {
					spec.Key = newKey(t)
					r = runLinearizablePermits(t, spec, oc)
					return r.check
				})
				if runs > 1 {
					t.Logf("%d runs: porcupine's check of the first %d ran out of %v", runs, runs-1, checkTimeout)
				}
				n := r.tally
				logPermits(t, fmt.Sprintf("2 processes × %d goroutines, porcupine %v in %v", spec.Goroutines, res, r.took.Round(time.Millisecond)), n)
				if res != porcupine.Ok {
					t.Errorf("porcupine: %v; visualization in %s", res, visualizePermits(r.info))
				}
				if err := n.Check(); err != nil {
					t.Error(err)
				}
				if want := 2 * spec.Attempts; n.Calls != want || n.Failed != 0 {
					t.Errorf("%d calls, %d failed; want %d, none failed", n.Calls, n.Failed, want)
				}
				if n.Granted == 0 || n.Denied == 0 || n.Released != n.Granted {
					t.Errorf("%d acquires granted, %d denied, %d released; want some granted and denied, each released", n.Granted, n.Denied, n.Released)
				}
				if r.counter != 0 {
					t.Errorf("overlap counter at %d after the run; want 0, every permit counted out", r.counter)
				}
				if d := newPermitObserver(t, spec).inspect(t); d.InFlight != 0 {
					t.Errorf("%d permits held after the run; want none", d.InFlight)
				}
			})
		}
	})
}

// TestRacyPermitsAreCaught shows that both checks can fail: the racy
// backend reads a key's permits, decides in Go and writes them back, so
// two acquires that overlap may both take the last permit. porcupine
// must find its history not linearizable, and the overlap counter must
// pass the limit; overlap is a matter of scheduling, so each gets three
// runs to show it.
func TestRacyPermitsAreCaught(t *testing.T) {
	skipShort(t)
	top := standalone(t)
	oc := newOverlapCounter(t)
	var porcupineCaught, counterCaught bool
	for seed := range uint64(3) {
		spec := linearizablePermits(t, top, harness.BackendRacy, oc.addr, seed)
		r := runLinearizablePermits(t, spec, oc)
		logPermits(t, fmt.Sprintf("run %d, porcupine %v in %v", seed, r.check, r.took.Round(time.Millisecond)), r.tally)
		porcupineCaught = porcupineCaught || r.check == porcupine.Illegal
		counterCaught = counterCaught || r.tally.MaxOverlap > permitLimit
		if porcupineCaught && counterCaught {
			if err := r.tally.Check(); err == nil {
				t.Error("harness.CountPermits found no violation in a run whose overlap counter passed the limit")
			}
			return
		}
	}
	if !porcupineCaught {
		t.Error("porcupine found no violation in 3 runs of the racy backend")
	}
	if !counterCaught {
		t.Errorf("the overlap counter stayed within the limit of %d in 3 runs of the racy backend", permitLimit)
	}
}

// permitObserver is a view of the key of a permits run, on a client of
// its own of the run's backend.
type permitObserver struct {
	spec harness.Spec
	conn *harness.Conn
}

func newPermitObserver(t *testing.T, spec harness.Spec) permitObserver {
	t.Helper()
	conn, err := harness.Connect(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return permitObserver{spec, conn}
}

// inspect returns the key's permits held, as the store counts them.
func (o permitObserver) inspect(t *testing.T) ratelimit.PermitDecision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := ratelimit.Permits(o.conn.Backend).DoPermit(ctx, o.spec.Key, o.spec.Permits.Concurrency, ratelimit.PermitRequest{Op: ratelimit.PermitInspect})
	if err != nil {
		t.Fatalf("InspectPermits: %v", err)
	}
	return d
}

// untilNoneHeld inspects the key until it holds no permit, and returns
// when an inspect last began that found one held (the zero Time if none
// did) and when the first that found none returned; it fails t if the key
// still holds one at deadline.
func (o permitObserver) untilNoneHeld(t *testing.T, deadline time.Time) (held, none time.Time) {
	t.Helper()
	for {
		start := time.Now()
		d := o.inspect(t)
		now := time.Now()
		switch {
		case d.InFlight == 0:
			return held, now
		case now.After(deadline):
			t.Fatalf("%d permits still held at the deadline", d.InFlight)
		}
		held = start
		time.Sleep(10 * time.Millisecond)
	}
}

// visualizePermits writes porcupine's view of a failed check of a permits
// run to a file that outlives the test, and returns its path.
func visualizePermits(info porcupine.LinearizationInfo) string {
	return visualizeModel(permitModel(permitLimit), info)
}

// killLease is the lease of TestPermitsKill's permits, and killMargin
// what a loaded machine may add to it before the permits come back: a
// poll of Limiter.Acquire (at most MaxAcquireBackoff apart) and a call
// that -race beside CPU burners makes slow.
const (
	killLease  = 1500 * time.Millisecond
	killMargin = 2 * time.Second
)

// TestPermitsKill: instance 0 takes all permitLimit permits, one a
// goroutine, each leased for killLease, and is killed (SIGKILL) at the
// hold that follows, every acquire returned. This process then takes the
// permits, with permitLimit goroutines: each first finds the key full
// (TryAcquire denied, every permit in flight, RetryAfter ending when the
// first of the killed instance's leases does), then waits for a permit
// with Limiter.Acquire. The m-th permit taken must come no sooner than the
// m-th of the killed leases ended on the server's clock (which is this
// machine's: a lease ends between its acquire's start and end plus
// killLease), and the last within killLease + killMargin of the killed
// acquires. Then the key holds this process's permits alone, and none
// once they are released.
func TestPermitsKill(t *testing.T) {
	skipShort(t)
	onEachTopology(t, func(t *testing.T, top topology, _ client) {
		for _, backend := range adapters {
			t.Run(backend, func(t *testing.T) { permitsKill(t, top, backend) })
		}
	})
}

// permitsKill is TestPermitsKill's run through backend.
func permitsKill(t *testing.T, top topology, backend string) {
	spec := permitSpec(t, top, backend, permitLimit, 2, killLease, "")
	spec.Holds = []harness.Hold{{At: permitLimit}}
	lim := spec.Permits.Concurrency
	in := servers.StartInstances(t, build.Bin(t), 1, spec)
	in.Go(t)
	in.WaitHeld(t)
	in.WaitIdle(t)
	in.Kill(t, 0)
	kill := time.Now().UnixNano()
	killed := in.Wait(t)
	if n := harness.CountPermits(killed, lim); n.Calls != permitLimit || n.Granted != permitLimit || n.Violations != 0 {
		t.Fatalf("the killed instance's calls: %+v; want %d acquires, each granted", n, permitLimit)
	}
	// The killed leases end within [start, end] + killLease of their
	// acquires, on the server's clock.
	var ends []int64
	firstEnd := [2]int64{1 << 62, 1 << 62} // the first lease's end: at the earliest, at the latest
	lastEnd := int64(0)
	for _, c := range killed {
		ends = append(ends, c.Start+int64(lim.Lease))
		firstEnd = [2]int64{min(firstEnd[0], c.Start+int64(lim.Lease)), min(firstEnd[1], c.End+int64(lim.Lease))}
		lastEnd = max(lastEnd, c.End+int64(lim.Lease))
	}
	slices.Sort(ends)

	obs := newPermitObserver(t, spec)
	limiter := ratelimit.New(obs.conn.Backend)
	takers := make([]taker, permitLimit)
	var wg sync.WaitGroup
	for i := range takers {
		wg.Go(func() { takers[i] = take(limiter, spec.Key, lim, time.Unix(0, lastEnd).Add(killMargin)) })
	}
	wg.Wait()
	defer func() {
		for _, tk := range takers {
			if tk.permit != nil {
				_ = tk.permit.Release(context.Background())
			}
		}
	}()

	const slack = int64(time.Millisecond) // µs on the server, ns here
	var got []int64
	for i, tk := range takers {
		d := tk.full
		switch {
		case tk.fullErr != nil:
			t.Errorf("taker %d: TryAcquire: %v", i, tk.fullErr)
		case d.Granted || d.InFlight != permitLimit:
			t.Errorf("taker %d: TryAcquire after the kill: %+v; want it denied with all %d in flight", i, d, permitLimit)
		case tk.fullStart+int64(d.RetryAfter) > firstEnd[1]+slack || tk.fullEnd+int64(d.RetryAfter) < firstEnd[0]-slack:
			t.Errorf("taker %d: RetryAfter %v at [%v, %v] after the kill; want it to end with the first killed lease, within [%v, %v]",
				i, d.RetryAfter, time.Duration(tk.fullStart-kill), time.Duration(tk.fullEnd-kill),
				time.Duration(firstEnd[0]-kill), time.Duration(firstEnd[1]-kill))
		}
		if tk.err != nil {
			t.Errorf("taker %d: Acquire: %v; want a permit within the lease + %v", i, tk.err, killMargin)
			continue
		}
		if d := tk.permit.Decision(); d.InFlight > permitLimit {
			t.Errorf("taker %d: granted with %d in flight; want at most %d", i, d.InFlight, permitLimit)
		}
		got = append(got, tk.end)
	}
	if t.Failed() {
		return
	}
	slices.Sort(got)
	for m := range got {
		if got[m] < ends[m]-slack {
			t.Errorf("permit %d taken %v before the %d-th killed lease could end", m+1, time.Duration(ends[m]-got[m]), m+1)
		}
	}
	ms := func(ns int64) time.Duration { return time.Duration(ns - kill).Round(time.Millisecond) }
	t.Logf("lease %v: the killed leases ended %v to %v after the kill; this process took the permits back %v to %v after it",
		lim.Lease, ms(ends[0]), ms(lastEnd), ms(got[0]), ms(got[len(got)-1]))
	if d := obs.inspect(t); d.InFlight != permitLimit {
		t.Errorf("%d in flight with this process's %d permits; want those alone", d.InFlight, permitLimit)
	}
	for i, tk := range takers {
		if err := tk.permit.Release(context.Background()); err != nil {
			t.Errorf("taker %d: Release: %v", i, err)
		}
	}
	if d := obs.inspect(t); d.InFlight != 0 {
		t.Errorf("%d in flight after the release; want none", d.InFlight)
	}
}

// taker is one goroutine of TestPermitsKill's process: the TryAcquire
// that found the key full, and the Acquire after it, with its end in ns.
type taker struct {
	full               ratelimit.PermitDecision
	fullErr            error
	fullStart, fullEnd int64
	permit             *ratelimit.Permit
	err                error
	end                int64
}

// take makes a taker's calls: a TryAcquire, then an Acquire until
// deadline.
func take(l *ratelimit.Limiter, key string, lim ratelimit.Concurrency, deadline time.Time) taker {
	var tk taker
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	tk.fullStart = time.Now().UnixNano()
	p, d, err := l.TryAcquire(ctx, key, lim, 1)
	tk.fullEnd = time.Now().UnixNano()
	tk.full, tk.fullErr = d, err
	if p != nil {
		tk.permit, tk.end = p, tk.fullEnd
		return tk
	}
	tk.permit, tk.err = l.Acquire(ctx, key, lim, 1)
	tk.end = time.Now().UnixNano()
	return tk
}

// pauseLease is the lease of TestPermitsPause's permits: longer than the
// pause (pauseFor, 1s) and what a loaded machine adds around it, so that
// no permit held across the pause ends in it.
const pauseLease = 4 * time.Second

// stalledTimeout bounds each call made while the store is paused: they
// fail, one after another, while it is.
const stalledTimeout = 200 * time.Millisecond

// TestPermitsPause pauses the store (SIGSTOP) while every permit is held:
// a standalone server, and the cluster master that holds the key (the
// cluster has no replica to fail over to, and the pause is a tenth of its
// node timeout). Through each Redis adapter, with permits leased for
// pauseLease, in two processes on one key, both counting on the overlap
// counter:
//
//   - the holders, permitLimit goroutines, take every permit and hold.
//   - The store is paused. Holders 0 and 1 release their permits, and the
//     waiters, 8 goroutines of the other process, try to acquire twice
//     each; every call times out (stalledTimeout), so each release and
//     acquire is unknown: the store may run it when it resumes, even
//     after calls sent later on other connections (seen: up to 18ms
//     after it, behind the holders' releases below), and an acquire so
//     run takes a permit that no goroutine holds until its lease ends.
//   - After pauseFor the store is continued. The key holds the 3 permits
//     held across the pause, and at most the 2 whose release is unknown
//     (or permits the unknown acquires took in their place). Holders 2 to
//     4 release theirs: each release must be granted, the permit still
//     held. Then the waiters acquire, hold and release, 10 calls each.
//
// No call started during the pause decides, none after it fails, none
// breaks the limit (harness.CountPermits and the overlap counter), and
// the overlap counter ends at 0. The permits whose release (or acquire)
// was unknown are released or reclaimed: the key holds none within a
// lease, plus killMargin, of the run's last call.
func TestPermitsPause(t *testing.T) {
	skipShort(t)
	t.Run("Standalone", func(t *testing.T) {
		t.Parallel()
		oc := newOverlapCounter(t)
		for _, backend := range adapters {
			t.Run(backend, func(t *testing.T) {
				t.Parallel()
				server := servers.StartRedis(t)
				permitsPause(t, topology{addrs: []string{server.Addr()}}, backend, oc, func(string) *servers.Redis { return server })
			})
		}
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		top := cluster(t)
		c := newClient(t, top)
		oc := newOverlapCounter(t)
		for _, backend := range adapters {
			t.Run(backend, func(t *testing.T) {
				permitsPause(t, top, backend, oc, func(key string) *servers.Redis { return c.master(t, top, key) })
			})
		}
	})
}

// permitsPause is TestPermitsPause's run through backend on top, whose
// server holding a key is server(key).
func permitsPause(t *testing.T, top topology, backend string, oc overlapCounter, server func(key string) *servers.Redis) {
	const (
		released = 2 // holders that release during the pause
		waiters  = 8
	)
	holders := permitSpec(t, top, backend, permitLimit, 2, pauseLease, oc.addr)
	holders.Holds = []harness.Hold{{At: permitLimit, Timeout: stalledTimeout}, {At: permitLimit + released}}
	waiting := permitSpec(t, top, backend, waiters, 2+10, pauseLease, oc.addr)
	waiting.Key = holders.Key
	waiting.Timeout, waiting.Holds = stalledTimeout, []harness.Hold{{At: 2 * waiters, Timeout: 10 * time.Second}}
	waiting.Pause, waiting.Permits.HoldMin, waiting.Permits.HoldMax = 5*time.Millisecond, time.Millisecond, 5*time.Millisecond
	lim, key := holders.Permits.Concurrency, holders.Key
	stopped := server(key)
	obs := newPermitObserver(t, holders)
	hold := servers.StartInstances(t, build.Bin(t), 1, holders)
	wait := servers.StartInstances(t, build.Bin(t), 1, waiting)

	hold.Go(t)
	hold.WaitHeld(t)
	hold.WaitIdle(t)
	if d := obs.inspect(t); d.InFlight != permitLimit {
		t.Fatalf("%d in flight once the holders hold; want all %d", d.InFlight, permitLimit)
	}
	stopped.Pause(t)
	struck := time.Now()
	hold.Go(t)
	wait.Go(t)
	for _, in := range []*servers.Instances{hold, wait} {
		in.WaitHeld(t)
		in.WaitIdle(t)
	}
	time.Sleep(time.Until(struck.Add(pauseFor)))
	healing := time.Now().UnixNano()
	stopped.Resume(t)
	resumed := obs.inspect(t)
	hold.Go(t)
	holderCalls := hold.Wait(t)
	wait.Go(t)
	calls := append(holderCalls, wait.Wait(t)...)

	n := harness.CountPermits(calls, lim)
	if err := n.Check(); err != nil {
		t.Error(err)
	}
	var split [3][]harness.Call // before, during and after the pause
	for _, c := range calls {
		i := 0
		switch {
		case c.Start > healing:
			i = 2
		case c.Start > struck.UnixNano():
			i = 1
		}
		split[i] = append(split[i], c)
	}
	var phase [3]harness.PermitTally
	for i, name := range []string{"before the pause", "during it", "after it"} {
		phase[i] = harness.CountPermits(split[i], lim)
		logPermits(t, name, phase[i])
	}
	if want := released + 2*waiters; phase[1].Calls != want || phase[1].Failed != want {
		t.Errorf("%d calls during the pause, %d failed; want %d, all failed", phase[1].Calls, phase[1].Failed, want)
	}
	if phase[2].Failed != 0 {
		t.Errorf("%d calls failed after the pause; want every call decided", phase[2].Failed)
	}
	if resumed.InFlight < permitLimit-released || resumed.InFlight > permitLimit {
		t.Errorf("%d in flight after the resume; want the %d held across the pause, and at most the %d whose release is unknown",
			resumed.InFlight, permitLimit-released, released)
	}
	for _, c := range holderCalls {
		if c.Attempt >= permitLimit+released && (c.Err != "" || !c.Permit.Decision.Granted) {
			t.Errorf("holder %d's release after the pause: %+v, %q; want it granted, the permit held across the pause", c.Goroutine, c.Permit.Decision, c.Err)
		}
	}
	if v := oc.value(t, key); v != 0 {
		t.Errorf("overlap counter at %d after the run; want 0", v)
	}
	last := time.Unix(0, slices.MaxFunc(calls, func(a, b harness.Call) int { return cmp.Compare(a.End, b.End) }).End)
	held, none := obs.untilNoneHeld(t, last.Add(lim.Lease+killMargin))
	reclaimed := "none held"
	if !held.IsZero() {
		reclaimed = fmt.Sprintf("some held %v, none %v", held.Sub(last).Round(time.Millisecond), none.Sub(last).Round(time.Millisecond))
	}
	t.Logf("%d in flight after the resume (%d held across it); after the run's last call, %s (lease %v)",
		resumed.InFlight, permitLimit-released, reclaimed, lim.Lease)
}
