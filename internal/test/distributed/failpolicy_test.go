package distributed_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// These runs put each instance's backend behind failpolicy's Local mode,
// with the Redis clients set up by their LowLatency helpers, as
// docs/operations.md tells a user to, and check the bound the package doc
// of failpolicy states: the shares cannot know what the store admitted,
// but everything they admit is charged to the store once it answers, so
// that at the end, with every instance settled (its debts charged),
//
//	admitted ≤ C + r·T − τ
//
// where C is the capacity, r the refill rate, T the run's length and τ the
// store's tokens at the end (negative when the charges left it in
// credit). Before the charges are paid back, each instance may have
// admitted up to twice its share on top of the limit.

// policyRun is the outcome of a run behind the Local mode.
type policyRun struct {
	calls               []harness.Call
	admitted, degraded  int
	start, end          time.Time // the run's first call, and the Inspect after it (the instances and the server share the machine's clock)
	tokens              float64   // τ: the store's tokens at end
	capacity            int64
	rate                float64 // r, tokens a second
	instances, attempts int
}

// settled runs spec's instances behind the Local mode, each settling at
// the end, with between run between the phases (nil: none), and reads the
// store's tokens.
func settledRun(t *testing.T, c client, spec harness.Spec, between func(in *servers.Instances, phase int)) policyRun {
	t.Helper()
	spec.LowLatency, spec.Settle = true, true
	r := policyRun{instances: 2, attempts: spec.Attempts}
	bw := spec.Config.Bandwidths[0]
	r.capacity = bw.Capacity
	r.rate = float64(bw.RefillTokens) / bw.RefillPeriod.Seconds()
	in := servers.StartInstances(t, build.Bin(t), r.instances, spec)
	in.Go(t)
	for phase := range spec.Holds {
		in.WaitHeld(t)
		between(in, phase)
		in.Go(t)
	}
	r.calls = in.Wait(t)
	r.start = time.Unix(0, r.calls[0].Start)
	for _, call := range r.calls {
		r.start = time.Unix(0, min(r.start.UnixNano(), call.Start))
		switch {
		case call.Err != "":
			t.Errorf("instance %d, attempt %d: %s; want a decision", call.Instance, call.Attempt, call.Err)
		case call.Decision.Allowed:
			r.admitted++
		}
		if call.Decision.Degraded {
			r.degraded++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := c.backend.Do(ctx, spec.Key, spec.Config, ratelimit.Request{Op: ratelimit.Inspect})
	if err != nil {
		t.Fatal(err)
	}
	r.end = c.serverTime(t, spec.Key)
	r.tokens = float64(d.Remaining)
	if d.Remaining == 0 {
		// RetryAfter is the wait for one token: τ + r·RetryAfter = 1.
		r.tokens = 1 - r.rate*d.RetryAfter.Seconds()
	}
	return r
}

// limit is C + r·T − τ: what the store has been charged for, the most
// the run may have admitted once every debt is charged.
func (r policyRun) limit() float64 {
	return float64(r.capacity) + r.rate*r.end.Sub(r.start).Seconds() - r.tokens
}

// checkCharged fails the test unless every admission was charged to the
// store, with slack tokens for rounding.
func (r policyRun) checkCharged(t *testing.T, slack float64) {
	t.Helper()
	t.Logf("%d calls: %d admitted, %d degraded; the store was charged %.2f tokens (C %d + r·T %.2f − τ %.2f)",
		len(r.calls), r.admitted, r.degraded, r.limit(), r.capacity, r.rate*r.end.Sub(r.start).Seconds(), r.tokens)
	if float64(r.admitted) > r.limit()+slack {
		t.Errorf("%d admitted, but the store was charged for %.2f: the shares' admissions were not all charged", r.admitted, r.limit())
	}
}

// TestPolicyBurst: 100 simultaneous requests to each of two instances on a
// fresh bucket of 20, behind the Local mode: with failpolicy's defaults,
// and with a 1ms deadline that a busy Redis misses, so that decisions are
// split between Redis and the shares (issue 12, 2). Either way at most the
// limit plus both shares, 40, are admitted, and every admission is charged
// to the store.
func TestPolicyBurst(t *testing.T) {
	skipShort(t)
	for _, backend := range adapters {
		for _, tc := range []struct {
			name    string
			timeout time.Duration // 0: the default
		}{{"Defaults", 0}, {"Split", time.Millisecond}} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				top := standalone(t)
				c := newClient(t, top)
				spec := harness.Spec{
					Backend:    backend,
					Server:     top.server(),
					Key:        newKey(t),
					Config:     ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{harness.NoRefill(20)}},
					Goroutines: 100,
					Attempts:   100,
					Policy:     &harness.Policy{Mode: "Local", Timeout: tc.timeout, Instances: 2},
				}
				r := settledRun(t, c, spec, nil)
				const bound = 20 + 2*10
				if r.admitted > bound {
					t.Errorf("%d admitted; want at most %d, the limit and both shares", r.admitted, bound)
				}
				r.checkCharged(t, 0.01)
			})
		}
	}
}

// TestPolicyPause: two instances under a steady load of about 100
// requests a second on a bucket of 20 a second, behind the Local mode with
// the defaults; Redis is stopped (SIGSTOP) for about 5s of the 12s run
// (issue 12, 2). The counts before, during and after the pause, and in
// the first half second after each change, are logged against the limit;
// at the end every admission has been charged to the store.
func TestPolicyPause(t *testing.T) {
	skipShort(t)
	for _, backend := range adapters {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			server := servers.StartRedis(t)
			top := topology{addrs: []string{server.Addr()}}
			c := newClient(t, top)
			const (
				goroutines = 4
				pause      = 80 * time.Millisecond // between a goroutine's calls: 50 a second an instance
				before     = 175                   // attempts an instance: 3.5s
				during     = 250                   // 5s
				after      = 175                   // 3.5s
			)
			spec := harness.Spec{
				Backend:    backend,
				Server:     top.server(),
				Key:        newKey(t),
				Config:     ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(20)}},
				Goroutines: goroutines,
				Attempts:   before + during + after,
				Pause:      pause,
				Holds:      []harness.Hold{{At: before}, {At: before + during}},
				Policy:     &harness.Policy{Mode: "Local", Instances: 2},
			}
			var paused, resumed int64
			r := settledRun(t, c, spec, func(_ *servers.Instances, phase int) {
				if phase == 0 {
					server.Pause(t)
					paused = time.Now().UnixNano()
				} else {
					server.Resume(t)
					resumed = time.Now().UnixNano()
				}
			})
			logPhases(t, r, paused, resumed)
			// Until both instances' breakers have closed again, one may
			// decide by its share while the other takes the whole limit
			// from the store: a partial outage, in which the cut-off
			// instance admits up to its share's rate beyond what its
			// capped debt pays back (see failpolicy's package doc).
			apart := disagreement(r.calls, resumed, r.instances)
			t.Logf("the instances were back on the store %v apart", apart.Round(time.Millisecond))
			r.checkCharged(t, 2+r.rate/float64(r.instances)*apart.Seconds())
		})
	}
}

// disagreement is how far apart, after from, the instances' first
// decisions by the store came; an instance with none counts from its last
// call.
func disagreement(calls []harness.Call, from int64, instances int) time.Duration {
	first, last := map[int]int64{}, map[int]int64{}
	for _, c := range calls {
		if c.Start < from {
			continue
		}
		last[c.Instance] = max(last[c.Instance], c.Start)
		if c.Err != "" || c.Decision.Degraded {
			continue
		}
		if f, ok := first[c.Instance]; !ok || c.Start < f {
			first[c.Instance] = c.Start
		}
	}
	lo, hi := int64(0), int64(0)
	for i := range instances {
		f, ok := first[i]
		if !ok {
			f = last[i]
		}
		if lo == 0 || f < lo {
			lo = f
		}
		hi = max(hi, f)
	}
	return time.Duration(hi - lo)
}

// logPhases logs the admissions before, during and after the pause, and
// in the first half second after each change, each against the limit of
// its span: C + r·T for the store, or both shares' C/2 + r/2·T for the
// instances deciding alone.
func logPhases(t *testing.T, r policyRun, paused, resumed int64) {
	t.Helper()
	type span struct {
		name     string
		from, to int64
	}
	first := r.calls[0].Start
	last := int64(0)
	for _, c := range r.calls {
		first, last = min(first, c.Start), max(last, c.Start)
	}
	half := int64(500 * time.Millisecond)
	for _, s := range []span{
		{"before the pause", first, paused},
		{"during the pause", paused, resumed},
		{"after the pause", resumed, last + 1},
		{"first 0.5s of the pause", paused, paused + half},
		{"first 0.5s after it", resumed, resumed + half},
	} {
		admitted, degraded := 0, 0
		for _, c := range r.calls {
			if c.Start < s.from || c.Start >= s.to {
				continue
			}
			if c.Err == "" && c.Decision.Allowed {
				admitted++
			}
			if c.Decision.Degraded {
				degraded++
			}
		}
		secs := time.Duration(s.to - s.from).Seconds()
		t.Logf("%-24s %5.2fs: %3d admitted (%3d degraded decisions); the limit C + r·T is %s",
			s.name, secs, admitted, degraded, fmt.Sprintf("%.0f", float64(r.capacity)+r.rate*secs))
	}
}
