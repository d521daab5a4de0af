package redisscript

import (
	"context"
	"encoding/binary"
	"math"
	"strings"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

// PermitCall is one permit call's invocation: a [Call] of the permits'
// script on the key's permits (see [PermitKey]), and what
// [PermitCall.Decision] needs to decode the reply.
type PermitCall struct {
	// Call is what a [Runner] runs: the permits' Redis key, the packed
	// request and the index of the permits' script.
	Call  Call
	op    ratelimit.PermitOp
	limit int64
}

// permitHeader is the bytes of a packed permit request before the holder:
// the op, then the limit, the lease (µs), the weight and now (µs) as
// little-endian doubles (see permits.lua).
const permitHeader = 1 + 4*8

// NewPermitCall packs req under lim for the permits of key. now is the
// time in µs since 1970 to decide at, or [ServerClock]; a time before 1970
// is taken as 1970. lim and req must have passed [ratelimit.CheckPermit].
// The Call keeps the op and the limit until [PermitCall.Decision].
func NewPermitCall(prefix, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest, now int64) PermitCall {
	if now != ServerClock {
		now = max(0, now)
	}
	holder := req.Holder
	if req.Op == ratelimit.PermitInspect {
		holder = "" // unread, and unchecked
	}
	// Release and Renew carry the weight acquired for the script's first
	// guess at the members to touch; the store goes by what it holds.
	weight := min(max(req.Weight, 1), ratelimit.MaxPermits)
	var b strings.Builder
	b.Grow(permitHeader + len(holder))
	var buf [8]byte
	num := func(v int64) {
		binary.LittleEndian.PutUint64(buf[:], math.Float64bits(float64(v)))
		b.Write(buf[:])
	}
	b.WriteByte(byte(req.Op))
	num(lim.Limit)
	num(lim.LeaseMicros())
	num(weight)
	num(now)
	b.WriteString(holder)
	return PermitCall{
		Call: Call{Key: PermitKey(prefix, key), Arg: b.String(), Script: permitScript},
		op:   req.Op, limit: lim.Limit,
	}
}

// permitReplyLen is the length of the permits' script's reply, one string
// (see permits.lua): granted (a byte, 1 or 0), then the permits held after
// the call and the retry after (µs) as little-endian doubles.
const permitReplyLen = 1 + 2*8

// Decision decodes the permits' script's reply. A reply of the wrong shape
// is an error wrapping [ratelimit.ErrBackendUnavailable] that names the
// key, as [Call.Decision]'s.
func (c PermitCall) Decision(reply string) (ratelimit.PermitDecision, error) {
	if len(reply) != permitReplyLen {
		return ratelimit.PermitDecision{}, c.Call.badReply(reply)
	}
	inFlight, ok1 := whole(reply[1:], ratelimit.MaxPermits)
	retry, ok2 := whole(reply[9:], maxTokens)
	granted := reply[0] == 1
	// A denied acquire, and it alone, waits for a lease, which ends after
	// now: the key then holds a permit. A granted acquire holds one.
	denied := c.op == ratelimit.PermitAcquire && !granted
	if !ok1 || !ok2 || reply[0] > 1 || (retry > 0) != denied || (denied || granted && c.op == ratelimit.PermitAcquire) && inFlight < 1 ||
		c.op == ratelimit.PermitInspect && granted != (inFlight < c.limit) {
		return ratelimit.PermitDecision{}, c.Call.badReply(reply)
	}
	return ratelimit.PermitDecision{
		Granted:    granted,
		Limit:      c.limit,
		InFlight:   inFlight,
		RetryAfter: micros(retry),
	}, nil
}

// PreparePermit is [Settings.Prepare] for a permit call: it validates the
// call with [ratelimit.CheckPermit], before any I/O, refuses it if ctx is
// already done, so that it takes nothing, and packs it on the settings'
// clock. backend names the backend in errors.
func (s Settings) PreparePermit(ctx context.Context, backend, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (PermitCall, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return PermitCall{}, err
	}
	if ctx.Err() != nil {
		return PermitCall{}, ctxerr.Caller(ctx, What(backend, req.Op, key), nil)
	}
	return NewPermitCall(s.Prefix, key, lim, req, s.now()), nil
}
