package redisscript

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

// The scripts' replies for a key they will not touch (see readState in
// prelude.lua): Error tells them by these words, which the scripts must
// keep (TestScriptsRefuseForeignSortedSets and TestScriptGarbageState find them
// in the scripts' errors), and by Redis's WRONGTYPE,
// for a key of a type no script keeps.
const (
	foreignWords = "holds a value sluice did not write"
	corruptWords = "sluice: corrupt state at key"
)

// Error wraps err, which a client returned, as the [ratelimit.Backend]
// contract asks, as "<sentinel>: <what>: <err>": if ctx has ended, the
// caller gave up, and the error wraps ctx's (see [ctxerr.Caller]; a
// deadline's error that comes back at most [ctxerr.Slack] before ctx's
// deadline counts as ctx's, see [ctxerr.Ended]); otherwise a script's
// refusal of the key wraps [ratelimit.ErrKeyRejected], a deadline or
// network timeout [ratelimit.ErrTimeout], and anything else
// [ratelimit.ErrBackendUnavailable]. err stays reachable with errors.Is
// and errors.As. what names the backend, op and key ("sluice/redis:
// Consume on key \"k\"").
func Error(ctx context.Context, err error, what string) error {
	if cerr := ctxerr.Caller(ctx, what, err); cerr != nil {
		return cerr
	}
	kind := ratelimit.ErrBackendUnavailable
	switch msg := err.Error(); {
	case strings.Contains(msg, foreignWords), strings.Contains(msg, corruptWords), strings.HasPrefix(msg, "WRONGTYPE"):
		kind = ratelimit.ErrKeyRejected
	case ctxerr.IsDeadline(err):
		kind = ratelimit.ErrTimeout
	}
	return fmt.Errorf("%w: %s: %w", kind, what, err)
}
