package rueidisbackend_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"testing"

	"github.com/redis/rueidis"

	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// foreignLibrary stands for another version of sluice's library on the
// same server: the backend must leave it alone.
const foreignLibrary = "#!lua name=sluice_0000000000000000\n" +
	"redis.register_function('sluice_0000000000000000_tokenbucket', function() return 1 end)"

func newClient(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// scriptExists reports whether the server caches the script src.
func scriptExists(t *testing.T, c rueidis.Client, src string) bool {
	t.Helper()
	ok, err := c.Do(context.Background(), c.B().ScriptExists().Sha1(sha1Hex(src)).Build()).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	return ok[0] == 1
}

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestFunctionsIntegration: decisions run as FCALL of the library, which
// the backend loads where it is missing (a new server, or one that lost
// it), beside another version's library, which it leaves as it is.
func TestFunctionsIntegration(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, testkit.StartRedis(t).Addr())
	if err := c.Do(ctx, c.B().FunctionLoad().FunctionCode(foreignLibrary).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	b, err := rueidisbackend.New(c)
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
	if err := c.Do(ctx, c.B().FunctionDelete().LibraryName(redisscript.Functions.Name).Build()).Error(); err != nil {
		t.Fatalf("FUNCTION DELETE after the first decision: %v; want the library loaded", err)
	}
	allow(8)
	libs, err := c.Do(ctx, c.B().FunctionList().Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) != 2 {
		t.Errorf("%d libraries; want the foreign one and %s", len(libs), redisscript.Functions.Name)
	}
	if scriptExists(t, c, redisscript.Scripts[0].Source) {
		t.Error("SCRIPT EXISTS: the script was sent; want functions only")
	}
}

// TestFunctionsRefusedIntegration: on a server that refuses FUNCTION (here
// renamed away, as a managed service may), the backend runs scripts: the
// conformance suite passes, Check reports no problem, and the scripts are
// in the server's cache.
func TestFunctionsRefusedIntegration(t *testing.T) {
	addr := testkit.StartRedis(t, "--rename-command", "FUNCTION", "").Addr()
	ratelimittest.Run(t, ratelimittest.Harness{New: func(t *testing.T, clock ratelimit.Clock) ratelimit.Backend {
		c := newClient(t, addr)
		if err := c.Do(context.Background(), c.B().Flushdb().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		b, err := rueidisbackend.New(c, rueidisbackend.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}})

	ctx := context.Background()
	c := newClient(t, addr)
	if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	b, err := rueidisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	for _, s := range redisscript.Scripts {
		if !scriptExists(t, c, s.Source) {
			t.Errorf("SCRIPT EXISTS %s after Check: not loaded", s.Name)
		}
	}
}
