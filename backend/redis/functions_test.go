package redisbackend_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// foreignLibrary stands for another version of sluice's library on the
// same server: the backend must leave it alone.
const foreignLibrary = "#!lua name=sluice_0000000000000000\n" +
	"redis.register_function('sluice_0000000000000000_tokenbucket', function() return 1 end)"

// TestFunctionsIntegration: decisions run as FCALL of the library, which
// the backend loads where it is missing (a new server, or one that lost
// it), beside another version's library, which it leaves as it is.
func TestFunctionsIntegration(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: testkit.StartRedis(t).Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	if err := c.FunctionLoad(ctx, foreignLibrary).Err(); err != nil {
		t.Fatal(err)
	}
	b, err := redisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	l := ratelimit.New(b)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}
	allow := func(want int64) {
		t.Helper()
		if d, err := l.Allow(ctx, "k", cfg); err != nil || !d.Allowed || d.Remaining != want {
			t.Fatalf("Allow: %+v, %v; want allowed, Remaining %d", d, err, want)
		}
	}
	allow(9)
	if err := c.FunctionDelete(ctx, redisscript.Functions.Name).Err(); err != nil {
		t.Fatalf("FUNCTION DELETE after the first decision: %v; want the library loaded", err)
	}
	allow(8)
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, lib := range libs {
		names = append(names, lib.Name)
	}
	if len(names) != 2 {
		t.Errorf("libraries %v; want the foreign one and %s", names, redisscript.Functions.Name)
	}
	if ok, err := c.ScriptExists(ctx, redis.NewScript(redisscript.Scripts[0].Source).Hash()).Result(); err != nil || ok[0] {
		t.Errorf("SCRIPT EXISTS: %v, %v; want no script sent", ok, err)
	}
}

// TestFunctionsRefusedIntegration: on a server that refuses FUNCTION (here
// renamed away, as a managed service may), the backend runs scripts: the
// conformance suite passes, Check reports no problem, and the scripts are
// in the server's cache.
func TestFunctionsRefusedIntegration(t *testing.T) {
	addr := testkit.StartRedis(t, "--rename-command", "FUNCTION", "").Addr()
	ratelimittest.Run(t, ratelimittest.Harness{New: func(t *testing.T, clock ratelimit.Clock) ratelimit.Backend {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		if err := c.FlushDB(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		b, err := redisbackend.New(c, redisbackend.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}})

	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	b, err := redisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	for _, s := range redisscript.Scripts {
		if ok, err := c.ScriptExists(ctx, redis.NewScript(s.Source).Hash()).Result(); err != nil || !ok[0] {
			t.Errorf("SCRIPT EXISTS %s after Check: %v, %v; want it loaded", s.Name, ok, err)
		}
	}
}
