package sharding

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// DoPermit records the key of a permit call that reaches r, as Do does,
// and passes it to next.
func (r *recorder) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	r.mu.Lock()
	r.log = append(r.log, key)
	r.mu.Unlock()
	return ratelimit.Permits(r.next).DoPermit(ctx, key, lim, req)
}

// TestPermitsNotSplit: a permit call on any key, a hot key's included,
// goes to the backend once, for the key as it is, and gets, call for call,
// the decision or error the bare backend gives: a hot key's limit of 4 is
// one limit of 4, not 4 sub-buckets of 1, while its bucket is split.
func TestPermitsNotSplit(t *testing.T) {
	clock := newClock()
	bare := newMemory(t, clock)
	rec := newRecorder(newMemory(t, clock))
	b := mustNew(t, rec, Keys(4, "hot"), Prefix(3, "p:"), Match(2, func(k string) bool { return strings.HasPrefix(k, "m") }))
	lim := ratelimit.InFlight(4, time.Minute)
	acquire := func(h string, w int64) ratelimit.PermitRequest {
		return ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: h, Weight: w}
	}
	release := func(h string) ratelimit.PermitRequest {
		return ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: h}
	}
	renew := func(h string) ratelimit.PermitRequest {
		return ratelimit.PermitRequest{Op: ratelimit.PermitRenew, Holder: h}
	}
	steps := []struct {
		advance time.Duration
		lim     ratelimit.Concurrency
		req     ratelimit.PermitRequest
	}{
		{0, lim, acquire("w", 4)}, {0, lim, acquire("a", 1)}, {0, lim, release("w")},
		{0, lim, acquire("a", 2)}, {0, lim, acquire("b", 2)}, {0, lim, acquire("c", 1)},
		{0, lim, ratelimit.PermitRequest{Op: ratelimit.PermitInspect}}, {30 * time.Second, lim, renew("a")},
		{40 * time.Second, lim, acquire("c", 1)}, {0, lim, release("b")}, {0, lim, release("b")}, {0, lim, renew("stranger")},
		{0, lim, release("a")}, {0, lim, release("c")},
		{0, lim, acquire("", 1)}, {0, lim, acquire("d", 5)}, {0, ratelimit.InFlight(0, time.Minute), acquire("d", 1)},
	}
	for _, key := range []string{"hot", "p:x", "m1", "cold", "hot\x000.4", "", strings.Repeat("k", ratelimit.MaxKeyLen+1)} {
		for i, s := range steps {
			clock.Advance(s.advance)
			want, wantErr := bare.DoPermit(context.Background(), key, s.lim, s.req)
			got, err := b.DoPermit(context.Background(), key, s.lim, s.req)
			if got != want || (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
				t.Fatalf("key %q, step %d (%v %q %d): got %+v, %v;\nthe bare backend %+v, %v", key, i, s.req.Op, s.req.Holder, s.req.Weight, got, err, want, wantErr)
			}
			calls := rec.calls()
			if wantErr == nil && !slices.Equal(calls, []string{key}) || wantErr != nil && len(calls) != 0 {
				t.Fatalf("key %q, step %d: the backend was called for %q; want %q once", key, i, calls, key)
			}
		}
	}
	// The hot key's bucket is split, all the same.
	do(t, b, "hot", config(ratelimit.PerHour(8)), consume(1))
	if calls := rec.calls(); len(calls) != 1 || calls[0] == "hot" {
		t.Errorf("a Consume on the hot key called the backend with %q; want one of its sub-keys", calls)
	}
}

// rateOnly is a Backend that holds no permits.
type rateOnly struct{ ratelimit.Backend }

// TestPermitsUnsupported: over a Backend that holds no permits, a permit
// call fails with errors.ErrUnsupported, after bad input.
func TestPermitsUnsupported(t *testing.T) {
	b := mustNew(t, rateOnly{newMemory(t, newClock())}, Keys(4, "hot"))
	lim := ratelimit.InFlight(4, time.Minute)
	req := ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "a", Weight: 1}
	for _, key := range []string{"hot", "cold"} {
		if _, err := b.DoPermit(context.Background(), key, lim, req); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%q: %v; want errors.ErrUnsupported", key, err)
		}
	}
	if _, err := b.DoPermit(context.Background(), "", lim, req); !errors.Is(err, ratelimit.ErrInvalidKey) {
		t.Errorf("an empty key: %v; want ErrInvalidKey", err)
	}
}
