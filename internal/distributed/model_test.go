package distributed_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// outcome is what the model checks of a decision.
type outcome struct {
	Allowed   bool
	Remaining int64
	Consumed  int64
}

func (o outcome) String() string {
	return fmt.Sprintf("allowed=%v remaining=%d consumed=%d", o.Allowed, o.Remaining, o.Consumed)
}

// bucketModel is the sequential specification of a token bucket of one
// bandwidth of the given capacity that does not refill within the run: its
// state is the whole tokens left. An operation's input is its
// ratelimit.Request; its output is an outcome, or nil when the call failed
// and may or may not have taken effect.
func bucketModel(capacity int64) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{capacity} },
		Step: func(state, input, output any) []any {
			s, req := state.(int64), input.(ratelimit.Request)
			next, want := step(capacity, s, req)
			got, ok := output.(*outcome)
			switch {
			case !ok || got == nil: // unknown: it took effect or it did not
				if next == s {
					return []any{s}
				}
				return []any{s, next}
			case *got == want:
				return []any{next}
			}
			return nil
		},
		DescribeOperation: func(input, output any) string {
			req := input.(ratelimit.Request)
			if o, _ := output.(*outcome); o != nil {
				return fmt.Sprintf("%v(%d) -> %v", req.Op, req.Tokens, *o)
			}
			return fmt.Sprintf("%v(%d) -> ?", req.Op, req.Tokens)
		},
		DescribeState: func(state any) string { return fmt.Sprintf("%d tokens", state.(int64)) },
	}
	return nm.ToModel()
}

// step applies req to a bucket with s of capacity tokens, as
// [ratelimit.Apply] documents each op: the state after and the outcome.
func step(capacity, s int64, req ratelimit.Request) (int64, outcome) {
	n := req.Tokens
	switch req.Op {
	case ratelimit.Consume:
		if s >= n {
			return s - n, outcome{true, s - n, n}
		}
		return s, outcome{false, s, 0}
	case ratelimit.Estimate:
		return s, outcome{s >= n, s, 0}
	case ratelimit.Inspect:
		return s, outcome{s >= 1, s, 0}
	case ratelimit.ConsumeUpTo:
		if k := min(n, s); k > 0 {
			return s - k, outcome{true, s - k, k}
		}
		return s, outcome{false, 0, 0}
	case ratelimit.Add:
		s = min(capacity, s+n)
		return s, outcome{true, s, 0}
	}
	panic(fmt.Sprintf("bucketModel: op %v is not modelled", req.Op))
}

// history turns the instances' calls into porcupine operations. A call that
// failed may take effect at any time after it started, so it gets no
// output and never returns.
func history(spec testkit.InstanceSpec, calls []testkit.Call) []porcupine.Operation {
	ops := make([]porcupine.Operation, len(calls))
	for i, c := range calls {
		op := porcupine.Operation{
			ClientId: c.Instance*spec.Goroutines + c.Goroutine,
			Input:    spec.Requests[c.Attempt%len(spec.Requests)],
			Call:     c.Start,
			Return:   c.End,
		}
		if c.Err == "" {
			op.Output = &outcome{c.Decision.Allowed, c.Decision.Remaining, c.Decision.Consumed}
		} else {
			op.Output, op.Return = (*outcome)(nil), math.MaxInt64
		}
		ops[i] = op
	}
	return ops
}

// TestModelMatchesMemory: bucketModel's step decides as the memory backend
// does, call for call, on the mixed requests of the linearizability runs.
func TestModelMatchesMemory(t *testing.T) {
	r := linearizabilityRun(topology{}, "")
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{r.bandwidth}}
	for seed := range uint64(20) {
		b := memory.New()
		s := r.bandwidth.Capacity
		for i, req := range mixedRequests(seed, 300) {
			d, err := b.Do(context.Background(), "k", cfg, req)
			if err != nil {
				t.Fatal(err)
			}
			var want outcome
			s, want = step(r.bandwidth.Capacity, s, req)
			if got := (outcome{d.Allowed, d.Remaining, d.Consumed}); got != want {
				t.Fatalf("seed %d, call %d, %v(%d): memory %v, model %v", seed, i, req.Op, req.Tokens, got, want)
			}
		}
		b.Close()
	}
}

// TestModelCatchesLostUpdate: two overlapping Consumes that both report 9
// of 10 left is a lost update, which porcupine must refuse; one after the
// other reporting 9 then 8 it must accept.
func TestModelCatchesLostUpdate(t *testing.T) {
	consume := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	op := func(client int, call, ret int64, remaining int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: consume, Call: call, Return: ret,
			Output: &outcome{Allowed: true, Remaining: remaining, Consumed: 1}}
	}
	model := bucketModel(10)
	if porcupine.CheckOperations(model, []porcupine.Operation{op(0, 0, 10, 9), op(1, 5, 15, 9)}) {
		t.Error("two Consumes both leaving 9 of 10 passed as linearizable")
	}
	if !porcupine.CheckOperations(model, []porcupine.Operation{op(0, 0, 10, 8), op(1, 5, 15, 9)}) {
		t.Error("overlapping Consumes leaving 9 then 8 failed as not linearizable")
	}
	unknown := porcupine.Operation{ClientId: 2, Input: consume, Call: 0, Return: math.MaxInt64, Output: (*outcome)(nil)}
	if !porcupine.CheckOperations(model, []porcupine.Operation{unknown, op(0, 20, 30, 8), op(1, 40, 50, 7)}) {
		t.Error("a failed Consume that took effect failed as not linearizable")
	}
}
