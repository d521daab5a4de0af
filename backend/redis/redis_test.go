package redisbackend_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/test/redistest"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// connect builds the client the package comment recommends: no retries,
// and the context's deadline obeyed.
func connect(t *testing.T, addrs []string, cluster bool, o redistest.Options) (redistest.Backend, func()) {
	var c redis.UniversalClient
	if cluster {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1, ContextTimeoutEnabled: true})
	} else {
		c = redis.NewClient(&redis.Options{Addr: addrs[0], MaxRetries: -1, ContextTimeoutEnabled: true})
	}
	closeClient := func() { _ = c.Close() } // a second Close reports ErrClosed, which is fine
	t.Cleanup(closeClient)
	b, err := redisbackend.New(c, redisbackend.WithPrefix(o.Prefix), redisbackend.WithClock(o.Clock))
	if err != nil {
		t.Fatal(err)
	}
	return b, closeClient
}

// sentinel builds a failover client through Sentinel.
func sentinel(t *testing.T, sentinels []string, master string) redistest.Backend {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: sentinels, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	b, err := redisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestIntegration(t *testing.T) {
	redistest.Run(t, redistest.Adapter{Connect: connect, Sentinel: sentinel})
}

func TestNewErrors(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		opts   []redisbackend.Option
		want   string
	}{
		{"nil client", nil, nil, "sluice/redis: the client is nil"},
		// Typed nils: the interface is not nil, the client is.
		{"nil *redis.Client", (*redis.Client)(nil), nil, "sluice/redis: the client is nil"},
		{"nil *redis.ClusterClient", (*redis.ClusterClient)(nil), nil, "sluice/redis: the client is nil"},
		{"nil *redis.Ring", (*redis.Ring)(nil), nil, "sluice/redis: the client is nil"},
		{"brace in prefix", c, []redisbackend.Option{redisbackend.WithPrefix("rl:{x}:")}, "prefix"},
	} {
		b, err := redisbackend.New(tc.client, tc.opts...)
		if b != nil || !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %s: %v, %v; want ErrInvalidConfig naming %q", tc.name, b, err, tc.want)
		}
	}
}

// TestCheckRetriesIntegration: a client left with go-redis's default of 3
// retries is reported, since a retried decision is charged twice.
func TestCheckRetriesIntegration(t *testing.T) {
	addr, _ := servers.StandaloneAddr(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	b, err := redisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	report, err := b.Check(context.Background())
	if !errors.Is(err, redisbackend.ErrUnsafeServer) || len(report.Problems) != 1 || !strings.Contains(report.Problems[0], "MaxRetries: -1") {
		t.Fatalf("Check with default retries: %+v, %v; want the retries reported", report, err)
	}
}

// TestCheckContextTimeoutIntegration: a client without
// ContextTimeoutEnabled is reported, plain, cluster or ring (a failover
// client is a *redis.Client), since its calls ignore their context's
// deadline and wait out ReadTimeout on a stalled server.
func TestCheckContextTimeoutIntegration(t *testing.T) {
	addr, _ := servers.StandaloneAddr(t)
	cluster := servers.StartCluster(t)
	for _, tc := range []struct {
		name string
		fix  string // the LowLatency function the problem names, if any
		new  func(contextTimeout bool) redis.UniversalClient
	}{
		{"Client", "LowLatency", func(on bool) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: on})
		}},
		{"ClusterClient", "LowLatencyCluster", func(on bool) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), MaxRetries: -1, ContextTimeoutEnabled: on})
		}},
		{"Ring", "", func(on bool) redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, MaxRetries: -1, ContextTimeoutEnabled: on})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, on := range []bool{false, true} {
				c := tc.new(on)
				defer c.Close()
				b, err := redisbackend.New(c)
				if err != nil {
					t.Fatal(err)
				}
				report, err := b.Check(context.Background())
				if on {
					if err != nil || len(report.Problems) != 0 {
						t.Errorf("Check with ContextTimeoutEnabled: %+v, %v; want no problem", report, err)
					}
					continue
				}
				if !errors.Is(err, redisbackend.ErrUnsafeServer) || len(report.Problems) != 1 {
					t.Fatalf("Check without ContextTimeoutEnabled: %+v, %v; want one problem", report, err)
				}
				p := report.Problems[0]
				for _, want := range []string{"deadline", "ReadTimeout", "ContextTimeoutEnabled: true", tc.fix} {
					if !strings.Contains(p, want) || !strings.Contains(err.Error(), want) {
						t.Errorf("Check without ContextTimeoutEnabled: problem %q, error %q; want both to say %q", p, err, want)
					}
				}
			}
		})
	}
}
