package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/test/servers"
)

// TestRedisIntegration runs the demo on a real redis-server, standalone
// and as a cluster (--redis, --cluster): the same burst is decided the
// same as in memory.
func TestRedisIntegration(t *testing.T) {
	servers.RequireRedisServer(t)
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) options
	}{
		{"redis", func(t *testing.T) options {
			return options{redisAddrs: []string{servers.StartRedis(t).Addr()}}
		}},
		{"redis cluster", func(t *testing.T) options {
			return options{redisAddrs: servers.StartCluster(t).Addrs(), cluster: true}
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

// TestReplicasShareWhenDown runs two replicas of the demo on one Redis
// with --replicas 2 (issue 28, item 7). With Redis up, bursts on both are
// decided exactly: 5 admitted of a bucket of 5. With Redis killed, each
// replica decides in its share, half the bucket: 2 each, 4 in all, where
// each replica deciding with the whole bucket admitted 10.
func TestReplicasShareWhenDown(t *testing.T) {
	servers.RequireRedisServer(t)
	r := servers.StartRedis(t)
	srvs := twoReplicas(t, r.Addr())
	bursts := func() (total map[int]int, each [2]map[int]int) {
		var wg sync.WaitGroup
		for i, srv := range srvs {
			wg.Go(func() { each[i], _ = burst(t, srv, 10, keyFree) })
		}
		wg.Wait()
		total = map[int]int{}
		for _, m := range each {
			for status, n := range m {
				total[status] += n
			}
		}
		return total, each
	}
	if total, each := bursts(); total[http.StatusOK] != 5 || total[http.StatusTooManyRequests] != 15 {
		t.Errorf("bursts of 10 on each of two replicas, on a bucket of 5 in Redis: got %v (%v, %v); want 5 admitted", total, each[0], each[1])
	}
	r.Kill(t)
	if total, each := bursts(); each[0][http.StatusOK] != 2 || each[1][http.StatusOK] != 2 || total[http.StatusTooManyRequests] != 16 {
		t.Errorf("bursts of 10 on each of two replicas, on a bucket of 5, with Redis killed: got %v (%v, %v); want 4 admitted, 2 by each replica's share", total, each[0], each[1])
	}
}

// TestReplicasExactWhenRedisIsSlow is a busy machine made deterministic
// (issue 28, item 7): two replicas on one Redis, behind a proxy that holds
// Redis's replies to bursts of 3 on each, their decisions (FCALL, as the
// backends send them), until all have reached Redis that can (see the
// barrier), and 100ms more:
// longer than the fail policy's default deadline of 50ms, well within the
// demo's 2s. The
// replicas wait for Redis rather than decide in their shares, and admit
// exactly what the bucket holds.
func TestReplicasExactWhenRedisIsSlow(t *testing.T) {
	servers.RequireRedisServer(t)
	proxy := servers.StartProxy(t, servers.StartRedis(t).Addr())
	srvs := twoReplicas(t, proxy.Addr())
	for i, srv := range srvs {
		// One request each, so that the function library is loaded and
		// a connection open before the stall: 2 of the bucket's 5.
		if r := do(t, srv, http.MethodGet, "/api/hello", "", keyFree); r.status != http.StatusOK {
			t.Fatalf("replica %d's first request: %d %s", i, r.status, r.body)
		}
	}
	proxy.StallAfter("fcall")
	var (
		wg   sync.WaitGroup
		each [2]map[int]int
	)
	done := make(chan struct{})
	start := time.Now()
	for i, srv := range srvs {
		wg.Go(func() { each[i], _ = burst(t, srv, 3, keyFree) })
	}
	go func() { wg.Wait(); close(done) }()
	// The barrier: the decisions have reached Redis, all 6, or as many as
	// the replicas send while the replies are held (a go-redis replica
	// sends a burst's later decisions in a pipeline behind its first, once
	// that one's reply is in), none more for 100ms; or, where the deadline
	// is shorter than the stall, the bursts ended without. A decision not
	// yet sent at the release is sent then, and decided by Redis all the
	// same.
	for last, since := 0, time.Now(); ; {
		select {
		case <-done:
		case <-time.After(time.Millisecond):
			n := proxy.Marked()
			if n != last {
				last, since = n, time.Now()
			}
			if n < 6 && (n < 2 || time.Since(since) < 100*time.Millisecond) {
				continue
			}
		}
		break
	}
	time.Sleep(100 * time.Millisecond)
	proxy.Release()
	held := time.Since(start)
	<-done
	total := map[int]int{}
	for _, m := range each {
		for status, n := range m {
			total[status] += n
		}
	}
	if total[http.StatusOK] != 3 || total[http.StatusTooManyRequests] != 3 {
		t.Errorf("bursts of 3 on each of two replicas, with Redis's replies held 100ms past the last decision's arrival (%v from the bursts' start), on a bucket of 5 with 3 left: got %v (%v, %v); want 3 admitted", held.Round(time.Millisecond), total, each[0], each[1])
	}
}

// twoReplicas starts two demo servers on the Redis at addr, each told
// --replicas 2, with the free plan at 5 tokens that refill slowly.
func twoReplicas(t *testing.T, addr string) [2]*httptest.Server {
	t.Helper()
	var srvs [2]*httptest.Server
	for i := range srvs {
		d, err := newDemo(t.Context(), options{redisAddrs: []string{addr}, replicas: 2}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		srvs[i] = httptest.NewServer(d.handler)
		t.Cleanup(func() {
			srvs[i].Close()
			if err := d.Close(context.WithoutCancel(t.Context())); err != nil {
				t.Error(err)
			}
		})
		mustPutPlan(t, srvs[i], "free", slowFree)
	}
	return srvs
}
