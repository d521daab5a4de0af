package servers

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/test/harness"
)

// readyTimeout bounds the wait for a new server's first answer;
// redis-server without data to load answers within milliseconds, but CI
// machines stall.
const readyTimeout = 10 * time.Second

// logTailLines is how much of a server's log failures show: redis-server
// logs its reason to exit last.
const logTailLines = 30

// errPortInUse marks a launch that failed because another process took a
// port between FreePorts and redis-server's bind; a retry with new ports may
// succeed.
var errPortInUse = errors.New("port in use")

// argv puts the defaults first so that the caller's args override them.
func (r *Redis) argv() []string {
	if r.master != "" {
		// Sentinel rewrites its config file, so it must have one of its own.
		return []string{r.sentinelConf(), "--sentinel", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir}
	}
	argv := []string{
		"--port", strconv.Itoa(r.port),
		"--bind", "127.0.0.1",
		"--dir", r.dir,
		"--save", "",
		"--appendonly", "no",
	}
	if r.busPort != 0 {
		argv = append(argv,
			"--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(r.busPort),
			"--cluster-config-file", filepath.Join(r.dir, "nodes.conf"),
			// Far longer than a test pauses a node for, so that the
			// others never mark it failed: a master without replicas that
			// was marked failed keeps the cluster down long after it
			// answers again.
			"--cluster-node-timeout", "10000",
		)
	}
	return append(argv, r.args...)
}

func (r *Redis) logPath() string { return filepath.Join(r.dir, "redis.log") }

// sentinelConf writes a Sentinel's config file, unless a Restart finds the
// one its predecessor rewrote, and returns its path.
func (r *Redis) sentinelConf() string {
	path := filepath.Join(r.dir, "sentinel.conf")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	// Any error shows when redis-server cannot read the file.
	_ = os.WriteFile(path, []byte(SentinelConfig(r.master)), 0o644)
	return path
}

// SentinelConfig is the config file of a Sentinel that monitors the server
// at master (host:port) as [SentinelMaster], with a quorum of one.
func SentinelConfig(master string) string {
	host, port, _ := net.SplitHostPort(master)
	return fmt.Sprintf("sentinel monitor %s %s %s 1\n", SentinelMaster, host, port)
}

// launch starts redis-server on r's ports and waits until it answers.
// When it fails, the process is gone and the error carries the log.
func (r *Redis) launch() error {
	out, err := os.OpenFile(r.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close() // the child has its own descriptor
	info, err := out.Stat()
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin, r.argv()...)
	// Without --logfile redis-server logs to stdout; config errors go to
	// stderr. Files rather than pipes, so no goroutines copy output.
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = harness.SysProcAttr()
	exited, err := startWatched(cmd)
	if err != nil {
		return err
	}
	r.cmd, r.exited = cmd, exited

	if err := r.waitReady(); err != nil {
		r.kill()
		tail := r.logTail(info.Size())
		if strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w: %w", errPortInUse, err)
		}
		return fmt.Errorf("%w; log:\n%s", err, tail)
	}
	return nil
}

// waitReady polls until the server answers, exits or runs out of time.
func (r *Redis) waitReady() error {
	return pollReady("redis-server", r.Addr(), readyTimeout, r.cmd, r.exited, func() error { return probe(r.Addr(), r.cmd.Process.Pid) })
}

// startWatched starts cmd and returns a channel closed once it has exited
// and been reaped.
func startWatched(cmd *exec.Cmd) (chan struct{}, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait() // the exit status is in cmd.ProcessState
		close(exited)
	}()
	return exited, nil
}

// pollReady polls probe until it succeeds, the server's process (cmd,
// from startWatched with exited) exits, or timeout passes. name and addr
// name the server in its errors.
func pollReady(name, addr string, timeout time.Duration, cmd *exec.Cmd, exited <-chan struct{}, probe func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := probe()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer from %s within %v: %w", addr, timeout, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("%s on %s exited: %v", name, addr, cmd.ProcessState)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// probe checks that the server on addr is process pid and answers: after
// redis-server fails to bind, the port may belong to another test's server,
// which would answer a PING just as well. It does not use go-redis: a
// go-redis pool remembers dial errors and redials from a goroutine that
// outlives Close by up to a second, which goleak reports as a leak.
func probe(addr string, pid int) error {
	conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Short, so that waitReady soon notices when its process has exited
	// while something else holds the port without answering.
	if err := conn.SetDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
		return err
	}
	// Redis takes a plain text line as an inline command.
	if _, err := conn.Write([]byte("INFO server\r\n")); err != nil {
		return err
	}
	replies := bufio.NewReader(conn)
	for {
		line, err := replies.ReadString('\n')
		if err != nil {
			return fmt.Errorf("INFO server on %s: %w", addr, err)
		}
		if strings.HasPrefix(line, "-") {
			return fmt.Errorf("INFO server on %s: %s", addr, strings.TrimSpace(line))
		}
		if id, ok := strings.CutPrefix(line, "process_id:"); ok {
			if id = strings.TrimSpace(id); id != strconv.Itoa(pid) {
				return fmt.Errorf("%s is served by pid %s, not by redis-server pid %d", addr, id, pid)
			}
			return nil
		}
	}
}

// logTail returns the last lines the server logged after byte offset from.
func (r *Redis) logTail(from int64) string {
	b, err := os.ReadFile(r.logPath())
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	lines := strings.SplitAfter(string(b[min(from, int64(len(b))):]), "\n")
	return strings.Join(lines[max(0, len(lines)-logTailLines):], "")
}
