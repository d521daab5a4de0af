package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// testScriptCache: the server forgets the library when it is deleted (or
// on a restart without persistence); the next decision loads it again
// ("Function not found", then FUNCTION LOAD and FCALL) and goes on with
// the bucket as it was. A restarted server without persistence has lost
// the buckets too, and starts them afresh.
func testScriptCache(t *testing.T, a Adapter) {
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}

	t.Run("Flush", func(t *testing.T) {
		t.Parallel()
		top := topology{addrs: []string{servers.StartRedis(t).Addr()}}
		b, _ := a.Connect(t, top.addrs, false, Options{})
		l := ratelimit.New(b)
		key := uniqueKey(t, "flush")
		for want := int64(9); want >= 7; want-- {
			expectRemaining(t, l, key, cfg, want)
		}
		c := raw(t, top)
		if err := c.FunctionDelete(ctx, redisscript.Functions.Name).Err(); err != nil {
			t.Fatal(err)
		}
		expectRemaining(t, l, key, cfg, 6)
		if libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: redisscript.Functions.Name}).Result(); err != nil || len(libs) != 1 {
			t.Fatalf("FUNCTION LIST after the decision: %v, %v; want the library loaded again", libs, err)
		}
		expectRemaining(t, l, key, cfg, 5)
	})

	t.Run("Restart", func(t *testing.T) {
		t.Parallel()
		r := servers.StartRedis(t)
		b, _ := a.Connect(t, []string{r.Addr()}, false, Options{})
		l := ratelimit.New(b)
		key := uniqueKey(t, "restart")
		expectRemaining(t, l, key, cfg, 9)
		expectRemaining(t, l, key, cfg, 8)
		r.Restart(t)
		// The first call may meet the connection the restart broke; the
		// client reconnects for the next.
		d, err := eventually(t, func() (ratelimit.Decision, error) { return l.Allow(ctx, key, cfg) })
		if err != nil || !d.Allowed || d.Remaining != 9 {
			t.Fatalf("after the restart: %+v, %v; want a new bucket, Remaining 9", d, err)
		}
	})
}

// expectRemaining takes a token and wants want left.
func expectRemaining(t *testing.T, l *ratelimit.Limiter, key string, cfg ratelimit.Config, want int64) {
	t.Helper()
	d, err := l.Allow(context.Background(), key, cfg)
	if err != nil || !d.Allowed || d.Remaining != want {
		t.Fatalf("Allow: %+v, %v; want allowed, Remaining %d", d, err, want)
	}
}

// eventually retries f for up to 5s until it returns no error.
func eventually[D any](t *testing.T, f func() (D, error)) (D, error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, err := f()
		if err == nil || time.Now().After(deadline) {
			return d, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
