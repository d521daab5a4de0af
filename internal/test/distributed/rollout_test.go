package distributed_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// rolloutCalls is how many calls the rollout test alternates between the
// two Limiters.
const rolloutCalls = 1000

// TestRolloutIntegration is a plan change rolling out: a key has taken 5
// of its 10 a minute on version 1 of its plan; then two Limiters, one on
// a go-redis client that already has version 2 (100 a minute) and one on a
// rueidis client that still has version 1, alternate 1,000 calls on it
// through one redis-server, with every strategy, both directions. Each
// strategy converts the bucket once, forward: the count admitted must be
// exactly what version 2 alone allows after those 5 (counted on a second
// key that only ever sees version 2). The clock is the suite's fake one,
// frozen, so no refill blurs the counts.
func TestRolloutIntegration(t *testing.T) {
	srv := servers.StartRedis(t)
	gr := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { gr.Close() })
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	clock := ratelimittest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	b1, err := redisbackend.New(gr, redisbackend.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	b2, err := rueidisbackend.New(rc, rueidisbackend.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, dir := range []struct {
		name     string
		from, to int64
	}{{"upgrade", 10, 100}, {"downgrade", 100, 10}} {
		v1 := ratelimit.Config{Version: 1, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(dir.from).WithID("main")}}
		v2 := ratelimit.Config{Version: 2, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(dir.to).WithID("main")}}
		for _, s := range []ratelimit.Inheritance{ratelimit.AsIs, ratelimit.ResetTokens, ratelimit.Proportionally, ratelimit.Additive} {
			onV2 := ratelimit.New(b1, ratelimit.WithInheritance(s))
			onV1 := ratelimit.New(b2, ratelimit.WithInheritance(s))
			prefix := "rollout:" + dir.name + ":" + s.String() + ":"
			count := func(key string, alternate bool) int {
				n := 0
				for range 5 {
					if d, err := onV1.Allow(ctx, key, v1); err != nil || !d.Allowed {
						t.Fatalf("%s: version 1 on a new bucket: %+v, %v", key, d, err)
					}
				}
				for i := range rolloutCalls {
					l, cfg := onV2, v2
					if alternate && i%2 == 1 {
						l, cfg = onV1, v1
					}
					d, err := l.Allow(ctx, key, cfg)
					if err != nil {
						t.Fatalf("%s: call %d: %v", key, i, err)
					}
					if d.Allowed {
						n++
					}
				}
				return n
			}
			got, want := count(prefix+"rollout", true), count(prefix+"reference", false)
			t.Logf("%-9s %-14v: %4d of %d alternating calls admitted; version 2 alone admits %d", dir.name, s, got, rolloutCalls, want)
			if got != want {
				t.Errorf("%s %v: %d admitted, want %d, as on version 2 alone", dir.name, s, got, want)
			}
		}
	}
}
