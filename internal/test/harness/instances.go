package harness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Instances is a distributed run: processes of an instance [Program],
// started by [Start], that wait to be released by Go.
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

// maxTailLine is how much of a line the tail keeps.
const maxTailLine = 4096

func (tl *tail) add(line string) {
	if len(line) > maxTailLine {
		line = line[:maxTailLine] + "…"
	}
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

// Program is the program of a run's instances: Path, run with Args and
// with Env added to the environment. It must call [InstanceMain] when
// [IsInstance] says so, as the instance program of internal/test/servers
// does, as a command may of itself (os.Executable), and as testkit's
// check does in a test binary run again with -test.run naming the test.
type Program struct {
	Path string
	Args []string
	// Env are "KEY=value" strings set in each instance's environment,
	// after this process's own.
	Env []string
}

// instanceStartTimeout bounds the wait for every instance to connect.
const instanceStartTimeout = 30 * time.Second

// Start starts n processes of prog, each running spec, and returns once
// all have connected to Redis and wait to be released. Close kills any
// left; on an error, Start has killed those it started.
func Start(prog Program, n int, spec Spec) (*Instances, error) {
	in := &Instances{open: map[[2]int]Call{}}
	err := in.startAll(prog, n, spec)
	if err != nil {
		in.Close()
		return nil, err
	}
	return in, nil
}

func (in *Instances) startAll(prog Program, n int, spec Spec) error {
	for i := range n {
		if err := in.start(prog, i, spec); err != nil {
			return fmt.Errorf("harness: start instance %d: %w", i, err)
		}
	}
	timeout := time.After(instanceStartTimeout)
	for i, p := range in.procs {
		select {
		case err := <-p.ready:
			if err != nil {
				return fmt.Errorf("harness: instance %d: %w", i, err)
			}
		case <-timeout:
			return fmt.Errorf("harness: instance %d not ready within %v; its last lines:\n%s", i, instanceStartTimeout, p.tail.String())
		}
	}
	return nil
}

// start starts instance i and hands it spec; once started, it is in
// in.procs, so that kill ends it whatever happens next.
func (in *Instances) start(prog Program, i int, spec Spec) error {
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	cmd := exec.Command(prog.Path, prog.Args...)
	// A race-enabled program sleeps 1s before it exits unless told not to.
	cmd.Env = slices.Concat(os.Environ(), prog.Env, []string{InstanceEnv + "=" + strconv.Itoa(i), "GORACE=atexit_sleep_ms=0 " + os.Getenv("GORACE")})
	p := &instance{index: i, cmd: cmd, ready: make(chan error, 1), done: make(chan struct{})}
	cmd.Stderr = io.MultiWriter(os.Stderr, &p.tail)
	cmd.SysProcAttr = SysProcAttr()
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
	r := bufio.NewReader(stdout)
	for {
		text, err := r.ReadBytes('\n')
		if err != nil {
			if len(text) > 0 {
				p.tail.add("stdout: " + string(text))
			}
			if !errors.Is(err, io.EOF) {
				in.fail(fmt.Errorf("instance %d: reading its output: %w", p.index, err))
				// Drain the rest, so that the process never blocks on a full pipe.
				_, _ = io.Copy(io.Discard, stdout)
			}
			break
		}
		other, lineJSON, isLine := cutLine(bytes.TrimSuffix(text, []byte{'\n'}))
		if len(other) > 0 {
			p.tail.add("stdout: " + string(other))
		}
		if !isLine {
			continue
		}
		p.tail.add("stdout: " + string(lineJSON))
		var line Line
		if err := json.Unmarshal(lineJSON, &line); err != nil {
			in.fail(fmt.Errorf("instance %d wrote %q: %w", p.index, lineJSON, err))
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
	err := p.cmd.Wait()
	ready(fmt.Errorf("exited before it was ready: %v", err))
	in.mu.Lock()
	killed := p.killed
	in.mu.Unlock()
	if !killed && (err != nil || !finished) {
		in.fail(fmt.Errorf("instance %d ended without finishing: %v", p.index, err))
	}
}

// cutLine splits a line of an instance's stdout into what the program
// wrote besides, before [LinePrefix], and the JSON of the [Line] after it,
// if there is one.
func cutLine(text []byte) (other, line []byte, isLine bool) {
	i := bytes.Index(text, []byte(LinePrefix))
	if i < 0 {
		return text, nil, false
	}
	return text[:i], text[i+len(LinePrefix):], true
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
func (in *Instances) Go() error {
	for i := range in.procs {
		if err := in.Release(i); err != nil {
			return err
		}
	}
	return nil
}

// Release releases instance i alone from its next hold, as Go does, so
// that it runs its next phase while the others hold. A killed instance
// is left alone.
func (in *Instances) Release(i int) error {
	p := in.procs[i]
	in.mu.Lock()
	killed := p.killed
	p.released++
	in.mu.Unlock()
	if killed {
		return nil
	}
	if _, err := io.WriteString(p.stdin, GoLine); err != nil {
		return fmt.Errorf("harness: release instance %d: %w; its last lines:\n%s", i, err, p.tail.String())
	}
	return nil
}

// WaitHeld waits until every instance not killed holds at the hold that
// its next release (Go or Release) ends: every attempt before it has
// started, and none after it will until then. It returns an error if an
// instance ends first, or after instanceRunTimeout.
func (in *Instances) WaitHeld() error {
	return in.waitUntil("waiting for the instances to hold", in.notHeld)
}

// WaitStarted waits until instance i has started n calls in all, or holds,
// or was killed. It returns an error if the instance ends first, or after
// instanceRunTimeout.
func (in *Instances) WaitStarted(i, n int) error {
	p := in.procs[i]
	return in.waitUntil(fmt.Sprintf("waiting for instance %d to start %d calls", i, n), func() (string, error) {
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

// Returned is how many calls the instances have reported returning, so
// far.
func (in *Instances) Returned() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.calls)
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
// phase. It returns an error if an instance ends first, or after
// instanceRunTimeout.
func (in *Instances) WaitIdle() error {
	return in.waitUntil("waiting for the calls in flight", in.busy)
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

// waitUntil polls pending until it reports nothing left; it returns an
// error, saying what it waited for, when pending returns one, or after
// instanceRunTimeout with what pending last reported.
func (in *Instances) waitUntil(what string, pending func() (string, error)) error {
	deadline := time.Now().Add(instanceRunTimeout)
	for {
		left, err := pending()
		switch {
		case err != nil:
			return fmt.Errorf("harness: %s: %w", what, err)
		case left == "":
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("harness: %s: after %v, %s", what, instanceRunTimeout, left)
		}
		time.Sleep(time.Millisecond)
	}
}

// Pid returns the process id of instance i, for a caller that stops and
// continues it (SIGSTOP, SIGCONT).
func (in *Instances) Pid(i int) int { return in.procs[i].cmd.Process.Pid }

// Kill kills instance i with SIGKILL mid-run, and returns once it is dead.
// Its calls in flight may have taken effect; Wait returns them with Err
// [ErrUnreported]. Killing an instance that has already exited is an
// error in the caller's design, not a fault injected: a caller must kill
// an instance that cannot have finished, such as one that holds or one
// whose current phase ends in a hold.
func (in *Instances) Kill(i int) error {
	p := in.procs[i]
	exited := func() error {
		<-p.done
		return fmt.Errorf("harness: Kill(%d): the instance had exited already (%v), so the kill struck nothing; kill an instance that holds (Spec.Holds). Its last lines:\n%s",
			i, p.cmd.ProcessState, p.tail.String())
	}
	select {
	case <-p.done:
		return exited()
	default:
	}
	in.mu.Lock()
	p.killed = true
	in.mu.Unlock()
	if err := p.cmd.Process.Kill(); err != nil {
		return exited()
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(instanceStartTimeout):
		return fmt.Errorf("harness: Kill(%d): not reaped within %v", i, instanceStartTimeout)
	}
}

// instanceRunTimeout bounds a run from Go to the last instance's exit.
const instanceRunTimeout = 5 * time.Minute

// Wait waits for every instance to finish or die and returns the calls
// they reported, in the order they arrived, then those that killed
// instances started but never reported. It returns an error if an
// instance not killed by Kill failed to finish its calls.
func (in *Instances) Wait() ([]Call, error) {
	timeout := time.After(instanceRunTimeout)
	for i, p := range in.procs {
		select {
		case <-p.done:
		case <-timeout:
			return nil, fmt.Errorf("harness: instance %d still running after %v", i, instanceRunTimeout)
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := errors.Join(in.errs...); err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	for _, c := range in.open {
		c.Err = ErrUnreported
		in.calls = append(in.calls, c)
	}
	clear(in.open)
	return in.calls, nil
}

// Close kills every process still running and waits for its reader. A
// run's owner calls it once, whatever happened; it is safe after Wait.
func (in *Instances) Close() {
	for _, p := range in.procs {
		_ = p.cmd.Process.Kill() // fails only when it has exited already
		_ = p.stdin.Close()
		<-p.done
	}
}
