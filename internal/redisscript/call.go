package redisscript

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

// ServerClock, passed to [NewCall] as now, makes the script read the
// server's clock (TIME). Every replica then decides on one clock.
const ServerClock = -1

// maxTokens bounds the token count sent to the script, where numbers are
// doubles: ConsumeUpTo and Add accept any positive count, but neither can
// use more than 2^52 tokens, so clamping there changes no decision. It
// bounds every number in a well-formed reply, too.
const maxTokens = 1 << 53

// Call is one decision's script invocation: the key and the packed request.
type Call struct {
	// Key is the bucket's Redis key, KEYS[1].
	Key string
	// Arg is the packed request, ARGV[1].
	Arg string
	// Script is the index in [Scripts] of the script to run, and in
	// [Functions].Functions of the function.
	Script int
	cfg    ratelimit.Config
}

// NewCall packs req on cfg for the bucket at key. now is the time in µs
// since 1970 to decide at, or [ServerClock]; req.Ago moves either back
// (the server's: by a negative now below ServerClock, which the script
// adds to TIME). cfg and req must have passed [ratelimit.CheckRequest].
// The Call keeps cfg until [Call.Decision].
func NewCall(prefix, key string, cfg ratelimit.Config, req ratelimit.Request, now int64) Call {
	if ago := req.Ago.Microseconds(); ago > 0 {
		if now == ServerClock {
			now -= ago
		} else {
			now = max(0, now-ago)
		}
	}
	const header, perBand, trailer = 8 + 1 + 8 + 8 + 1 + 8 + 1 + 1, 1 + 6*8 + 1, 8
	size := header + trailer
	for i := range cfg.Bandwidths {
		size += perBand + len(cfg.Bandwidths[i].ID)
	}
	var b strings.Builder
	b.Grow(size)
	var buf [8]byte
	u64 := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		b.Write(buf[:])
	}
	num := func(v int64) { u64(math.Float64bits(float64(v))) }

	u64(cfg.Fingerprint())
	b.WriteByte(byte(req.Op))
	num(min(req.Tokens, maxTokens))
	num(int64(req.MaxWait / time.Microsecond))
	b.WriteByte(byte(req.Strategy))
	num(now)
	b.WriteByte(byte(len(cfg.Bandwidths)))
	b.WriteByte(byte(cfg.Algorithm))
	for i := range cfg.Bandwidths {
		bw := &cfg.Bandwidths[i]
		scale, rate := bw.Units()
		var start int64
		if bw.Refill == ratelimit.IntervalAligned {
			start = bw.AlignedStart.UnixMicro()
		}
		b.WriteByte(byte(bw.Refill))
		num(bw.Capacity)
		num(scale)
		num(rate)
		num(bw.PeriodMicros())
		num(bw.Initial())
		num(start)
		b.WriteByte(byte(len(bw.ID)))
		b.WriteString(bw.ID)
	}
	num(int64(cfg.Version)) // at most MaxVersion: exact as a double
	return Call{Key: Key(prefix, key), Arg: b.String(), Script: scriptFor[cfg.Algorithm], cfg: cfg}
}

// replyLen is the length of the script's reply, one string (see
// prelude.lua): allowed (a byte, 1 or 0), then consumed, limit,
// remaining, retry after (µs), reset after (µs) and refill after (µs), as
// little-endian doubles, then the binding bandwidth's index (a byte).
const replyLen = 1 + 6*8 + 1

// Decision decodes the script's reply. A reply of the wrong shape is an
// error wrapping [ratelimit.ErrBackendUnavailable]: it means the server ran
// some other script under this one's SHA, or a proxy mangled the reply.
func (c Call) Decision(reply string) (ratelimit.Decision, error) {
	if len(reply) != replyLen {
		return ratelimit.Decision{}, c.badReply(reply)
	}
	var n [6]int64
	for i := range n {
		// Every number of a decision is whole and within [0, 2^53].
		var ok bool
		if n[i], ok = whole(reply[1+8*i:], maxTokens); !ok {
			return ratelimit.Decision{}, c.badReply(reply)
		}
	}
	allowed, binding := reply[0], reply[replyLen-1]
	consumed, limit, remaining, retry, reset, refill := n[0], n[1], n[2], n[3], n[4], n[5]
	name := c.cfg.BandwidthName(int(binding))
	if allowed > 1 || limit < 1 || limit > ratelimit.MaxCapacity || remaining > limit || refill > reset || name == "" {
		return ratelimit.Decision{}, c.badReply(reply)
	}
	return ratelimit.Decision{
		Allowed:     allowed == 1,
		Limit:       limit,
		Remaining:   remaining,
		Consumed:    consumed,
		RetryAfter:  micros(retry),
		ResetAfter:  micros(reset),
		RefillAfter: micros(refill),
		Bandwidth:   name,
	}, nil
}

// whole decodes the little-endian double that b starts with, which must
// be a whole number in [0, hi]; NaN fails the comparisons.
func whole(b string, hi int64) (int64, bool) {
	f := math.Float64frombits(binary.LittleEndian.Uint64([]byte(b[:8])))
	if !(f >= 0 && f <= float64(hi) && f == math.Trunc(f)) {
		return 0, false
	}
	return int64(f), true
}

// micros is µs, a reply's time, as a Duration.
func micros(µs int64) time.Duration { return time.Duration(µs) * time.Microsecond }

func (c Call) badReply(reply string) error {
	return fmt.Errorf("%w: sluice: key %q: the script replied %q, not a decision", ratelimit.ErrBackendUnavailable, c.Key, reply)
}

// Settings are the options both backends take.
type Settings struct {
	// Prefix goes before every bucket key (see [Key]). It must not contain
	// '{' or '}': the hash tag would then be in the prefix, and every
	// bucket would land on one cluster slot.
	Prefix string
	// Clock, when set, decides instead of the server's clock.
	Clock ratelimit.Clock
}

// Check validates the settings, with an error wrapping
// [ratelimit.ErrInvalidConfig]; backend names the backend in it.
func (s Settings) Check(backend string) error {
	if strings.ContainsAny(s.Prefix, "{}") {
		return fmt.Errorf("%w: %s: the WithPrefix key prefix %q must not contain '{' or '}': the bucket's hash tag follows it", ratelimit.ErrInvalidConfig, backend, s.Prefix)
	}
	return nil
}

// Prepare validates a call with [ratelimit.CheckRequest], before any I/O,
// refuses it if ctx is already done, so that it takes nothing, and packs
// it on the settings' clock. backend names the backend in errors.
func (s Settings) Prepare(ctx context.Context, backend, key string, cfg ratelimit.Config, req ratelimit.Request) (Call, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return Call{}, err
	}
	if ctx.Err() != nil {
		return Call{}, ctxerr.Caller(ctx, What(backend, req.Op, key), nil)
	}
	return NewCall(s.Prefix, key, cfg, req, s.now()), nil
}

// now is the time to pack into a call: the settings' clock's in µs, or
// [ServerClock].
func (s Settings) now() int64 {
	if s.Clock == nil {
		return ServerClock
	}
	return s.Clock.Now().UnixMicro()
}

// What names a call in its errors: `sluice/redis: Consume on key "k"`.
// op is a [ratelimit.Op] or a [ratelimit.PermitOp].
func What(backend string, op fmt.Stringer, key string) string {
	return fmt.Sprintf("%s: %v on key %q", backend, op, key)
}
