//go:build !linux

package testkit

import "syscall"

// sysProcAttr returns nil: only Linux can tie the child's life to the test
// binary's, so elsewhere a crashed test run may leave servers behind.
func sysProcAttr() *syscall.SysProcAttr { return nil }
