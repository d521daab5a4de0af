package harness

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

// permitSpec is a permits run of goroutines × attempts on key "k" under a
// limit of 3, leased for a minute.
func permitSpec(goroutines, attempts int) Spec {
	return Spec{
		Key: "k", Goroutines: goroutines, Attempts: attempts, Timeout: 10 * time.Second,
		Permits: &Permits{Concurrency: ratelimit.InFlight(3, time.Minute), Seed: 7},
	}
}

// TestGateOwnAttempts: in a permits run goroutine g takes attempts g,
// g + G, g + 2G, … and waits at a hold for the first of them at or past
// its At, until the hold is released.
func TestGateOwnAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec := permitSpec(3, 10)
		spec.Holds = []Hold{{At: 4}}
		g := newGate(spec, func() {})
		var (
			mu    sync.Mutex
			taken [3][]int
			wg    sync.WaitGroup
		)
		for gi := range 3 {
			wg.Go(func() {
				for {
					i, ok := g.take(gi)
					if !ok {
						return
					}
					mu.Lock()
					taken[gi] = append(taken[gi], i)
					mu.Unlock()
				}
			})
		}
		synctest.Wait()
		mu.Lock()
		if got, want := taken, [3][]int{{0, 3}, {1}, {2}}; !equalTaken(got, want) {
			t.Errorf("before the hold: %v; want %v", got, want)
		}
		mu.Unlock()
		g.mu.Lock()
		g.passed++
		g.released.Broadcast()
		g.mu.Unlock()
		wg.Wait()
		if got, want := taken, [3][]int{{0, 3, 6, 9}, {1, 4, 7}, {2, 5, 8}}; !equalTaken(got, want) {
			t.Errorf("in all: %v; want %v", got, want)
		}
	})
}

func equalTaken(a, b [3][]int) bool {
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

// runPermits runs spec's goroutines in this process as instance index on
// pb, and returns the calls they wrote.
func runPermits(t *testing.T, spec Spec, pb ratelimit.PermitBackend, index int, g *gate) []Call {
	t.Helper()
	var buf bytes.Buffer
	o := &out{w: &buf}
	if g == nil {
		g = newGate(spec, func() {})
	}
	if err := runClients(o, g, permitClients(spec, pb, nil, index), spec); err != nil {
		t.Fatal(err)
	}
	return readCalls(t, &buf)
}

// readCalls reads the calls of the Lines in buf.
func readCalls(t *testing.T, buf *bytes.Buffer) []Call {
	t.Helper()
	var calls []Call
	sc := bufio.NewScanner(buf)
	for sc.Scan() {
		_, text, ok := cutLine(sc.Bytes())
		if !ok {
			t.Fatalf("not a line: %q", sc.Text())
		}
		var l Line
		if err := json.Unmarshal(text, &l); err != nil {
			t.Fatal(err)
		}
		if l.Call != nil {
			calls = append(calls, *l.Call)
		}
	}
	return calls
}

// TestPermitsOnMemory: two instances' goroutines of a permits run, in
// this process on one memory store, make every call they are meant to,
// each op among them, break no limit, and end holding nothing. Each
// goroutine's calls are its own attempts, in turn, and it releases
// exactly the permits it was granted.
func TestPermitsOnMemory(t *testing.T) {
	spec := permitSpec(8, 400)
	spec.Permits.Weights = []int64{1, 1, 2}
	spec.Permits.HoldMax = 200 * time.Microsecond
	spec.Permits.Reacquire, spec.Permits.Inspect = 2, 5
	store := memory.New()
	defer store.Close()
	var (
		wg    sync.WaitGroup
		calls [2][]Call
	)
	for index := range 2 {
		wg.Go(func() { calls[index] = runPermits(t, spec, store, index, nil) })
	}
	wg.Wait()
	all := append(calls[0], calls[1]...)
	n := CountPermits(all, spec.Permits.Concurrency)
	t.Logf("%+v", n)
	if err := n.Check(); err != nil {
		t.Error(err)
	}
	if n.Calls != 800 || n.Failed != 0 || n.Granted == 0 || n.Denied == 0 || n.Reacquires == 0 || n.Inspects == 0 || n.Released != n.Granted {
		t.Errorf("tally %+v; want 800 calls, none failed, some of each op, every permit granted released", n)
	}
	d, err := store.DoPermit(context.Background(), spec.Key, spec.Permits.Concurrency, ratelimit.PermitRequest{Op: ratelimit.PermitInspect})
	if err != nil || d.InFlight != 0 {
		t.Errorf("InspectPermits after the run: %+v, %v; want none in flight", d, err)
	}
	for index := range 2 {
		last := map[int]int{}
		for _, c := range calls[index] {
			if c.Attempt%spec.Goroutines != c.Goroutine {
				t.Fatalf("goroutine %d made attempt %d", c.Goroutine, c.Attempt)
			}
			if prev, ok := last[c.Goroutine]; ok && c.Attempt != prev+spec.Goroutines {
				t.Fatalf("goroutine %d made attempt %d after %d", c.Goroutine, c.Attempt, prev)
			}
			last[c.Goroutine] = c.Attempt
			if h := c.Permit.Request.Holder; c.Permit.Request.Op != ratelimit.PermitInspect && !strings.HasPrefix(h, holderPrefix+".i") {
				t.Fatalf("holder %q; want one of this process's", h)
			}
		}
	}
}

// TestPermitsHeldAcrossHold: with as many attempts before a hold as
// goroutines, each goroutine makes one acquire there, and those granted
// hold their permits until the hold is released; then they release them.
func TestPermitsHeldAcrossHold(t *testing.T) {
	spec := permitSpec(5, 10)
	spec.Holds = []Hold{{At: 5}}
	store := memory.New()
	defer store.Close()
	g := newGate(spec, func() {})
	pb := returns{store, make(chan struct{}, 10)}
	done := make(chan []Call)
	go func() { done <- runPermits(t, spec, pb, 0, g) }()
	for range 5 {
		<-pb.returned
	}
	d, err := store.DoPermit(context.Background(), spec.Key, spec.Permits.Concurrency, ratelimit.PermitRequest{Op: ratelimit.PermitInspect})
	if err != nil || d.InFlight != 3 {
		t.Fatalf("at the hold: %+v, %v; want the limit, 3, in flight", d, err)
	}
	g.mu.Lock()
	g.passed++
	g.released.Broadcast()
	g.mu.Unlock()
	calls := <-done
	n := CountPermits(calls, spec.Permits.Concurrency)
	if n.Acquires != 5 || n.Granted != 3 || n.Released != 3 || n.Inspects != 2 || n.Violations != 0 {
		t.Errorf("tally %+v; want 5 acquires, 3 granted and released, 2 inspects", n)
	}
}

// returns is a PermitBackend that says when each call has returned.
type returns struct {
	ratelimit.PermitBackend
	returned chan struct{}
}

func (r returns) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	defer func() { r.returned <- struct{}{} }()
	return r.PermitBackend.DoPermit(ctx, key, lim, req)
}

// TestCountPermits: each decision that breaks what a store says of
// itself is a violation, and so is an overlap counter past the limit;
// failed calls count as failed, unknown unless refused, and a fail
// policy's decisions as degraded, unchecked.
func TestCountPermits(t *testing.T) {
	lim := ratelimit.InFlight(3, time.Second)
	acquire := ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "h", Weight: 2}
	release := ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: "h", Weight: 2}
	inspect := ratelimit.PermitRequest{Op: ratelimit.PermitInspect}
	call := func(req ratelimit.PermitRequest, d ratelimit.PermitDecision, overlap int64) Call {
		d.Limit = cmp.Or(d.Limit, 3)
		return Call{Permit: &PermitCall{Request: req, Decision: d, Overlap: overlap}}
	}
	for _, tt := range []struct {
		name string
		c    Call
		want string // in the error; "" for none
	}{
		{"Granted", call(acquire, ratelimit.PermitDecision{Granted: true, InFlight: 3}, 3), ""},
		{"Denied", call(acquire, ratelimit.PermitDecision{InFlight: 2, RetryAfter: time.Second}, 0), ""},
		{"Released", call(release, ratelimit.PermitDecision{Granted: true, InFlight: 0}, 0), ""},
		{"ReleaseLost", call(release, ratelimit.PermitDecision{InFlight: 1}, 0), ""},
		{"Inspect", call(inspect, ratelimit.PermitDecision{Granted: true, InFlight: 2}, 0), ""},
		{"Failed", Call{Err: "timeout", Permit: &PermitCall{Request: acquire}}, ""},
		{"Degraded", call(acquire, ratelimit.PermitDecision{Degraded: true, RetryAfter: time.Minute}, 0), ""},
		{"Overlap", call(acquire, ratelimit.PermitDecision{Granted: true, InFlight: 3}, 4), "the overlap counter reached 4, over the limit of 3"},
		{"OverLimit", call(acquire, ratelimit.PermitDecision{Granted: true, InFlight: 4}, 0), "4 in flight of a limit of 3"},
		{"WrongLimit", call(inspect, ratelimit.PermitDecision{Granted: true, Limit: 5, InFlight: 2}, 0), "limit of 5"},
		{"GrantedWithoutItself", call(acquire, ratelimit.PermitDecision{Granted: true, InFlight: 1}, 0), "less than its own weight"},
		{"DeniedWithRoom", call(acquire, ratelimit.PermitDecision{InFlight: 1, RetryAfter: time.Second}, 0), "room for its weight of 2"},
		{"DeniedNoRetry", call(acquire, ratelimit.PermitDecision{InFlight: 2}, 0), "RetryAfter of 0s"},
		{"DeniedRetryPastLease", call(acquire, ratelimit.PermitDecision{InFlight: 2, RetryAfter: 2 * time.Second}, 0), "RetryAfter of 2s"},
		{"RetryOnRelease", call(release, ratelimit.PermitDecision{Granted: true, RetryAfter: time.Millisecond}, 0), "only on a denied acquire"},
		{"InspectFull", call(inspect, ratelimit.PermitDecision{Granted: true, InFlight: 3}, 0), "inspect granted true with 3 of 3"},
		{"NotPermits", Call{}, "not a permit call"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := CountPermits([]Call{tt.c}, lim)
			err := n.Check()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Check = %v; want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Check = %v; want an error with %q", err, tt.want)
			}
		})
	}
	n := CountPermits([]Call{
		{Start: 5, End: 9, Err: "timeout", Permit: &PermitCall{Request: acquire}},
		{Start: 2, End: 3, Err: "invalid", Refused: true, Permit: &PermitCall{Request: acquire}},
		{Start: 4, End: 12, Permit: &PermitCall{Request: acquire, Reacquire: true, Decision: ratelimit.PermitDecision{Granted: true, Limit: 3, InFlight: 2}}},
		{Start: 6, End: 7, Permit: &PermitCall{Request: release, Decision: ratelimit.PermitDecision{Degraded: true, Limit: 3}}},
	}, lim)
	if want := (PermitTally{Calls: 4, Reacquires: 1, Degraded: 1, Failed: 2, Unknown: 1, First: 2, Last: 12}); !reflect.DeepEqual(n, want) {
		t.Errorf("CountPermits = %+v; want %+v", n, want)
	}
}

// TestCheckPermits: a permits spec with a bucket's options, a bad limit
// or weight, or holds out of order is refused, naming what is wrong.
func TestCheckPermits(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  func(*Spec)
		want string
	}{
		{"Shard", func(s *Spec) { s.Shard = &Shard{N: 2} }, "Shard, Lease or Settle"},
		{"Settle", func(s *Spec) { s.Settle = true }, "Shard, Lease or Settle"},
		{"Limit", func(s *Spec) { s.Permits.Limit = 0 }, "Concurrency.Limit"},
		{"Key", func(s *Spec) { s.Key = "" }, "key must be"},
		{"Weight", func(s *Spec) { s.Permits.Weights = []int64{1, 4} }, "Weights[1] is 4"},
		{"Hold", func(s *Spec) { s.Permits.HoldMin = time.Second }, "HoldMin 1s, HoldMax 0s"},
		{"Reacquire", func(s *Spec) { s.Permits.Reacquire = -1 }, "Reacquire -1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec := permitSpec(2, 4)
			tt.set(&spec)
			if err := checkPermits(spec); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("checkPermits = %v; want an error with %q", err, tt.want)
			}
		})
	}
	if err := checkPermits(permitSpec(2, 4)); err != nil {
		t.Errorf("checkPermits of a good spec = %v", err)
	}
}
