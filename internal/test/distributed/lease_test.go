package distributed_test

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// These runs lease one hot key's tokens with the lease package
// (harness.Spec.Lease) on one standalone Redis, and check what its
// package doc states: unspent leased tokens lapse at the refill rate, as
// the store could have refilled past them, so the key admits at most
// C + r·T over every interval of length T, not only over the whole run,
// whatever the instances do (run on, die with a lease, stop holding one)
// and whatever the store does (a pause behind failpolicy's Closed mode).
// A lease killed or stopped is lost: under-admission, never a token spent
// twice.

// leaseBandwidth is the hot key's limit in the lease runs: C = 60, r = 600
// a second, so the store refills from empty to full in C/r = 100ms.
var leaseBandwidth = ratelimit.PerSecond(600).WithBurst(60)

// TestLeasedRefill: TestShardedRefill's load on one standalone Redis, 10s
// at about 80%, 100% and 150% of a key of 600 a second with a burst of 60,
// unleased and leased with at most a quarter of the capacity (15 tokens) a
// lease (each backend's runs beside the other's). Every call decides, and
// the key admits at most C + r·T over every interval (checkEveryInterval).
// The unleased key denies no call it surely had a token for (sureFalse);
// the leased one's such denials are its false rejections, logged with the
// share of C + r·T admitted.
func TestLeasedRefill(t *testing.T) {
	skipShort(t)
	top := standalone(t)
	for _, backend := range adapters {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			leasedRefillRuns(t, top, backend, leaseBandwidth)
		})
	}
}

// leasedRefillRuns makes TestLeasedRefill's runs for one backend, in turn.
func leasedRefillRuns(t *testing.T, top topology, backend string, bw ratelimit.Bandwidth) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{bw}}
	const (
		goroutines = 8
		window     = 10 * time.Second
	)
	for _, load := range []struct {
		name  string
		pause time.Duration // between a goroutine's calls
	}{{"80%", 33 * time.Millisecond}, {"100%", 25 * time.Millisecond}, {"150%", 17 * time.Millisecond}} {
		for _, leased := range []bool{false, true} {
			name := load.name + "/unleased"
			if leased {
				name = load.name + "/leased"
			}
			t.Run(name, func(t *testing.T) {
				spec := harness.Spec{
					Backend: backend, Server: top.server(), Key: newKey(t), Config: cfg,
					Goroutines: goroutines, Attempts: int(window / load.pause * goroutines), Pause: load.pause,
				}
				if leased {
					spec.Lease = &harness.Lease{MaxShare: 0.25}
				}
				in := servers.StartInstances(t, build.Bin(t), 2, spec)
				in.Go(t)
				calls := in.Wait(t)
				tl := harness.Count(calls)
				span := tl.Span()
				bound := bw.Capacity + int64(float64(bw.RefillTokens)*span.Seconds()/bw.RefillPeriod.Seconds())
				sure := sureFalse(calls, bw)
				t.Logf("%d calls over %v (%.0f a second): %d admitted of at most C + r·T = %d (%.1f%%), %d denied, %d of them false (%.2f%% of calls), %d failed",
					tl.Calls, span.Round(time.Millisecond), tl.Rate(), tl.Admitted, bound, 100*float64(tl.Admitted)/float64(bound), tl.Denied, sure, 100*float64(sure)/float64(tl.Calls), tl.Failed)
				if tl.Failed != 0 {
					t.Errorf("%d calls failed; want every call decided", tl.Failed)
				}
				checkEveryInterval(t, calls, bw)
				if !leased && sure != 0 {
					t.Errorf("the unleased bucket denied %d calls it surely had a token for", sure)
				}
			})
		}
	}
}

// TestLeasedKill: two processes on a leased key, at about the limit. Once
// both have made their first phase of calls, and so taken leases, and no
// call is in flight, instance 0 is killed (SIGKILL) at the hold; instance
// 1 goes on alone. Its tokens leased and unspent are lost with it: the
// key admits at most C + r·T over every interval and over the run, and
// every call decides.
func TestLeasedKill(t *testing.T) {
	skipShort(t)
	top := standalone(t)
	bw := leaseBandwidth
	for _, backend := range adapters {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			const (
				goroutines = 8
				pause      = 25 * time.Millisecond // between a goroutine's calls: about 600 a second in all
				before     = 20 * goroutines       // attempts an instance: 0.5s
				after      = 60 * goroutines       // 1.5s, instance 1 alone
			)
			spec := harness.Spec{
				Backend: backend, Server: top.server(), Key: newKey(t),
				Config:     ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{bw}},
				Goroutines: goroutines, Attempts: before + after, Pause: pause,
				Holds: []harness.Hold{{At: before}},
				Lease: &harness.Lease{Target: 100 * time.Millisecond, MaxShare: 0.25},
			}
			in := servers.StartInstances(t, build.Bin(t), 2, spec)
			in.Go(t)
			in.WaitHeld(t)
			in.WaitIdle(t)
			in.Kill(t, 0)
			killed := time.Now().UnixNano()
			in.Go(t) // instance 1 alone
			calls := in.Wait(t)

			var phase [2]harness.Tally
			for _, c := range calls {
				i := 0
				if c.Start > killed {
					i = 1
					if c.Instance == 0 {
						t.Errorf("instance 0 started attempt %d after it was killed", c.Attempt)
					}
				}
				phase[i] = phase[i].Add(c)
			}
			for i, name := range []string{"before the kill", "after it"} {
				t.Logf("%-15s %4d calls: %4d admitted, %4d denied, %d failed", name, phase[i].Calls, phase[i].Admitted, phase[i].Denied, phase[i].Failed)
			}
			tl := harness.Count(calls)
			bound := bw.Capacity + int64(float64(bw.RefillTokens)*tl.Span().Seconds()/bw.RefillPeriod.Seconds())
			t.Logf("%d admitted over %v; C + r·T = %d", tl.Admitted, tl.Span().Round(time.Millisecond), bound)
			if tl.Failed != 0 {
				t.Errorf("%d calls failed; want every call decided (none was in flight at the kill)", tl.Failed)
			}
			if int64(tl.Admitted) > bound {
				t.Errorf("%d admitted over the run; want at most C + r·T = %d", tl.Admitted, bound)
			}
			if phase[1].Admitted == 0 {
				t.Errorf("instance 1 was admitted nothing after the kill; want the store to refill for it")
			}
			checkEveryInterval(t, calls, bw)
		})
	}
}

// TestLeasedPause stops a leaseholder, and the store.
//
// Instance: instance 0 takes leases under a light load (at most 400 calls
// a second, leases aimed at 100ms of it, up to 15 tokens), and is stopped
// (SIGSTOP) at a hold, no call in flight, holding what it leased. While
// it is stopped the store refills to full (2·C/r) and instance 1, a
// process of its own, drains it (8 goroutines, 1ms apart). Once the stop
// has lasted 5·C/r, instance 0 is continued (SIGCONT) and released, while
// instance 1 still drains. Its old lease has lapsed meanwhile (the
// monotonic clock runs on while a process is stopped): were it spent, the
// interval from the drain's start to that spending would hold C + r·T and
// the lease on top, which checkEveryInterval would catch. Every call
// decides.
//
// Redis: two instances at about the limit, leased over failpolicy's
// Closed mode, with the redis-server stopped (SIGSTOP) between two holds
// for about a second and continued (SIGCONT) before a last phase of 3s,
// as TestShardedPause does. The calls during the pause are denied (or
// admitted from what the leases hold); none before or after it fails,
// some after it are admitted again, and the key admits at most C + r·T
// over every interval.
func TestLeasedPause(t *testing.T) {
	skipShort(t)
	for _, backend := range adapters {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			t.Run("Instance", func(t *testing.T) { instancePause(t, backend) })
			t.Run("Redis", func(t *testing.T) { redisPause(t, backend) })
		})
	}
}

// instancePause is TestLeasedPause's Instance run.
func instancePause(t *testing.T, backend string) {
	top := standalone(t)
	bw := leaseBandwidth
	fill := time.Duration(bw.Capacity) * bw.RefillPeriod / time.Duration(bw.RefillTokens) // C/r
	stopFor := 5 * fill
	const (
		goroutines = 4
		pause      = 10 * time.Millisecond // between a goroutine's calls
		phase      = 30 * goroutines       // attempts: 0.3s
	)
	holder := harness.Spec{
		Backend: backend, Server: top.server(), Key: newKey(t),
		Config:     ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{bw}},
		Goroutines: goroutines, Attempts: 2 * phase, Pause: pause,
		Holds: []harness.Hold{{At: phase}},
		Lease: &harness.Lease{Target: 100 * time.Millisecond, MaxShare: 0.25},
	}
	drain := holder
	drain.Goroutines, drain.Attempts, drain.Pause, drain.Holds = 8, 8*1000, time.Millisecond, nil
	held := servers.StartInstances(t, build.Bin(t), 1, holder)
	drainer := servers.StartInstances(t, build.Bin(t), 1, drain)

	held.Go(t)
	held.WaitHeld(t)
	held.WaitIdle(t)
	held.Stop(t, 0)
	stopped := time.Now()
	time.Sleep(2 * fill) // the store refills to full
	drainer.Go(t)
	drainer.WaitStarted(t, 0, 100)
	time.Sleep(time.Until(stopped.Add(stopFor)))
	held.Continue(t, 0)
	resumed := time.Now().UnixNano()
	held.Go(t)
	calls := held.Wait(t)
	for _, c := range drainer.Wait(t) {
		c.Instance = 1
		calls = append(calls, c)
	}

	var after [2]harness.Tally
	for _, c := range calls {
		if c.Start > resumed {
			after[c.Instance] = after[c.Instance].Add(c)
		}
	}
	tl := harness.Count(calls)
	t.Logf("instance 0 stopped for %v; after it continued: instance 0 %d calls, %d admitted; instance 1 %d calls, %d admitted",
		time.Duration(resumed-stopped.UnixNano()).Round(time.Millisecond), after[0].Calls, after[0].Admitted, after[1].Calls, after[1].Admitted)
	t.Logf("%d calls over %v: %d admitted, %d denied, %d failed", tl.Calls, tl.Span().Round(time.Millisecond), tl.Admitted, tl.Denied, tl.Failed)
	if tl.Failed != 0 {
		t.Errorf("%d calls failed; want every call decided", tl.Failed)
	}
	if after[0].Calls == 0 {
		t.Errorf("instance 0 made no call after it continued")
	}
	checkEveryInterval(t, calls, bw)
}

// redisPause is TestLeasedPause's Redis run.
func redisPause(t *testing.T, backend string) {
	server := servers.StartRedis(t)
	top := topology{addrs: []string{server.Addr()}}
	const (
		goroutines = 8
		pause      = 25 * time.Millisecond // between a goroutine's calls: about 600 a second in all
		before     = 20 * goroutines       // attempts an instance: 0.5s
		during     = 40 * goroutines       // 1s
		after      = 120 * goroutines      // 3s
	)
	bw := leaseBandwidth
	// The policy's deadline is well within the lease's refill timeout (1s),
	// so that a refill the paused store leaves unanswered ends in the
	// policy's denial, not the lease's timeout.
	spec := harness.Spec{
		Backend: backend, Server: top.server(), Key: newKey(t),
		Config:     ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{bw}},
		Goroutines: goroutines, Attempts: before + during + after, Pause: pause,
		Holds:  []harness.Hold{{At: before}, {At: before + during}},
		Policy: &harness.Policy{Mode: "Closed", Timeout: 500 * time.Millisecond},
		Lease:  &harness.Lease{Target: 100 * time.Millisecond, MaxShare: 0.25},
	}
	in := servers.StartInstances(t, build.Bin(t), 2, spec)
	calls, phase := pausedPhases(t, in, server)
	for i, name := range []string{"before the pause", "during it", "after it"} {
		t.Logf("%-16s %4d calls: %4d admitted, %4d denied, %4d degraded (the policy's denials), %d failed",
			name, phase[i].Calls, phase[i].Admitted, phase[i].Denied, phase[i].Degraded, phase[i].Failed)
	}
	for _, i := range []int{0, 2} {
		if phase[i].Failed != 0 {
			t.Errorf("%d calls failed with the store up; want them decided", phase[i].Failed)
		}
	}
	if phase[2].Admitted == 0 {
		t.Errorf("no call was admitted after the resume; want the store to decide again")
	}
	checkEveryInterval(t, calls, bw)
}

// checkEveryInterval fails t unless the key admitted at most C + r·T
// over every interval of length T: for each pair of admitted calls i and
// j, the tokens of the admitted calls lying wholly within
// [Start_i, End_j] are at most C + ⌊r·(End_j − Start_i)⌋. Each admission
// was decided within its call, by the store or from a lease in its
// instance, and the instances and the server share this machine's clock:
// the calls wholly within an interval were decided within it, so a run
// that kept the bound passes. It fails with the interval that exceeds
// the bound most, and logs the tightest interval of a run that passes.
func checkEveryInterval(t *testing.T, calls []harness.Call, bw ratelimit.Bandwidth) {
	t.Helper()
	w, err := worstInterval(calls, bw)
	switch {
	case err != nil:
		t.Fatal(err)
	case w.calls == 0:
		return
	case w.tokens > w.bound:
		t.Errorf("%d tokens admitted by the %d calls wholly within %s; want at most C + ⌊r·T⌋ = %d",
			w.tokens, w.calls, w.describe(calls), w.bound)
	default:
		t.Logf("every interval within the bound; the tightest: %d tokens admitted within %s, C + r·T = %.2f",
			w.tokens, w.describe(calls), float64(w.bound)+w.slack)
	}
}

// interval is [from, to], in ns on the instances' clock, the start of
// an admitted call and the end of one: the calls admitted wholly within
// it, and the tokens they took, against bound, C + ⌊r·(to − from)⌋.
type interval struct {
	from, to      int64
	calls         int
	tokens, bound int64
	slack         float64 // the fraction of r·(to − from) that bound drops
	excess        int64   // (tokens − C − r·(to − from)) · RefillPeriod in ns
}

// describe says where w lies in the run of calls, and how long it is.
func (w interval) describe(calls []harness.Call) string {
	first := calls[0].Start
	for _, c := range calls {
		first = min(first, c.Start)
	}
	ms := func(ns int64) string { return time.Duration(ns).Round(time.Microsecond).String() }
	return fmt.Sprintf("[%s, %s] of the run (T = %s)", ms(w.from-first), ms(w.to-first), ms(w.to-w.from))
}

// worstInterval returns, of every interval [Start_i, End_j] of admitted
// calls i and j, the one whose admitted tokens exceed C + r·T most (or
// fall short of it least), in O(n log n) for n admitted calls.
//
// With P the refill period and R its tokens, the calls admitted wholly
// within [a, e] exceed the bound by (W(a, e)·P − R·(e − a) − C·P) / P,
// W(a, e) their tokens. Taking the left ends a from the latest start to
// the earliest, each call joins as a passes its start: it adds its tokens
// to W(a, e) for every right end e at or after its own. A tree over the
// right ends, in order, holds W(a, e)·P − R·e for each, adds to a suffix
// of them, and finds the largest from a on.
func worstInterval(calls []harness.Call, bw ratelimit.Bandwidth) (interval, error) {
	var admitted []harness.Call
	for _, c := range calls {
		if c.Err == "" && c.Decision.Allowed && c.Tokens > 0 {
			admitted = append(admitted, c)
		}
	}
	if len(admitted) == 0 {
		return interval{}, nil
	}
	period, rate := int64(bw.RefillPeriod), bw.RefillTokens
	base, last, tokens := admitted[0].Start, int64(0), int64(0)
	for _, c := range admitted {
		base, last, tokens = min(base, c.Start), max(last, c.End), tokens+c.Tokens
	}
	if float64(tokens+bw.Capacity)*float64(period)+float64(rate)*float64(last-base) > 1<<62 {
		return interval{}, fmt.Errorf("worstInterval: %d tokens over %v at %v overflow its arithmetic", tokens, time.Duration(last-base), bw)
	}

	ends := make([]int64, len(admitted))
	for i, c := range admitted {
		ends[i] = c.End
	}
	slices.Sort(ends)
	values := make([]int64, len(ends))
	for i, e := range ends {
		values[i] = -rate * (e - base)
	}
	tree := newMaxTree(values)
	slices.SortFunc(admitted, func(x, y harness.Call) int { return cmp.Compare(y.Start, x.Start) })

	best := interval{excess: -1 << 63}
	for i := 0; i < len(admitted); {
		a := admitted[i].Start
		for ; i < len(admitted) && admitted[i].Start == a; i++ {
			from, _ := slices.BinarySearch(ends, admitted[i].End)
			tree.add(from, admitted[i].Tokens*period)
		}
		from, _ := slices.BinarySearch(ends, a) // a call admitted by then ends at a or later
		v, at := tree.max(from)
		if excess := v + rate*(a-base) - bw.Capacity*period; excess > best.excess {
			best = interval{from: a, to: ends[at], excess: excess}
		}
	}
	for _, c := range admitted {
		if c.Start >= best.from && c.End <= best.to {
			best.calls++
			best.tokens += c.Tokens
		}
	}
	refilled := rate * (best.to - best.from)
	best.bound = bw.Capacity + refilled/period
	best.slack = float64(refilled%period) / float64(period)
	return best, nil
}

// maxTree is a segment tree over values v[0..n) that adds to a suffix of
// them and finds the largest of a suffix, and where it is. A node holds
// the largest value below it with its own adds, which it does not pass
// down.
type maxTree struct {
	n    int
	top  []int64 // the largest value below the node, its adds included
	adds []int64 // what was added to every value below the node
	at   []int   // where top is
}

func newMaxTree(v []int64) *maxTree {
	t := &maxTree{n: len(v), top: make([]int64, 4*len(v)), adds: make([]int64, 4*len(v)), at: make([]int, 4*len(v))}
	t.build(1, 0, t.n-1, v)
	return t
}

func (t *maxTree) build(node, lo, hi int, v []int64) {
	if lo == hi {
		t.top[node], t.at[node] = v[lo], lo
		return
	}
	mid := (lo + hi) / 2
	t.build(2*node, lo, mid, v)
	t.build(2*node+1, mid+1, hi, v)
	t.pull(node)
}

// pull sets node's top from its children's.
func (t *maxTree) pull(node int) {
	l, r := 2*node, 2*node+1
	if t.top[l] >= t.top[r] {
		t.top[node], t.at[node] = t.top[l], t.at[l]
	} else {
		t.top[node], t.at[node] = t.top[r], t.at[r]
	}
	t.top[node] += t.adds[node]
}

// add adds x to v[from..n).
func (t *maxTree) add(from int, x int64) { t.addBelow(1, 0, t.n-1, from, x) }

func (t *maxTree) addBelow(node, lo, hi, from int, x int64) {
	switch {
	case hi < from:
		return
	case lo >= from:
		t.top[node] += x
		t.adds[node] += x
		return
	}
	mid := (lo + hi) / 2
	t.addBelow(2*node, lo, mid, from, x)
	t.addBelow(2*node+1, mid+1, hi, from, x)
	t.pull(node)
}

// max returns the largest of v[from..n) and its index; from < n.
func (t *maxTree) max(from int) (int64, int) { return t.maxBelow(1, 0, t.n-1, from) }

func (t *maxTree) maxBelow(node, lo, hi, from int) (int64, int) {
	if lo >= from {
		return t.top[node], t.at[node]
	}
	mid := (lo + hi) / 2
	v, at := t.maxBelow(2*node+1, mid+1, hi, from) // hi ≥ from
	if mid >= from {
		if lv, lat := t.maxBelow(2*node, lo, mid, from); lv >= v {
			v, at = lv, lat
		}
	}
	return v + t.adds[node], at
}

// TestWorstInterval checks worstInterval against the count over every
// pair of admitted calls on random histories, and that it finds a burst
// beyond C + r·T that the run's whole span hides. It needs no server.
func TestWorstInterval(t *testing.T) {
	bw := ratelimit.PerSecond(10).WithBurst(5)
	period := int64(bw.RefillPeriod)
	r := rand.New(rand.NewPCG(32, 0))
	for run := range 300 {
		calls := make([]harness.Call, 1+r.IntN(40))
		for i := range calls {
			start := r.Int64N(int64(3 * time.Second))
			calls[i] = harness.Call{Start: start, End: start + r.Int64N(int64(50*time.Millisecond)), Tokens: 1 + r.Int64N(3)}
			switch r.IntN(4) {
			case 0:
				calls[i].Err = "failed"
			case 1, 2:
				calls[i].Decision.Allowed = true
			}
			if r.IntN(5) == 0 && i > 0 { // ties of starts and ends
				calls[i].Start, calls[i].End = calls[i-1].Start, calls[i-1].End
			}
		}
		w, err := worstInterval(calls, bw)
		if err != nil {
			t.Fatal(err)
		}
		want, found := int64(-1<<63), false
		for _, ci := range calls {
			for _, cj := range calls {
				if !ci.Decision.Allowed || !cj.Decision.Allowed || ci.Err != "" || cj.Err != "" || cj.End < ci.Start {
					continue
				}
				var tokens int64
				for _, c := range calls {
					if c.Err == "" && c.Decision.Allowed && c.Start >= ci.Start && c.End <= cj.End {
						tokens += c.Tokens
					}
				}
				want, found = max(want, tokens*period-bw.RefillTokens*(cj.End-ci.Start)-bw.Capacity*period), true
			}
		}
		if !found {
			want = 0 // the zero interval
		}
		if w.excess != want {
			t.Fatalf("run %d: worstInterval's excess %d (%+v); want %d", run, w.excess, w, want)
		}
	}

	ms := int64(time.Millisecond)
	var calls []harness.Call
	for range 5 { // the burst at the start
		calls = append(calls, harness.Call{Start: 0, End: ms, Tokens: 1, Decision: ratelimit.Decision{Allowed: true}})
	}
	for range 8 { // 8 in 1ms, 10s on: 3 beyond the burst and 1ms of refill
		calls = append(calls, harness.Call{Start: 10_000 * ms, End: 10_001 * ms, Tokens: 1, Decision: ratelimit.Decision{Allowed: true}})
	}
	w, err := worstInterval(calls, bw)
	if err != nil {
		t.Fatal(err)
	}
	if want := (interval{from: 10_000 * ms, to: 10_001 * ms, calls: 8, tokens: 8, bound: 5}); w.from != want.from || w.to != want.to || w.calls != want.calls || w.tokens != want.tokens || w.bound != want.bound {
		t.Errorf("worstInterval: %+v; want %+v", w, want)
	}
}
