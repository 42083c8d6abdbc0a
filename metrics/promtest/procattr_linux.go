package promtest

import "syscall"

// procAttr makes the kernel kill the server when the test binary dies
// (a go test timeout, say), so that no prometheus process outlives it.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
