//go:build !linux

package harness

import "syscall"

// SysProcAttr returns nil: only Linux can tie a child's life to its
// parent's, so elsewhere a crashed run may leave children behind.
func SysProcAttr() *syscall.SysProcAttr { return nil }
