package distributed_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/ratelimit"
)

// permitOutcome is what permitModel checks of a permit decision.
type permitOutcome struct {
	Granted  bool
	InFlight int64
}

// maxModelHolders bounds the holders a permitState keeps, and so the
// Limit permitModel takes: each holds a weight of 1 at least.
const maxModelHolders = 8

// permitState is one key's permits held, in permitModel: its holders in
// order, each with its weight, and their sum. It is a value, compared
// with ==.
type permitState struct {
	n        int
	holds    [maxModelHolders]modelHold
	inFlight int64
}

type modelHold struct {
	holder string
	weight int64
}

// find returns the index of holder's hold, and whether it holds one.
func (s permitState) find(holder string) (int, bool) {
	return slices.BinarySearchFunc(s.holds[:s.n], holder, func(h modelHold, holder string) int { return strings.Compare(h.holder, holder) })
}

func (s permitState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d held:", s.inFlight)
	for _, h := range s.holds[:s.n] {
		fmt.Fprintf(&b, " %s×%d", h.holder, h.weight)
	}
	return b.String()
}

// permitStep applies req to s under limit, as ratelimit.ApplyPermit
// documents each op for leases that do not end: the state after, and the
// decision's outcome. An acquire is granted if its holder holds a permit
// already, which it keeps (counted once), or if there is room for its
// weight; a release is granted, and frees the permit, if its holder holds
// one; an inspect is granted if there is room for one more.
func permitStep(limit int64, s permitState, req ratelimit.PermitRequest) (permitState, permitOutcome) {
	i, held := s.find(req.Holder)
	switch req.Op {
	case ratelimit.PermitAcquire:
		switch {
		case held:
			return s, permitOutcome{true, s.inFlight}
		case s.inFlight+req.Weight <= limit:
			copy(s.holds[i+1:s.n+1], s.holds[i:s.n])
			s.holds[i] = modelHold{req.Holder, req.Weight}
			s.n++
			s.inFlight += req.Weight
			return s, permitOutcome{true, s.inFlight}
		}
		return s, permitOutcome{false, s.inFlight}
	case ratelimit.PermitRelease:
		if !held {
			return s, permitOutcome{false, s.inFlight}
		}
		s.inFlight -= s.holds[i].weight
		copy(s.holds[i:s.n-1], s.holds[i+1:s.n])
		s.n--
		s.holds[s.n] = modelHold{}
		return s, permitOutcome{true, s.inFlight}
	case ratelimit.PermitInspect:
		return s, permitOutcome{s.inFlight < limit, s.inFlight}
	}
	panic(fmt.Sprintf("permitModel: op %v is not modelled", req.Op))
}

// permitModel is the sequential specification of one key's permits under
// limit (at most maxModelHolders), with leases that outlast the run: its
// state is the holders and their weights (permitStep). An operation's
// input is its ratelimit.PermitRequest; its output a *permitOutcome, or
// nil when the call failed and may or may not have taken effect.
func permitModel(limit int64) porcupine.Model {
	if limit > maxModelHolders {
		panic(fmt.Sprintf("permitModel: a limit of %d; at most %d", limit, maxModelHolders))
	}
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{permitState{}} },
		Step: func(state, input, output any) []any {
			s := state.(permitState)
			next, want := permitStep(limit, s, input.(ratelimit.PermitRequest))
			got, _ := output.(*permitOutcome)
			return stepTo(s, next, want, got)
		},
		DescribeOperation: func(input, output any) string {
			req := input.(ratelimit.PermitRequest)
			if o, _ := output.(*permitOutcome); o != nil {
				return fmt.Sprintf("%v(%s, %d) -> granted %t, %d held", req.Op, req.Holder, req.Weight, o.Granted, o.InFlight)
			}
			return fmt.Sprintf("%v(%s, %d) -> ?", req.Op, req.Holder, req.Weight)
		},
		DescribeState: func(state any) string { return state.(permitState).String() },
	}
	return nm.ToModel()
}

// permitHistory turns the calls of a permits run into porcupine
// operations. A call that failed may take effect at any time after it
// started, so it gets no output and never returns. Holders are shortened
// to the instance, goroutine and attempt that made them, for the
// visualization.
func permitHistory(spec harness.Spec, calls []harness.Call) []porcupine.Operation {
	ops := make([]porcupine.Operation, len(calls))
	for i, c := range calls {
		req := c.Permit.Request
		if _, short, ok := strings.Cut(req.Holder, "."); ok {
			req.Holder = short
		}
		op := porcupine.Operation{ClientId: c.Instance*spec.Goroutines + c.Goroutine, Input: req, Call: c.Start, Return: c.End}
		if c.Err == "" {
			op.Output = &permitOutcome{c.Permit.Decision.Granted, c.Permit.Decision.InFlight}
		} else {
			op.Output, op.Return = (*permitOutcome)(nil), math.MaxInt64
		}
		ops[i] = op
	}
	return ops
}

// randomPermitRequests are n permit calls of the holders h0 to h9, of
// weights 1 to 3, under a limit of 5: acquires (of a holder that holds
// one, sometimes), releases (of one that holds none, sometimes) and
// inspects.
func randomPermitRequests(seed uint64, n int) []ratelimit.PermitRequest {
	r := rand.New(rand.NewPCG(seed, 2))
	reqs := make([]ratelimit.PermitRequest, n)
	for i := range reqs {
		holder := fmt.Sprintf("h%d", r.IntN(10))
		switch r.IntN(5) {
		case 0, 1:
			reqs[i] = ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: holder, Weight: 1 + r.Int64N(3)}
		case 2, 3:
			reqs[i] = ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: holder, Weight: 1}
		default:
			reqs[i] = ratelimit.PermitRequest{Op: ratelimit.PermitInspect}
		}
	}
	return reqs
}

// TestPermitModelMatchesMemory: permitStep decides as the memory backend
// does, call for call, under a lease no call outlives.
func TestPermitModelMatchesMemory(t *testing.T) {
	lim := ratelimit.InFlight(5, time.Hour)
	for seed := range uint64(20) {
		b := memory.New()
		var s permitState
		for i, req := range randomPermitRequests(seed, 300) {
			d, err := b.DoPermit(context.Background(), "k", lim, req)
			if err != nil {
				t.Fatal(err)
			}
			var want permitOutcome
			s, want = permitStep(lim.Limit, s, req)
			if got := (permitOutcome{d.Granted, d.InFlight}); got != want {
				t.Fatalf("seed %d, call %d, %v(%s, %d): memory %+v, model %+v", seed, i, req.Op, req.Holder, req.Weight, got, want)
			}
		}
		b.Close()
	}
}

// TestPermitModelCatchesDoubleGrant: two overlapping acquires both
// granted the last permit is not linearizable, nor a release granted to a
// holder that holds none, nor a re-acquire that counts its holder twice;
// the same calls with the outcomes a store gives are, and so is a failed
// acquire that took effect.
func TestPermitModelCatchesDoubleGrant(t *testing.T) {
	acquire := func(holder string, w int64) ratelimit.PermitRequest {
		return ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: holder, Weight: w}
	}
	release := ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: "a", Weight: 1}
	op := func(client int, call, ret int64, req ratelimit.PermitRequest, granted bool, inFlight int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: req, Call: call, Return: ret, Output: &permitOutcome{granted, inFlight}}
	}
	model := permitModel(2)
	fill := op(0, 0, 1, acquire("x", 1), true, 1)
	for _, tt := range []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"DoubleGrant", []porcupine.Operation{fill, op(1, 5, 15, acquire("a", 1), true, 2), op(2, 6, 16, acquire("b", 1), true, 2)}, false},
		{"OneGranted", []porcupine.Operation{fill, op(1, 5, 15, acquire("a", 1), true, 2), op(2, 6, 16, acquire("b", 1), false, 2)}, true},
		{"OverWeight", []porcupine.Operation{fill, op(1, 5, 15, acquire("a", 2), true, 3)}, false},
		{"ReleaseNotHeld", []porcupine.Operation{fill, op(1, 5, 15, release, true, 0)}, false},
		{"ReleaseHeld", []porcupine.Operation{fill, op(1, 5, 15, acquire("a", 1), true, 2), op(1, 20, 30, release, true, 1)}, true},
		{"ReacquireCountedTwice", []porcupine.Operation{op(1, 5, 15, acquire("a", 1), true, 1), op(1, 20, 30, acquire("a", 1), true, 2)}, false},
		{"Reacquire", []porcupine.Operation{op(1, 5, 15, acquire("a", 1), true, 1), op(1, 20, 30, acquire("a", 1), true, 1)}, true},
		{"UnknownTookEffect", []porcupine.Operation{
			{ClientId: 3, Input: acquire("u", 1), Call: 0, Return: math.MaxInt64, Output: (*permitOutcome)(nil)},
			op(1, 20, 30, acquire("a", 1), true, 2), op(2, 40, 50, acquire("b", 1), false, 2),
		}, true},
	} {
		if got := porcupine.CheckOperations(model, tt.ops); got != tt.want {
			t.Errorf("%s: linearizable %t; want %t", tt.name, got, tt.want)
		}
	}
}
