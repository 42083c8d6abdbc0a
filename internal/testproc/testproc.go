// Package testproc runs a server binary as a test's child process, for
// the test-support packages that start real servers (metrics/promtest:
// Prometheus; live/redistest: redis-server): the binary found on PATH
// ([Find]: the test is skipped without it, and fails under CI=true), a
// free port of 127.0.0.1 ([FreePort]), its output kept ([Output]), and the
// process ([Start]) stopped with SIGTERM then SIGKILL ([Proc.Stop]) and, on
// Linux, killed with the test binary (a go test timeout, say), so that no
// server outlives its test (procattr_linux.go; procattr_other.go elsewhere).
package testproc

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Find returns the path of the binary name on PATH. Without it the test is
// skipped with the command that installs it (installHint), or fails when
// the environment has CI=true (the CI image must install it); who names
// the caller in that failure.
func Find(t testing.TB, who, name, installHint string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s: %s not found on PATH with CI=true (the CI image must install it: %s): %v", who, name, installHint, err)
		}
		t.Skipf("%s not installed; install with: %s", name, installHint)
	}
	return bin
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Output is a process's stdout and stderr, safe for the process's writers
// and the test's readers.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// Proc is a started process, waited for on a goroutine of its own.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's, once done is closed
}

// Start starts cmd, tied to the test binary's life where the system allows
// it (Linux: the kernel kills it when the test binary dies).
func Start(cmd *exec.Cmd) (*Proc, error) {
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process exited (exec.Cmd.Wait's error); call it after
// Done is closed.
func (p *Proc) Err() error { return p.err }

// Stop sends SIGTERM, then SIGKILL when the process has not exited within
// grace, and waits for it.
func (p *Proc) Stop(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Kill kills the process and waits for it.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}
