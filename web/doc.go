// Package web renders LM Warden's HTML: self-contained capacity reports and the live dashboard.
//
// Start reading at report.go: a Report is a title, the question and its answer in one sentence,
// and Sections of paragraphs, tables, charts and KPI definitions (name -> PromQL). It knows
// nothing of the simulator; SimReport (simreport.go) fills one from the simulator's results.
// charts.go builds the charts from plain float series with go-echarts (line charts with a log
// axis, bars, stacked areas, gauges), each with a fixed element id so that the same input gives
// byte-identical HTML; golden files of every chart's options live in testdata/.
//
// Pages never touch the network. A report inlines Apache ECharts 5.6.0 (embedded from
// assets/echarts with its LICENSE and NOTICE) in a <script> element, so it opens offline and can
// be mailed. The dashboard (dashboard.go, its script in assets/dashboard.js, embedded and inlined
// in each page) is served by the proxy's admin listener; its pages load echarts from the binary
// and poll the proxy's /api/status (live.StatusReport, read as generic
// JSON; DashboardHandler documents the fields) once a second; the stats page draws the last hour
// that the proxy keeps (/api/history, live.HistoryReport) as soon as it opens.
//
// go-echarts is used for what it is good at, typed chart options; the page around the charts is
// this package's own html/template (page.go), because a report interleaves prose, tables and
// charts, and because options are embedded as HTML-escaped JSON (a series named "</script>"
// cannot end the script element).
//
// Package webtest drives headless Chromium to check that pages really draw: every chart a
// canvas, no console message, no network request.
package web
