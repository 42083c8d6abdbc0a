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
	"runtime"
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

// TestEPPConfigSizeBounded: warden epp reads its configuration as the
// proxy does, refusing one over live.MaxConfigBytes without reading it
// whole (issue 46 item 8 bounded the proxy's; the picker read a 100 MiB
// file whole before it found it no YAML).
func TestEPPConfigSizeBounded(t *testing.T) {
	big := filepath.Join(t.TempDir(), "epp.yaml")
	if err := os.WriteFile(big, []byte("listen: :8080\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 100<<20); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := runEPP(context.Background(), &eppOptions{Config: big, Check: true, LogLevel: "error"}, io.Discard, io.Discard)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "more than the 1048576 bytes") {
		t.Errorf("err = %v, want the file refused as too large", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Errorf("%d MiB allocated to refuse it", grew>>20)
	}
}
