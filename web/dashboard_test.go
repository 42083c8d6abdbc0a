package web_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/web"
	"github.com/lm-warden/warden/web/webtest"
)

// fakeStatus is what `warden proxy` serves at /api/status (live.StatusReport); its counters grow
// with every call, as a live proxy's would. Replica 1's scrape is failing.
func fakeStatus(call int64) live.StatusReport {
	f := func(v float64) *float64 { return &v }
	rep := func(id int, inFlight int64, kv, hit float64) live.ReplicaStatus {
		return live.ReplicaStatus{
			ID: id, URL: fmt.Sprintf("http://10.0.0.%d:8000", id+1), State: "healthy",
			InFlight: inFlight, Sticky: int64(40 + id), SpilledIn: int64(3 * id), ClientPinned: int64(id),
			Requests: 1000*call + int64(id), Retried: int64(id),
			Running: f(float64(inFlight)), Waiting: f(float64(id)), KVUsage: f(kv), PrefixHitPct: f(hit),
			PrefixQueries: f(float64(10000 * call)), PrefixHits: f(float64(8000 * call)),
			ScrapeAgeSec: f(0.4), ScrapeState: "ok",
		}
	}
	r1 := rep(1, 5, 0.1225, 71)
	r1.ScrapeState, r1.ScrapeError = "failed", "connection refused"
	return live.StatusReport{Models: []live.Status{{
		Model: "qwen3-coder <b>", Layout: "urls", Strategy: "affinity", Affinity: true,
		SpillThreshold: 64, SpillAuto: true, MaxNumSeqs: 256, MaxNumSeqsSource: "server",
		InFlight: 12, Sessions: 30, SessionCap: 100000, StickyPct: f(93.25),
		Replicas: []live.ReplicaStatus{rep(0, 7, 0.415, 88.5), r1},
	}}}
}

func dashboardServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", web.DashboardHandler(web.DashboardOptions{Prefix: "/dashboard/"}))
	mux.HandleFunc("/api/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(fakeStatus(calls.Add(1)))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, &calls
}

func TestDashboardRoutingPageShowsLiveNumbers(t *testing.T) {
	srv, calls := dashboardServer(t)
	res := webtest.CheckPage(t, srv.URL+"/dashboard/")
	screenshot(t, srv.URL+"/dashboard/")
	if len(res.Console) > 0 || len(res.Blocked) > 0 {
		t.Errorf("console %q, blocked %q: want none", res.Console, res.Blocked)
	}
	if calls.Load() < 2 {
		t.Errorf("the page fetched /api/status %d times, want it polled (>= 2)", calls.Load())
	}
	// The rows as the page built them: the DOM holds the numbers of the fake status.
	for _, want := range []string{
		`<tr id="replica-qwen3-coder &lt;b&gt;-0"><td>0 http://10.0.0.1:8000</td><td>healthy</td><td data-field="in_flight">7</td><td data-field="sticky">40</td><td data-field="spilled_in">0</td><td data-field="client_pinned">0</td><td data-field="running">7</td><td data-field="waiting">0</td><td data-field="kv_used_pct">41.5</td><td data-field="prefix_hit_pct">88.5</td>`,
		`<td class="bad" title="connection refused">healthy, scrape failed</td><td data-field="in_flight">5</td><td data-field="sticky">41</td><td data-field="spilled_in">3</td><td data-field="client_pinned">1</td><td data-field="running">5</td><td data-field="waiting">1</td><td data-field="kv_used_pct">12.3</td><td data-field="prefix_hit_pct">71</td>`,
		`<td data-field="retried">1</td>`, // a counter since start, shown in its own column
		`<th>affinity</th><td data-field="affinity">on</td>`,
		`<td data-field="spill threshold">64 (auto)</td>`,
		`<td data-field="sticky %">93.3</td>`,
		`<td data-field="max_num_seqs">256 (server)</td>`,
		`<td data-field="scrape">replica 1 failed (connection refused); routing on local counts there</td>`,
	} {
		if !strings.Contains(res.DOM, want) {
			t.Errorf("dashboard DOM lacks\n%s\nDOM:\n%s", want, res.DOM)
		}
	}
	// The requests counter grows with every poll: the row shows a later status than the first.
	if strings.Contains(res.DOM, `<td data-field="requests">1,000</td>`) || strings.Contains(res.DOM, `<td data-field="requests">1000</td>`) {
		t.Error("the table still shows the first status: it did not refresh")
	}
	if strings.Contains(res.DOM, "<b>") {
		t.Error("a model name was injected as markup")
	}
}

func TestDashboardStatsPageDraws(t *testing.T) {
	srv, _ := dashboardServer(t)
	res := webtest.CheckPage(t, srv.URL+"/dashboard/stats")
	screenshot(t, srv.URL+"/dashboard/stats")
	if len(res.Console) > 0 || len(res.Blocked) > 0 {
		t.Errorf("console %q, blocked %q: want none", res.Console, res.Blocked)
	}
	if res.Canvases != 2 {
		t.Errorf("stats page drew %d canvases, want 2", res.Canvases)
	}
	// Every call adds 10000 prompt tokens of which 8000 cached: 80 %.
	if !strings.Contains(res.Text, "80.0 %") {
		t.Errorf("stats page text lacks the hit rate 80.0 %%: %q", res.Text)
	}
}

func TestDashboardHandlerRoutes(t *testing.T) {
	h := web.DashboardHandler(web.DashboardOptions{Prefix: "/dashboard"})
	tests := []struct {
		method, path string
		code         int
		ctype, body  string
	}{
		{"GET", "/dashboard/", 200, "text/html; charset=utf-8", `src="/dashboard/static/echarts.min.js"`},
		{"GET", "/dashboard/stats", 200, "text/html; charset=utf-8", `<div class="chart" id="prompt"`},
		{"GET", "/dashboard/static/echarts.min.js", 200, "text/javascript; charset=utf-8", "echarts"},
		{"GET", "/dashboard/static/echarts.LICENSE", 200, "text/plain; charset=utf-8", "Apache License"},
		{"GET", "/dashboard/static/nope.js", 404, "", ""},
		{"GET", "/dashboard/other", 404, "", ""},
		{"GET", "/elsewhere", 404, "", ""},
		{"POST", "/dashboard/", 405, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			if rec.Code != tt.code {
				t.Fatalf("status %d, want %d", rec.Code, tt.code)
			}
			if tt.ctype != "" && rec.Header().Get("Content-Type") != tt.ctype {
				t.Errorf("Content-Type %q, want %q", rec.Header().Get("Content-Type"), tt.ctype)
			}
			body, _ := io.ReadAll(rec.Body)
			if !strings.Contains(string(body), tt.body) {
				t.Errorf("body lacks %q", tt.body)
			}
		})
	}
}
