package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// Racy is the store of [BackendRacy]. It keeps a bucket's ratelimit.State
// as JSON in a plain key (under Prefix + "racy:", beside where the Redis
// backends keep theirs), and applies a request by GET, ratelimit.Apply on
// the local clock, then SET: a lost update whenever two calls overlap.
// It keeps a key's permits as the Redis backends do, a sorted set with a
// member per permit held scored with its lease's end, but in separate
// round trips (see DoPermit). It exists to show that a checker catches a
// limiter that is not atomic.
type Racy struct {
	Client redis.UniversalClient
	Prefix string
	// Between, if set, is called between the read and the write of each
	// call that writes: a test holds calls there to make them overlap
	// for certain.
	Between func()
}

// Do reads, decides in Go and writes back, in three steps.
func (r Racy) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := ratelimit.CheckRequest(key, cfg, req); err != nil {
		return ratelimit.Decision{}, err
	}
	rkey := redisscript.Key(r.Prefix+"racy:", key)
	var s ratelimit.State
	stored, err := r.Client.Get(ctx, rkey).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, err)
	default:
		if err := json.Unmarshal(stored, &s); err != nil {
			return ratelimit.Decision{}, err
		}
	}
	d := ratelimit.Apply(&s, cfg, req, time.Now().UnixMicro())
	if req.Op == ratelimit.Inspect {
		return d, nil
	}
	if r.Between != nil {
		r.Between()
	}
	state, err := json.Marshal(s)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	if err := r.Client.Set(ctx, rkey, state, 0).Err(); err != nil {
		return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, err)
	}
	return d, nil
}

// DoPermit applies a permit call in round trips of its own, on the local
// clock: it drops the ended leases (ZREMRANGEBYSCORE), then, for a new
// acquire, counts the permits held (ZCARD), decides in Go and adds the
// holder's (ZADD): two acquires that overlap may both take the last
// permit. A release is one ZREM, and an acquire of a permit held, or a
// renew, one ZADD XX, each followed by a ZCARD for the decision's count.
// Like the script, it keeps a member per unit of weight, holder#1 to
// holder#w, with req.Weight as the weight a release or renew frees or
// moves.
func (r Racy) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	rkey := redisscript.PermitKey(r.Prefix+"racy:", key)
	now := time.Now().UnixMicro()
	d := ratelimit.PermitDecision{Limit: lim.Limit}
	if err := r.Client.ZRemRangeByScore(ctx, rkey, "-inf", strconv.FormatInt(now, 10)).Err(); err != nil {
		return d, unavailable(err)
	}
	units := make([]string, max(req.Weight, 1))
	for i := range units {
		units[i] = fmt.Sprintf("%s#%d", req.Holder, i+1)
	}
	expires := float64(now + lim.LeaseMicros())
	members := func() []redis.Z {
		z := make([]redis.Z, len(units))
		for i, u := range units {
			z[i] = redis.Z{Score: expires, Member: u}
		}
		return z
	}
	var err error
	switch req.Op {
	case ratelimit.PermitAcquire, ratelimit.PermitRenew:
		var held bool
		if held, err = r.holds(ctx, rkey, units[0]); err != nil || !held && req.Op == ratelimit.PermitRenew {
			break
		}
		if held {
			d.Granted, err = true, r.Client.ZAddXX(ctx, rkey, members()...).Err()
			break
		}
		var n int64
		if n, err = r.Client.ZCard(ctx, rkey).Result(); err != nil {
			break
		}
		if n+req.Weight > lim.Limit {
			d.RetryAfter, err = r.retryAfter(ctx, rkey, now)
			break
		}
		if r.Between != nil {
			r.Between()
		}
		d.Granted, err = true, r.Client.ZAdd(ctx, rkey, members()...).Err()
	case ratelimit.PermitRelease:
		var n int64
		n, err = r.Client.ZRem(ctx, rkey, units).Result()
		d.Granted = n > 0
	}
	if err == nil {
		d.InFlight, err = r.Client.ZCard(ctx, rkey).Result()
	}
	if err != nil {
		return ratelimit.PermitDecision{}, unavailable(err)
	}
	return d, nil
}

// holds says whether the sorted set at rkey has member.
func (r Racy) holds(ctx context.Context, rkey, member string) (bool, error) {
	err := r.Client.ZScore(ctx, rkey, member).Err()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return err == nil, err
}

// retryAfter is the time from now to the first lease's end in the sorted
// set at rkey.
func (r Racy) retryAfter(ctx context.Context, rkey string, now int64) (time.Duration, error) {
	first, err := r.Client.ZRangeWithScores(ctx, rkey, 0, 0).Result()
	if err != nil || len(first) == 0 {
		return 0, err
	}
	return time.Duration(int64(first[0].Score)-now) * time.Microsecond, nil
}

// unavailable wraps a failure of the racy store's Redis.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, err)
}

var _ ratelimit.PermitBackend = Racy{}
