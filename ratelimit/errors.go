package ratelimit

import "errors"

var (
	// ErrInvalidConfig is returned for a [Config] that [Config.Validate]
	// rejects. The wrapped message names the field.
	ErrInvalidConfig = errors.New("ratelimit: invalid config")

	// ErrInvalidKey is returned for an empty key or one longer than
	// [MaxKeyLen] bytes.
	ErrInvalidKey = errors.New("ratelimit: invalid key")

	// ErrInvalidRequest is returned for a [Request] that cannot be applied to
	// its config: an unknown [Op], a token count below 1 or above the smallest
	// capacity (such a request could never pass), a negative MaxWait.
	ErrInvalidRequest = errors.New("ratelimit: invalid request")

	// ErrBackendUnavailable is returned when the store could not decide: it is
	// unreachable, closed or full. The request may or may not have been
	// applied if the failure happened after the command was sent; backends
	// say which in the wrapped error.
	ErrBackendUnavailable = errors.New("ratelimit: backend unavailable")

	// ErrTimeout is returned when the store did not answer within the
	// caller's deadline. As with [ErrBackendUnavailable], the request may have
	// been applied: do not retry a consuming call blindly.
	ErrTimeout = errors.New("ratelimit: timeout")

	// ErrWaitExceedsDeadline is returned by [Bucket.Wait] when the tokens
	// would arrive after the context's deadline. No tokens are taken.
	ErrWaitExceedsDeadline = errors.New("ratelimit: wait exceeds deadline")
)
