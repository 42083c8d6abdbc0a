package main

import (
	"bytes"
	"context"
	"io"
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

// TestSessionKeyCheck (issue 50, item 6, for both commands): warden
// proxy --check and warden epp --check refuse a placeholder session_key,
// naming the line; the key comes from --session-key-file (at least 16
// bytes, no placeholder, not also in the file); a store without a key
// passes --check, which says where the key must come from, and is
// refused when the command would run. Before, warden proxy --check
// accepted change-me-... (and live/testdata/proxy-shared.yaml shipped
// one), and had no --session-key-file.
func TestSessionKeyCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyFile := write("session-key", "3c1f0a5e9b7d4c2a8e6f1b0d9c7a5e3f\n", 0o600)
	shortKey := write("short-key", "abc\n", 0o600)
	placeholderKey := write("placeholder-key", "change-me-please-to-something\n", 0o600)
	store := "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nauth: passthrough\nsession_store: redis://127.0.0.1:1/0\nmodels:\n  - name: m\n    replicas: [http://10.0.0.1:8000]\n"
	commands := []struct {
		name, who, ok string
		run           func(config, keyFile string, check bool, out io.Writer) error
	}{
		{"proxy", "the proxy", "c.yaml: OK, 1 model(s)\n", func(config, keyFile string, check bool, out io.Writer) error {
			return runProxy(context.Background(), &proxyOptions{Config: config, Check: check, LogLevel: "error", SessionKeyFile: keyFile}, out, io.Discard)
		}},
		{"epp", "the picker", "c.yaml: OK, 1 model(s), 1 endpoint(s)\n", func(config, keyFile string, check bool, out io.Writer) error {
			return runEPP(context.Background(), &eppOptions{Config: config, Check: check, LogLevel: "error", SessionKeyFile: keyFile}, out, io.Discard)
		}},
	}
	for _, c := range commands {
		for _, tt := range []struct {
			name, config, keyFile, want, wantErr string
			run                                  bool // without --check
		}{
			{name: "placeholder", config: "session_key: change-me-to-a-long-random-string\n" + store,
				wantErr: `c.yaml:1: session_key: "change-me-to-a-long-random-string" is a placeholder`},
			{name: "placeholder without a store", config: "session_key: <your key>\n" + strings.Replace(store, "session_store", "#", 1),
				wantErr: `c.yaml:1: session_key: "<your key>" is a placeholder`},
			{name: "key file", config: store, keyFile: keyFile, want: c.ok},
			{name: "key later", config: store, want: "c.yaml: session_key: none in the file: give it with --session-key-file when " + c.who + " runs\n" + c.ok},
			{name: "key twice", config: "session_key: 3c1f0a5e9b7d4c2a8e6f\n" + store, keyFile: keyFile, wantErr: "c.yaml:1: session_key: given twice"},
			{name: "short key file", config: store, keyFile: shortKey, wantErr: "3 bytes: want at least 16"},
			{name: "placeholder key file", config: store, keyFile: placeholderKey, wantErr: "a placeholder key"},
			{name: "no key at run", config: store, run: true, wantErr: "c.yaml: session_key: required with session_store (the same key on every proxy: ids are stored HMAC-hashed): give it with --session-key-file"},
		} {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				var out bytes.Buffer
				err := c.run(write("c.yaml", tt.config, 0o644), tt.keyFile, !tt.run, &out)
				switch {
				case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
					t.Errorf("got %v, want an error containing %q", err, tt.wantErr)
				case tt.wantErr == "" && (err != nil || strings.ReplaceAll(out.String(), dir+"/", "") != tt.want):
					t.Errorf("got %q %v, want %q", out.String(), err, tt.want)
				}
			})
		}
	}
}
