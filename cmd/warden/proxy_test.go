package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestProxyCheck(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd()
	root.SetArgs([]string{"proxy", "--config", "../../live/testdata/proxy.yaml", "--check"})
	root.SetOut(&out)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "OK, 3 model(s)") {
		t.Errorf("output %q", out.String())
	}
}

func TestProxyBadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(path, []byte("listen: :1\nauth: keys\nmodels: []\n"), 0o644)
	err := runProxy(context.Background(), &proxyOptions{Config: path, LogLevel: "info"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "p.yaml:") {
		t.Errorf("err = %v, want one naming p.yaml and a line", err)
	}
}

// TestProxyBadProcs: --procs takes auto or a count from 1, and says so
// before anything starts.
func TestProxyBadProcs(t *testing.T) {
	for _, v := range []string{"0", "-2", "many", "2.5"} {
		err := runProxy(context.Background(), &proxyOptions{Config: "../../live/testdata/proxy.yaml", LogLevel: "info", Procs: v}, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "--procs") || !strings.Contains(err.Error(), v) {
			t.Errorf("--procs %s: err = %v, want one naming --procs and the value", v, err)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) waitFor(t *testing.T, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.String(), what) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q never contained %q", s.String(), what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProxyServesReloadsAndDrains runs the command on 127.0.0.1:0, reloads
// it with SIGHUP and stops it by cancelling its context (as SIGTERM does).
func TestProxyServesReloadsAndDrains(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	cfg := "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nauth: passthrough\nscrape_interval: 1h\nmodels:\n  - name: m\n    replicas: [http://127.0.0.1:9]\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runProxy(ctx, &proxyOptions{Config: path, LogLevel: "error"}, &out, &bytes.Buffer{})
	}()
	out.waitFor(t, "listening on http://127.0.0.1:")
	if err := os.WriteFile(path, []byte(cfg+"  - name: n\n    replicas: [http://127.0.0.1:9]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "reloaded "+path)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
