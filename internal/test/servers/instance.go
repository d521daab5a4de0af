package servers

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/test/harness"
)

// InstancePackage is the import path of the instance program that
// [BuildInstance] builds: one sluice client process of a distributed run,
// which is all [harness.InstanceMain].
const InstancePackage = "github.com/sluicehq/sluice/internal/test/servers/instance"

// InstanceBuild builds the instance program once for a test binary, for
// the tests that start instances. Its zero value is ready to use; TestMain
// calls Remove after the tests.
type InstanceBuild struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// Bin builds the program on its first call, into a temporary folder, and
// returns its path; it fails t if the build failed.
func (b *InstanceBuild) Bin(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "sluice-instance-"); b.err == nil {
			b.bin, b.err = BuildInstance(b.dir)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

// Remove removes what Bin built.
func (b *InstanceBuild) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// BuildInstance builds the instance program into dir and returns its path.
// When the calling binary has the race detector, so does the program.
func BuildInstance(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("servers: the go command builds the instance program: %w", err)
	}
	bin := filepath.Join(dir, "sluice-instance")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command(goBin, append(args, InstancePackage)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("servers: go build %s: %w\n%s", InstancePackage, err, out)
	}
	return bin, nil
}

// Instances is a distributed run of the instance program, started by
// [StartInstances]: a [harness.Instances] whose methods fail the test
// instead of returning an error.
type Instances struct {
	run *harness.Instances
}

// StartInstances starts n processes of the program at bin (from
// [BuildInstance]), each running spec, and returns once all have connected
// to Redis and wait to be released; see [harness.Start]. t.Cleanup kills
// any left.
func StartInstances(t testing.TB, bin string, n int, spec harness.Spec) *Instances {
	t.Helper()
	in, err := harness.Start(harness.Program{Path: bin}, n, spec)
	if err != nil {
		t.Fatalf("servers: %v", err)
	}
	t.Cleanup(in.Close)
	return &Instances{in}
}

// Go is [harness.Instances.Go].
func (in *Instances) Go(t testing.TB) {
	t.Helper()
	must(t, in.run.Go())
}

// Release is [harness.Instances.Release].
func (in *Instances) Release(t testing.TB, i int) {
	t.Helper()
	must(t, in.run.Release(i))
}

// WaitHeld is [harness.Instances.WaitHeld].
func (in *Instances) WaitHeld(t testing.TB) {
	t.Helper()
	must(t, in.run.WaitHeld())
}

// WaitStarted is [harness.Instances.WaitStarted].
func (in *Instances) WaitStarted(t testing.TB, i, n int) {
	t.Helper()
	must(t, in.run.WaitStarted(i, n))
}

// WaitIdle is [harness.Instances.WaitIdle].
func (in *Instances) WaitIdle(t testing.TB) {
	t.Helper()
	must(t, in.run.WaitIdle())
}

// Kill is [harness.Instances.Kill].
func (in *Instances) Kill(t testing.TB, i int) {
	t.Helper()
	must(t, in.run.Kill(i))
}

// Stop stops instance i with SIGSTOP mid-run and, on Linux, returns once
// the kernel reports every thread of it stopped: it then runs no code,
// and its monotonic clock runs on, until [Instances.Continue]. The test's
// cleanup continues it if the test does not.
func (in *Instances) Stop(t testing.TB, i int) {
	t.Helper()
	pid := in.run.Pid(i)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("servers: SIGSTOP instance %d: %v", i, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) // an instance gone is not stopped
	deadline := time.Now().Add(readyTimeout)
	for {
		ok, err := processStopped(pid)
		switch {
		case err != nil:
			t.Fatalf("servers: instance %d after SIGSTOP: %v", i, err)
		case ok:
			return
		case time.Now().After(deadline):
			t.Fatalf("servers: instance %d not stopped %v after SIGSTOP", i, readyTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// Continue continues instance i, stopped by [Instances.Stop], with
// SIGCONT.
func (in *Instances) Continue(t testing.TB, i int) {
	t.Helper()
	if err := syscall.Kill(in.run.Pid(i), syscall.SIGCONT); err != nil {
		t.Fatalf("servers: SIGCONT instance %d: %v", i, err)
	}
}

// Wait is [harness.Instances.Wait].
func (in *Instances) Wait(t testing.TB) []harness.Call {
	t.Helper()
	calls, err := in.run.Wait()
	must(t, err)
	return calls
}

// must fails t with err, if there is one.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// WrapInstances gives the methods of [Instances] to a run started by
// [harness.Start] (as [harness.Measure] does), for a test that drives it.
// The run's owner closes it.
func WrapInstances(in *harness.Instances) *Instances { return &Instances{in} }
