package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/redis/go-redis/v9"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/testproc"
)

// InstallHint is the command that installs the server.
const InstallHint = "sudo apt-get install -y redis-server"

// Server is a running (or stopped) redis-server.
type Server struct {
	// Addr is host:port on 127.0.0.1; it stays the same across Stop and
	// Start.
	Addr string

	t   testing.TB
	bin string
	dir string

	mu   sync.Mutex
	proc *testproc.Proc // nil: stopped
}

// URL is the server's redis:// URL with database db.
func (s *Server) URL(db int) string { return "redis://" + s.Addr + "/" + strconv.Itoa(db) }

// Start starts redis-server on a free port of 127.0.0.1 and registers its
// stop with the test's cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := testproc.Find(t, "redistest", "redis-server", InstallHint)
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	var lastErr error
	for range 5 {
		port, err := testproc.FreePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.launch(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: %v", lastErr)
	return nil
}

// Restart starts the server again on its port after Stop; the data is
// gone (persistence is off), as after a real restart without a dump.
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	for range 20 { // the port may linger briefly in the kernel
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart: %v", err)
}

func (s *Server) launch() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	cmd := exec.Command(s.bin,
		"--bind", "127.0.0.1", "--port", port,
		"--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no", "--loglevel", "warning",
	)
	log := &testproc.Output{}
	cmd.Stdout = log
	cmd.Stderr = log
	proc, err := testproc.Start(cmd)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ping(s.Addr) == nil {
			s.mu.Lock()
			s.proc = proc
			s.mu.Unlock()
			return nil
		}
		select {
		case <-proc.Done():
			return fmt.Errorf("redis-server exited: %s", strings.TrimSpace(log.String()))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			proc.Kill()
			return errors.New("redis-server did not answer PING within 10s")
		}
	}
}

// ping sends PING and waits for +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// Stop stops the server (SIGTERM, then SIGKILL after 5 s) and waits for it.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	proc := s.proc
	s.proc = nil
	s.mu.Unlock()
	if proc != nil {
		proc.Stop(5 * time.Second)
	}
}

// Client is a go-redis client of the server, closed when the test ends:
// what a test plants keys with, a hostile peer's records or keys of the
// wrong type (RESP2, no client name, as the session store speaks).
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
