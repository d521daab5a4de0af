package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlstest"
	"github.com/sluicehq/sluice/internal/test/servers"
)

// exactConfig has a limit of 100 in each form, none of which refills
// while a test runs: a fixed window of a year (aligned to the Unix epoch,
// so the test checks whether a boundary passed), a token bucket and GCRA
// of 100 refilled one a day, and the token bucket split into 4
// sub-buckets.
const exactConfig = `domain: exact
descriptors:
  - key: window
    rate_limit: {unit: year, requests_per_unit: 100}
  - key: bucket
    rate_limit:
      algorithm: TokenBucket
      bandwidths: [{capacity: 100, refill_tokens: 1, refill_period: 24h}]
  - key: gcra
    rate_limit:
      algorithm: GCRA
      bandwidths: [{capacity: 100, refill_tokens: 1, refill_period: 24h}]
  - key: sharded
    rate_limit:
      algorithm: TokenBucket
      shards: 4
      bandwidths: [{capacity: 100, refill_tokens: 1, refill_period: 24h}]
`

// TestReplicasExactOnRedis runs two sluice-server processes on one Redis
// (standalone, a 3-master cluster and a master behind a Sentinel, each
// with both clients) and sends 400
// calls at each limit of 100 from 32 goroutines spread over both: exactly
// 100 pass, as one server would let through; the split key passes at most
// 100 (a request refused by the sub-buckets it tried while another still
// had tokens is a false rejection, which sharding's docs bound).
func TestReplicasExactOnRedis(t *testing.T) {
	path := filepath.Join(t.TempDir(), "exact.yaml")
	if err := os.WriteFile(path, []byte(exactConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	standalone := servers.StartRedis(t)
	cluster := servers.StartCluster(t)
	master := servers.StartRedis(t)
	sentinel := servers.StartSentinel(t, master.Addr())
	for _, c := range []struct {
		name string
		args []string
	}{
		{"standalone go-redis", []string{"--redis", standalone.Addr(), "--client", "go-redis"}},
		{"standalone rueidis", []string{"--redis", standalone.Addr(), "--client", "rueidis"}},
		{"cluster go-redis", []string{"--cluster", cluster.Addrs()[0], "--client", "go-redis"}},
		{"cluster rueidis", []string{"--cluster", cluster.Addrs()[0], "--client", "rueidis"}},
		{"sentinel go-redis", []string{"--sentinel", sentinel.Addr(), "--master", servers.SentinelMaster, "--client", "go-redis"}},
		{"sentinel rueidis", []string{"--sentinel", sentinel.Addr(), "--master", servers.SentinelMaster, "--client", "rueidis"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--config", path, "--prefix", "exact:" + c.name + ":", "--fail-mode", "error"}, c.args...)
			reps := []*testServer{replica(t, args...), replica(t, args...)}
			for _, key := range []string{"window", "bucket", "gcra", "sharded"} {
				window := yearWindow()
				passed := exactly(t, reps, 32, 400, "exact", key, "k")
				switch {
				case key == "sharded":
					if passed < 1 || passed > 100 {
						t.Errorf("%s: %d of 400 passed, want 1 to 100", key, passed)
					}
				case key == "window" && yearWindow() != window:
					// A window's boundary passed: two windows' worth.
					if passed < 100 || passed > 200 {
						t.Errorf("%s across a year's end: %d passed, want 100 to 200", key, passed)
					}
				case passed != 100:
					t.Errorf("%s: %d of 400 passed, want exactly 100", key, passed)
				}
			}
		})
	}
}

// yearWindow is the index of the year-long window (365 days from the Unix
// epoch, as the config's unit counts it) that holds now.
func yearWindow() int64 { return time.Now().Unix() / (365 * 24 * 3600) }

// TestFailModes stops Redis under a running server: each domain answers
// as its fail_mode says, and the "error" mode fails the call for Envoy's
// failure_mode_deny to decide.
func TestFailModes(t *testing.T) {
	r := servers.StartRedis(t)
	dir := t.TempDir()
	for _, mode := range []string{"open", "closed", "local", "error"} {
		data := "domain: " + mode + "\nfail_mode: " + mode + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"
		if err := os.WriteFile(filepath.Join(dir, mode+".yaml"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := start(t, defaults(t, "--config", dir, "--redis", r.Addr(), "--timeout", "5s"), nil)
	for _, mode := range []string{"open", "closed", "local", "error"} {
		if resp := ask(t, s.client, mode, "k", "v"); resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Errorf("%s, Redis up: %v", mode, resp.OverallCode)
		}
	}
	r.Kill(t)
	for mode, want := range map[string]string{"open": "OK", "closed": "OVER_LIMIT", "local": "OK"} {
		if resp := ask(t, s.client, mode, "k", "v"); resp.OverallCode.String() != want {
			t.Errorf("%s, Redis down: %v, want %s", mode, resp.OverallCode, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.client.ShouldRateLimit(ctx, rlstest.Request("error", []string{"k", "v"}))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("error, Redis down: %v, want Unavailable", err)
	}
}
