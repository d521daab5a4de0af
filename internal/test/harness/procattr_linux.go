package harness

import "syscall"

// SysProcAttr is the SysProcAttr of a child process that must not outlive
// its parent: the kernel kills it when the parent dies without cleaning up
// (a test's -timeout abort, a panic in another goroutine, SIGKILL), so no
// instance, and no server that package servers starts, is left behind.
//
// Pdeathsig follows the OS thread that started the child, not the process.
// Go only ends a thread when a goroutine exits while locked to it; the
// goroutine that starts a child is the one whose cleanups stop it, so the
// signal never fires early.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
