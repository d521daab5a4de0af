package redisscript

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/sluicehq/sluice/ratelimit"
)

// Error wraps err, which a client returned, as the [ratelimit.Backend]
// contract asks: a deadline or network timeout wraps [ratelimit.ErrTimeout],
// anything else [ratelimit.ErrBackendUnavailable]. err stays reachable with
// errors.Is and errors.As. what prefixes the message ("sluice/redis:
// Consume on key \"k\"").
func Error(err error, what string) error {
	kind := ratelimit.ErrBackendUnavailable
	if isTimeout(err) {
		kind = ratelimit.ErrTimeout
	}
	return fmt.Errorf("%s: %w: %w", what, kind, err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
