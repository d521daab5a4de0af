package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit"
)

// TestRedisIntegration runs the demo on a real redis-server, standalone
// and as a cluster (--redis, --cluster): the same burst is decided the
// same as in memory.
func TestRedisIntegration(t *testing.T) {
	testkit.RequireRedisServer(t)
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) options
	}{
		{"redis", func(t *testing.T) options {
			return options{redisAddrs: []string{testkit.StartRedis(t).Addr()}}
		}},
		{"redis cluster", func(t *testing.T) options {
			return options{redisAddrs: testkit.StartCluster(t).Addrs(), cluster: true}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := newDemo(t.Context(), tc.start(t), testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(d.handler)
			defer func() {
				srv.Close()
				if err := d.Close(t.Context()); err != nil {
					t.Error(err)
				}
			}()
			if got := plansNow(t, srv).Store; got != tc.name {
				t.Errorf("GET /api/plans store: got %q, want %q", got, tc.name)
			}
			mustPutPlan(t, srv, "free", slowFree)
			statuses, _ := burst(t, srv, 20, keyFree)
			if statuses[http.StatusOK] != 5 || statuses[http.StatusTooManyRequests] != 15 {
				t.Errorf("a burst of 20 on a bucket of 5: got %v", statuses)
			}
		})
	}
}
