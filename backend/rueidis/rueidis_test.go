package rueidisbackend_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"go.uber.org/goleak"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/test/redistest"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestMain(m *testing.M) {
	// After a topology refresh, a rueidis cluster client closes the
	// connections it dropped five seconds later, in a goroutine that
	// outlives Close; it ends on its own.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

func connect(t *testing.T, addrs []string, cluster bool, o redistest.Options) (redistest.Backend, func()) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, ForceSingleClient: !cluster, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close) // Close is idempotent
	b, err := rueidisbackend.New(c, rueidisbackend.WithPrefix(o.Prefix), rueidisbackend.WithClock(o.Clock))
	if err != nil {
		t.Fatal(err)
	}
	return b, c.Close
}

// sentinel builds a client that finds the master through Sentinel.
func sentinel(t *testing.T, sentinels []string, master string) redistest.Backend {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: sentinels, Sentinel: rueidis.SentinelOption{MasterSet: master}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	b, err := rueidisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestIntegration(t *testing.T) {
	redistest.Run(t, redistest.Adapter{Connect: connect, Sentinel: sentinel})
}

// TestSharedBucketIntegration: processes on go-redis and on rueidis share
// buckets: 64 goroutines, half on each client, are admitted exactly 100.
func TestSharedBucketIntegration(t *testing.T) {
	addr, _ := servers.StandaloneAddr(t)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	gc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer gc.Close()
	rb, err := rueidisbackend.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	gb, err := redisbackend.New(gc)
	if err != nil {
		t.Fatal(err)
	}
	for alg := range ratelimit.LeakyBucket + 1 {
		t.Run(alg.String(), func(t *testing.T) { redistest.Exact(t, alg, rb, gb) })
	}
}

// wrapped is a rueidis.Client of the caller's own, as a decorator would be.
type wrapped struct{ rueidis.Client }

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client rueidis.Client
	}{
		{"nil", nil},
		// A typed nil: the interface is not nil, the client is.
		{"a nil *wrapped", (*wrapped)(nil)},
	} {
		if b, err := rueidisbackend.New(tc.client); b != nil || !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), "sluice/rueidis: the client is nil") {
			t.Errorf("New(%s): %v, %v; want ErrInvalidConfig saying the client is nil", tc.name, b, err)
		}
	}
	addr, _ := servers.StandaloneAddr(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b, err := rueidisbackend.New(c, rueidisbackend.WithPrefix("}")); b != nil || !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), "prefix") {
		t.Errorf("New with a brace in the prefix: %v, %v; want ErrInvalidConfig", b, err)
	}
}
