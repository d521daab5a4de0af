// Package ratelimit is the core of sluice: the portable [Limiter] and
// [Bucket] that services call, the [Backend] interface that stores implement,
// and the token-bucket math every backend shares.
//
// A bucket is described by a [Config]: one or more [Bandwidth] limits (a burst
// and a sustained rate, say). A request passes only when every bandwidth holds
// the tokens it asks for, and then it takes them from all of them. The
// outcome is a [Decision]: allowed or not, how much is left, how long to wait.
//
// The config travels with every call and only the bucket's state is stored,
// stamped with a fingerprint of the config that built it. When a caller
// passes a different config for the same key (a customer changed plan), the
// next call converts the stored state with the [Limiter]'s [Inheritance]
// strategy, in the same single round trip.
//
// # Exactness
//
// All arithmetic is on integers: time in whole microseconds and tokens in
// scaled units (see [Apply]). Nothing drifts, and a [Decision.RetryAfter] is
// exact to the microsecond and never rounded down. [Config.Validate] accepts
// only values that every backend, including Lua scripts whose numbers are
// IEEE doubles, computes exactly; the limits are the Max* constants.
//
// # Errors
//
// Errors wrap one of the sentinel values ([ErrInvalidConfig],
// [ErrInvalidKey], [ErrInvalidRequest], [ErrBackendUnavailable], [ErrTimeout],
// [ErrWaitExceedsDeadline]); test them with [errors.Is]. Bad input is
// rejected before any I/O and changes nothing.
//
// # Concurrency
//
// A [Limiter] and its [Bucket] values are safe for concurrent use; each
// decision is atomic in the backend.
package ratelimit
