//go:build unix

package measure

import (
	"syscall"
	"time"
)

// ProcessCPU is the user and system CPU time this process has used, in all
// its threads: the client's share of a decision's cost.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
