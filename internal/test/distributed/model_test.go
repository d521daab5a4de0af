package distributed_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
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
			s := state.(int64)
			next, want := step(capacity, s, input.(ratelimit.Request))
			got, _ := output.(*outcome)
			return stepTo(s, next, want, got)
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

// stepTo is a nondeterministic model's step for an operation that takes
// state s to next with outcome want: an unknown outcome (got nil, the
// call failed) took effect or did not, and a known one must be want.
func stepTo[S, O comparable](s, next S, want O, got *O) []any {
	switch {
	case got == nil:
		if next == s {
			return []any{s}
		}
		return []any{s, next}
	case *got == want:
		return []any{next}
	}
	return nil
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
func history(spec harness.Spec, calls []harness.Call) ([]porcupine.Operation, error) {
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
	return ops, nil
}

// timedHistory turns the instances' calls into porcupine operations for
// refillModel: each call's input carries its start and end in µs, which
// bound the server's clock when it was applied, since the server runs on
// the same machine. Calls that failed cannot be modelled: an error.
func timedHistory(spec harness.Spec, calls []harness.Call) ([]porcupine.Operation, error) {
	ops := make([]porcupine.Operation, len(calls))
	for i, c := range calls {
		if c.Err != "" {
			return nil, fmt.Errorf("instance %d, attempt %d failed: %s; refillModel has no failed calls", c.Instance, c.Attempt, c.Err)
		}
		in := timedRequest{spec.Requests[c.Attempt%len(spec.Requests)], c.Start / 1000, (c.End + 999) / 1000}
		ops[i] = porcupine.Operation{
			ClientId: c.Instance*spec.Goroutines + c.Goroutine,
			Input:    in,
			Call:     c.Start,
			Output:   newTimedOutcome(c.Decision),
			Return:   c.End,
		}
	}
	return ops, nil
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

// refillModel is the sequential specification of a token bucket of one
// bandwidth that refills greedily by one scaled unit a microsecond (Rate
// 1; Scale units to a token) up to capacity tokens.
//
// A history does not say when, on the server's clock, each call was
// applied; only that it was between the call's start and end, which on
// one machine read the server's clock too. So the state is the level, in
// scaled units, at a time known to lie in an interval, and each step finds
// the times at which the call could have been applied to give its output.
// With Rate 1 the output pins the time exactly: ResetAfter, the µs until
// the bucket is full, gives the level after the call, and that less the
// level before, plus what the call took, is the µs of refill since the
// previous call. A full bucket only bounds the time from below. Each step
// then checks every field of the output against the level at that time.
//
// Inputs are timedRequests and outputs *timedOutcomes; calls that failed
// are not modelled (their time and effect are both unknown).
func refillModel(capacity, scale int64) porcupine.Model {
	full := capacity * scale
	return porcupine.Model{
		Init: func() any { return refillState{level: full, from: math.MinInt64 / 2, to: math.MaxInt64 / 2} },
		Step: func(state, input, output any) (bool, any) {
			next, ok := refillStep(full, scale, state.(refillState), input.(timedRequest), output.(*timedOutcome))
			return ok, next
		},
		DescribeOperation: func(input, output any) string {
			in := input.(timedRequest)
			return fmt.Sprintf("%v(%d) in [%d, %d] -> %+v", in.Op, in.Tokens, in.start, in.end, *output.(*timedOutcome))
		},
		DescribeState: func(state any) string {
			s := state.(refillState)
			return fmt.Sprintf("level %d at a µs in [%d, %d]", s.level, s.from, s.to)
		},
	}
}

// refillState is a bucket's level, in scaled units, at some µs in
// [from, to].
type refillState struct {
	level, from, to int64
}

// timedRequest is a request and the µs of its call's start and end.
type timedRequest struct {
	ratelimit.Request
	start, end int64
}

// timedOutcome is what refillModel checks of a decision; times in µs.
type timedOutcome struct {
	Allowed                bool
	Remaining, Consumed    int64
	RetryAfter, ResetAfter int64
}

func newTimedOutcome(d ratelimit.Decision) *timedOutcome {
	return &timedOutcome{d.Allowed, d.Remaining, d.Consumed, int64(d.RetryAfter / time.Microsecond), int64(d.ResetAfter / time.Microsecond)}
}

// refillStep applies a call to s, as refillModel describes.
func refillStep(full, scale int64, s refillState, in timedRequest, out *timedOutcome) (refillState, bool) {
	after := full - out.ResetAfter // Rate 1: ResetAfter is the units missing
	at := after + out.Consumed*scale
	if after < 0 || at > full || at < s.level {
		return s, false
	}
	// The call was applied at t, with t − (previous time) = at − s.level,
	// or at least full − s.level if the bucket was full by then.
	from, to := s.from+(at-s.level), s.to+(at-s.level)
	if at == full {
		to = math.MaxInt64 / 2
	}
	from, to = max(from, in.start), min(to, in.end)
	if from > to {
		return s, false
	}
	if want := decideAt(full, scale, at, in.Request); *out != want {
		return s, false
	}
	return refillState{level: after, from: from, to: to}, true
}

// decideAt is the decision on a bucket that holds level scaled units when
// the call is applied, as ratelimit.Apply makes it.
func decideAt(full, scale, level int64, req ratelimit.Request) timedOutcome {
	n := req.Tokens
	var taken int64
	switch req.Op {
	case ratelimit.Inspect:
		n = 1
	case ratelimit.ConsumeUpTo:
		if taken = min(n, level/scale); taken == 0 {
			n = 1
		}
	case ratelimit.Consume:
		if level >= n*scale {
			taken = n
		}
	}
	after := level - taken*scale
	o := timedOutcome{Allowed: true, Remaining: after / scale, Consumed: taken, ResetAfter: full - after}
	if taken == 0 && level < n*scale {
		o.Allowed, o.RetryAfter = false, n*scale-level
	}
	return o
}

// refillBandwidth is the bucket of the refill linearizability runs: 10
// tokens, one more every 10ms, so Scale 10,000 and Rate 1. (At one a
// millisecond the bucket is often full, which bounds a call's time only
// from below, and porcupine's search took up to a minute.)
var refillBandwidth = ratelimit.Every(10*time.Millisecond, 1).WithBurst(10)

const refillScale = 10_000 // refillBandwidth's scaled units to a token

// TestRefillModelMatchesMemory: refillModel accepts the memory backend's
// decisions on a fake clock, each at the exact µs it was made, over random
// requests and random pauses between them; and refuses each decision with
// any one field changed, or a µs late when the bucket was not full.
func TestRefillModelMatchesMemory(t *testing.T) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{refillBandwidth}}
	model := refillModel(refillBandwidth.Capacity, refillScale)
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 1))
		clock := ratelimittest.NewClock(time.UnixMicro(1_000_000_000_000))
		b := memory.New(memory.WithClock(clock))
		state := model.Init()
		for i, req := range refillRequests(seed, 300) {
			pause := r.IntN(4) * r.IntN(refillScale*4/5) // µs; about half a token a call
			if r.IntN(20) == 0 {
				pause = 15 * refillScale // long enough to fill the bucket
			}
			clock.Advance(time.Duration(pause) * time.Microsecond)
			d, err := b.Do(context.Background(), "k", cfg, req)
			if err != nil {
				t.Fatal(err)
			}
			now := clock.Now().UnixMicro()
			in, out := timedRequest{req, now, now}, newTimedOutcome(d)
			for _, wrong := range wrongOutcomes(*out) {
				if ok, _ := model.Step(state, in, &wrong); ok {
					t.Fatalf("seed %d, call %d, %v(%d): the model accepts %+v besides %+v", seed, i, req.Op, req.Tokens, wrong, *out)
				}
			}
			if out.ResetAfter > out.Consumed*refillScale { // not full: the output pins the µs
				if ok, _ := model.Step(state, timedRequest{req, now + 1, now + 1}, out); ok {
					t.Fatalf("seed %d, call %d, %v(%d): the model accepts %+v a µs late", seed, i, req.Op, req.Tokens, *out)
				}
			}
			ok, next := model.Step(state, in, out)
			if !ok {
				t.Fatalf("seed %d, call %d, %v(%d) at %d µs on %s: the model refuses the memory backend's %+v",
					seed, i, req.Op, req.Tokens, now, model.DescribeState(state), *out)
			}
			state = next
		}
		b.Close()
	}
}

// wrongOutcomes returns o with each field changed in turn.
func wrongOutcomes(o timedOutcome) []timedOutcome {
	w := []timedOutcome{o, o, o, o, o}
	w[0].Allowed = !o.Allowed
	w[1].Remaining++
	w[2].Consumed++
	w[3].RetryAfter++
	w[4].ResetAfter++
	return w
}

// refillRequests are the calls of a refill linearizability run: the ops
// that refillModel knows, which are those of mixedRequests but Add.
func refillRequests(seed uint64, n int) []ratelimit.Request {
	reqs := mixedRequests(seed, n)
	for i := range reqs {
		if reqs[i].Op == ratelimit.Add {
			reqs[i].Op = ratelimit.Consume
		}
	}
	return reqs
}
