package testkit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// InstancePackage is the import path of the instance program that
// [BuildInstance] builds: one sluice client process of a distributed run.
const InstancePackage = "github.com/sluicehq/sluice/internal/testkit/instance"

// Backends an [InstanceSpec] may name.
const (
	// BackendGoRedis is backend/redis on a go-redis client.
	BackendGoRedis = "goredis"
	// BackendRueidis is backend/rueidis on a rueidis client.
	BackendRueidis = "rueidis"
	// BackendRacy reads the bucket with GET, decides in Go with
	// ratelimit.Apply and writes it back with SET: deliberately not
	// atomic, so that a checker can be shown to catch it. Tests only.
	BackendRacy = "racy"
)

// InstanceSpec is what every process of a distributed run does: it connects
// to Redis with Backend, then, once released, runs Goroutines goroutines
// that make Attempts calls in all on the bucket at Key with Config.
type InstanceSpec struct {
	// Backend is BackendGoRedis, BackendRueidis or BackendRacy.
	Backend string
	// Addrs is the standalone server's address, or the cluster's nodes.
	Addrs []string
	// Cluster says that Addrs are the nodes of a Redis Cluster.
	Cluster bool
	// Key and Config name the bucket; every call uses them.
	Key    string
	Config ratelimit.Config
	// Requests are the calls to make, in turn: attempt i of the instance
	// makes Requests[i % len(Requests)]. Empty means Consume of 1 token.
	Requests []ratelimit.Request
	// Goroutines make the calls concurrently, taking the next attempt as
	// each finishes one; Attempts is this instance's total.
	Goroutines, Attempts int
	// Timeout bounds each call; 0 means 10s.
	Timeout time.Duration
}

// Call is one call an instance made, as it reports it.
type Call struct {
	// Instance is the index of the process; Goroutine, of the goroutine in it.
	Instance, Goroutine int
	// Attempt is the instance's attempt number: the call made
	// Spec.Requests[Attempt % len(Spec.Requests)].
	Attempt int
	// Start and End are the wall-clock times, in ns since the Unix epoch,
	// just before the call and just after it returned. Every instance runs
	// on the test's machine, so they read one clock.
	Start, End int64
	// Decision is the call's decision; meaningless when Err is set.
	Decision ratelimit.Decision
	// Err is the error the call returned, or "", or [ErrUnreported]. A call
	// with an error may or may not have taken effect.
	Err string
}

// ErrUnreported is the Err of a call that an instance started but never
// reported, because it died; End is then 0.
const ErrUnreported = "unreported: the instance died during the call"

// InstanceLine is one line, in JSON, that the instance program writes on
// stdout: Ready once connected; then for each call, Started (Instance,
// Goroutine, Attempt and Start) just before it and Call as it returns; then
// Done. Or Fatal when it gives up.
type InstanceLine struct {
	Ready   bool   `json:",omitempty"`
	Done    bool   `json:",omitempty"`
	Fatal   string `json:",omitempty"`
	Started *Call  `json:",omitempty"`
	Call    *Call  `json:",omitempty"`
}

// InstanceGo is the line the harness writes on an instance's stdin, after
// the spec, to release it.
const InstanceGo = "go\n"

// BuildInstance builds the instance program into dir and returns its path.
// When the calling binary has the race detector, so does the program.
func BuildInstance(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("testkit: the go command builds the instance program: %w", err)
	}
	bin := filepath.Join(dir, "sluice-instance")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command(goBin, append(args, InstancePackage)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("testkit: go build %s: %w\n%s", InstancePackage, err, out)
	}
	return bin, nil
}

// Instances is a distributed run: processes of the instance program,
// started by [StartInstances], that wait to be released by Go.
type Instances struct {
	procs []*instance

	mu    sync.Mutex
	calls []Call
	open  map[[2]int]Call // started, not yet reported, by instance and attempt
	errs  []error
}

// instance is one process and what it has reported.
type instance struct {
	index  int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	ready  chan error    // one value: nil once connected, else why not
	done   chan struct{} // closed once its stdout is drained and it is reaped
	killed bool
}

// instanceStartTimeout bounds the wait for every instance to connect.
const instanceStartTimeout = 30 * time.Second

// StartInstances starts n processes of the program at bin (from
// [BuildInstance]), each running spec, and returns once all have connected
// to Redis and wait to be released. t.Cleanup kills any left.
func StartInstances(t testing.TB, bin string, n int, spec InstanceSpec) *Instances {
	t.Helper()
	in := &Instances{open: map[[2]int]Call{}}
	t.Cleanup(in.kill)
	for i := range n {
		if err := in.start(bin, i, spec); err != nil {
			t.Fatalf("testkit: start instance %d: %v", i, err)
		}
	}
	timeout := time.After(instanceStartTimeout)
	for i, p := range in.procs {
		select {
		case err := <-p.ready:
			if err != nil {
				t.Fatalf("testkit: instance %d: %v", i, err)
			}
		case <-timeout:
			t.Fatalf("testkit: instance %d not ready within %v", i, instanceStartTimeout)
		}
	}
	return in
}

// start starts instance i and hands it spec; once started, it is in
// in.procs, so that kill ends it whatever happens next.
func (in *Instances) start(bin string, i int, spec InstanceSpec) error {
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, strconv.Itoa(i))
	// A race-enabled program sleeps 1s before it exits unless told not to.
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = sysProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &instance{index: i, cmd: cmd, stdin: stdin, ready: make(chan error, 1), done: make(chan struct{})}
	in.procs = append(in.procs, p)
	go in.read(p, stdout)
	// The pipe holds the spec until the program reads it.
	_, err = stdin.Write(append(specJSON, '\n'))
	return err
}

// read collects p's lines until its stdout closes, then reaps it.
func (in *Instances) read(p *instance, stdout io.Reader) {
	defer close(p.done)
	readied, finished := false, false
	ready := func(err error) {
		if !readied {
			readied = true
			p.ready <- err
		}
	}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var line InstanceLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			in.fail(fmt.Errorf("instance %d wrote %q: %w", p.index, sc.Text(), err))
			continue
		}
		switch {
		case line.Fatal != "":
			err := fmt.Errorf("instance %d: %s", p.index, line.Fatal)
			ready(err)
			in.fail(err)
		case line.Ready:
			ready(nil)
		case line.Done:
			finished = true
		case line.Started != nil:
			c := *line.Started
			in.mu.Lock()
			in.open[[2]int{c.Instance, c.Attempt}] = c
			in.mu.Unlock()
		case line.Call != nil:
			c := *line.Call
			in.mu.Lock()
			delete(in.open, [2]int{c.Instance, c.Attempt})
			in.calls = append(in.calls, c)
			in.mu.Unlock()
		}
	}
	if err := sc.Err(); err != nil {
		in.fail(fmt.Errorf("instance %d: reading its output: %w", p.index, err))
		// Drain the rest, so that the process never blocks on a full pipe.
		_, _ = io.Copy(io.Discard, stdout)
	}
	err := p.cmd.Wait()
	ready(fmt.Errorf("exited before it was ready: %v", err))
	in.mu.Lock()
	killed := p.killed
	in.mu.Unlock()
	if !killed && (err != nil || !finished) {
		in.fail(fmt.Errorf("instance %d ended without finishing: %v", p.index, err))
	}
}

// fail records an error for Wait to report.
func (in *Instances) fail(err error) {
	in.mu.Lock()
	in.errs = append(in.errs, err)
	in.mu.Unlock()
}

// Go releases every instance at once.
func (in *Instances) Go(t testing.TB) {
	t.Helper()
	for i, p := range in.procs {
		if _, err := io.WriteString(p.stdin, InstanceGo); err != nil {
			t.Fatalf("testkit: release instance %d: %v", i, err)
		}
	}
}

// Calls returns how many calls the instances have reported so far.
func (in *Instances) Calls() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.calls)
}

// WaitCalls waits until the instances have reported n calls, or until
// timeout, which fails t.
func (in *Instances) WaitCalls(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for in.Calls() < n {
		if time.Now().After(deadline) {
			t.Fatalf("testkit: %d calls reported within %v, waiting for %d", in.Calls(), timeout, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Kill kills instance i with SIGKILL mid-run. Its calls in flight may have
// taken effect; Wait returns them with Err [ErrUnreported].
func (in *Instances) Kill(t testing.TB, i int) {
	t.Helper()
	p := in.procs[i]
	in.mu.Lock()
	p.killed = true
	in.mu.Unlock()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("testkit: kill instance %d: %v", i, err)
	}
}

// instanceRunTimeout bounds a run from Go to the last instance's exit.
const instanceRunTimeout = 5 * time.Minute

// Wait waits for every instance to finish or die and returns the calls
// they reported, in the order they arrived, then those that killed
// instances started but never reported. It fails t if
// an instance not killed by Kill failed to finish its calls.
func (in *Instances) Wait(t testing.TB) []Call {
	t.Helper()
	timeout := time.After(instanceRunTimeout)
	for i, p := range in.procs {
		select {
		case <-p.done:
		case <-timeout:
			t.Fatalf("testkit: instance %d still running after %v", i, instanceRunTimeout)
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := errors.Join(in.errs...); err != nil {
		t.Fatalf("testkit: %v", err)
	}
	for _, c := range in.open {
		c.Err = ErrUnreported
		in.calls = append(in.calls, c)
	}
	clear(in.open)
	return in.calls
}

// kill ends every process still running and waits for its reader.
func (in *Instances) kill() {
	for _, p := range in.procs {
		_ = p.cmd.Process.Kill() // fails only when it has exited already
		_ = p.stdin.Close()
		<-p.done
	}
}
