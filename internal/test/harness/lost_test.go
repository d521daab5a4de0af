package harness

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

// faulty is a backend that misbehaves on every tenth Consume, as fault
// says, and passes every other call to the memory backend.
type faulty struct {
	*memory.Backend
	fault string
	n     int
}

func (f *faulty) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if req.Op != ratelimit.Consume {
		return f.Backend.Do(ctx, key, cfg, req)
	}
	if f.n++; f.n%10 != 0 {
		return f.Backend.Do(ctx, key, cfg, req)
	}
	switch f.fault {
	case "Lost": // admits without charging
		return ratelimit.Decision{Allowed: true, Consumed: req.Tokens, Limit: cfg.Bandwidths[0].Capacity}, nil
	case "TimeoutAfterCharge": // charges, then the reply is lost
		_, _ = f.Backend.Do(ctx, key, cfg, req)
		return ratelimit.Decision{}, fmt.Errorf("redis: Consume: %w", context.DeadlineExceeded)
	case "TimeoutBeforeCharge": // the command never ran
		return ratelimit.Decision{}, fmt.Errorf("redis: Consume: %w", context.DeadlineExceeded)
	case "RefusedAfterCharge": // says it left the bucket alone, but charged
		_, _ = f.Backend.Do(ctx, key, cfg, req)
		return ratelimit.Decision{}, fmt.Errorf("redis: %w", ratelimit.ErrKeyRejected)
	}
	panic("faulty: no fault " + f.fault)
}

// TestLostAdmissionsAreCaught: the bound must fail a backend that admits
// without charging, and one that charges for a call it says it refused;
// and pass one whose timeouts may or may not have charged, since their
// tokens are unknown. Each run is 3,000 calls of one token, one at a time,
// recorded as an instance records them, on a bucket of 1000 without
// refill.
func TestLostAdmissionsAreCaught(t *testing.T) {
	bw := NoRefill(1000)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{bw}}
	consume := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	for _, tt := range []struct{ fault, want string }{
		{"Lost", "over the bound"},
		{"RefusedAfterCharge", "under the bound"},
		{"TimeoutAfterCharge", ""},
		{"TimeoutBeforeCharge", ""},
	} {
		t.Run(tt.fault, func(t *testing.T) {
			b := &faulty{Backend: memory.New(), fault: tt.fault}
			defer b.Close()
			var n Tally
			for i := range 3000 {
				c := Call{Attempt: i, Tokens: tokens(consume)}
				c.record(b.Do(context.Background(), "k", cfg, consume))
				n = n.Add(c)
			}
			d, err := b.Do(context.Background(), "k", cfg, ratelimit.Request{Op: ratelimit.Inspect})
			if err != nil {
				t.Fatal(err)
			}
			err = Bounds{Low: bw.Capacity, High: bw.Capacity}.Check(n, d.Remaining)
			t.Logf("admitted %d, denied %d, failed %d (%d unknown tokens), remaining %d: %v", n.Admitted, n.Denied, n.Failed, n.Unknown, d.Remaining, err)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Check = %v; want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Check = %v; want an error with %q", err, tt.want)
			}
		})
	}
}

// TestRefused: only errors that leave the bucket alone are refusals; a
// timeout or a lost connection leaves the outcome unknown.
func TestRefused(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("x: %w", ratelimit.ErrInvalidConfig), true},
		{fmt.Errorf("x: %w", ratelimit.ErrInvalidKey), true},
		{fmt.Errorf("x: %w", ratelimit.ErrInvalidRequest), true},
		{fmt.Errorf("x: %w", ratelimit.ErrKeyRejected), true},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		{fmt.Errorf("x: %w", ratelimit.ErrTimeout), false},
		{fmt.Errorf("x: %w", ratelimit.ErrBackendUnavailable), false},
		{errors.New("read tcp: connection reset by peer"), false},
	} {
		var c Call
		c.record(ratelimit.Decision{}, tt.err)
		if c.Refused != tt.want || c.Unknown() == tt.want {
			t.Errorf("%v: Refused %t, Unknown %t; want Refused %t", tt.err, c.Refused, c.Unknown(), tt.want)
		}
	}
}
