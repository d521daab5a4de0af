package ctxerr_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"testing/synctest"
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

// TestEnded: a deadline's error counts as the context's own deadline when
// that is at most Slack away, so that a client returning it a moment
// early does not make it the store's; Done, the check before a call, is
// unmoved by it. In a synctest bubble, so that no time passes between
// setting a deadline and judging by it.
func TestEnded(t *testing.T) {
	deadlineErr := fmt.Errorf("sluice/rueidis: %w", context.DeadlineExceeded)
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: timeout{}}
	refused := errors.New("connect: connection refused")
	const none = -1 // no deadline

	tests := []struct {
		name string
		left time.Duration // to the deadline
		err  error
		want bool
	}{
		{"DeadlineErrorDeadlineSoon", 10 * time.Microsecond, deadlineErr, true},
		{"NetTimeoutDeadlineSoon", 10 * time.Microsecond, dialTimeout, true},
		{"DeadlineErrorAtSlack", ctxerr.Slack, deadlineErr, true},
		{"DeadlineErrorBeyondSlack", ctxerr.Slack + time.Microsecond, deadlineErr, false},
		{"DeadlineErrorDeadlineLater", time.Second, deadlineErr, false},
		{"DeadlineErrorNoDeadline", none, deadlineErr, false},
		{"OtherErrorDeadlineSoon", 10 * time.Microsecond, refused, false},
		{"NoErrorDeadlineSoon", 10 * time.Microsecond, nil, false},
		{"DeadlinePassed", 0, refused, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				if tt.left != none {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.left)
					defer cancel()
				}
				if got := ctxerr.Ended(ctx, tt.err); got != tt.want {
					t.Errorf("Ended: %v; want %v", got, tt.want)
				}
				err := ctxerr.Caller(ctx, "x", tt.err)
				if tt.want != (err != nil) {
					t.Fatalf("Caller: %v; want an error: %v", err, tt.want)
				}
				if err != nil && (!errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, tt.err)) {
					t.Errorf("Caller: %v; want context.DeadlineExceeded wrapping %v", err, tt.err)
				}
				judged := ctxerr.Judged(ctx, "x", tt.err)
				if tt.want != (judged != nil) {
					t.Fatalf("Judged: %v; want an error: %v", judged, tt.want)
				}
				if judged != nil && (!errors.Is(judged, context.DeadlineExceeded) || errors.Is(judged, tt.err)) {
					t.Errorf("Judged: %v; want context.DeadlineExceeded, not wrapping %v", judged, tt.err)
				}
				if err := ctxerr.Done(ctx); (err != nil) != (tt.left == 0) {
					t.Errorf("Done with %v left: %v; want an error only once the deadline has passed", tt.left, err)
				}
			})
		})
	}
}

// timeout is a net.Error timeout that does not wrap
// context.DeadlineExceeded, as a socket's deadline error does not.
type timeout struct{}

func (timeout) Error() string   { return "i/o timeout" }
func (timeout) Timeout() bool   { return true }
func (timeout) Temporary() bool { return true }
