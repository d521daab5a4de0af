package redisscript_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestError: a client's error is the store's, by its kind, unless it is a
// deadline's that came back at most ctxerr.Slack before the caller's
// deadline (rueidis hands a call the error of a dial it joined, a few µs
// early): then the caller's context ended the call, and the error wraps
// the context's and no store sentinel. In a synctest bubble, so that no
// time passes between setting a deadline and judging by it.
func TestError(t *testing.T) {
	deadlineErr := fmt.Errorf("rueidis: %w", context.DeadlineExceeded)
	readTimeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	refused := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	wrongType := errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")
	const none = -1 // no deadline

	tests := []struct {
		name string
		left time.Duration // to the caller's deadline
		err  error
		want error // the sentinel, or the context's error
	}{
		{"DeadlineErrorDeadlineSoon", 10 * time.Microsecond, deadlineErr, context.DeadlineExceeded},
		{"ReadTimeoutDeadlineSoon", 10 * time.Microsecond, readTimeout, context.DeadlineExceeded},
		{"DeadlineErrorDeadlineLater", time.Second, deadlineErr, ratelimit.ErrTimeout},
		{"DeadlineErrorNoDeadline", none, deadlineErr, ratelimit.ErrTimeout},
		{"ReadTimeoutNoDeadline", none, readTimeout, ratelimit.ErrTimeout},
		{"RefusedDeadlineSoon", 10 * time.Microsecond, refused, ratelimit.ErrBackendUnavailable},
		{"WrongTypeDeadlineSoon", 10 * time.Microsecond, wrongType, ratelimit.ErrKeyRejected},
		{"RefusedDeadlinePassed", 0, refused, context.DeadlineExceeded},
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
				err := redisscript.Error(ctx, tt.err, `sluice/redis: Consume on key "k"`)
				if !errors.Is(err, tt.want) || !errors.Is(err, tt.err) {
					t.Fatalf("%v; want it to wrap %v and the client's error", err, tt.want)
				}
				store := errors.Is(err, ratelimit.ErrTimeout) || errors.Is(err, ratelimit.ErrBackendUnavailable)
				if caller := tt.want == context.DeadlineExceeded; caller && store {
					t.Errorf("%v: the caller's deadline wraps a store failure's sentinel", err)
				}
			})
		})
	}
}
