package servers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redisconn"
	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestInstances runs 2 instances × 3 goroutines, 10 calls each, and
// checks what they report: every attempt once, in its instance, with
// times in order and the bucket's capacity admitted.
func TestInstances(t *testing.T) {
	t.Parallel()
	bin := build.Bin(t)
	r := servers.StartRedis(t)
	spec := harness.Spec{
		Backend: harness.BackendGoRedis, Server: harness.Server{Server: redisconn.Server{Addrs: []string{r.Addr()}}}, Key: "instances",
		Config:     ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(5)}},
		Goroutines: 3, Attempts: 10,
	}
	in := servers.StartInstances(t, bin, 2, spec)
	in.Go(t)
	calls := in.Wait(t)
	if len(calls) != 20 {
		t.Fatalf("%d calls reported, want 20", len(calls))
	}
	seen := map[[2]int]bool{}
	admitted := 0
	for _, c := range calls {
		if c.Instance < 0 || c.Instance > 1 || c.Goroutine < 0 || c.Goroutine > 2 || c.Attempt < 0 || c.Attempt > 9 {
			t.Errorf("call %+v is out of range", c)
		}
		if seen[[2]int{c.Instance, c.Attempt}] {
			t.Errorf("instance %d reported attempt %d twice", c.Instance, c.Attempt)
		}
		seen[[2]int{c.Instance, c.Attempt}] = true
		if c.Err != "" || c.Start <= 0 || c.End < c.Start {
			t.Errorf("call %+v: want no error and 0 < Start <= End", c)
		}
		if c.Decision.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("admitted %d, want 5", admitted)
	}
}

// TestInstancesBadSpec: an instance that cannot run its spec makes
// StartInstances fail the test with the instance's reason.
func TestInstancesBadSpec(t *testing.T) {
	t.Parallel()
	bin := build.Bin(t)
	tests := []struct {
		name string
		spec harness.Spec
		want string
	}{
		{"Backend", harness.Spec{Backend: "memcached", Server: harness.Server{Server: redisconn.Server{Addrs: []string{"127.0.0.1:1"}}}, Goroutines: 1}, `Backend "memcached"`},
		{"Goroutines", harness.Spec{Backend: harness.BackendGoRedis, Server: harness.Server{Server: redisconn.Server{Addrs: []string{"127.0.0.1:1"}}}}, "Goroutines 0"},
		{"Addrs", harness.Spec{Backend: harness.BackendRueidis, Goroutines: 1}, "no Addrs"},
		{"HoldAtAttempts", harness.Spec{Backend: harness.BackendGoRedis, Server: harness.Server{Server: redisconn.Server{Addrs: []string{"127.0.0.1:1"}}}, Goroutines: 1, Attempts: 5,
			Holds: []harness.Hold{{At: 5}}}, "Holds[0] {At 5"},
		{"HoldsOutOfOrder", harness.Spec{Backend: harness.BackendGoRedis, Server: harness.Server{Server: redisconn.Server{Addrs: []string{"127.0.0.1:1"}}}, Goroutines: 1, Attempts: 5,
			Holds: []harness.Hold{{At: 3}, {At: 2}}}, "Holds[1] {At 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := &outcomeTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				servers.StartInstances(tb, bin, 1, tt.spec)
				tb.outcome = "returned"
			}()
			<-done
			if tb.outcome != "failed" || !strings.Contains(tb.msg, tt.want) {
				t.Errorf("StartInstances %s: %q; want it failed, naming %s", tb.outcome, tb.msg, tt.want)
			}
		})
	}
}

// goRedisSpec is the spec of the harness's own tests: goroutines calling
// attempts times in all, with holds, through go-redis on the server at
// addr, on a bucket of 100 an hour at key.
func goRedisSpec(addr, key string, goroutines, attempts int, holds ...harness.Hold) harness.Spec {
	return harness.Spec{
		Backend: harness.BackendGoRedis, Server: harness.Server{Server: redisconn.Server{Addrs: []string{addr}}}, Key: key,
		Config:     ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(100)}},
		Goroutines: goroutines, Attempts: attempts, Holds: holds,
	}
}

// TestInstancesHold runs 2 instances × 3 goroutines, 12 calls each, with
// holds at attempts 4 and 8, and the server paused between them, once the
// calls before the first hold have returned (WaitIdle): every attempt
// before a hold starts before WaitHeld returns, and none after it until Go
// releases it; the calls between the holds have that phase's timeout of
// 50ms, and the others the spec's 10s.
func TestInstancesHold(t *testing.T) {
	t.Parallel()
	const phaseTimeout = 50 * time.Millisecond
	r := servers.StartRedis(t)
	spec := goRedisSpec(r.Addr(), "holds", 3, 12, harness.Hold{At: 4, Timeout: phaseTimeout}, harness.Hold{At: 8})
	in := servers.StartInstances(t, build.Bin(t), 2, spec)
	in.Go(t)
	in.WaitHeld(t)
	in.WaitIdle(t)
	r.Pause(t)
	paused := time.Now().UnixNano()
	in.Go(t)
	in.WaitHeld(t)
	resuming := time.Now().UnixNano()
	r.Resume(t)
	in.Go(t)
	calls := in.Wait(t)
	if len(calls) != 24 {
		t.Fatalf("%d calls reported, want 24", len(calls))
	}
	held := []int64{paused, resuming} // each hold seen, before its release
	failed := map[int]int{}           // the calls of phase 1 that failed, by instance
	for _, c := range calls {
		phase := 0
		for _, h := range spec.Holds {
			if c.Attempt >= h.At {
				phase++
			}
		}
		if phase > 0 && c.Start <= held[phase-1] {
			t.Errorf("instance %d started attempt %d before hold %d was released", c.Instance, c.Attempt, phase-1)
		}
		if phase < len(held) && c.Start >= held[phase] {
			t.Errorf("instance %d started attempt %d after WaitHeld saw it hold at %d", c.Instance, c.Attempt, spec.Holds[phase].At)
		}
		took := time.Duration(c.End - c.Start)
		switch {
		case phase != 1 && c.Err != "":
			t.Errorf("instance %d, attempt %d, with the server up: %s", c.Instance, c.Attempt, c.Err)
		case phase == 1 && c.Err != "":
			failed[c.Instance]++
			// The spec's 10s would take 200 times as long.
			if took < phaseTimeout || took > 5*time.Second {
				t.Errorf("instance %d, attempt %d, on the paused server, failed after %v; want the phase's %v timeout", c.Instance, c.Attempt, took, phaseTimeout)
			}
		case phase == 1 && c.End < resuming:
			t.Errorf("instance %d, attempt %d decided while the server was paused", c.Instance, c.Attempt)
		}
	}
	// Each instance starts its fourth call in the phase only once one of
	// its three has ended, which only a timeout can do.
	for i := range 2 {
		if failed[i] == 0 {
			t.Errorf("instance %d: no call on the paused server timed out", i)
		}
	}
}

// TestKillExited: killing an instance that has finished fails the test as
// a mistake in its design, with the instance's last lines.
func TestKillExited(t *testing.T) {
	t.Parallel()
	r := servers.StartRedis(t)
	spec := goRedisSpec(r.Addr(), "kill-exited", 1, 1)
	in := servers.StartInstances(t, build.Bin(t), 1, spec)
	in.Go(t)
	in.Wait(t)
	tb := &outcomeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		in.Kill(tb, 0)
		tb.outcome = "returned"
	}()
	<-done
	for _, want := range []string{"had exited already", "exit status 0", `"Done":true`} {
		if tb.outcome != "failed" || !strings.Contains(tb.msg, want) {
			t.Errorf("Kill of an exited instance %s: %q; want it failed, saying %s", tb.outcome, tb.msg, want)
		}
	}
}

// TestInstancesRelease: Release lets one instance run its next phase
// while the other holds, and WaitStarted sees its calls start.
func TestInstancesRelease(t *testing.T) {
	t.Parallel()
	r := servers.StartRedis(t)
	spec := goRedisSpec(r.Addr(), "release", 2, 12, harness.Hold{At: 4}, harness.Hold{At: 8})
	in := servers.StartInstances(t, build.Bin(t), 2, spec)
	in.Go(t)
	in.WaitHeld(t)
	in.Release(t, 0)
	in.WaitStarted(t, 0, 6)
	in.WaitHeld(t)
	alone := time.Now().UnixNano() // instance 0 at its second hold, 1 at its first
	in.Go(t)
	// Instance 0 has no hold left and may have exited already: only
	// instance 1 has one to release.
	in.Release(t, 1)
	calls := in.Wait(t)
	if len(calls) != 24 {
		t.Fatalf("%d calls reported, want 24", len(calls))
	}
	for _, c := range calls {
		between := c.Attempt >= 4 && c.Attempt < 8
		switch {
		case c.Err != "":
			t.Errorf("instance %d, attempt %d: %s", c.Instance, c.Attempt, c.Err)
		case c.Instance == 0 && between && c.Start >= alone:
			t.Errorf("instance 0 started attempt %d after its phase, released alone, held", c.Attempt)
		case c.Instance == 1 && c.Attempt >= 4 && c.Start <= alone:
			t.Errorf("instance 1 started attempt %d while it held", c.Attempt)
		}
	}
}
