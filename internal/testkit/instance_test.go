package testkit_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestInstances runs 2 instances × 3 goroutines, 10 calls each, and
// checks what they report: every attempt once, in its instance, with
// times in order and the bucket's capacity admitted.
func TestInstances(t *testing.T) {
	t.Parallel()
	bin, err := testkit.BuildInstance(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := testkit.StartRedis(t)
	spec := testkit.InstanceSpec{
		Backend: testkit.BackendGoRedis, Addrs: []string{r.Addr()}, Key: "instances",
		Config:     ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(5)}},
		Goroutines: 3, Attempts: 10,
	}
	in := testkit.StartInstances(t, bin, 2, spec)
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
	bin, err := testkit.BuildInstance(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		spec testkit.InstanceSpec
		want string
	}{
		{"Backend", testkit.InstanceSpec{Backend: "memcached", Addrs: []string{"127.0.0.1:1"}, Goroutines: 1}, `Backend "memcached"`},
		{"Goroutines", testkit.InstanceSpec{Backend: testkit.BackendGoRedis, Addrs: []string{"127.0.0.1:1"}}, "Goroutines 0"},
		{"Addrs", testkit.InstanceSpec{Backend: testkit.BackendRueidis, Goroutines: 1}, "no Addrs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := &outcomeTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				testkit.StartInstances(tb, bin, 1, tt.spec)
				tb.outcome = "returned"
			}()
			<-done
			if tb.outcome != "failed" || !strings.Contains(tb.msg, tt.want) {
				t.Errorf("StartInstances %s: %q; want it failed, naming %s", tb.outcome, tb.msg, tt.want)
			}
		})
	}
}
