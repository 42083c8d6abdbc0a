package testproc

import "syscall"

// procAttr makes the kernel kill the server when the test binary dies
// (a go test timeout, say), so that no server outlives it.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
