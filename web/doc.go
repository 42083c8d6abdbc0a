// Package web renders LM Warden's HTML: self-contained capacity reports and the live dashboard.
//
// Start reading at report.go: a Report is a title, the question and its answer in one sentence,
// and Sections of paragraphs, tables, charts and KPI definitions (name -> PromQL). It knows
// nothing of the simulator; SimReport (simreport.go) fills one from the simulator's results.
// charts.go builds the charts from plain float series with go-echarts (line charts with a log
// axis, bars, stacked areas, gauges), each with a fixed element id so that the same input gives
// byte-identical HTML; golden files of every chart's options live in testdata/.
//
// PlanReport (planreport.go) fills a Report from the planner's answer (planner.Result), reading
// its typed fields, one file per section: planreport_overview.go the candidates compared (table
// and charts), planreport_routings.go the cards per routing, planreport_rule.go the rule of thumb
// and its dials, planreport_timeline.go the answer's farm over time, planreport_candidate.go one
// section per candidate; planreport_band.go reads the uncertainty band and says what it is,
// planreport_format.go formats the figures, and planreport.go itself the buyer's check and the
// settings. observedreport.go is the "prediction vs observation" section of a plan of a running
// farm; CompareReport (comparereport.go) sets warden sim's prediction beside warden bench's
// measurement.
//
// Pages never touch the network. A report inlines Apache ECharts 5.6.0 (embedded from
// assets/echarts with its LICENSE and NOTICE, assets.go) in a <script> element, so it opens offline and can
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
