package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestEPPCheck: --check accepts the example configuration and refuses,
// naming the file and the key, endpoints the gateway cannot be told.
func TestEPPCheck(t *testing.T) {
	var out bytes.Buffer
	if err := runEPP(context.Background(), &eppOptions{Config: "../../epp/testdata/epp.yaml", Check: true, LogLevel: "info"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if want := "epp.yaml: OK, 1 model(s), 4 endpoint(s)\n"; !strings.HasSuffix(out.String(), want) {
		t.Errorf("--check: %q, want ...%q", out.String(), want)
	}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "session-key")
	if err := os.WriteFile(keyFile, []byte("3c1f0a5e9b7d4c2a8e6f1b0d9c7a5e3f\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	shortKey := filepath.Join(dir, "short-key")
	if err := os.WriteFile(shortKey, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The session key (issue 50, item 6): a placeholder in the file is
	// refused, naming the line; the key comes from --session-key-file; a
	// store without a key passes --check, which says where it must come
	// from. Before, a ConfigMap's change-me-... passed --check and keyed
	// every picker alike.
	store := "listen: 127.0.0.1:0\nauth: passthrough\nsession_store: redis://warden-redis:6379/0\nmodels:\n  - name: m\n    replicas: [http://10.0.0.1:8000]\n"
	for _, tt := range []struct {
		name, config, keyFile, want, wantErr string
	}{
		{"placeholder", "session_key: change-me-to-a-long-random-string\n" + store, "", "", `epp.yaml:1: session_key: "change-me-to-a-long-random-string" is a placeholder`},
		{"key file", store, keyFile, "epp.yaml: OK, 1 model(s), 1 endpoint(s)\n", ""},
		{"key later", store, "", "epp.yaml: session_key: none in the file: give it with --session-key-file when the picker runs\nepp.yaml: OK, 1 model(s), 1 endpoint(s)\n", ""},
		{"key twice", "session_key: 3c1f0a5e9b7d4c2a8e6f\n" + store, keyFile, "", "session_key: given twice"},
		{"short key file", store, shortKey, "", "3 bytes: want at least 16"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "epp.yaml")
			if err := os.WriteFile(p, []byte(tt.config), 0o644); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err := runEPP(context.Background(), &eppOptions{Config: p, Check: true, LogLevel: "info", SessionKeyFile: tt.keyFile}, &out, io.Discard)
			switch {
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("got %v, want an error containing %q", err, tt.wantErr)
			case tt.wantErr == "" && (err != nil || strings.ReplaceAll(out.String(), dir+"/", "") != tt.want):
				t.Errorf("got %q %v, want %q", out.String(), err, tt.want)
			}
		})
	}
	for _, tt := range []struct{ name, model, want string }{
		{"hostname", "    replicas: [http://vllm-0:8000]\n", `epp.yaml: models[0].replicas[0] (m): "http://vllm-0:8000": "vllm-0" is not an IP address`},
		{"dp", "    url: http://10.0.0.1:8000\n    data_parallel_size: 2\n", "epp.yaml: models[0] (m): url with data_parallel_size: the picker names endpoints"},
		{"https", "    replicas: [https://10.0.0.1:8000]\n", `want http://IP:PORT`},
		{"noport", "    replicas: [http://10.0.0.1]\n", `want http://IP:PORT with the port`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "epp.yaml")
			if err := os.WriteFile(p, []byte("listen: 127.0.0.1:0\nauth: passthrough\nmodels:\n  - name: m\n"+tt.model), 0o644); err != nil {
				t.Fatal(err)
			}
			err := runEPP(context.Background(), &eppOptions{Config: p, Check: true, LogLevel: "info"}, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestEPPServesHealthAndMetrics: `warden epp` serves the gRPC health
// services the protocol names and /metrics, and drains when its context
// ends (SIGTERM).
func TestEPPServesHealthAndMetrics(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "epp.yaml")
	if err := os.WriteFile(p, []byte("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nauth: passthrough\ntimeouts: {drain: 2s}\nmodels:\n  - name: m\n    replicas: [http://127.0.0.1:1]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := startEPP(t, &eppOptions{Config: p, LogLevel: "error", HealthListen: "127.0.0.1:0"})
	defer e.conn.Close()
	hconn, err := grpc.NewClient(e.health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hconn.Close()
	for _, tt := range []struct {
		port *grpc.ClientConn
		svcs []string
	}{
		{e.conn, []string{"liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "inference-extension"}},
		// The health port, where the llm-d chart and GAIE's conformance
		// manifests probe inference-extension.
		{hconn, []string{"liveness", "readiness", "inference-extension"}},
	} {
		hc := healthpb.NewHealthClient(tt.port)
		for _, svc := range tt.svcs {
			cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
			r, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: svc})
			ccancel()
			if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health %s on %s: %v %v, want SERVING", svc, tt.port.Target(), r.GetStatus(), err)
			}
		}
	}
	res, err := http.Get(e.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), "warden_") {
		t.Errorf("/metrics: %d, no warden_ series", res.StatusCode)
	}
	e.stop()
}

// runningEPP is a warden epp started by startEPP: its gRPC connection and
// admin URL.
type runningEPP struct {
	conn   *grpc.ClientConn
	admin  string
	health string // the health port ("none": none)
	cancel context.CancelFunc
	done   chan error
	t      *testing.T
}

// startEPP runs warden epp with opts in this process until stop, and
// connects to its gRPC address once it prints it.
func startEPP(t *testing.T, opts *eppOptions) *runningEPP {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	e := &runningEPP{cancel: cancel, done: make(chan error, 1), t: t}
	go func() {
		e.done <- runEPP(ctx, opts, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	m := regexp.MustCompile(`gRPC on (\S+) \(admin (\S+), gRPC health on (\S+)\)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("first line %q: want the addresses", line)
	}
	e.admin, e.health = m[2], m[3]
	if e.conn, err = grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	return e
}

// stop ends the picker as SIGTERM does and checks that it drains within 10 s.
func (e *runningEPP) stop() {
	e.t.Helper()
	e.cancel()
	select {
	case err := <-e.done:
		if err != nil {
			e.t.Errorf("drain: %v", err)
		}
	case <-time.After(10 * time.Second):
		e.t.Fatal("warden epp did not stop within 10s of SIGTERM")
	}
}
