package ratelimit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// naivePermits is the permits' model at its plainest: a list of holds,
// scanned in full on every call. ApplyPermit keeps a map and a bound on
// the first lease's end instead; the two must agree on every call.
type naivePermits []naiveHold

type naiveHold struct {
	holder          string
	weight, expires int64
}

func (n *naivePermits) apply(lim Concurrency, req PermitRequest, now int64) PermitDecision {
	kept := (*n)[:0]
	for _, h := range *n {
		if h.expires > now {
			kept = append(kept, h)
		}
	}
	*n = kept
	held, at := int64(0), -1
	for i, h := range *n {
		held += h.weight
		if h.holder == req.Holder {
			at = i
		}
	}
	d := PermitDecision{Limit: lim.Limit, InFlight: held}
	switch {
	case req.Op == PermitInspect:
		d.Granted = held < lim.Limit
	case at >= 0 && (req.Op == PermitAcquire || req.Op == PermitRenew):
		(*n)[at].expires = now + lim.LeaseMicros()
		d.Granted = true
	case at >= 0 && req.Op == PermitRelease:
		d.InFlight -= (*n)[at].weight
		*n = append((*n)[:at], (*n)[at+1:]...)
		d.Granted = true
	case req.Op == PermitAcquire && held+req.Weight <= lim.Limit:
		*n = append(*n, naiveHold{req.Holder, req.Weight, now + lim.LeaseMicros()})
		d.InFlight += req.Weight
		d.Granted = true
	case req.Op == PermitAcquire:
		first := (*n)[0].expires
		for _, h := range *n {
			first = min(first, h.expires)
		}
		d.RetryAfter = time.Duration(first-now) * time.Microsecond
	}
	return d
}

// permitCall is one call of a generated sequence.
type permitCall struct {
	lim Concurrency
	req PermitRequest
	now int64
}

// permitCalls turns fuzz bytes into a sequence of calls on one key: six
// holders, limits of 1 to 8, leases of 1 to 16 ms, a clock that mostly
// moves forward but may step back, as a store's may.
func permitCalls(data []byte) []permitCall {
	var calls []permitCall
	now := int64(1_700_000_000_000_000)
	for len(data) >= 4 {
		op, holder, weight, step := data[0], data[1], data[2], data[3]
		data = data[4:]
		lim := Concurrency{Limit: int64(op>>2)%8 + 1, Lease: time.Duration(int64(holder>>3)%16+1) * time.Millisecond}
		req := PermitRequest{Op: PermitOp(op % 4), Holder: fmt.Sprintf("h%d", holder%6), Weight: int64(weight)%lim.Limit + 1}
		now += int64(step%64)*500 - 2000
		calls = append(calls, permitCall{lim, req, now})
	}
	return calls
}

// checkPermitCalls applies calls to a PermitState and the naive model, and
// fails on the first disagreement or broken invariant.
func checkPermitCalls(t *testing.T, calls []permitCall) {
	t.Helper()
	var st PermitState
	var model naivePermits
	for i, c := range calls {
		if err := CheckPermit("k", c.lim, c.req); err != nil {
			t.Fatalf("call %d: bad call: %v", i, err)
		}
		got := ApplyPermit(&st, c.lim, c.req, c.now)
		want := model.apply(c.lim, c.req, c.now)
		if got != want {
			t.Fatalf("call %d: %v %s weight %d, limit %d, at %d = %+v; the model says %+v", i, c.req.Op, c.req.Holder, c.req.Weight, c.lim.Limit, c.now, got, want)
		}
		sum := int64(0)
		for _, h := range st.Holds {
			sum += h.Weight
		}
		if sum != st.InFlight || len(st.Holds) != len(model) {
			t.Fatalf("call %d: %d holds of weight %d, InFlight %d; the model holds %d", i, len(st.Holds), sum, st.InFlight, len(model))
		}
		if got.Granted && c.req.Op == PermitAcquire && got.InFlight > c.lim.Limit && !heldBefore(calls[:i], c.req.Holder) {
			t.Fatalf("call %d: a new holder was granted with %d of %d held", i, got.InFlight, c.lim.Limit)
		}
	}
}

// heldBefore reports whether holder acquired in calls: a re-acquire is
// granted over a lowered limit.
func heldBefore(calls []permitCall, holder string) bool {
	for _, c := range calls {
		if c.req.Op == PermitAcquire && c.req.Holder == holder {
			return true
		}
	}
	return false
}

func FuzzApplyPermit(f *testing.F) {
	f.Add([]byte{0, 0, 0, 10, 0, 1, 0, 10, 4, 2, 1, 10, 1, 0, 0, 10, 2, 1, 0, 63, 3, 0, 0, 0})
	f.Add(binary.LittleEndian.AppendUint64(nil, 0x0102030405060708))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkPermitCalls(t, permitCalls(data))
	})
}

func TestApplyPermitAgainstModel(t *testing.T) {
	seed := uint64(1)
	for run := range 2000 {
		data := make([]byte, 4*64)
		for i := range data {
			seed = seed*6364136223846793005 + 1442695040888963407
			data[i] = byte(seed >> 56)
		}
		t.Run(fmt.Sprint(run), func(t *testing.T) { checkPermitCalls(t, permitCalls(data)) })
		if t.Failed() {
			return
		}
	}
}

func TestCheckPermit(t *testing.T) {
	good := InFlight(3, time.Second)
	acquire := PermitRequest{Holder: "h", Weight: 1}
	cases := []struct {
		key   string
		lim   Concurrency
		req   PermitRequest
		want  error
		field string
	}{
		{"", good, acquire, ErrInvalidKey, "key"},
		{strings.Repeat("k", MaxKeyLen+1), good, acquire, ErrInvalidKey, "key"},
		{"k", InFlight(0, time.Second), acquire, ErrInvalidConfig, "Concurrency.Limit"},
		{"k", InFlight(MaxPermits+1, time.Second), acquire, ErrInvalidConfig, "Concurrency.Limit"},
		{"k", InFlight(3, MinPermitLease-1), acquire, ErrInvalidConfig, "Concurrency.Lease"},
		{"k", InFlight(3, MaxPermitLease+time.Microsecond), acquire, ErrInvalidConfig, "Concurrency.Lease"},
		{"k", InFlight(3, time.Second+time.Nanosecond), acquire, ErrInvalidConfig, "whole microseconds"},
		{"k", good, PermitRequest{Weight: 1}, ErrInvalidRequest, "Holder"},
		{"k", good, PermitRequest{Op: PermitRenew, Holder: strings.Repeat("h", MaxHolderLen+1)}, ErrInvalidRequest, "Holder"},
		{"k", good, PermitRequest{Holder: "h"}, ErrInvalidRequest, "Weight"},
		{"k", good, PermitRequest{Holder: "h", Weight: 4}, ErrInvalidRequest, "Weight"},
		{"k", good, PermitRequest{Op: 9, Holder: "h"}, ErrInvalidRequest, "PermitOp(9)"},
	}
	for _, c := range cases {
		err := CheckPermit(c.key, c.lim, c.req)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("CheckPermit(%.10q, %+v, %+v) = %v; want %v naming %s", c.key, c.lim, c.req, err, c.want, c.field)
		}
	}
	for _, req := range []PermitRequest{acquire, {Op: PermitRelease, Holder: "h"}, {Op: PermitRenew, Holder: "h", Weight: 99}, {Op: PermitInspect}} {
		if err := CheckPermit("k", InFlight(MaxPermits, MaxPermitLease), req); err != nil {
			t.Errorf("CheckPermit(%+v) = %v; want nil", req, err)
		}
	}
}

func FuzzCheckPermit(f *testing.F) {
	f.Add("k", int64(3), int64(time.Second), uint8(0), "h", int64(1))
	f.Fuzz(func(t *testing.T, key string, limit, lease int64, op uint8, holder string, weight int64) {
		lim := Concurrency{Limit: limit, Lease: time.Duration(lease)}
		req := PermitRequest{Op: PermitOp(op), Holder: holder, Weight: weight}
		if err := CheckPermit(key, lim, req); err != nil {
			return
		}
		var st PermitState
		d := ApplyPermit(&st, lim, req, 1_700_000_000_000_000)
		if d.InFlight < 0 || d.InFlight > lim.Limit || d.Limit != lim.Limit {
			t.Fatalf("%+v on %+v = %+v", req, lim, d)
		}
	})
}
