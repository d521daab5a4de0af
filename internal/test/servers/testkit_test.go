package servers_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/test/servers"
)

// build is the instance program of the tests that start instances.
var build servers.InstanceBuild

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		build.Remove()
		os.Exit(code)
	}))
}

func newClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:        addr,
		MaxRetries:  -1, // a retry would hide the failures these tests look for
		ReadTimeout: 200 * time.Millisecond,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestStartRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClient(t, servers.StartRedis(t).Addr())

	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want \"v\"", got, err)
	}
}

func TestStartRedisArgs(t *testing.T) {
	t.Parallel()
	c := newClient(t, servers.StartRedis(t, "--maxmemory-policy", "allkeys-lru").Addr())

	got, err := c.ConfigGet(context.Background(), "maxmemory-policy").Result()
	if err != nil {
		t.Fatalf("CONFIG GET: %v", err)
	}
	if got["maxmemory-policy"] != "allkeys-lru" {
		t.Fatalf("maxmemory-policy = %q, want allkeys-lru", got["maxmemory-policy"])
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := servers.StartRedis(t)
	c := newClient(t, r.Addr())
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING before Pause: %v", err)
	}

	r.Pause(t)
	begin := time.Now()
	err := c.Ping(ctx).Err()
	var netErr net.Error
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("PING while paused: %v, want a timeout", err)
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("PING while paused took %v, want about the 200ms read timeout", took)
	}

	r.Resume(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

func TestKill(t *testing.T) {
	t.Parallel()
	r := servers.StartRedis(t)
	r.Pause(t) // SIGKILL must work on a stopped process too
	r.Kill(t)

	conn, err := net.DialTimeout("tcp", r.Addr(), time.Second)
	if err == nil {
		conn.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after Kill: %v, want connection refused", err)
	}
	r.Kill(t) // a second Kill, like the cleanup's, must not block
}

func TestRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := servers.StartRedis(t)
	addr := r.Addr()
	before := newClient(t, addr)
	if err := before.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	r.Restart(t)
	if r.Addr() != addr {
		t.Fatalf("Addr after Restart = %s, want %s", r.Addr(), addr)
	}
	after := newClient(t, addr)
	if err := after.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Restart: %v, want redis.Nil", err)
	}

	r.Kill(t)
	r.Restart(t)
	if err := newClient(t, addr).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Kill and Restart: %v", err)
	}
}

func TestStandaloneAddr(t *testing.T) {
	tests := []struct {
		name         string
		env          string
		wantExternal bool
	}{
		{"unset starts a server", "", false},
		{"set uses it", "192.0.2.1:6379", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SLUICE_REDIS_ADDR", tt.env)
			addr, external := servers.StandaloneAddr(t)
			if external != tt.wantExternal {
				t.Errorf("external = %v, want %v", external, tt.wantExternal)
			}
			if tt.env != "" && addr != tt.env {
				t.Errorf("addr = %q, want %q", addr, tt.env)
			}
			if tt.env == "" {
				if err := newClient(t, addr).Ping(context.Background()).Err(); err != nil {
					t.Errorf("PING %s: %v", addr, err)
				}
			}
		})
	}
}

// outcomeTB records how RequireRedisServer ended a test without ending the
// real one; like testing.T, Fatal and Skip stop the calling goroutine.
type outcomeTB struct {
	testing.TB
	outcome string
	msg     string
}

func (tb *outcomeTB) Helper() {}

func (tb *outcomeTB) Fatal(args ...any) { tb.end("failed", args) }

func (tb *outcomeTB) Fatalf(format string, args ...any) {
	tb.end("failed", []any{fmt.Sprintf(format, args...)})
}

func (tb *outcomeTB) Skip(args ...any) { tb.end("skipped", args) }

func (tb *outcomeTB) end(outcome string, args []any) {
	tb.outcome, tb.msg = outcome, fmt.Sprint(args...)
	runtime.Goexit()
}

func TestRequireRedisServerMissing(t *testing.T) {
	tests := []struct {
		ci   string
		want string
	}{
		{ci: "", want: "skipped"},
		{ci: "true", want: "failed"},
	}
	for _, tt := range tests {
		t.Run("CI="+tt.ci, func(t *testing.T) {
			t.Setenv("PATH", t.TempDir())
			t.Setenv("CI", tt.ci)
			tb := &outcomeTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				servers.RequireRedisServer(tb)
				tb.outcome = "returned"
			}()
			<-done
			if tb.outcome != tt.want {
				t.Errorf("outcome = %s, want %s", tb.outcome, tt.want)
			}
			if !strings.Contains(tb.msg, "apt-get install redis-server") {
				t.Errorf("message %q does not say how to install redis-server", tb.msg)
			}
		})
	}
}

func TestRequireRedisServerFound(t *testing.T) {
	t.Parallel()
	path := servers.RequireRedisServer(t)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("RequireRedisServer returned %q: %v", path, err)
	}
}
