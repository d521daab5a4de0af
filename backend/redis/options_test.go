package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/test/redistest"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// A limiter whose decisions give up after 5ms, on a client that honours
// the deadline and never retries. The example needs a Redis server on
// 127.0.0.1:6379, so it is compiled but not run.
func ExampleLowLatency() {
	opts := &redis.Options{Addr: "127.0.0.1:6379"}
	redisbackend.LowLatency(opts)
	client := redis.NewClient(opts)
	defer client.Close()

	backend, err := redisbackend.New(client)
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(backend)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(100)}}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	d, err := limiter.Allow(ctx, "user:12345", cfg)
	if errors.Is(err, ratelimit.ErrTimeout) {
		log.Print("no decision within 5ms: the fail policy decides")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Allowed)
}

// TestLowLatency: each helper overwrites its fields, whatever the caller
// set, and leaves the others alone.
func TestLowLatency(t *testing.T) {
	t.Parallel()
	// fields are the settings a helper may touch, and two it must not.
	type fields struct {
		ContextTimeoutEnabled                               bool
		MaxRetries, MaxRedirects, DialerRetries             int
		DialTimeout, ReadTimeout, WriteTimeout, PoolTimeout time.Duration
		PoolSize, MinIdleConns                              int
	}
	const ms = time.Millisecond
	for _, tc := range []struct {
		name string
		set  func() fields
		want fields
	}{
		{"LowLatency", func() fields {
			o := &redis.Options{MaxRetries: 5, DialerRetries: 3, DialTimeout: time.Second, ReadTimeout: time.Hour, WriteTimeout: -1, PoolTimeout: 2 * time.Second, PoolSize: 7, MinIdleConns: 3}
			redisbackend.LowLatency(o)
			return fields{o.ContextTimeoutEnabled, o.MaxRetries, 0, o.DialerRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.PoolSize, o.MinIdleConns}
		}, fields{true, -1, 0, 1, 100 * ms, 50 * ms, 50 * ms, 50 * ms, 7, 3}},
		{"LowLatencyCluster", func() fields {
			o := &redis.ClusterOptions{MaxRetries: 5, MaxRedirects: 8, ReadTimeout: time.Hour, PoolSize: 7, MinIdleConns: 3}
			redisbackend.LowLatencyCluster(o)
			return fields{o.ContextTimeoutEnabled, o.MaxRetries, o.MaxRedirects, o.DialerRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.PoolSize, o.MinIdleConns}
		}, fields{true, -1, -1, 1, 100 * ms, 50 * ms, 50 * ms, 50 * ms, 7, 3}},
		{"LowLatencyFailover", func() fields {
			o := &redis.FailoverOptions{MaxRetries: 5, ReadTimeout: time.Hour, ContextTimeoutEnabled: false, PoolSize: 7, MinIdleConns: 3}
			redisbackend.LowLatencyFailover(o)
			return fields{o.ContextTimeoutEnabled, o.MaxRetries, 0, o.DialerRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.PoolSize, o.MinIdleConns}
		}, fields{true, -1, 0, 1, 100 * ms, 50 * ms, 50 * ms, 50 * ms, 7, 3}},
	} {
		if got := tc.set(); got != tc.want {
			t.Errorf("%s set\n%+v, want\n%+v", tc.name, got, tc.want)
		}
	}
}

// lowLatencyKinds are the clients the integration tests build. "Client"
// sends a lone call on a connection of its own, as the backend does when
// no other call is out; "Pipelined" sends every call through the client's
// autopipeliner, as it does when others are.
var lowLatencyKinds = []redistest.LowLatencyKind{
	{Name: "Client", Topology: redistest.Standalone},
	{Name: "Pipelined", Topology: redistest.Standalone},
	{Name: "Failover", Topology: redistest.Sentinel},
	{Name: "Cluster", Topology: redistest.Cluster},
}

// lowLatencyBackend returns a backend on a new client of kind, connected
// to s and set up with the matching helper. The client is closed by
// t.Cleanup, before the servers are killed.
func lowLatencyBackend(t *testing.T, kind string, s redistest.Servers) ratelimit.Backend {
	t.Helper()
	var c redis.UniversalClient
	switch kind {
	case "Client", "Pipelined":
		o := &redis.Options{Addr: s.Addrs[0]}
		redisbackend.LowLatency(o)
		c = redis.NewClient(o)
	case "Failover":
		o := &redis.FailoverOptions{MasterName: servers.SentinelMaster, SentinelAddrs: s.Addrs}
		redisbackend.LowLatencyFailover(o)
		c = redis.NewFailoverClient(o)
	case "Cluster":
		o := &redis.ClusterOptions{Addrs: s.Addrs}
		redisbackend.LowLatencyCluster(o)
		c = redis.NewClusterClient(o)
	default:
		t.Fatalf("unknown client kind %q", kind)
	}
	t.Cleanup(func() { c.Close() })
	b, err := redisbackend.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if kind == "Pipelined" {
		redisbackend.AlwaysPipeline(b)
	}
	return b
}

// stallBound is how long a call on a paused or dead server may take in
// these tests: 40 times the 50ms timeouts, for a loaded machine and the
// race detector, and still well below go-redis's 5s defaults, so it shows
// that no call waits for them.
const stallBound = 2 * time.Second

// TestLowLatencyIntegration runs [redistest.LowLatency] on each client
// kind. A call on a paused server returns ErrTimeout at about its 5ms
// deadline, or, without one, after about the 50ms read timeout, not
// go-redis's 5s; it is not sent again, so once the server resumes and runs
// what queued up, the bucket is charged once. (A client that retries,
// standalone with MaxRetries 3 or cluster with MaxRedirects 3, queues its
// retries on the paused server too, and is charged for each.)
func TestLowLatencyIntegration(t *testing.T) {
	t.Parallel()
	redistest.LowLatency(t, redistest.LowLatencyAdapter{
		Kinds:        lowLatencyKinds,
		Backend:      lowLatencyBackend,
		StallBound:   stallBound,
		WantDeadline: "about the 5ms deadline",
		WantBackstop: "about the 50ms read timeout",
	})
}
