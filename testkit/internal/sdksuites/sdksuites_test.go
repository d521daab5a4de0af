// Package sdksuites runs the SDK's own Redis and PostgreSQL suites against
// servers the test kit starts: the backends' conformance, exactness and
// key tests on a standalone server and on a 3-master cluster (go-redis and
// rueidis), and the PostgreSQL plan store's tests. The suites read the
// servers from $SLUICE_REDIS_ADDR, $SLUICE_REDIS_CLUSTER_ADDRS and
// $SLUICE_POSTGRES_URL, which they otherwise start as processes of their
// own, so they run the same way on either.
package sdksuites

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/testkit"
)

// suites are the go test runs, in the SDK's module: the packages and the
// tests of each that take their servers from the environment.
var suites = [][]string{
	{"-run", "^TestIntegration$/^(Conformance|Exact|Keys)$", "./backend/redis/", "./backend/rueidis/"},
	{"./plans/postgres/"},
}

// TestSDKSuites runs the suites on containers. As binaries it is skipped:
// make test runs the same suites on processes of their own.
func TestSDKSuites(t *testing.T) {
	if testkit.ModeOf(t) != testkit.Containers {
		t.Skip("the kit runs binaries; make test runs these suites on processes of their own")
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "ratelimit")); err != nil {
		t.Fatalf("the SDK's module is not at %s: %v", root, err)
	}
	env := append(os.Environ(),
		"GOWORK=off",
		"SLUICE_REDIS_ADDR="+testkit.StartRedis(t).Addr(),
		"SLUICE_REDIS_CLUSTER_ADDRS="+strings.Join(testkit.StartCluster(t).Addrs(), ","),
		"SLUICE_POSTGRES_URL="+testkit.Postgres(t).ConnString(),
	)
	for _, s := range suites {
		args := append([]string{"test", "-race", "-count=1", "-timeout=15m"}, s...)
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = root, env
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		t.Logf("go %s", strings.Join(args, " "))
		if err := cmd.Run(); err != nil {
			t.Errorf("go %s: %v", strings.Join(args, " "), err)
		}
	}
}

func TestMain(m *testing.M) { os.Exit(testkit.Main(m).Run()) }
