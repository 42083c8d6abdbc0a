package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/web/webtest"
)

// holdingVLLM is a minimal vLLM server of one engine for the dashboard
// test: it answers OpenAI chat requests (JSON), holds those whose body
// contains "hold" until release is closed, and serves /health and a
// vLLM-style /metrics whose num_requests_running is the requests it holds.
type holdingVLLM struct {
	srv     *httptest.Server
	release chan struct{}

	mu      sync.Mutex
	running int
	served  int
}

func newHoldingVLLM(t *testing.T, release chan struct{}) *holdingVLLM {
	f := &holdingVLLM{release: release}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *holdingVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/metrics":
		f.mu.Lock()
		running, served := f.running, f.served
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		for _, l := range []string{
			"# TYPE vllm:num_requests_running gauge",
			fmt.Sprintf(`vllm:num_requests_running{engine="0",model_name="m"} %d`, running),
			"# TYPE vllm:num_requests_waiting gauge",
			`vllm:num_requests_waiting{engine="0",model_name="m"} 0`,
			"# TYPE vllm:kv_cache_usage_perc gauge",
			`vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25`,
			"# TYPE vllm:prefix_cache_queries_total counter",
			fmt.Sprintf(`vllm:prefix_cache_queries_total{engine="0",model_name="m"} %d`, 100*served),
			"# TYPE vllm:prefix_cache_hits_total counter",
			fmt.Sprintf(`vllm:prefix_cache_hits_total{engine="0",model_name="m"} %d`, 50*served),
		} {
			fmt.Fprintln(w, l)
		}
		return
	}
	body, _ := io.ReadAll(r.Body)
	hold := bytes.Contains(body, []byte("hold"))
	f.mu.Lock()
	f.served++
	if hold {
		f.running++
	}
	f.mu.Unlock()
	if hold {
		select {
		case <-f.release:
		case <-r.Context().Done():
		}
		f.mu.Lock()
		f.running--
		f.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":100,"completion_tokens":1}}`)
}

// TestProxyDashboardShowsLiveNumbers runs `warden proxy` (runProxy) on
// 127.0.0.1:0 in front of two fake replicas, holds requests in flight, opens
// the dashboard that cmd/warden mounts on the admin listener in headless
// Chromium and checks that each replica's row shows the in-flight, sticky
// and running numbers of /api/status.
func TestProxyDashboardShowsLiveNumbers(t *testing.T) {
	browser := webtest.Find(t)
	release := make(chan struct{})
	a, b := newHoldingVLLM(t, release), newHoldingVLLM(t, release)
	path := filepath.Join(t.TempDir(), "p.yaml")
	cfg := fmt.Sprintf("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nauth: passthrough\nscrape_interval: 50ms\n"+
		"models:\n  - name: m\n    replicas: [%s, %s]\n", a.srv.URL, b.srv.URL)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runProxy(ctx, &proxyOptions{Config: path, LogLevel: "error"}, &out, &bytes.Buffer{})
	}()
	var wg sync.WaitGroup
	defer func() { // unblock and stop everything, also when the test fails
		close(release)
		wg.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runProxy: %v", err)
		}
	}()
	out.waitFor(t, "(admin http://")
	m := regexp.MustCompile(`listening on (http://\S+) \(admin (http://[^)]+)\)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no addresses in %q", out.String())
	}
	proxyURL, adminURL := m[1], m[2]
	client := &http.Client{Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()

	send := func(session string, turn int, hold bool) {
		msgs := []map[string]string{{"role": "user", "content": "first message of " + session}}
		for i := 1; i <= turn; i++ {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": "ok"},
				map[string]string{"role": "user", "content": fmt.Sprintf("follow-up %d", i)})
		}
		if hold {
			msgs[len(msgs)-1]["content"] += " (hold)"
		}
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		req, _ := http.NewRequest("POST", proxyURL+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("X-Claude-Code-Session-Id", session)
		res, err := client.Do(req)
		if err != nil {
			t.Errorf("%s turn %d: %v", session, turn, err)
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("%s turn %d: status %d", session, turn, res.StatusCode)
		}
	}
	status := func() live.Status {
		res, err := client.Get(adminURL + "/api/status")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var st live.StatusReport
		if err := json.NewDecoder(res.Body).Decode(&st); err != nil || len(st.Models) != 1 {
			t.Fatalf("/api/status: %v, %d models", err, len(st.Models))
		}
		return st.Models[0]
	}
	waitStatus := func(what string, cond func(live.Status) bool) live.Status {
		deadline := time.Now().Add(10 * time.Second)
		for {
			st := status()
			if cond(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// A request is counted by reason when its response has gone out.
	// Session x: four turns done (sticky 3), one held (in flight 1).
	// Session y, on the other replica (fewer sessions): two turns done
	// (sticky 1), two held (in flight 2).
	for turn := range 4 {
		send("x", turn, false)
	}
	for turn := range 2 {
		send("y", turn, false)
	}
	for _, r := range []struct {
		session string
		turn    int
	}{{"x", 4}, {"y", 2}, {"y", 3}} {
		wg.Go(func() { send(r.session, r.turn, true) })
	}
	// The scraped running counts catch up with the held requests.
	st := waitStatus("3 requests in flight, scraped", func(st live.Status) bool {
		if st.InFlight != 3 {
			return false
		}
		for _, r := range st.Replicas {
			if r.ScrapeState != "ok" || r.Running == nil || *r.Running != float64(r.InFlight) {
				return false
			}
		}
		return true
	})
	if in := []int64{st.Replicas[0].InFlight, st.Replicas[1].InFlight}; in[0]+in[1] != 3 || in[0] == in[1] {
		t.Fatalf("in flight per replica %v, want 1 and 2", in)
	}

	res := browser.Check(t, adminURL+"/")
	if len(res.Console) > 0 || len(res.Blocked) > 0 {
		t.Errorf("console %q, blocked %q: want none", res.Console, res.Blocked)
	}
	for _, r := range st.Replicas {
		row := tableRow(res.DOM, fmt.Sprintf("replica-m-%d", r.ID))
		if row == "" {
			t.Errorf("dashboard has no row for replica %d; DOM:\n%s", r.ID, res.DOM)
			continue
		}
		for _, want := range []string{
			fmt.Sprintf(`<td data-field="in_flight">%d</td>`, r.InFlight),
			fmt.Sprintf(`<td data-field="sticky">%d</td>`, r.Sticky),
			fmt.Sprintf(`<td data-field="running">%d</td>`, int(*r.Running)),
			fmt.Sprintf(`<td data-field="spilled_in">%d</td>`, r.SpilledIn),
			fmt.Sprintf(`<td data-field="requests">%d</td>`, r.Requests),
			`<td data-field="kv_used_pct">25</td>`,
		} {
			if !strings.Contains(row, want) {
				t.Errorf("replica %d row lacks %s:\n%s", r.ID, want, row)
			}
		}
	}
	// The stats page draws its two charts with the echarts of the binary,
	// and the admin routes of live keep precedence over the dashboard's "/".
	// It reads the hour from the admin listener's /api/history.
	if res := browser.Check(t, adminURL+"/stats"); res.Canvases != 2 || len(res.Console) > 0 || len(res.Blocked) > 0 {
		t.Errorf("stats page: %d canvases (want 2), console %q, blocked %q", res.Canvases, res.Console, res.Blocked)
	} else if strings.Contains(res.Text, "reading the last hour") || strings.Contains(res.Text, "history unavailable") {
		t.Errorf("stats page did not get the history: %q", res.Text)
	}
	for path, want := range map[string]string{"/metrics": "warden_in_flight", "/healthz": "ok", "/static/echarts.min.js": "echarts"} {
		res, err := client.Get(adminURL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d, body lacks %q", path, res.StatusCode, want)
		}
	}
	if got := status(); got.InFlight != 3 || got.LaterTurns != st.LaterTurns {
		t.Errorf("status changed while the page was open: %+v, was %+v", got, st)
	}
	// The numbers are the traffic's: x's home has sticky 3 and 1 in flight,
	// y's home sticky 1 and 2 in flight.
	for _, r := range st.Replicas {
		if want := map[int64]int64{1: 3, 2: 1}[r.InFlight]; r.Sticky != want {
			t.Errorf("replica %d: sticky %d with %d in flight, want %d", r.ID, r.Sticky, r.InFlight, want)
		}
	}
}

// tableRow returns the <tr id="id">...</tr> element of dom, or "".
func tableRow(dom, id string) string {
	_, rest, ok := strings.Cut(dom, `<tr id="`+id+`">`)
	if !ok {
		return ""
	}
	row, _, _ := strings.Cut(rest, "</tr>")
	return row
}
