package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/redisconn"
	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
)

// TestMain makes the test binary the command's instances too: run starts
// os.Executable, the test binary, as each of them. It fails the tests if
// any leaves a goroutine behind.
func TestMain(m *testing.M) {
	if harness.IsInstance() {
		harness.InstanceMain(harness.Connect)
	}
	goleak.VerifyTestMain(m)
}

// verified runs the command with args and returns its exit status, its
// stdout and its stderr.
func verified(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// verifiedJSON runs the command with --json and args and decodes its
// report.
func verifiedJSON(t *testing.T, args ...string) (int, report) {
	t.Helper()
	code, stdout, stderr := verified(t, append([]string{"--json"}, args...)...)
	var rep report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("exit %d, stdout %q: %v; stderr:\n%s", code, stdout, err, stderr)
	}
	t.Logf("exit %d; stderr:\n%s", code, stderr)
	return code, rep
}

// client returns a go-redis client of s for the test's own looks at the
// server.
func client(t *testing.T, s redisconn.Server) redis.UniversalClient {
	t.Helper()
	c, _, err := redisconn.GoRedis(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// checkClean fails t unless a SCAN of every master finds no key under
// prefix, and the key other, if any, still holds what it held.
func checkClean(t *testing.T, c redis.UniversalClient, prefix, other string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	left, err := harness.Keys(ctx, c, prefix, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("SCAN finds %d keys under %q after the run, such as %q; want none", len(left), prefix, left[0])
	}
	if other == "" {
		return
	}
	if got, err := c.Get(ctx, other).Result(); err != nil || got != "untouched" {
		t.Errorf("GET %s = %q, %v; want the value the test set, untouched", other, got, err)
	}
}

// setOther sets a key outside the run's prefix, which it must not touch.
func setOther(t *testing.T, c redis.UniversalClient, key string) {
	t.Helper()
	if err := c.Set(context.Background(), key, "untouched", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyIntegration runs the command, with its defaults (2 processes ×
// 64 goroutines, 5000 calls on each of the seven buckets, through go-redis
// and rueidis), against a standalone server, a 3-master cluster and a
// Sentinel's master: every bound must hold, every call decide, Check find
// nothing, and the run leave no key behind and touch no other.
func TestVerifyIntegration(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: each run takes seconds")
	}
	topologies := []struct {
		name  string
		start func(t *testing.T) (redisconn.Server, []string)
	}{
		{"Standalone", func(t *testing.T) (redisconn.Server, []string) {
			addr := servers.StartRedis(t).Addr()
			return redisconn.Server{Addrs: []string{addr}}, []string{"--redis", addr}
		}},
		{"Cluster", func(t *testing.T) (redisconn.Server, []string) {
			addrs := servers.StartCluster(t).Addrs()
			return redisconn.Server{Addrs: addrs, Cluster: true}, []string{"--cluster", strings.Join(addrs, ",")}
		}},
		{"Sentinel", func(t *testing.T) (redisconn.Server, []string) {
			master := servers.StartRedis(t)
			sentinel := servers.StartSentinel(t, master.Addr()).Addr()
			return redisconn.Server{Addrs: []string{sentinel}, Sentinel: servers.SentinelMaster},
				[]string{"--sentinel", sentinel, "--master", servers.SentinelMaster}
		}},
	}
	for _, tc := range topologies {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			server, args := tc.start(t)
			c := client(t, server)
			setOther(t, c, "sluice-verifx")
			code, rep := verifiedJSON(t, args...)
			if code != exitOK || !rep.OK {
				t.Errorf("exit %d, ok %t; want 0, true", code, rep.OK)
			}
			if want := len(harness.Buckets(1)) * 2; len(rep.Runs) != want {
				t.Errorf("%d runs; want %d", len(rep.Runs), want)
			}
			for _, r := range rep.Runs {
				t.Logf("%s %s: %s, %d calls, admitted %d, remaining %d, bound [%d, %d], p99 %.2fms", r.Adapter, r.Bucket, r.Verdict, r.Made, r.Admitted, r.Remaining, r.Bound.Low, r.Bound.High, r.Latency.P99)
				if r.Verdict != verdictOK || r.Made != 5000 || r.Failed != 0 {
					t.Errorf("%s %s: %s, %d calls, %d failed (%s); want ok, 5000 calls, none failed", r.Adapter, r.Bucket, r.Verdict, r.Made, r.Failed, r.Error)
				}
				if r.Bound.Low == r.Bound.High && r.Admitted != 1000 {
					t.Errorf("%s %s: admitted %d without refill; want exactly 1000", r.Adapter, r.Bucket, r.Admitted)
				}
			}
			for _, a := range rep.Adapters {
				if len(a.Problems) > 0 || a.CheckError != "" || len(a.Servers) == 0 {
					t.Errorf("%s: Check found %q, error %q, %d servers; want no problem and the servers", a.Name, a.Problems, a.CheckError, len(a.Servers))
				}
			}
			// A bucket that has refilled expires by itself: the refilling
			// ones, full again 10s after their run, may be gone before the
			// clean-up; every other one lasts an hour.
			lasting := 0
			for _, r := range rep.Runs {
				if r.Bucket != "TokenBucketRefill" {
					lasting++
				}
			}
			if rep.KeysDeleted < lasting || rep.KeysDeleted > len(rep.Runs) || rep.KeysLeft != 0 || rep.CleanError != "" {
				t.Errorf("clean-up deleted %d keys, left %d (%s); want %d to %d deleted, none left", rep.KeysDeleted, rep.KeysLeft, rep.CleanError, lasting, len(rep.Runs))
			}
			checkClean(t, c, rep.Prefix, "sluice-verifx")
		})
	}
}

// TestVerifyFlagsUnsafeSettings: a server that may evict bucket keys and a
// go-redis client that retries (go-redis's default of 3) are both in the
// report, while the bounds hold; --strict makes them fail the run.
func TestVerifyFlagsUnsafeSettings(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: each run takes seconds")
	}
	t.Parallel()
	addr := servers.StartRedis(t, "--maxmemory-policy", "allkeys-lru").Addr()
	args := []string{"--redis", addr, "--retries", "3", "--buckets", "TokenBucket"}
	code, rep := verifiedJSON(t, args...)
	if code != exitOK || !rep.OK {
		t.Errorf("exit %d, ok %t; want 0, true: the problems are reported, the bounds hold", code, rep.OK)
	}
	for _, a := range rep.Adapters {
		problems := strings.Join(a.Problems, "\n")
		t.Logf("%s: %s", a.Name, problems)
		if !strings.Contains(problems, "maxmemory-policy is allkeys-lru") {
			t.Errorf("%s: problems %q; want the allkeys-lru policy", a.Name, a.Problems)
		}
		if retries := strings.Contains(problems, "retries a command up to 3 times"); retries != (a.Name == harness.BackendGoRedis) {
			t.Errorf("%s: problems %q; want the retries flagged on go-redis alone (rueidis never resends FCALL)", a.Name, a.Problems)
		}
	}
	if code, _, _ := verified(t, append(args, "--strict", "--quiet")...); code != exitBroken {
		t.Errorf("--strict: exit %d; want %d", code, exitBroken)
	}
	code, stdout, _ := verified(t, append(args, "--quiet")...)
	if code != exitOK || !strings.Contains(stdout, "PROBLEM: "+addr+": maxmemory-policy is allkeys-lru") || !strings.Contains(stdout, "PROBLEM: the client retries") {
		t.Errorf("the table (exit %d) does not flag both problems:\n%s", code, stdout)
	}
}

// TestVerifyCatchesRacyStore: the harness's read-modify-write store, which
// loses updates whenever two calls overlap, makes the command exit 1 with
// the over-admission in the report. Overlap is a matter of scheduling, so
// it gets three runs to show it.
func TestVerifyCatchesRacyStore(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: each run takes seconds")
	}
	t.Parallel()
	addr := servers.StartRedis(t).Addr()
	c := client(t, redisconn.Server{Addrs: []string{addr}})
	for attempt := range 3 {
		code, rep := verifiedJSON(t, "--redis", addr, "--test-racy-store", "--buckets", "TokenBucket")
		checkClean(t, c, rep.Prefix, "")
		if len(rep.Runs) != 1 {
			t.Fatalf("%d runs; want 1", len(rep.Runs))
		}
		r := rep.Runs[0]
		t.Logf("run %d: exit %d, %s: admitted %d, remaining %d, bound [%d, %d]: %s", attempt, code, r.Verdict, r.Admitted, r.Remaining, r.Bound.Low, r.Bound.High, r.Error)
		if code == exitOK {
			continue
		}
		if code != exitBroken || r.Verdict != verdictBroken || int64(r.Admitted)+r.Remaining <= r.Bound.High || !strings.Contains(r.Error, "over the bound") {
			t.Errorf("exit %d, %s (%s); want %d, %s, admitted + remaining over the bound", code, r.Verdict, r.Error, exitBroken, verdictBroken)
		}
		return
	}
	t.Error("the racy store stayed within the bound in 3 runs")
}

// TestVerifyReportsUnknownTokens: calls whose deadline (1µs) ends before
// they can be decided fail, and each one's token is unknown: it may have
// been taken. The report says how many (unknown_tokens), the bound still
// holds with them, and the run is "calls failed", not ok.
func TestVerifyReportsUnknownTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: each run takes seconds")
	}
	t.Parallel()
	addr := servers.StartRedis(t).Addr()
	code, rep := verifiedJSON(t, "--redis", addr, "--timeout", "1us", "--buckets", "TokenBucket", "--adapters", "goredis")
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs; want 1", len(rep.Runs))
	}
	r := rep.Runs[0]
	t.Logf("exit %d, %s: admitted %d, failed %d, unknown tokens %d, remaining %d, bound [%d, %d]: %s", code, r.Verdict, r.Admitted, r.Failed, r.Unknown, r.Remaining, r.Bound.Low, r.Bound.High, r.Error)
	if code != exitBroken || r.Verdict != verdictFailed || r.Failed == 0 || r.Unknown != int64(r.Failed) {
		t.Errorf("exit %d, %s, %d failed, %d unknown tokens; want %d, %s, some failed, each with its one token unknown", code, r.Verdict, r.Failed, r.Unknown, exitBroken, verdictFailed)
	}
}

// TestVerifyRefusesUsedPrefix: with a key under its prefix on the server,
// the command makes no run, exits 2 and leaves the key as it was.
func TestVerifyRefusesUsedPrefix(t *testing.T) {
	t.Parallel()
	addr := servers.StartRedis(t).Addr()
	c := client(t, redisconn.Server{Addrs: []string{addr}})
	setOther(t, c, "mine:[x]*")
	code, stdout, stderr := verified(t, "--redis", addr, "--prefix", "mine:[x]")
	if code != exitCannot || stdout != "" || !strings.Contains(stderr, `refusing to run: the server already holds keys under the prefix "mine:[x]" (mine:[x]*)`) {
		t.Errorf("exit %d, stdout %q, stderr %q; want %d, nothing, the refusal naming the key", code, stdout, stderr, exitCannot)
	}
	keys, err := c.Keys(context.Background(), "*").Result()
	if err != nil || len(keys) != 1 {
		t.Errorf("keys %q, %v; want the one the test set", keys, err)
	}
	checkClean(t, c, "nothing", "mine:[x]*")
}

// TestVerifyPrefixIsLiteral: a prefix with SCAN's pattern characters
// matches only itself, so that a run never takes another key for its own.
func TestVerifyPrefixIsLiteral(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: each run takes seconds")
	}
	t.Parallel()
	addr := servers.StartRedis(t).Addr()
	c := client(t, redisconn.Server{Addrs: []string{addr}})
	setOther(t, c, "v1:{x}")
	code, rep := verifiedJSON(t, "--redis", addr, "--prefix", "v?:", "--buckets", "GCRA", "--adapters", "rueidis", "--calls", "200", "--capacity", "50")
	if code != exitOK || rep.KeysDeleted != 1 || rep.KeysLeft != 0 {
		t.Errorf("exit %d, deleted %d, left %d; want 0, the run's one key, none", code, rep.KeysDeleted, rep.KeysLeft)
	}
	checkClean(t, c, "v?:", "v1:{x}")
}

// TestParseRejects: each bad flag is named, and nothing runs.
func TestParseRejects(t *testing.T) {
	t.Parallel()
	const addr = "127.0.0.1:1" // nothing listens; a run would fail to connect
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"NoServer", nil, "give exactly one of --redis, --cluster and --sentinel"},
		{"TwoServers", []string{"--redis", addr, "--cluster", addr}, "give exactly one of"},
		{"SentinelWithoutMaster", []string{"--sentinel", addr}, "--sentinel needs --master"},
		{"MasterWithoutSentinel", []string{"--redis", addr, "--master", "m"}, "--master is for --sentinel"},
		{"ClusterDB", []string{"--cluster", addr, "--db", "2"}, "--db 2: a cluster has only database 0"},
		{"EmptyAddr", []string{"--cluster", addr + ","}, "an empty address"},
		{"EmptyPrefix", []string{"--redis", addr, "--prefix", ""}, "--prefix must not be empty"},
		{"Processes", []string{"--redis", addr, "--processes", "0"}, "--processes 0"},
		{"Goroutines", []string{"--redis", addr, "--goroutines", "-1"}, "--goroutines -1"},
		{"Calls", []string{"--redis", addr, "--processes", "3", "--calls", "2"}, "--calls 2"},
		{"Capacity", []string{"--redis", addr, "--capacity", "0"}, "--capacity 0"},
		{"CapacityOfLog", []string{"--redis", addr, "--capacity", "20000"}, "--capacity 20000: bucket SlidingWindowLog: ratelimit: invalid config: Bandwidths[0].Capacity must be at most 10000"},
		{"Retries", []string{"--redis", addr, "--retries", "-1"}, "--retries -1"},
		{"Timeout", []string{"--redis", addr, "--timeout", "0s"}, "--timeout 0s"},
		{"Bucket", []string{"--redis", addr, "--buckets", "TokenBucket,Nope"}, `--buckets: no bucket "Nope"`},
		{"Adapter", []string{"--redis", addr, "--adapters", "redigo"}, `--adapters: "redigo" is not`},
		{"Argument", []string{"--redis", addr, "extra"}, `unexpected argument "extra"`},
		{"UnknownFlag", []string{"--redis", addr, "--pool", "4"}, "flag provided but not defined: -pool"},
		{"BadNumber", []string{"--redis", addr, "--calls", "many"}, `invalid value "many" for flag -calls`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := verified(t, tt.args...)
			if code != exitCannot || stdout != "" || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant %d, nothing, and %q", code, stdout, stderr, exitCannot, tt.want)
			}
		})
	}
}

// TestHelp: --help lists every flag but the hidden one, and exits 0.
func TestHelp(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := verified(t, "--help")
	if code != exitOK || stdout != "" {
		t.Errorf("exit %d, stdout %q; want 0, nothing", code, stdout)
	}
	for _, want := range []string{"--redis host:port", "--cluster", "--sentinel", "--master", "--tls-ca", "--password", "--json", "--strict", "--prefix prefix"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("--help does not show %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "racy") {
		t.Errorf("--help shows the hidden flag:\n%s", stderr)
	}
}

// TestPasswordFromEnvironment: --password defaults to $REDISCLI_AUTH, and
// --help does not show it.
func TestPasswordFromEnvironment(t *testing.T) {
	t.Setenv("REDISCLI_AUTH", "s3cret")
	var stderr bytes.Buffer
	o, err := parse([]string{"--redis", "127.0.0.1:1"}, &stderr)
	if err != nil || o.server.Password != "s3cret" {
		t.Errorf("password %q, %v; want the environment's", o.server.Password, err)
	}
	if _, err := parse([]string{"--help"}, &stderr); err == nil || strings.Contains(stderr.String(), "s3cret") {
		t.Errorf("--help: %v, and shows the password:\n%s", err, stderr.String())
	}
}
