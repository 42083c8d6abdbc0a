package web_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lm-warden/warden/kvevents"
	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/web"
	"github.com/lm-warden/warden/web/webtest"
)

// fakeStatus is what `warden proxy` serves at /api/status (live.StatusReport); its counters grow
// with every call, as a live proxy's would. Replica 1's scrape is failing.
func ptrTo[T any](v T) *T { return &v }

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
	r0 := rep(0, 7, 0.415, 88.5)
	r0.KVCapacityTokens, r0.FootprintTokens, r0.HeadroomTokens = ptrTo(1_118_000), 1_080_400, ptrTo(37_600)
	r0.Sessions, r0.Active, r0.Held = 9, 7, 5
	r1 := rep(1, 5, 0.1225, 71)
	r1.ScrapeState, r1.ScrapeError = "failed", "connection refused"
	return live.StatusReport{Models: []live.Status{{
		Model: "qwen3-coder <b>", Layout: "urls", Strategy: "affinity", Affinity: true,
		SpillThreshold: 64, SpillAuto: true, MaxNumSeqs: 256, MaxNumSeqsSource: "server",
		InFlight: 12, Sessions: 30, SessionCap: 100000, StickyPct: f(93.25),
		Admission:    &live.AdmissionStatus{Waiting: 2, Waits: 9, Timeouts: 1, TimeoutSec: 60},
		SpillReasons: []live.SpillReason{{From: 0, To: 1, Reason: "home 9 in flight > 8"}, {From: 1, To: 0, Reason: "priced: home 4.1 s vs 1.2 s elsewhere"}},
		Replicas:     []live.ReplicaStatus{r0, r1},
	}}}
}

// fakeHistory is what `warden proxy` serves at /api/history (live.HistoryReport): covered
// points of 1000 prompt tokens/s of which 800 cached (80 %) and 50 completion tokens/s, half on
// each replica; the points before the first covered one are null (the proxy was not running).
func fakeHistory(covered int) live.HistoryReport {
	const points, interval = 360, 10
	f := func(v float64) *float64 { return &v }
	series := func(share float64) live.HistorySeries {
		s := live.HistorySeries{
			PromptTPS: make([]*float64, points), CachedTPS: make([]*float64, points), ComputedTPS: make([]*float64, points),
			GenerationTPS: make([]*float64, points), HitPct: make([]*float64, points),
		}
		for i := points - covered; i < points; i++ {
			// A dip in the middle, so the chart has a shape to look at.
			dip := 1.0
			if i%60 < 6 {
				dip = 0.5
			}
			s.PromptTPS[i], s.CachedTPS[i], s.ComputedTPS[i] = f(1000*share*dip), f(800*share*dip), f(200*share*dip)
			s.GenerationTPS[i], s.HitPct[i] = f(50*share*dip), f(80)
		}
		sec := float64(covered * interval)
		s.Total = live.HistoryTotals{Seconds: sec, PromptTokens: 1000 * share * sec, CachedTokens: 800 * share * sec,
			ComputedTokens: 200 * share * sec, QueriedTokens: 1000 * share * sec, GenerationTokens: f(50 * share * sec), HitPct: f(80)}
		return s
	}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	return live.HistoryReport{Time: now, IntervalSec: interval, Points: points, Models: []live.ModelHistory{{
		Model: "qwen3-coder <b>", StartMs: now.Add(-time.Hour).UnixMilli(), HistorySeries: series(1),
		Replicas: []live.ReplicaHistory{
			{ID: 0, URL: "http://10.0.0.1:8000", HistorySeries: series(0.5)},
			{ID: 1, URL: "http://10.0.0.2:8000", HistorySeries: series(0.5)},
		},
	}}}
}

func dashboardServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	return dashboardServerWith(t, 360)
}

// fakeStatusKV is fakeStatus with KV events and re-homing, which add the
// optional columns: the widest replica table the proxy serves.
func fakeStatusKV(call int64) live.StatusReport {
	st := fakeStatus(call)
	r := st.Models[0].Replicas
	r[0].KVEvents = &kvevents.ReplicaStatus{Connected: true, Complete: true, BlocksHeld: 2_345_678,
		Miss: kvevents.MissTokens{Cold: 12_345_678, Evicted: 2_345_678, Elsewhere: 1_234_567}}
	r[1].KVEvents = &kvevents.ReplicaStatus{Connected: false, BlocksHeld: 45_678, Miss: kvevents.MissTokens{Cold: 123_456}}
	r[0].Rehomes, r[1].Rehomes, r[1].RehomedIn = 3, 1, 2
	return st
}

// dashboardServerWith serves the dashboard, a growing /api/status and an /api/history of
// covered points.
func dashboardServerWith(t *testing.T, covered int) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	return dashboardServerOf(t, covered, fakeStatus)
}

// dashboardServerOf serves the dashboard with status as /api/status.
func dashboardServerOf(t *testing.T, covered int, status func(int64) live.StatusReport) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", web.DashboardHandler(web.DashboardOptions{Prefix: "/dashboard/"}))
	mux.HandleFunc("/api/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(status(calls.Add(1)))
	})
	mux.HandleFunc("/api/history", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(fakeHistory(covered))
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
		`<tr id="replica-qwen3-coder &lt;b&gt;-0"><td class="replica" title="0 http://10.0.0.1:8000">0 http://10.0.0.1:8000</td><td>healthy</td><td data-field="in_flight">7</td><td data-field="sticky">40</td><td data-field="spilled_in">0</td><td data-field="client_pinned">0</td><td data-field="running">7</td><td data-field="waiting">0</td><td data-field="kv_used_pct">41.5</td><td data-field="prefix_hit_pct">88.5</td>`,
		`<td class="bad" title="connection refused">healthy, scrape failed</td><td data-field="in_flight">5</td><td data-field="sticky">41</td><td data-field="spilled_in">3</td><td data-field="client_pinned">1</td><td data-field="running">5</td><td data-field="waiting">1</td><td data-field="kv_used_pct">12.3</td><td data-field="prefix_hit_pct">71</td>`,
		`<td data-field="retried">1</td>`, // a counter since start, shown in its own column
		"<td data-field=\"prefix_hit_pct\">88.5</td><td class=\"split\" data-field=\"footprint_tokens\">1.1M/\u200b1.1M</td><td class=\"split\" data-field=\"sessions\">9/\u200b7/\u200b5</td>",
		"<td data-field=\"prefix_hit_pct\">71</td><td data-field=\"footprint_tokens\"></td><td class=\"split\" data-field=\"sessions\">0/\u200b0/\u200b0</td>",
		`<td data-field="admission">kv: 2 waiting, 9 waited, 1 timed out (timeout 60 s)</td>`,
		`<td data-field="last spills">0→1 home 9 in flight &gt; 8; 1→0 priced: home 4.1 s vs 1.2 s elsewhere</td>`,
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

// TestDashboardStatsPageDraws opens the stats page on a proxy that has counted for a while and
// checks that the hour is drawn at once, from /api/history: both charts with their points, the
// hit rate of the hour in words, and one row per replica with its sparkline.
func TestDashboardStatsPageDraws(t *testing.T) {
	for _, tc := range []struct {
		covered int
		words   string
	}{
		{360, "Last hour: 80.0 % of prompt tokens came from the prefix cache"},
		{60, "Last 10 min (as long as the proxy has counted): 80.0 % of prompt tokens came from the prefix cache"},
	} {
		t.Run(fmt.Sprint(tc.covered), func(t *testing.T) {
			srv, _ := dashboardServerWith(t, tc.covered)
			res := webtest.CheckPage(t, srv.URL+"/dashboard/stats")
			screenshot(t, srv.URL+"/dashboard/stats")
			if len(res.Console) > 0 || len(res.Blocked) > 0 {
				t.Errorf("console %q, blocked %q: want none", res.Console, res.Blocked)
			}
			if res.Canvases != 2 {
				t.Errorf("stats page drew %d canvases, want 2 (prompt, completion)", res.Canvases)
			}
			if !strings.Contains(res.Text, tc.words) {
				t.Errorf("stats page text lacks %q: %q", tc.words, res.Text)
			}
			for _, want := range []string{
				`<tr id="hist-replica-0"><td class="replica" title="0 http://10.0.0.1:8000">0 http://10.0.0.1:8000</td><td>healthy</td><td data-field="hit">80.0</td><td data-field="prompt">500</td><td data-field="cached">400</td><td data-field="completion">25.0</td>`,
				`<td class="bad" title="connection refused">healthy, scrape failed</td>`,
			} {
				if !strings.Contains(res.DOM, want) {
					t.Errorf("stats DOM lacks\n%s\nDOM:\n%s", want, res.DOM)
				}
			}
			// Every scraped point of the hour is in the charts.
			for _, id := range []string{"prompt", "completion"} {
				m := regexp.MustCompile(`<div class="chart" id="` + id + `"[^>]*data-points="(\d+)"`).FindStringSubmatch(res.DOM)
				if m == nil || m[1] != fmt.Sprint(tc.covered) {
					t.Errorf("chart %s drew %v points, want %d", id, m, tc.covered)
				}
			}
			if n := strings.Count(res.DOM, `<svg class="spark"`); n != 2 {
				t.Errorf("%d sparklines, want one per replica (2)", n)
			}
			if strings.Contains(res.DOM, "<b>") {
				t.Error("a model name was injected as markup")
			}
		})
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

// fitPage is a test page (not shipped) that opens page in a same-origin iframe of the given
// width and writes what the iframe's layout measured into #fit, once the routing tables are
// there: the document's scroll width against its viewport, and per table.replicas whether it
// stays inside its box and whether it needs to scroll there.
const fitPage = `<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="%s" style="width:%dpx;height:900px;border:0"></iframe>
<pre id="fit">pending</pre>
<script>
function check() {
  var d = document.getElementById("f").contentDocument;
  var ts = d ? d.querySelectorAll("table.replicas") : [];
  if (!ts.length) { setTimeout(check, 50); return; }
  var out = ["document " + d.documentElement.scrollWidth + " of " + d.documentElement.clientWidth];
  ts.forEach(function (t) {
    var box = t.parentElement, main = d.getElementById("main").getBoundingClientRect();
    out.push("table " + Math.ceil(t.getBoundingClientRect().width) + " in box " + box.clientWidth +
      (box.getBoundingClientRect().right <= main.right + 1 ? " inside" : " outside"));
  });
  document.getElementById("fit").textContent = out.join("\n");
}
setTimeout(check, 50);
</script></body></html>`

// TestDashboardRoutingTableFits opens the routing page at 1400 px and at 800 px: at 1400 px
// the replica table, with every column the proxy reports, fits without scrolling; at 800 px it
// scrolls inside its own box; at neither width does the page itself overflow.
func TestDashboardRoutingTableFits(t *testing.T) {
	t.Run("plain", func(t *testing.T) { checkTableFits(t, fakeStatus) })
	// With KV events and re-homing the table had 1,535 px in a 1,352 px box at 1,400 px.
	t.Run("kv-events", func(t *testing.T) { checkTableFits(t, fakeStatusKV) })
}

func checkTableFits(t *testing.T, status func(int64) live.StatusReport) {
	srv, _ := dashboardServerOf(t, 360, status)
	mux := http.NewServeMux()
	for _, w := range []int{1400, 800} {
		mux.HandleFunc(fmt.Sprintf("/fit%d", w), func(rw http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(rw, fitPage, "/dashboard/", w)
		})
	}
	// The wrapper must share the dashboard's origin to read the iframe: mount it on srv's mux.
	fit := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/fit") {
			mux.ServeHTTP(w, r)
			return
		}
		proxyTo(srv.URL, w, r)
	}))
	defer fit.Close()
	for _, tc := range []struct {
		width  int
		scroll bool // the table may scroll inside its box
	}{{1400, false}, {800, true}} {
		t.Run(fmt.Sprint(tc.width), func(t *testing.T) {
			res := webtest.CheckPage(t, fmt.Sprintf("%s/fit%d", fit.URL, tc.width))
			got := regexp.MustCompile(`(?s)<pre id="fit">(.*?)</pre>`).FindStringSubmatch(res.DOM)
			if got == nil || got[1] == "pending" {
				t.Fatalf("the page never measured its tables; DOM:\n%.2000s", res.DOM)
			}
			var doc, view int
			lines := strings.Split(got[1], "\n")
			if _, err := fmt.Sscanf(lines[0], "document %d of %d", &doc, &view); err != nil {
				t.Fatalf("measure %q: %v", lines[0], err)
			}
			if doc > view {
				t.Errorf("at %d px the page is %d px wide, over its %d px window", tc.width, doc, view)
			}
			for _, l := range lines[1:] {
				var tw, bw int
				var where string
				if _, err := fmt.Sscanf(l, "table %d in box %d %s", &tw, &bw, &where); err != nil {
					t.Fatalf("measure %q: %v", l, err)
				}
				if where != "inside" {
					t.Errorf("at %d px the replica table's box leaves the page's column: %s", tc.width, l)
				}
				if !tc.scroll && tw > bw {
					t.Errorf("at %d px the replica table is %d px wide in a %d px box: it does not fit", tc.width, tw, bw)
				}
			}
		})
	}
}

// proxyTo forwards r to the server at base (same origin for the fit page's iframe).
func proxyTo(base string, w http.ResponseWriter, r *http.Request) {
	res, err := http.Get(base + r.URL.RequestURI())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = io.Copy(w, res.Body)
}
