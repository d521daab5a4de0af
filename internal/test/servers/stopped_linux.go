package servers

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// stopped reports whether every thread of the server's process is stopped
// by a signal, as the kernel reports it in /proc: once it is, the server
// runs no more code until SIGCONT.
func (r *Redis) stopped() (bool, error) { return processStopped(r.cmd.Process.Pid) }

// processStopped reports whether every thread of the process pid is
// stopped by a signal, as /proc reports it.
func processStopped(pid int) (bool, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false, fmt.Errorf("no threads of pid %d in /proc (%v)", pid, err)
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(task)
		if err != nil {
			return false, err
		}
		// The state follows the command, which is in parentheses and may
		// itself hold any character.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) {
			return false, fmt.Errorf("%s: no state in %q", task, stat)
		}
		if state := stat[i+2]; state != 'T' && state != 't' {
			return false, nil
		}
	}
	return true, nil
}
