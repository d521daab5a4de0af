package ctxerr_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestCaller(t *testing.T) {
	if err := ctxerr.Caller(context.Background(), "x", errors.New("store")); err != nil {
		t.Fatalf("live context: %v; want nil", err)
	}
	store := errors.New("i/o timeout")
	cause := errors.New("the caller's reason")

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, stop := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer stop()
	withCause, cancelCause := context.WithCancelCause(context.Background())
	cancelCause(cause)

	tests := []struct {
		name string
		ctx  context.Context
		err  error
		is   []error
		want string
	}{
		{"Cancelled", cancelled, nil, []error{context.Canceled}, `context canceled: memory: Consume on key "k"`},
		{"Expired", expired, store, []error{context.DeadlineExceeded, store}, `context deadline exceeded: memory: Consume on key "k": i/o timeout`},
		{"Cause", withCause, store, []error{context.Canceled, cause, store}, `context canceled: memory: Consume on key "k": the caller's reason: i/o timeout`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ctxerr.Caller(tt.ctx, `memory: Consume on key "k"`, tt.err)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("%v; want %q", err, tt.want)
			}
			for _, target := range tt.is {
				if !errors.Is(err, target) {
					t.Errorf("errors.Is(%v, %v) is false", err, target)
				}
			}
			if errors.Is(err, ratelimit.ErrTimeout) || errors.Is(err, ratelimit.ErrBackendUnavailable) {
				t.Errorf("%v wraps a store failure's sentinel", err)
			}
		})
	}
}

// TestDonePastDeadline: a deadline that has passed counts as done before
// the context's timer says so.
func TestDonePastDeadline(t *testing.T) {
	ctx := pastDeadline{context.Background(), time.Now().Add(-time.Second)}
	if err := ctxerr.Done(ctx); err != context.DeadlineExceeded {
		t.Errorf("Done: %v; want context.DeadlineExceeded", err)
	}
	if err := ctxerr.Caller(ctx, "x", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Caller: %v; want context.DeadlineExceeded", err)
	}
	if err := ctxerr.Done(context.Background()); err != nil {
		t.Errorf("Done of a live context: %v", err)
	}
}

// pastDeadline is a context whose deadline has passed while its Err is
// still nil, as a context is in the moment before its timer fires.
type pastDeadline struct {
	context.Context
	deadline time.Time
}

func (p pastDeadline) Deadline() (time.Time, bool) { return p.deadline, true }
