package redisscript

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/sluicehq/sluice/ratelimit"
)

// Error wraps err, which running a call for op on the bucket at key
// returned, as the [ratelimit.Backend] contract asks: a deadline or network
// timeout wraps [ratelimit.ErrTimeout], anything else
// [ratelimit.ErrBackendUnavailable]. err stays reachable with errors.Is and
// errors.As. name is the backend's error prefix ("sluice/redis").
func Error(name string, err error, key string, op ratelimit.Op) error {
	kind := ratelimit.ErrBackendUnavailable
	if isTimeout(err) {
		kind = ratelimit.ErrTimeout
	}
	return fmt.Errorf("%s: %v on key %q: %w: %w", name, op, key, kind, err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
