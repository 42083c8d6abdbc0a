//go:build !linux

package testproc

import "syscall"

// procAttr returns nil: only Linux can tie a child's life to its parent's.
func procAttr() *syscall.SysProcAttr { return nil }
