package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// Racy is the store of [BackendRacy]. It keeps a bucket's ratelimit.State
// as JSON in a plain key (under Prefix + "racy:", beside where the Redis
// backends keep theirs), and applies a request by GET, ratelimit.Apply on
// the local clock, then SET: a lost update whenever two calls overlap. It
// exists to show that a checker catches a limiter that is not atomic.
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
