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
	// unreachable or closed, or it failed. The request may or may not have
	// been applied if the failure happened after the command was sent;
	// backends say which in the wrapped error. Fail policies count it as
	// the store failing.
	ErrBackendUnavailable = errors.New("ratelimit: backend unavailable")

	// ErrTimeout is returned when the store did not answer in time: a
	// client's own timeout, or a fail policy's deadline. As with
	// [ErrBackendUnavailable], the request may have been applied: do not
	// retry a consuming call blindly. A caller's own deadline is not a
	// timeout of the store: that call returns the context's error,
	// [context.DeadlineExceeded] (see [Backend]).
	ErrTimeout = errors.New("ratelimit: timeout")

	// ErrKeyRejected is returned when the store, though working, cannot
	// keep a bucket at this key: the key holds a value the limiter did not
	// write, or it is a new key and the store holds as many buckets as it
	// may. Other keys are unaffected, so it says nothing about the store's
	// health: fail policies pass it back to the caller rather than count it
	// as a failure.
	ErrKeyRejected = errors.New("ratelimit: key rejected")

	// ErrWaitExceedsDeadline is returned by [Bucket.Wait] when the tokens
	// would arrive after the context's deadline. No tokens are taken.
	ErrWaitExceedsDeadline = errors.New("ratelimit: wait exceeds deadline")
)
