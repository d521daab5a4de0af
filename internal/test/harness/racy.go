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
// the local clock, then SET: a lost update whenever two calls overlap.
// It keeps a key's permits so too, a ratelimit.PermitState under Prefix +
// "racy:permits:", applied with ratelimit.ApplyPermit: two acquires that
// overlap may both be granted the last permit. It exists to show that a
// checker catches a limiter that is not atomic.
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
	if err := r.get(ctx, rkey, &s); err != nil {
		return ratelimit.Decision{}, err
	}
	d := ratelimit.Apply(&s, cfg, req, time.Now().UnixMicro())
	if req.Op == ratelimit.Inspect {
		return d, nil
	}
	if r.Between != nil {
		r.Between()
	}
	return d, r.set(ctx, rkey, s)
}

// get reads the state at rkey into s, which a missing key leaves alone.
func (r Racy) get(ctx context.Context, rkey string, s any) error {
	stored, err := r.Client.Get(ctx, rkey).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil
	case err != nil:
		return fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, err)
	}
	return json.Unmarshal(stored, s)
}

// set writes the state s at rkey.
func (r Racy) set(ctx context.Context, rkey string, s any) error {
	state, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := r.Client.Set(ctx, rkey, state, 0).Err(); err != nil {
		return fmt.Errorf("%w: %w", ratelimit.ErrBackendUnavailable, err)
	}
	return nil
}

// DoPermit reads the key's permits, decides in Go and writes them back, in
// three steps, as Do does a bucket.
func (r Racy) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	rkey := redisscript.Key(r.Prefix+"racy:permits:", key)
	var s ratelimit.PermitState
	if err := r.get(ctx, rkey, &s); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	d := ratelimit.ApplyPermit(&s, lim, req, time.Now().UnixMicro())
	if req.Op == ratelimit.PermitInspect {
		return d, nil
	}
	if r.Between != nil {
		r.Between()
	}
	return d, r.set(ctx, rkey, s)
}

var _ ratelimit.PermitBackend = Racy{}
