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
// # Concurrency limits
//
// A rate says how often; a [Concurrency] says how many at once. A
// [Limiter]'s TryAcquire and Acquire take a [Permit] for a key, of a
// weight, when the weights held stay within the Limit; the permit's
// Release gives it back. Each permit has its own holder identity, so a
// late or second release frees nothing else, and a lease on the store's
// clock, so a holder that dies gives its permits back within the Lease:
// work that may run longer renews it ([Permit.KeepAlive]). Backends that
// hold permits implement [PermitBackend]; every store of sluice's does,
// and [ApplyPermit] is the math they share. docs/concurrency.md has the
// semantics, the bound and the failure modes.
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
// [ErrInvalidKey], [ErrInvalidRequest], [ErrKeyRejected],
// [ErrBackendUnavailable], [ErrTimeout], [ErrWaitExceedsDeadline]), or the
// caller's context error (below); test them with [errors.Is]. (A [Bucket]
// wraps its config supplier's error as "ratelimit: config supplier: ...",
// with no sentinel.) Bad input is rejected before any I/O and changes
// nothing. [ErrKeyRejected] is about one key (it holds a value the limiter
// did not write, or the store is at its key cap); [ErrBackendUnavailable]
// and [ErrTimeout] are the store failing, and only they count as failures
// for a fail policy.
//
// A caller's own context is not the store's: a call whose context is
// already done returns the context's error and takes nothing, and one
// whose context ends during the call returns an error wrapping ctx.Err()
// ([context.Canceled] or [context.DeadlineExceeded]) and neither
// [ErrTimeout] nor [ErrBackendUnavailable]. [ErrTimeout] is the store not
// answering by a client's own timeout or a fail policy's deadline.
//
// Messages read "<sentinel>: <component>: <detail>", then the store's own
// error, which stays reachable with [errors.Is] and [errors.As]; a caller's
// context error starts with the context's text:
//
//	ratelimit: timeout: sluice/redis: Consume on key "k": read tcp ...: i/o timeout
//	context canceled: memory: Consume on key "k"
//
// # Concurrency
//
// A [Limiter] and its [Bucket] values are safe for concurrent use; each
// decision is atomic in the backend.
package ratelimit
