package redistest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// foreignLibrary stands for another version of sluice's library on the
// same server: a backend must leave it alone.
const foreignLibrary = "#!lua name=sluice_0000000000000000\n" +
	"redis.register_function('sluice_0000000000000000_tokenbucket', function() return 1 end)"

// testFunctions: decisions run as FCALL of sluice's library, loaded beside
// another version's library, which stays as it is, and send no script; on
// a server that refuses FUNCTION (renamed away here, as a managed service
// may), the backend runs scripts instead: the conformance suite, permits
// included, passes,
// Check reports no problem, and the scripts are in the server's cache.
// (ScriptCache shows a deleted library loaded again.)
func testFunctions(t *testing.T, a Adapter) {
	ctx := context.Background()

	t.Run("Library", func(t *testing.T) {
		t.Parallel()
		top := topology{addrs: []string{servers.StartRedis(t).Addr()}}
		c := raw(t, top)
		if err := c.FunctionLoad(ctx, foreignLibrary).Err(); err != nil {
			t.Fatal(err)
		}
		b, _ := a.Connect(t, top.addrs, false, Options{})
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}
		if d, err := ratelimit.New(b).Allow(ctx, "k", cfg); err != nil || !d.Allowed || d.Remaining != 9 {
			t.Fatalf("Allow: %+v, %v; want allowed, Remaining 9", d, err)
		}
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
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		top := topology{addrs: []string{servers.StartRedis(t, "--rename-command", "FUNCTION", "").Addr()}}
		c := raw(t, top)
		ratelimittest.Run(t, ratelimittest.Harness{Permits: true, New: func(t *testing.T, clock ratelimit.Clock) ratelimit.Backend {
			if err := c.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			b, _ := a.Connect(t, top.addrs, false, Options{Clock: clock})
			return b
		}})

		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		b, _ := a.Connect(t, top.addrs, false, Options{})
		if _, err := b.Check(ctx); err != nil {
			t.Fatalf("Check: %v", err)
		}
		for _, s := range redisscript.Scripts {
			if ok, err := c.ScriptExists(ctx, redis.NewScript(s.Source).Hash()).Result(); err != nil || !ok[0] {
				t.Errorf("SCRIPT EXISTS %s after Check: %v, %v; want it loaded", s.Name, ok, err)
			}
		}
	})
}
