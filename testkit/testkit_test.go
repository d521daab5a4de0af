package testkit

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { os.Exit(Main(m).Run()) }

// TestStartRedis: the server answers, takes writes, and is the test's own.
func TestStartRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := StartRedis(t), StartRedis(t)
	if a.Addr() == b.Addr() {
		t.Fatalf("two servers at one address %s", a.Addr())
	}
	ca := redis.NewClient(&redis.Options{Addr: a.Addr()})
	defer ca.Close()
	cb := redis.NewClient(&redis.Options{Addr: b.Addr()})
	defer cb.Close()
	if err := ca.Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatalf("SET on %s: %v", a.Addr(), err)
	}
	if n, err := cb.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS k on the other server %s: %d, %v; want 0", b.Addr(), n, err)
	}
	if v, err := ca.Get(ctx, "k").Result(); err != nil || v != "a" {
		t.Fatalf("GET k: %q, %v; want a", v, err)
	}
}

// TestStartCluster: three masters, each serving keys of its slots, and
// cluster_state:ok on every one; in containers, in each layout this
// platform can run.
func TestStartCluster(t *testing.T) {
	t.Parallel()
	layouts := []string{""}
	if ModeOf(t) == Containers {
		layouts = []string{"single"}
		if runtime.GOOS == "linux" {
			layouts = append(layouts, "host")
		}
	}
	for _, layout := range layouts {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			testCluster(t, startCluster(t, layout))
		})
	}
}

func testCluster(t *testing.T, c *Cluster) {
	ctx := context.Background()
	if len(c.Addrs()) != 3 {
		t.Fatalf("Addrs() = %v; want 3 masters", c.Addrs())
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer client.Close()
	owners := map[string]bool{}
	for i := range 64 {
		key := fmt.Sprintf("key:%d", i)
		if err := client.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		node, err := client.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		owners[node.Options().Addr] = true
	}
	if len(owners) != 3 {
		t.Errorf("64 keys landed on masters %v; want all 3", owners)
	}
	for _, addr := range c.Addrs() {
		node := redis.NewClient(&redis.Options{Addr: addr})
		info, err := node.ClusterInfo(ctx).Result()
		node.Close()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			t.Errorf("CLUSTER INFO on %s: %v\n%s", addr, err, info)
		}
	}
}

// TestStartSentinel: a failover client finds the master through the
// Sentinel and writes to it.
func TestStartSentinel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartSentinel(t)
	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: []string{s.Addr()}})
	defer client.Close()
	if err := client.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the Sentinel at %s: %v", s.Addr(), err)
	}
	direct := redis.NewClient(&redis.Options{Addr: s.Master().Addr()})
	defer direct.Close()
	if v, err := direct.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET k on the master %s: %q, %v; want v", s.Master().Addr(), v, err)
	}
}

// TestPostgres: two databases, each empty and the test's own.
func TestPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := Postgres(t), Postgres(t)
	if a.Name() == b.Name() {
		t.Fatalf("two databases named %s", a.Name())
	}
	conn, err := pgx.Connect(ctx, a.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.Pool(t).QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 't'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("table t in the other database: %d, %v; want none", n, err)
	}
}

// fatalRecorder records a Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

// TestModeOf: $SLUICE_TESTKIT's value is taken, and one the kit does not
// know fails the test with the variable named.
func TestModeOf(t *testing.T) {
	t.Setenv(EnvMode, "binaries")
	if m := ModeOf(t); m != Binaries {
		t.Errorf("%s=binaries: ModeOf = %q", EnvMode, m)
	}
	t.Setenv(EnvMode, "docker")
	f := &fatalRecorder{TB: t}
	ModeOf(f)
	if !strings.Contains(f.msg, EnvMode) || !strings.Contains(f.msg, `"docker"`) {
		t.Errorf("%s=docker: Fatalf(%q); want it to name the variable and the value", EnvMode, f.msg)
	}
}

// TestImage: the variable's image, else the default.
func TestImage(t *testing.T) {
	t.Setenv(EnvRedisImage, "")
	if got := image(EnvRedisImage, DefaultRedisImage); got != DefaultRedisImage {
		t.Errorf("unset: %q; want %q", got, DefaultRedisImage)
	}
	t.Setenv(EnvRedisImage, "mirror.example/redis:7")
	if got := image(EnvRedisImage, DefaultRedisImage); got != "mirror.example/redis:7" {
		t.Errorf("set: %q", got)
	}
}
