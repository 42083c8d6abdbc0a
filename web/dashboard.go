package web

import (
	"bytes"
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
	// Refresh is the polling period; 0 means one second.
	Refresh time.Duration
}

// DashboardHandler serves the live dashboard of `warden proxy` on its admin listener:
//
//	{prefix}                        the data-parallel routing page, one panel per model
//	{prefix}?model=NAME             the routing page of one model
//	{prefix}stats?model=NAME        prompt tokens per second, cached vs computed, and hit rate
//	{prefix}static/echarts.min.js   echarts from the binary (also LICENSE, NOTICE)
//
// The pages are static; their script fetches StatusURL every Refresh and draws what it finds.
// The stats page keeps the last hour of samples in the page (a ring of one sample per refresh),
// so its history starts when the page is opened.
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
//	         max_num_seqs_source, replicas ([REPLICA])
//	REPLICA: id, url, rank, state, in_flight, sticky, spilled_in, client_pinned, running,
//	         waiting, kv_usage (0..1, shown as %), prefix_hit_pct (0..100), scrape_state
//	         ("ok", "stale", "failed", "pending"), scrape_age_s, scrape_error, health_error,
//	         prefix_queries and prefix_hits (vLLM's prompt-token counters)
//
// Any other number in a REPLICA (a counter since start: requests, new, retried, ...) is shown
// in an extra column named after its key, in key order. A replica whose scrape_state is not
// "ok" is flagged in its row and in the model's panel (routing then uses local counts). The
// stats page sums prefix_queries (prompt tokens) and prefix_hits (of those, served from cache)
// over a model's replicas and differentiates them between polls.
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
	if o.Refresh <= 0 {
		o.Refresh = time.Second
	}
	cfg, _ := json.Marshal(map[string]any{ // cannot fail: strings and a number
		"statusURL": o.StatusURL,
		"prefix":    o.Prefix,
		"refreshMs": o.Refresh.Milliseconds(),
	})
	render := func(kind, title string) []byte {
		var buf bytes.Buffer
		err := dashboardTemplate.Execute(&buf, dashboardView{
			Title:  title,
			Kind:   kind,
			Prefix: o.Prefix,
			Head:   servedHead(o.Prefix),
			Config: template.JS(cfg),
			Script: template.JS(dashboardJS),
		})
		if err != nil {
			panic(fmt.Sprintf("web: dashboard template: %v", err)) // a bug in this package
		}
		return buf.Bytes()
	}
	routing := render("routing", "LM Warden: routing")
	stats := render("stats", "LM Warden: prompt tokens and hit rate")
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
	Config, Script      template.JS
}

var dashboardTemplate = template.Must(template.New("dashboard").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
{{.Head}}
</head>
<body>
<header>
<h1>{{.Title}}</h1>
<nav><a href="{{.Prefix}}">routing</a><a href="{{.Prefix}}stats">stats</a><span id="models"></span></nav>
<p class="muted" id="updated">waiting for the first status</p>
</header>
<main id="main"></main>
{{- if eq .Kind "stats"}}
<div class="chart" id="prompt" style="height:360px"></div>
<div class="chart" id="hitrate" style="height:300px"></div>
{{- end}}
<script>
var wardenConfig = {{.Config}};
var wardenPage = {{.Kind}};
{{.Script}}
</script>
</body>
</html>
`))

// dashboardJS builds the pages from the status JSON with DOM calls (textContent only, so no
// field of the status can inject markup).
const dashboardJS = `
var KNOWN = [
  ["in_flight", "in flight"], ["sticky", "sticky"], ["spilled_in", "spilled in"],
  ["client_pinned", "client-pinned"], ["running", "running"], ["waiting", "waiting"],
  ["kv_used_pct", "KV used %", function (r) { return typeof r.kv_usage === "number" ? 100 * r.kv_usage : r.kv_used_pct; }],
  ["prefix_hit_pct", "prefix hit %"]
];
var HIDDEN = {id: 1, url: 1, rank: 1, state: 1, scrape_state: 1, scrape_age_s: 1, kv_usage: 1,
  prefix_hits: 1, prefix_queries: 1};
var RING = 3600;
var samples = {};   // model -> [{t, prompt, cached}], at most RING samples

function el(tag, text, cls) {
  var e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function num(v, digits) {
  if (typeof v !== "number" || !isFinite(v)) return "";
  if (digits === undefined) digits = Number.isInteger(v) ? 0 : 1;
  return v.toFixed(digits);
}
function models(status) {
  if (Array.isArray(status)) return status;
  if (status && Array.isArray(status.models)) return status.models;
  var out = [];
  if (status && typeof status === "object") {
    Object.keys(status).sort().forEach(function (k) {
      var m = status[k];
      if (m && typeof m === "object") { if (!m.model) m.model = k; out.push(m); }
    });
  }
  return out;
}
function wanted() { return new URLSearchParams(location.search).get("model"); }
function modelLinks(ms) {
  var nav = document.getElementById("models");
  nav.textContent = "";
  var page = wardenPage === "stats" ? "stats" : "";
  ms.forEach(function (m) {
    var a = el("a", m.model);
    a.href = wardenConfig.prefix + page + "?model=" + encodeURIComponent(m.model);
    nav.appendChild(a);
  });
}
function extraKeys(reps) {
  var known = {}; KNOWN.forEach(function (k) { known[k[0]] = 1; });
  var keys = {};
  reps.forEach(function (r) {
    Object.keys(r).forEach(function (k) {
      if (!known[k] && !HIDDEN[k] && typeof r[k] === "number") keys[k] = 1;
    });
  });
  return Object.keys(keys).sort();
}
function scrapeSummary(reps) {
  var bad = [];
  reps.forEach(function (r, i) {
    if (r.scrape_state && r.scrape_state !== "ok") {
      bad.push("replica " + (r.id === undefined ? i : r.id) + " " + r.scrape_state + (r.scrape_error ? " (" + r.scrape_error + ")" : ""));
    }
  });
  if (bad.length) return bad.join("; ") + "; routing on local counts there";
  var ages = reps.map(function (r) { return r.scrape_age_s; }).filter(function (a) { return typeof a === "number"; });
  return reps.length ? "ok" + (ages.length ? ", oldest " + num(Math.max.apply(null, ages), 1) + " s" : "") : "";
}
function panel(m) {
  var sec = el("section");
  sec.id = "model-" + m.model;
  sec.appendChild(el("h2", m.model));
  var reps = Array.isArray(m.replicas) ? m.replicas : [];
  var t = el("table"); t.className = "routing";
  var spill = typeof m.spill_threshold === "number" ? num(m.spill_threshold) + (m.spill_auto ? " (auto)" : " (fixed)") : "";
  var seqs = typeof m.max_num_seqs === "number" ? num(m.max_num_seqs) + (m.max_num_seqs_source ? " (" + m.max_num_seqs_source + ")" : "") : "";
  var sessions = typeof m.sessions === "number" ? num(m.sessions) + (typeof m.session_cap === "number" ? " of " + num(m.session_cap) : "") : "";
  [["strategy", m.strategy || ""],
   ["affinity", typeof m.affinity === "boolean" ? (m.affinity ? "on" : "off") : ""],
   ["spill threshold", spill], ["sticky %", num(m.sticky_pct, 1)], ["in flight", num(m.in_flight)],
   ["sessions", sessions], ["max_num_seqs", seqs], ["layout", m.layout || ""],
   ["scrape", scrapeSummary(reps)]].forEach(function (row) {
    var tr = el("tr"); tr.appendChild(el("th", row[0]));
    var td = el("td", row[1]); td.dataset.field = row[0]; tr.appendChild(td); t.appendChild(tr);
  });
  sec.appendChild(t);
  var extra = extraKeys(reps);
  var rt = el("table"); rt.className = "replicas";
  var head = el("tr");
  ["replica", "state"].concat(KNOWN.map(function (k) { return k[1]; }),
    extra.map(function (k) { return k.replace(/_/g, " "); })).forEach(function (h) { head.appendChild(el("th", h)); });
  var thead = el("thead"); thead.appendChild(head); rt.appendChild(thead);
  var tb = el("tbody");
  reps.forEach(function (r, i) {
    var tr = el("tr");
    var id = r.id === undefined ? i : r.id;
    tr.id = "replica-" + m.model + "-" + id;
    var name = String(id) + (typeof r.rank === "number" ? " (rank " + r.rank + ")" : "") + (r.url ? " " + r.url : "");
    tr.appendChild(el("td", name));
    var state = r.state || "";
    var badScrape = r.scrape_state && r.scrape_state !== "ok";
    if (badScrape) state += (state ? ", " : "") + "scrape " + r.scrape_state;
    var st = el("td", state, badScrape || (r.state && r.state !== "healthy") ? "bad" : "");
    if (r.scrape_error || r.health_error) st.title = [r.scrape_error, r.health_error].filter(Boolean).join("; ");
    tr.appendChild(st);
    KNOWN.forEach(function (k) {
      var td = el("td", num(k[2] ? k[2](r) : r[k[0]]));
      td.dataset.field = k[0];
      tr.appendChild(td);
    });
    extra.forEach(function (k) {
      var td = el("td", num(r[k]));
      td.dataset.field = k;
      tr.appendChild(td);
    });
    tb.appendChild(tr);
  });
  rt.appendChild(tb);
  sec.appendChild(rt);
  return sec;
}
function sum(reps, k) {
  var s = 0, seen = false;
  reps.forEach(function (r) { if (typeof r[k] === "number") { s += r[k]; seen = true; } });
  return seen ? s : null;
}
function record(ms, now) {
  ms.forEach(function (m) {
    var reps = Array.isArray(m.replicas) ? m.replicas : [];
    var p = sum(reps, "prefix_queries"), c = sum(reps, "prefix_hits");
    if (p === null || c === null) return;
    var h = samples[m.model] || (samples[m.model] = []);
    h.push({t: now, prompt: p, cached: c});
    if (h.length > RING) h.shift();
  });
}
var charts = {};
function drawStats(m) {
  var h = samples[m.model] || [];
  var cached = [], computed = [], hit = [];
  for (var i = 1; i < h.length; i++) {
    var dt = (h[i].t - h[i - 1].t) / 1000;
    var dp = h[i].prompt - h[i - 1].prompt, dc = h[i].cached - h[i - 1].cached;
    if (dt <= 0 || dp < 0 || dc < 0) continue;   // counter reset: skip the step
    var x = new Date(h[i].t);
    cached.push([x, dc / dt]);
    computed.push([x, Math.max(0, dp - dc) / dt]);
    hit.push([x, dp > 0 ? 100 * dc / dp : null]);
  }
  var hour = "";
  if (h.length > 1) {
    var a = h[0], b = h[h.length - 1];
    if (b.prompt > a.prompt) hour = num(100 * (b.cached - a.cached) / (b.prompt - a.prompt), 1) + " %";
  }
  var main = document.getElementById("main");
  main.textContent = "";
  main.appendChild(el("h2", m.model));
  var span = h.length ? (h[h.length - 1].t - h[0].t) / 1000 : 0;
  var p = el("p", "Prefix-cache hit rate over the last " + (span < 120 ? Math.round(span) + " s" : Math.round(span / 60) + " min") +
    " (at most one hour, since this page opened): ");
  var s = el("strong", hour || "no prompt tokens yet"); s.id = "hour-hit";
  p.appendChild(s);
  main.appendChild(p);
  if (!charts.prompt) {
    charts.prompt = echarts.init(document.getElementById("prompt"), null, {renderer: "canvas"});
    charts.hit = echarts.init(document.getElementById("hitrate"), null, {renderer: "canvas"});
  }
  charts.prompt.setOption({
    animation: false, title: {text: "Prompt tokens per second"}, legend: {top: 28},
    tooltip: {trigger: "axis"}, grid: {top: 70, left: 60, right: 30, bottom: 40, containLabel: true},
    xAxis: {type: "time"}, yAxis: {type: "value", name: "tokens/s"},
    series: [
      {name: "computed", type: "line", stack: "total", areaStyle: {opacity: 0.6}, showSymbol: false, data: computed},
      {name: "cached", type: "line", stack: "total", areaStyle: {opacity: 0.6}, showSymbol: false, data: cached}
    ]
  });
  charts.hit.setOption({
    animation: false, title: {text: "Prefix-cache hit rate"}, tooltip: {trigger: "axis"},
    grid: {top: 50, left: 60, right: 30, bottom: 40, containLabel: true},
    xAxis: {type: "time"}, yAxis: {type: "value", name: "%", min: 0, max: 100},
    series: [{name: "hit %", type: "line", showSymbol: false, data: hit}]
  });
}
function show(status) {
  var ms = models(status);
  modelLinks(ms);
  var now = Date.now();
  record(ms, now);
  var want = wanted();
  var shown = ms.filter(function (m) { return !want || m.model === want; });
  document.getElementById("updated").textContent = "updated " + new Date(now).toLocaleTimeString() +
    (want && !shown.length ? "; no model named " + want : "");
  if (wardenPage === "stats") {
    if (shown.length) drawStats(shown[0]);
    return;
  }
  var main = document.getElementById("main");
  main.textContent = "";
  shown.forEach(function (m) { main.appendChild(panel(m)); });
}
function poll() {
  fetch(wardenConfig.statusURL, {cache: "no-store"})
    .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
    .then(show)
    .catch(function (e) {
      document.getElementById("updated").textContent = "status unavailable: " + e.message;
    });
}
poll();
setInterval(poll, wardenConfig.refreshMs);
`
