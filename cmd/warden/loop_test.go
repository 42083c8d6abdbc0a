package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/sim"
)

// lineWriter is an io.Writer safe for concurrent use that hands each
// complete line to a channel (for servers that print their addresses).
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		select {
		case w.lines <- line:
		default:
		}
	}
}

var proxyAddrRE = regexp.MustCompile(`listening on (http://\S+) \(admin (http://\S+)\)`)

// startLoopProxy runs warden proxy with the config file cfg in this
// process until ctx ends (wg waits for it) and returns its address and its
// admin /metrics URL once it listens.
func startLoopProxy(ctx context.Context, t *testing.T, wg *sync.WaitGroup, cfg string) (target, metrics string) {
	t.Helper()
	w := &lineWriter{lines: make(chan string, 16)}
	errc := make(chan error, 1)
	wg.Go(func() { errc <- runProxy(ctx, &proxyOptions{Config: cfg, LogLevel: "error"}, w, &bytes.Buffer{}) })
	for {
		select {
		case line := <-w.lines:
			if m := proxyAddrRE.FindStringSubmatch(line); m != nil {
				return m[1], m[2] + "/metrics"
			}
		case err := <-errc:
			t.Fatalf("proxy %s: %v", cfg, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("proxy %s did not start within 30 s", cfg)
		}
	}
}

// TestREADMELoop runs the README's loop in-process, in a short form: warden
// emulate (the built-in 4-replica farm, 20 times faster), two warden proxies
// in front of it (affinity off, then on: one emulated farm, warm between the
// runs as in the published benchmark), warden bench through each, warden
// sim with the same seed and load, and warden compare with its HTML report.
func TestREADMELoop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	// Each run on a fresh emulated farm, cold as warden sim starts each
	// strategy: one vLLM server of 4 data-parallel ranks (as
	// scripts/loop.sh). least-loaded is its own front end, benched
	// straight; affinity is warden proxy in front of it.
	emulate := func() (server string, stop func()) {
		ectx, ecancel := context.WithCancel(ctx)
		urlc := make(chan []string, 1)
		em := &emulateOptions{Listen: "127.0.0.1:0", Layout: "dp", Speed: 20, Seed: 1, ready: func(u []string) { urlc <- u }}
		emErr := make(chan error, 1)
		wg.Go(func() { emErr <- runEmulate(ectx, em, &bytes.Buffer{}) })
		var urls []string
		select {
		case urls = <-urlc:
		case err := <-emErr:
			ecancel()
			t.Fatalf("emulate: %v", err)
		}
		return urls[0], func() {
			ecancel()
			select {
			case err := <-emErr:
				if err != nil {
					t.Errorf("emulate: %v", err)
				}
			case <-time.After(time.Minute):
				t.Error("emulate did not stop within a minute of its context ending")
			}
		}
	}
	proxy := func(server string) (target, admin string) {
		cfg := filepath.Join(dir, "proxy.yaml")
		yaml := fmt.Sprintf("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nauth: passthrough\nscrape_interval: 50ms\nmodels:\n"+
			"  - name: Qwen/Qwen3-4B-Instruct-2507\n    url: %s\n    data_parallel_size: 4\n    max_num_seqs: 32\n    affinity: on\n", server)
		if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		return startLoopProxy(ctx, t, &wg, cfg)
	}
	benchJSON := func(label, server, target string, via ...string) string {
		args := append([]string{"bench", "--target", target, "--metrics-url", server + "/metrics"}, via...)
		out, err := execWarden(t, append(args, "--label", label, "--sessions", "2,4", "--step", "40s", "--speed", "20",
			"--sample-interval", "50ms", "--json", "--requests", filepath.Join(dir, label+".requests.jsonl"))...)
		if err != nil {
			t.Fatalf("bench %s: %v", label, err)
		}
		checkRequestLines(t, filepath.Join(dir, label+".requests.jsonl"), label)
		path := filepath.Join(dir, label+".json")
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	server, stop := emulate()
	off := benchJSON("least-loaded", server, server)
	stop()
	server, stop = emulate()
	target, admin := proxy(server)
	on := benchJSON("affinity", server, target, "--proxy-metrics-url", admin)
	stop()

	simOut, err := execWarden(t, "sim", "--sessions", "2,4", "--duration", "40s", "--json")
	if err != nil {
		t.Fatal(err)
	}
	simPath := filepath.Join(dir, "sim.json")
	if err := os.WriteFile(simPath, []byte(simOut), 0o644); err != nil {
		t.Fatal(err)
	}
	html := filepath.Join(dir, "compare.html")
	out, err := execWarden(t, "compare", "--predicted", simPath, "--observed", off, "--observed", on, "--out", html)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("warden compare:\n%s", out)
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"2 least-loaded prefix hit %", "4 affinity stayed %", "report: " + html} {
		if !strings.Contains(flat, want) {
			t.Errorf("compare output lacks %q", want)
		}
	}
	if strings.Contains(out, "without a partner") {
		t.Errorf("every step should have matched:\n%s", out)
	}
	if st, err := os.Stat(html); err != nil || st.Size() < 100_000 {
		t.Errorf("report %s: %v (want a self-contained page)", html, err)
	}
	// The report reads either side: warden report renders the bench result.
	if _, err := execWarden(t, "report", "--from", on, "--out", filepath.Join(dir, "on.html")); err != nil {
		t.Errorf("warden report --from bench.json: %v", err)
	}
}

// checkRequestLines checks a --requests file of warden bench: one
// sim.RequestRecord per line, of the run's strategy label, each session's
// turns in order from 0, and at least one answered.
func checkRequestLines(t *testing.T, path, label string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	turns := map[string]int{}
	finished := 0
	for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r sim.RequestRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%s:%d: %v", path, i+1, err)
		}
		if r.Strategy != label || r.Turn != turns[r.Session] || r.Replica != -1 {
			t.Fatalf("%s:%d: strategy %q turn %d replica %d, want %q, turn %d, -1", path, i+1, r.Strategy, r.Turn, r.Replica, label, turns[r.Session])
		}
		turns[r.Session]++
		if r.Finished {
			finished++
		}
	}
	if finished == 0 {
		t.Errorf("%s: no request answered", path)
	}
}
