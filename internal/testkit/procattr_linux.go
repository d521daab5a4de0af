package testkit

import "syscall"

// sysProcAttr has the kernel kill redis-server when the test binary dies
// without running its cleanups (a -timeout abort, a panic in another
// goroutine, SIGKILL), so no server outlives the test run.
//
// Pdeathsig follows the OS thread that started the child, not the process.
// Go only ends a thread when a goroutine exits while locked to it; the test
// goroutine that starts servers is the one whose cleanups stop them, so the
// signal never fires early.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
