var KNOWN = [
  ["in_flight", "in flight"], ["sticky", "sticky"], ["spilled_in", "spilled in"],
  ["client_pinned", "client-pinned"], ["running", "running"], ["waiting", "waiting"],
  ["kv_used_pct", "KV used %", function (r) { return typeof r.kv_usage === "number" ? 100 * r.kv_usage : r.kv_used_pct; }],
  ["prefix_hit_pct", "prefix hit %"],
  ["footprint_tokens", "KV held<br>of cap", kvHeld],
  ["sessions", "sessions<br>all/active/<br>held", sessionCounts]
];
// OPTIONAL columns are shown only when some replica carries their field: the KV events'
// blocks held and computed tokens by why (kv_events), and the conversations re-homed
// from a replica found cold for them (rehomes: shown once some replica has re-homed one,
// since the proxy reports the count, 0, with rehome off too).
var OPTIONAL = [
  ["kv_events", "cache holds<br>blocks", kvBlocks],
  ["kv_miss", "computed tok<br>cold/evicted/<br>elsewhere", kvMiss, "kv_events"],
  ["rehomes", "re-homed", function (r) { return num(r.rehomes) + (r.rehomed_in ? " (in " + num(r.rehomed_in) + ")" : ""); }, "rehomes",
    function (r) { return r.rehomes > 0 || r.rehomed_in > 0; }]
];
// kvBlocks is the blocks a replica's prefix cache holds from its KV events, "≥" when the
// count is a lower bound (batches lost, or subscribed after the start), "off" while the
// events' socket is not connected.
function kvBlocks(r) {
  var k = r.kv_events;
  if (!k || typeof k !== "object") return "";
  var v = kTok(k.blocks_held);
  if (!k.complete) v = "\u2265" + v;
  return k.connected ? v : v + " (off)";
}
function kvMiss(r) {
  var k = r.kv_events;
  if (!k || !k.miss_tokens) return "";
  var m = k.miss_tokens;
  return [m.cold, m.evicted, m.elsewhere].map(kTok).join("/");
}
// columns is KNOWN plus the OPTIONAL columns some replica has.
function columns(reps) {
  return KNOWN.concat(OPTIONAL.filter(function (k) {
    var key = k[3] || k[0], show = k[4];
    return reps.some(function (r) { return show ? show(r) : r[key] !== undefined && r[key] !== null; });
  }));
}
var HIDDEN = {id: 1, url: 1, rank: 1, state: 1, scrape_state: 1, scrape_age_s: 1, kv_usage: 1,
  prefix_hits: 1, prefix_queries: 1, kv_capacity_tokens: 1, kv_headroom_tokens: 1,
  active_sessions: 1, held_sessions: 1, prefill_tokens_per_s: 1, prefill_queue_tokens: 1,
  rehomes: 1, rehomed_in: 1, observed_prompt_tokens: 1, observed_cached_tokens: 1, kv_events: 1};
// kTok writes a token count compactly: 37.6k, 1.2M.
function kTok(v) {
  if (typeof v !== "number" || !isFinite(v)) return "";
  var a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return String(Math.round(v));
}
// kvHeld is "held footprint/capacity" in tokens (the headroom admission and the KV balance
// see is the difference, negative once the conversations held there outgrew the cache);
// "" when the server does not expose its cache size.
function kvHeld(r) {
  if (typeof r.kv_capacity_tokens !== "number") return "";
  return kTok(r.footprint_tokens || 0) + "/" + kTok(r.kv_capacity_tokens);
}
// sessionCounts is a replica's conversations: homed there / seen within the active window /
// held (a request in flight or expected back within its return timeout).
function sessionCounts(r) {
  if (typeof r.sessions !== "number") return "";
  return [r.sessions, r.active_sessions, r.held_sessions].map(function (v) { return num(v); }).join("/");
}
// admissionText summarises a model's admission queue; "" when admission is off.
function admissionText(a) {
  if (!a || typeof a !== "object") return "";
  return "kv: " + num(a.waiting) + " waiting, " + num(a.waits) + " waited, " + num(a.timeouts) + " timed out (timeout " + num(a.timeout_s) + " s)";
}
// spillText is the latest spill reasons, newest first.
function spillText(rs) {
  if (!Array.isArray(rs) || !rs.length) return "";
  return rs.slice(0, 3).map(function (s) { return s.from + "\u2192" + s.to + " " + s.reason; }).join("; ");
}

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
  // What routing assumes that the operator should know (a max_num_seqs nobody stated, a
  // prefill rate missing): said above the tables, where it is seen.
  (Array.isArray(m.warnings) ? m.warnings : []).forEach(function (w) {
    var p = el("p", "\u26a0 " + w, "warning"); p.dataset.field = "warning"; sec.appendChild(p);
  });
  var reps = Array.isArray(m.replicas) ? m.replicas : [];
  var t = el("table"); t.className = "routing";
  var spill = typeof m.spill_threshold === "number" ? num(m.spill_threshold) + (m.spill_auto ? " (auto)" : " (fixed)") : "";
  if (m.spill_priced) spill = "priced" + (spill ? ", else " + spill : "");
  var seqs = typeof m.max_num_seqs === "number" ? num(m.max_num_seqs) + (m.max_num_seqs_source ? " (" + m.max_num_seqs_source + ")" : "") : "";
  var sessions = typeof m.sessions === "number" ? num(m.sessions) + (typeof m.session_cap === "number" ? " of " + num(m.session_cap) : "") : "";
  [["strategy", m.strategy || ""],
   ["affinity", typeof m.affinity === "boolean" ? (m.affinity ? "on" : "off") : ""],
   ["spill threshold", spill], ["sticky %", num(m.sticky_pct, 1)], ["in flight", num(m.in_flight)],
   ["sessions", sessions], ["max_num_seqs", seqs], ["layout", m.layout || ""],
   ["scrape", scrapeSummary(reps)]].concat(
    m.admission ? [["admission", admissionText(m.admission)]] : [],
    Array.isArray(m.spill_reasons) && m.spill_reasons.length ? [["last spills", spillText(m.spill_reasons)]] : []
  ).forEach(function (row) {
    var tr = el("tr"); tr.appendChild(el("th", row[0]));
    var td = el("td", row[1]); td.dataset.field = row[0]; tr.appendChild(td); t.appendChild(tr);
  });
  sec.appendChild(t);
  var extra = extraKeys(reps);
  var cols = columns(reps);
  var rt = el("table"); rt.className = "replicas";
  var head = el("tr");
  ["replica", "state"].concat(cols.map(function (k) { return k[1]; }),
    extra.map(function (k) { return k.replace(/_/g, " "); })).forEach(function (h) {
    var th = el("th");
    h.split("<br>").forEach(function (part, i) { if (i) th.appendChild(el("br")); th.appendChild(document.createTextNode(part)); });
    head.appendChild(th);
  });
  var thead = el("thead"); thead.appendChild(head); rt.appendChild(thead);
  var tb = el("tbody");
  reps.forEach(function (r, i) {
    var tr = el("tr");
    var id = r.id === undefined ? i : r.id;
    tr.id = "replica-" + m.model + "-" + id;
    tr.appendChild(replicaCell(id, r));
    tr.appendChild(stateCell(r));
    cols.forEach(function (k) {
      var v = k[2] ? k[2](r) : r[k[0]];
      var text = typeof v === "string" ? v : num(v);
      // "12.3M/2.3M/1.2M" may break after a slash: the table keeps within the page.
      var td = el("td", text.indexOf("/") >= 0 ? text.replace(/\//g, "/\u200b") : text, text.indexOf("/") >= 0 ? "split" : "");
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
  var box = el("div", null, "scroll"); box.appendChild(rt);
  sec.appendChild(box);
  return sec;
}
// replicaCell names a replica in full: its id, its data-parallel rank and its URL, never cut
// (the cell wraps, at any character of a long URL), so that two replicas on one host, on two
// ports or two ranks of one URL, read apart.
function replicaCell(id, r) {
  var name = String(id) + (typeof r.rank === "number" ? " (rank " + r.rank + ")" : "") + (r.url ? " " + r.url : "");
  var td = el("td", name, "replica"); td.title = name;
  return td;
}
// stateCell is a replica's state, flagged when it is not healthy or its scrape is not ok.
function stateCell(r) {
  var state = r.state || "";
  var badScrape = r.scrape_state && r.scrape_state !== "ok";
  if (badScrape) state += (state ? ", " : "") + "scrape " + r.scrape_state;
  var st = el("td", state, badScrape || (r.state && r.state !== "healthy") ? "bad" : "");
  if (r.scrape_error || r.health_error) st.title = [r.scrape_error, r.health_error].filter(Boolean).join("; ");
  return st;
}
// The stats page: the hour the proxy keeps (live.HistoryReport), drawn as soon as it arrives.
var lastStatus = null, lastHistory = null, lastHistoryAt = 0, charts = {};
var GREEN = "#91cc75", BLUE = "#5470c6", TEAL = "#3ba272";
function fmtRate(v) {
  if (typeof v !== "number" || !isFinite(v)) return "";
  if (v >= 1e6) return (v / 1e6).toFixed(2) + " M";
  if (v >= 1e4) return (v / 1e3).toFixed(1) + " k";
  return v >= 100 ? v.toFixed(0) : v.toFixed(1);
}
function fmtTokens(v) {
  if (typeof v !== "number" || !isFinite(v)) return "";
  if (v >= 1e9) return (v / 1e9).toFixed(2) + " G";
  if (v >= 1e6) return (v / 1e6).toFixed(2) + " M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + " k";
  return v.toFixed(0);
}
// spanWords names how long a total covers: "Last hour", or less while the proxy is young.
function spanWords(sec, hour) {
  if (sec >= hour - 20) return "Last hour";
  var d = sec < 120 ? Math.round(sec) + " s" : Math.round(sec / 60) + " min";
  return "Last " + d + " (as long as the proxy has counted)";
}
function hourSentence(h, hour) {
  var t = h.total || {};
  if (!(t.seconds > 0)) return "No counts yet: the hour starts with the proxy's second scrape of vLLM's /metrics.";
  var head = spanWords(t.seconds, hour) + ": ";
  if (typeof t.hit_pct !== "number" || !(t.prompt_tokens > 0)) return head + "no prompt tokens.";
  var s = head + num(t.hit_pct, 1) + " % of prompt tokens came from the prefix cache (" +
    fmtTokens(t.cached_tokens) + " cached, " + fmtTokens(t.computed_tokens) + " computed";
  if (typeof t.generation_tokens === "number") s += "; " + fmtTokens(t.generation_tokens) + " completion tokens";
  return s + ").";
}
function points(h, iv, arr) {
  var out = [];
  for (var i = 0; i < (arr || []).length; i++) out.push([h.start_ms + i * iv, arr[i]]);
  return out;
}
function counted(arr) { return (arr || []).filter(function (v) { return typeof v === "number"; }).length; }
// lastMinute is the mean rate of the last minute's points that were scraped.
function lastMinute(arr, iv) {
  var n = Math.max(1, Math.round(60000 / iv)), s = 0, k = 0;
  for (var i = Math.max(0, arr.length - n); i < arr.length; i++) if (typeof arr[i] === "number") { s += arr[i]; k++; }
  return k ? s / k : null;
}
// xRange shows from the first scraped point (at least five minutes) to the end of the ring.
function xRange(h, iv, n) {
  var end = h.start_ms + n * iv, first = end;
  for (var i = 0; i < n; i++) if (typeof h.prompt_tps[i] === "number") { first = h.start_ms + i * iv; break; }
  return {min: Math.min(first, end - 5 * 60000), max: end};
}
function areaSeries(name, color, data, stack) {
  var few = counted(data.map(function (p) { return p[1]; })) < 3;
  return {name: name, type: "line", stack: stack, data: data, color: color, symbol: "circle", symbolSize: 4,
    showSymbol: few, lineStyle: {width: 1}, areaStyle: {opacity: 0.75}, emphasis: {disabled: true}};
}
function timeAxis(r) {
  return {type: "time", min: r.min, max: r.max, axisLabel: {hideOverlap: true}, splitLine: {show: false}};
}
function axisRate(v) {
  if (v >= 1e6) return +(v / 1e6).toFixed(1) + " M";
  if (v >= 1e3) return +(v / 1e3).toFixed(1) + " k";
  return String(+v.toFixed(1));
}
function rateAxis(name) {
  return {type: "value", name: name, nameGap: 12, axisLabel: {formatter: axisRate}, min: 0};
}
// promptTip lists, for the point under the pointer, cached, computed, their sum and the hit %.
function promptTip(h, iv) {
  return function (ps) {
    if (!ps.length) return "";
    var i = ps[0].dataIndex, c = h.cached_tps[i], p = h.computed_tps[i], hit = h.hit_pct[i];
    var d = new Date(h.start_ms + i * iv);
    var out = [d.toLocaleTimeString() + ", " + (iv / 1000) + " s"];
    if (typeof c !== "number") return out.concat(["not scraped"]).join("<br>");
    out.push("cached " + fmtRate(c) + " tokens/s", "computed " + fmtRate(p) + " tokens/s",
      "prompt " + fmtRate(h.prompt_tps[i]) + " tokens/s", "hit " + (typeof hit === "number" ? num(hit, 1) + " %" : "-"));
    return out.join("<br>");
  };
}
function chart(id) {
  if (!charts[id]) charts[id] = echarts.init(document.getElementById(id), null, {renderer: "canvas"});
  return charts[id];
}
// sparkline draws a replica's prompt tokens/s (computed on top, cached below) on a shared scale.
function sparkline(h, top, from) {
  var NS = "http://www.w3.org/2000/svg", W = 360, H = 30, n = (h.prompt_tps || []).length - from;
  var svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  svg.setAttribute("preserveAspectRatio", "none");
  function area(arr, cls) {
    var d = "", run = [];
    function flush() {
      if (!run.length) return;
      d += "M" + run[0][0] + " " + H;
      run.forEach(function (p) { d += "L" + p[0] + " " + p[1]; });
      d += "L" + run[run.length - 1][0] + " " + H + "Z";
      run = [];
    }
    for (var i = 0; i < n; i++) {
      var v = arr[from + i], x = (i + 0.5) * W / n;
      if (typeof v !== "number") { flush(); continue; }
      run.push([x.toFixed(1), (H - H * Math.min(1, v / top)).toFixed(1)]);
    }
    flush();
    var p = document.createElementNS(NS, "path");
    p.setAttribute("class", cls);
    p.setAttribute("d", d || "M0 " + H);
    svg.appendChild(p);
  }
  area(h.prompt_tps || [], "computed");
  area(h.cached_tps || [], "cached");
  return svg;
}
function drawStats() {
  var rep = lastHistory;
  if (!rep) return;
  var want = wanted();
  var h = (rep.models || []).filter(function (m) { return !want || m.model === want; })[0];
  var title = document.getElementById("stats-model");
  if (!h) { title.textContent = want ? "no model named " + want : "no model"; return; }
  var iv = 1000 * rep.interval_s, n = (h.prompt_tps || []).length, hour = rep.interval_s * rep.points;
  title.textContent = h.model;
  document.getElementById("hour-hit").textContent = hourSentence(h, hour);
  var r = xRange(h, iv, n);
  var grid = {top: 56, left: 16, right: 24, bottom: 24, containLabel: true};
  var tooltip = {trigger: "axis", valueFormatter: function (v) { return typeof v === "number" ? fmtRate(v) + " tokens/s" : "not scraped"; }};
  chart("prompt").setOption({
    animation: false, title: {text: "Prompt tokens per second", textStyle: {fontSize: 14}},
    legend: {top: 2, right: 24}, tooltip: {trigger: "axis", formatter: promptTip(h, iv)}, grid: grid,
    xAxis: timeAxis(r), yAxis: rateAxis("tokens/s"),
    series: [areaSeries("cached (prefix cache)", GREEN, points(h, iv, h.cached_tps), "prompt"),
             areaSeries("computed", BLUE, points(h, iv, h.computed_tps), "prompt")]
  });
  document.getElementById("prompt").setAttribute("data-points", counted(h.prompt_tps));
  var gen = points(h, iv, h.generation_tps);
  chart("completion").setOption({
    animation: false, title: {text: "Completion tokens per second", textStyle: {fontSize: 14},
      subtext: counted(h.generation_tps) ? "" : "the servers expose no vllm:generation_tokens_total"},
    tooltip: tooltip, grid: {top: 48, left: 16, right: 24, bottom: 24, containLabel: true},
    xAxis: timeAxis(r), yAxis: rateAxis("tokens/s"),
    series: [areaSeries("completion", TEAL, gen)]
  });
  document.getElementById("completion").setAttribute("data-points", counted(h.generation_tps));
  drawReplicas(h, iv);
}
// firstIndex is the ring index the charts start at (see xRange).
function firstIndex(h, iv) {
  var n = (h.prompt_tps || []).length;
  return Math.max(0, Math.min(n - 1, Math.floor((xRange(h, iv, n).min - h.start_ms) / iv)));
}
function drawReplicas(h, iv) {
  var reps = h.replicas || [], states = {};
  if (lastStatus) {
    models(lastStatus).forEach(function (m) {
      if (m.model === h.model) (m.replicas || []).forEach(function (r, i) { states[r.id === undefined ? i : r.id] = r; });
    });
  }
  var top = 0;
  reps.forEach(function (r) { (r.prompt_tps || []).forEach(function (v) { if (typeof v === "number" && v > top) top = v; }); });
  top = top || 1;
  var from = firstIndex(h, iv);
  var tb = document.querySelector("#hist-replicas tbody");
  tb.textContent = "";
  reps.forEach(function (r) {
    var tr = el("tr"); tr.id = "hist-replica-" + r.id;
    tr.appendChild(replicaCell(r.id, r));
    tr.appendChild(states[r.id] ? stateCell(states[r.id]) : el("td", ""));
    var t = r.total || {};
    [["hit", num(t.hit_pct, 1)], ["prompt", fmtRate(lastMinute(r.prompt_tps || [], iv))],
     ["cached", fmtRate(lastMinute(r.cached_tps || [], iv))],
     ["completion", fmtRate(lastMinute(r.generation_tps || [], iv))]].forEach(function (c) {
      var td = el("td", c[1]); td.dataset.field = c[0]; tr.appendChild(td);
    });
    var sp = el("td"); sp.appendChild(sparkline(r, top, from)); tr.appendChild(sp);
    tb.appendChild(tr);
  });
}
function pollHistory() {
  var want = wanted();
  var url = wardenConfig.historyURL + (want ? "?model=" + encodeURIComponent(want) : "");
  lastHistoryAt = Date.now();
  fetch(url, {cache: "no-store"})
    .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
    .then(function (rep) { lastHistory = rep; drawStats(); })
    .catch(function (e) {
      document.getElementById("hour-hit").textContent = "history unavailable: " + e.message;
    });
}
window.addEventListener("resize", function () { Object.keys(charts).forEach(function (k) { charts[k].resize(); }); });
function show(status) {
  var ms = models(status);
  modelLinks(ms);
  lastStatus = status;
  var now = Date.now();
  var want = wanted();
  var shown = ms.filter(function (m) { return !want || m.model === want; });
  document.getElementById("updated").textContent = "updated " + new Date(now).toLocaleTimeString() +
    (want && !shown.length ? "; no model named " + want : "");
  if (wardenPage === "stats") {
    if (lastHistory) drawReplicas(currentHistory(), 1000 * lastHistory.interval_s);
    return;
  }
  var main = document.getElementById("main");
  main.textContent = "";
  shown.forEach(function (m) { main.appendChild(panel(m)); });
}
function currentHistory() {
  var want = wanted();
  return (lastHistory.models || []).filter(function (m) { return !want || m.model === want; })[0] || {replicas: []};
}
function poll() {
  if (wardenPage === "stats" && Date.now() - lastHistoryAt >= wardenConfig.historyMs) pollHistory();
  fetch(wardenConfig.statusURL, {cache: "no-store"})
    .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
    .then(show)
    .catch(function (e) {
      document.getElementById("updated").textContent = "status unavailable: " + e.message;
    });
}
poll();
setInterval(poll, wardenConfig.refreshMs);
