package sharding

import (
	"context"
	"fmt"
)

// An Option configures a [Backend]: a [Rule], or [WithHooks]. The set is
// closed: only this package makes Options.
type Option interface {
	option()
}

func (Rule) option() {}

// hooksOption is the Option [WithHooks] returns.
type hooksOption struct{ h Hooks }

func (hooksOption) option() {}

// WithHooks sets the functions a [Backend] calls as its hot keys'
// requests move between sub-buckets, for metrics. Given more than once,
// the last one counts.
func WithHooks(h Hooks) Option {
	return hooksOption{h}
}

// Hooks are called by a [Backend] as a hot key's request moves between
// sub-buckets; each may be nil. They run on the caller's goroutine,
// between one sub-bucket's call and the next, so they add to the
// decision's latency: they must be quick and safe for concurrent use,
// and must not call the Backend (a hot key's decision would then wait on
// another).
type Hooks struct {
	// Retried is called each time a request moves on from one sub-bucket
	// to the next: with reason [RetryRejected] when the sub-bucket
	// rejected it (a retry counted against the rule's
	// [Rule.WithRetries]), [RetryFailed] when it failed (an error
	// wrapping [ratelimit.ErrBackendUnavailable], [ratelimit.ErrTimeout]
	// or [ratelimit.ErrKeyRejected]; not counted), [RetryDegraded] when a
	// fail policy inside denied it (not counted). key is the hot key (not
	// the sub-key). A request that its first sub-bucket decides, or that
	// goes to every sub-bucket at once (Add, Reset, Replace, Inspect),
	// makes no call; a ConsumeUpTo that its first sub-bucket could not
	// fill moves on with reason RetryRejected.
	Retried func(ctx context.Context, key string, reason RetryReason)
}

// RetryReason is why a request moved on from a sub-bucket, as
// [Hooks.Retried] gets it.
type RetryReason uint8

// The reasons a request moves on. The zero RetryReason is none of them.
const (
	// RetryRejected: the sub-bucket rejected the request, or gave a
	// ConsumeUpTo less than it asked for.
	RetryRejected RetryReason = iota + 1
	// RetryFailed: the sub-bucket's call failed.
	RetryFailed
	// RetryDegraded: a fail policy inside the decorator denied the
	// request for the sub-bucket.
	RetryDegraded
)

var retryReasonNames = [...]string{RetryRejected: "rejected", RetryFailed: "failed", RetryDegraded: "degraded"}

// String returns "rejected", "failed" or "degraded", short enough to be
// a metric's attribute value.
func (r RetryReason) String() string {
	if r != 0 && int(r) < len(retryReasonNames) {
		return retryReasonNames[r]
	}
	return fmt.Sprintf("RetryReason(%d)", uint8(r))
}
