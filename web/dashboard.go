package web

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"
)

// DashboardOptions configure DashboardHandler. The zero value serves the dashboard at "/" and
// polls "/api/status" once a second.
type DashboardOptions struct {
	// Prefix is the path the handler is mounted at, ending in "/", e.g. "/dashboard/";
	// "" means "/". Mount with mux.Handle(prefix, DashboardHandler(opts)).
	Prefix string
	// StatusURL is what the pages fetch, relative to the page's origin; "" means "/api/status".
	StatusURL string
	// HistoryURL is the last hour of token rates the stats page draws (live.HistoryReport),
	// relative to the page's origin; "" means "/api/history".
	HistoryURL string
	// Refresh is the polling period; 0 means one second.
	Refresh time.Duration
}

// DashboardHandler serves the live dashboard of `warden proxy` on its admin listener:
//
//	{prefix}                        the data-parallel routing page, one panel per model
//	{prefix}?model=NAME             the routing page of one model
//	{prefix}stats?model=NAME        the last hour: prompt tokens per second, cached vs computed,
//	                                completion tokens per second, the hit rate, per replica too
//	{prefix}static/echarts.min.js   echarts from the binary (also LICENSE, NOTICE)
//
// The pages are static; their script fetches StatusURL every Refresh and draws what it finds.
// The stats page draws the hour the proxy keeps (HistoryURL, read every 5 s at most), so it
// shows the last hour the moment it opens, whenever that is.
//
// # The status JSON the pages read
//
// The pages read live.StatusReport (GET /api/status of `warden proxy`'s admin listener) as
// generic JSON, so live can grow its Status without breaking them. The top level is
// {"models": [MODEL, ...]} (a bare array of MODEL, or an object keyed by model name, is accepted
// too). The fields read, all optional; null shows as an empty cell:
//
//	MODEL:   model, strategy, layout, affinity (bool), spill_threshold, spill_auto (bool),
//	         sticky_pct (0..100), in_flight, sessions, session_cap, max_num_seqs,
//	         max_num_seqs_source, admission ({waiting, waits, timeouts, timeout_s}),
//	         spill_reasons ([{from, to, reason}], newest first), replicas ([REPLICA])
//	REPLICA: id, url, rank, state, in_flight, sticky, spilled_in, client_pinned, running,
//	         waiting, kv_usage (0..1, shown as %), prefix_hit_pct (0..100), scrape_state
//	         ("ok", "stale", "failed", "pending"), scrape_age_s, scrape_error, health_error,
//	         prefix_queries and prefix_hits (vLLM's prompt-token counters),
//	         kv_headroom_tokens and kv_capacity_tokens (shown as "37.6k/40k", headroom/capacity),
//	         kv_events ({connected, complete, blocks_held, miss_tokens: {cold, evicted,
//	         elsewhere}}: the blocks held, "≥" before a lower bound, and the computed tokens by
//	         why; the columns only when some replica has it), rehomes (conversations re-homed
//	         from the replica, found cold there; shown as "re-homed")
//
// Any other number in a REPLICA (a counter since start: requests, new, retried, ...) is shown
// in an extra column named after its key, in key order. A replica whose scrape_state is not
// "ok" is flagged in its row and in the model's panel (routing then uses local counts). The
// stats page reads the replicas' state from here and their hour from the history.
//
// # The history JSON the stats page reads
//
// live.HistoryReport (GET /api/history?model=NAME): interval_s, points and per model start_ms
// (point i covers start_ms + i*interval_s), the series prompt_tps, cached_tps, computed_tps,
// generation_tps and hit_pct (null where nothing was scraped), total (seconds, prompt_tokens,
// cached_tokens, computed_tokens, generation_tokens, hit_pct), and the same per replica (id,
// url) in replicas.
func DashboardHandler(o DashboardOptions) http.Handler {
	if o.Prefix == "" {
		o.Prefix = "/"
	}
	if !strings.HasSuffix(o.Prefix, "/") {
		o.Prefix += "/"
	}
	if o.StatusURL == "" {
		o.StatusURL = "/api/status"
	}
	if o.HistoryURL == "" {
		o.HistoryURL = "/api/history"
	}
	if o.Refresh <= 0 {
		o.Refresh = time.Second
	}
	cfg, _ := json.Marshal(map[string]any{ // cannot fail: strings and numbers
		"statusURL":  o.StatusURL,
		"historyURL": o.HistoryURL,
		"prefix":     o.Prefix,
		"refreshMs":  o.Refresh.Milliseconds(),
		// The history's points are 10 s long: reading it every 5 s is enough.
		"historyMs": max(o.Refresh, 5*time.Second).Milliseconds(),
	})
	render := func(kind, title string) []byte {
		var buf bytes.Buffer
		err := dashboardTemplate.Execute(&buf, dashboardView{
			Title:  title,
			Kind:   kind,
			Prefix: o.Prefix,
			Head:   servedHead(o.Prefix),
			CSS:    template.CSS(dashboardCSS),
			Config: template.JS(cfg),
			Script: template.JS(dashboardJS),
		})
		if err != nil {
			panic(fmt.Sprintf("web: dashboard template: %v", err)) // a bug in this package
		}
		return buf.Bytes()
	}
	routing := render("routing", "LM Warden: routing")
	stats := render("stats", "LM Warden: tokens and prefix-cache hits")
	static := http.StripPrefix(strings.TrimSuffix(o.Prefix, "/"), StaticHandler())

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, o.Prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		if strings.HasPrefix(rest, "static/") {
			static.ServeHTTP(w, r)
			return
		}
		var page []byte
		switch rest {
		case "":
			page = routing
		case "stats":
			page = stats
		default:
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(page)
	})
}

type dashboardView struct {
	Title, Kind, Prefix string
	Head                template.HTML
	CSS                 template.CSS
	Config, Script      template.JS
}

// dashboardCSS is what the dashboard adds to pageCSS: a wider column (its tables are wide),
// tables that scroll inside their own box rather than widen the page, and the sparklines.
const dashboardCSS = `
body.dashboard{max-width:1360px}
.scroll{max-width:100%;overflow-x:auto}
table.replicas{font-size:.85em;margin-top:0}
table.replicas th{vertical-align:bottom;padding:3px 2px}
table.replicas td{white-space:nowrap;padding:3px 2px}
table.replicas td.replica{white-space:normal;overflow-wrap:anywhere;min-width:6em;max-width:12em}
.warning{background:#fff7e0;border-left:4px solid #fac858;padding:.3em .6em;margin:.4em 0}
table.replicas td:nth-child(2){white-space:normal}
table.replicas td.split{white-space:normal;min-width:3.5em}
svg.spark{display:block;width:240px;height:30px}
#hist-replicas td:last-child{text-align:left}
svg.spark .computed{fill:#5470c6;opacity:.55}
svg.spark .cached{fill:#91cc75}
.answer{font-size:1.15em;font-weight:600;margin:.4em 0 .2em}
.legend-note{font-size:.85em;color:#52606d;margin:.2em 0}
`

var dashboardTemplate = template.Must(template.New("dashboard").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
{{.Head}}
<style>{{.CSS}}</style>
</head>
<body class="dashboard">
<header>
<h1>{{.Title}}</h1>
<nav><a href="{{.Prefix}}">routing</a><a href="{{.Prefix}}stats">stats</a><span id="models"></span></nav>
<p class="muted" id="updated">waiting for the first status</p>
</header>
<main id="main">
{{- if eq .Kind "stats"}}
<h2 id="stats-model"></h2>
<p class="answer" id="hour-hit">reading the last hour from the proxy</p>
<p class="legend-note">Prompt tokens per second as vLLM counted them on every replica (prompt_tokens_total): cached = served from the prefix cache (prefix_cache_hits_total), computed = the rest. Points of 10 s, kept by the proxy.</p>
<div class="chart" id="prompt" style="height:340px"></div>
<div class="chart" id="completion" style="height:220px"></div>
<h3>Per replica, last hour</h3>
<div class="scroll"><table class="replicas" id="hist-replicas"><thead><tr><th>replica</th><th>state</th><th>hit %<br>hour</th><th>prompt tok/s<br>last min</th><th>cached tok/s<br>last min</th><th>completion tok/s<br>last min</th><th>prompt tok/s (green: cached)</th></tr></thead><tbody></tbody></table></div>
{{- end}}
</main>
<script>
var wardenConfig = {{.Config}};
var wardenPage = {{.Kind}};

{{.Script}}
</script>
</body>
</html>
`))

// dashboardJS builds the pages from the status JSON with DOM calls (textContent only, so no
// field of the status can inject markup). It is inlined in each page, after wardenConfig and
// wardenPage.
//
//go:embed assets/dashboard.js
var dashboardJS string
