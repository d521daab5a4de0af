package testkit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
	// LowLatency builds the client with the backend's LowLatency helper,
	// as docs/operations.md tells a user to, instead of the harness's
	// plain settings (no retries, the context's deadline obeyed).
	LowLatency bool
	// Policy, if set, puts the backend behind a fail policy.
	Policy *InstancePolicy
	// Shard, if set, splits Key into sub-buckets with the sharding
	// package, outside the fail policy if there is one (as sharding's
	// package doc advises).
	Shard *InstanceShard
	// Pause is how long each goroutine waits after a call before it takes
	// the next attempt: a steady load rather than a flood.
	Pause time.Duration
	// Settle makes the instance, after its attempts, make Estimate calls
	// of 1 token, 50ms apart, until one is decided by the store (not
	// Degraded) or 30s have passed, when it gives up as Fatal. With a
	// policy in Local mode, the store has then been charged every debt of
	// the key's share. Settle calls take nothing and are not reported.
	Settle bool
	// Holds divide the attempts into phases, so that a test can act
	// between them without racing the calls: at each hold, in order, no
	// goroutine starts attempt At or a later one until the harness
	// releases the hold ([Instances.Go], [Instances.Release]). Once every attempt before At
	// has started (some may still be in flight, until
	// [Instances.WaitIdle]), the instance reports that it holds, which
	// [Instances.WaitHeld] waits for. Each At must be after the previous
	// one and before Attempts.
	Holds []Hold
}

// InstancePolicy is the fail policy of [InstanceSpec.Policy]: the
// failpolicy.Wrap of the backend, with these options where they are set
// and failpolicy's defaults where they are zero.
type InstancePolicy struct {
	// Mode is the failpolicy.Mode, by name: "Open", "Closed" or "Local".
	Mode string
	// Timeout is the WithTimeout.
	Timeout time.Duration
	// Instances is the WithInstances.
	Instances int
}

// InstanceShard is the split of [InstanceSpec.Shard]: sharding.New of the
// backend (behind its policy, if any) with the rule
// sharding.Keys(N, Key).WithRetries(Retries).
type InstanceShard struct {
	N, Retries int
}

// Hold is one of [InstanceSpec.Holds].
type Hold struct {
	// At is the first attempt held back.
	At int
	// Timeout bounds each call from attempt At to the next hold; 0
	// means the spec's Timeout.
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
// Goroutine, Attempt and Start) just before it and Call as it returns,
// with Held at each of the spec's holds; then Done. Or Fatal when it gives
// up.
type InstanceLine struct {
	Ready   bool   `json:",omitempty"`
	Held    bool   `json:",omitempty"`
	Done    bool   `json:",omitempty"`
	Fatal   string `json:",omitempty"`
	Started *Call  `json:",omitempty"`
	Call    *Call  `json:",omitempty"`
}

// InstanceGo is the line the harness writes on an instance's stdin, after
// the spec, to release it, and again to release each of its holds.
const InstanceGo = "go\n"

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
	index int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ready chan error    // one value: nil once connected, else why not
	done  chan struct{} // closed once its stdout is drained and it is reaped
	tail  tail          // its last lines, for failure messages

	// Guarded by Instances.mu.
	killed   bool
	released int // the gos written to it
	held     int // the holds it has reported
	started  int // the calls it has reported starting
}

// tailLines is how many of an instance's last lines failures show.
const tailLines = 20

// tail keeps the last lines an instance wrote on stdout and stderr. As an
// io.Writer it takes stderr, in pieces that need not end lines.
type tail struct {
	mu      sync.Mutex
	lines   []string
	partial []byte // stderr written since its last newline
}

func (tl *tail) add(line string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.addLocked(line)
}

func (tl *tail) addLocked(line string) {
	if len(tl.lines) == tailLines {
		tl.lines = slices.Delete(tl.lines, 0, 1)
	}
	tl.lines = append(tl.lines, line)
}

func (tl *tail) Write(p []byte) (int, error) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.partial = append(tl.partial, p...)
	for {
		i := bytes.IndexByte(tl.partial, '\n')
		if i < 0 {
			break
		}
		tl.addLocked("stderr: " + string(tl.partial[:i]))
		tl.partial = tl.partial[i+1:]
	}
	if len(tl.partial) > 4096 {
		tl.addLocked("stderr: " + string(tl.partial))
		tl.partial = nil
	}
	return len(p), nil
}

func (tl *tail) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	lines := tl.lines
	if len(tl.partial) > 0 {
		lines = append(slices.Clip(lines), "stderr: "+string(tl.partial))
	}
	if len(lines) == 0 {
		return "  (none)"
	}
	return "  " + strings.Join(lines, "\n  ")
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
	p := &instance{index: i, cmd: cmd, ready: make(chan error, 1), done: make(chan struct{})}
	cmd.Stderr = io.MultiWriter(os.Stderr, &p.tail)
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
	p.stdin = stdin
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
		p.tail.add("stdout: " + sc.Text())
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
		case line.Held:
			in.mu.Lock()
			p.held++
			in.mu.Unlock()
		case line.Done:
			finished = true
		case line.Started != nil:
			c := *line.Started
			in.mu.Lock()
			p.started++
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

// Go releases every instance not killed at once: first from the start,
// then from each of the spec's holds in turn, once [Instances.WaitHeld] has
// seen them all hold there.
func (in *Instances) Go(t testing.TB) {
	t.Helper()
	for i := range in.procs {
		in.Release(t, i)
	}
}

// Release releases instance i alone from its next hold, as Go does, so
// that it runs its next phase while the others hold. A killed instance
// is left alone.
func (in *Instances) Release(t testing.TB, i int) {
	t.Helper()
	p := in.procs[i]
	in.mu.Lock()
	killed := p.killed
	p.released++
	in.mu.Unlock()
	if killed {
		return
	}
	if _, err := io.WriteString(p.stdin, InstanceGo); err != nil {
		t.Fatalf("testkit: release instance %d: %v; its last lines:\n%s", i, err, p.tail.String())
	}
}

// WaitHeld waits until every instance not killed holds at the hold that
// its next release (Go or Release) ends: every attempt before it has
// started, and none after it will until then. It fails t if an instance
// ends first, or after instanceRunTimeout.
func (in *Instances) WaitHeld(t testing.TB) {
	t.Helper()
	in.waitUntil(t, "waiting for the instances to hold", in.notHeld)
}

// WaitStarted waits until instance i has started n calls in all, or holds,
// or was killed. It fails t if the instance ends first, or after
// instanceRunTimeout.
func (in *Instances) WaitStarted(t testing.TB, i, n int) {
	t.Helper()
	p := in.procs[i]
	in.waitUntil(t, fmt.Sprintf("waiting for instance %d to start %d calls", i, n), func() (string, error) {
		in.mu.Lock()
		defer in.mu.Unlock()
		if p.killed || p.started >= n || p.held >= p.released {
			return "", nil
		}
		select {
		case <-p.done:
			return "", fmt.Errorf("instance %d ended after %d calls (%v); its last lines:\n%s", i, p.started, p.cmd.ProcessState, p.tail.String())
		default:
			return fmt.Sprintf("it has started %d", p.started), nil
		}
	})
}

// notHeld describes an instance not killed that has yet to report the
// hold its next release ends, or returns "" if none is left. An instance
// that ended before it held is an error.
func (in *Instances) notHeld() (string, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, p := range in.procs {
		if p.killed || p.held >= p.released {
			continue
		}
		select {
		case <-p.done:
			return "", fmt.Errorf("instance %d ended before it held (%v); its last lines:\n%s", p.index, p.cmd.ProcessState, p.tail.String())
		default:
			return fmt.Sprintf("instance %d does not hold; its last lines:\n%s", p.index, p.tail.String()), nil
		}
	}
	return "", nil
}

// WaitIdle waits until no instance not killed has a call in flight: every
// call started so far has returned. Once the instances hold, that makes
// the run quiet, so that a fault struck then meets no call of an earlier
// phase. It fails t if an instance ends first, or after
// instanceRunTimeout.
func (in *Instances) WaitIdle(t testing.TB) {
	t.Helper()
	in.waitUntil(t, "waiting for the calls in flight", in.busy)
}

// busy says how many calls the instances not killed have in flight, or
// returns "" if none. An instance that ended with calls in flight is an
// error.
func (in *Instances) busy() (string, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	n := 0
	for key := range in.open {
		p := in.procs[key[0]]
		if p.killed {
			continue
		}
		select {
		case <-p.done:
			return "", fmt.Errorf("instance %d ended with calls in flight (%v); its last lines:\n%s", p.index, p.cmd.ProcessState, p.tail.String())
		default:
		}
		n++
	}
	if n == 0 {
		return "", nil
	}
	return fmt.Sprintf("%d calls in flight", n), nil
}

// waitUntil polls pending until it reports nothing left; it fails t,
// saying what it waited for, when pending returns an error, or after
// instanceRunTimeout with what pending last reported.
func (in *Instances) waitUntil(t testing.TB, what string, pending func() (string, error)) {
	t.Helper()
	deadline := time.Now().Add(instanceRunTimeout)
	for {
		left, err := pending()
		switch {
		case err != nil:
			t.Fatalf("testkit: %s: %v", what, err)
		case left == "":
			return
		case time.Now().After(deadline):
			t.Fatalf("testkit: %s: after %v, %s", what, instanceRunTimeout, left)
		}
		time.Sleep(time.Millisecond)
	}
}

// Kill kills instance i with SIGKILL mid-run, and returns once it is dead.
// Its calls in flight may have taken effect; Wait returns them with Err
// [ErrUnreported]. Killing an instance that has already exited is an
// error in the test's design, not a fault injected: a test must kill an
// instance that cannot have finished, such as one that holds or one whose
// current phase ends in a hold.
func (in *Instances) Kill(t testing.TB, i int) {
	t.Helper()
	p := in.procs[i]
	exited := func() {
		t.Helper()
		<-p.done
		t.Fatalf("testkit: Kill(%d): the instance had exited already (%v), so the kill struck nothing; kill an instance that holds (InstanceSpec.Holds). Its last lines:\n%s",
			i, p.cmd.ProcessState, p.tail.String())
	}
	select {
	case <-p.done:
		exited()
	default:
	}
	in.mu.Lock()
	p.killed = true
	in.mu.Unlock()
	if err := p.cmd.Process.Kill(); err != nil {
		exited()
	}
	select {
	case <-p.done:
	case <-time.After(instanceStartTimeout):
		t.Fatalf("testkit: Kill(%d): not reaped within %v", i, instanceStartTimeout)
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
