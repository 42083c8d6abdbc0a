package web

import (
	"html/template"
	"sync"
)

// pageCSS is the small stylesheet every page embeds: readable on screen and on paper.
const pageCSS = `
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1100px;padding:16px 24px;color:#1f2933;line-height:1.45}
header{border-bottom:2px solid #5470c6;margin-bottom:16px}
h1{font-size:1.6em;margin:.3em 0}
h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #d9dee5}
.question{font-size:1.05em;color:#52606d;margin:.2em 0}
.answer{font-size:1.2em;font-weight:600;margin:.3em 0 .8em}
.note{color:#52606d;margin:.2em 0 .8em}
table{border-collapse:collapse;margin:.8em 0;font-size:.92em}
caption{text-align:left;font-weight:600;padding:.3em 0}
th,td{border:1px solid #d9dee5;padding:4px 8px;text-align:right}
th{background:#f0f3f7}
td:first-child,th:first-child{text-align:left}
table.prose td,table.prose th{text-align:left}
.chart{width:100%;margin:12px 0}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em;background:#f5f7fa;padding:1px 3px}
dl.defs dt{font-weight:600;margin-top:.5em}
dl.defs dd{margin-left:1.2em}
nav a{margin-right:1em}
.ok{color:#2d7a3a}.bad{color:#b3261e}.muted{color:#7b8794}
footer{margin-top:2em;color:#7b8794;font-size:.85em}
@media print{.chart{break-inside:avoid}}
`

// drawJS draws one chart into its element and keeps it sized with the window.
const drawJS = `
"use strict";
var wardenCharts = [];
// A band's shading: a custom series whose one item is the outline [x0, y0, x1, y1, ...].
function wardenBand(flat, color) {
  return function (params, api) {
    var pts = [];
    for (var i = 0; i + 1 < flat.length; i += 2) { pts.push(api.coord([flat[i], flat[i + 1]])); }
    return {type: "polygon", shape: {points: pts}, silent: true, style: {fill: color, opacity: 0.18}};
  };
}
function wardenDraw(id, option) {
  var el = document.getElementById(id);
  (option.series || []).forEach(function (s) {
    if (s.renderItem === "__band__") { s.renderItem = wardenBand(s.data[0], s.color); }
  });
  var c = echarts.init(el, null, {renderer: "canvas"});
  c.setOption(option);
  wardenCharts.push(c);
  // What echarts holds after drawing, for tests that read the DOM: title, axis names, legend.
  var o = c.getOption(), names = function (a) { return (a || []).map(function (x) { return x.name || ""; }).join("|"); };
  var legend = (o.legend || []).some(function (l) { return l.show !== false; });
  el.setAttribute("data-title", ((o.title || [])[0] || {}).text || "");
  el.setAttribute("data-x-names", names(o.xAxis));
  el.setAttribute("data-y-names", names(o.yAxis));
  el.setAttribute("data-legend", legend ? names((o.series || []).filter(function (s) { return s.type !== "custom"; })) : "");
  el.setAttribute("data-type", ((o.series || [])[0] || {}).type || "");
  el.setAttribute("data-drawn", el.querySelector("canvas") ? "yes" : "no");
}
window.addEventListener("resize", function () { wardenCharts.forEach(function (c) { c.resize(); }); });
`

// inlineHead is the head of a self-contained page: echarts and the draw helper inlined.
// echarts.min.js contains no "</script" (checked by a test), so it can sit in a script element.
var inlineHead = sync.OnceValue(func() template.HTML {
	return template.HTML("<style>" + pageCSS + "</style>\n<script>" + string(echartsJS) + "</script>\n<script>" + drawJS + "</script>")
})

// servedHead is the head of a dashboard page: echarts fetched from the binary at StaticPath.
func servedHead(prefix string) template.HTML {
	return template.HTML("<style>" + pageCSS + "</style>\n<script src=\"" + template.HTMLEscapeString(prefix+StaticPath[1:]) + "\"></script>\n<script>" + drawJS + "</script>")
}

type pageView struct {
	Title, Question, Answer string
	Notes                   []string
	Head                    template.HTML
	Sections                []sectionView
}

type sectionView struct {
	Heading     string
	Paragraphs  []string
	Tables      []Table
	Charts      []chartView
	Definitions []Definition
}

type chartView struct {
	ID      string
	Height  int
	Options template.JS
}

func newChartView(c *Chart) (chartView, error) {
	js, err := c.OptionsJSON()
	if err != nil {
		return chartView{}, err
	}
	// OptionsJSON is HTML-escaped JSON (<, > and & as \u00XX), safe inside <script>.
	return chartView{ID: c.ID, Height: c.height(), Options: template.JS(js)}, nil
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="LM Warden">
<title>{{.Title}}</title>
{{.Head}}
</head>
<body>
<header>
<h1>{{.Title}}</h1>
{{- if .Question}}
<p class="question" id="question">{{.Question}}</p>
{{- end}}
{{- if .Answer}}
<p class="answer" id="answer">{{.Answer}}</p>
{{- end}}
{{- range .Notes}}
<p class="note">{{.}}</p>
{{- end}}
</header>
{{- range .Sections}}
<section>
{{- if .Heading}}
<h2>{{.Heading}}</h2>
{{- end}}
{{- range .Paragraphs}}
<p>{{.}}</p>
{{- end}}
{{- range .Tables}}
<table{{if .Prose}} class="prose"{{end}}>
{{- if .Caption}}<caption>{{.Caption}}</caption>{{end}}
{{- if .Header}}
<thead><tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr></thead>
{{- end}}
<tbody>
{{- range .Rows}}
<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{- end}}
</tbody>
</table>
{{- end}}
{{- range .Charts}}
<div class="chart" id="{{.ID}}" style="height:{{.Height}}px"></div>
<script>wardenDraw({{.ID}}, {{.Options}});</script>
{{- end}}
{{- if .Definitions}}
<dl class="defs">
{{- range .Definitions}}
<dt>{{.Title}}{{if .Unit}} ({{.Unit}}){{end}} <span class="muted">{{.Name}}</span></dt>
<dd><code>{{.Expr}}</code></dd>
{{- end}}
</dl>
{{- end}}
</section>
{{- end}}
<footer>Made by LM Warden. Charts drawn by Apache ECharts ` + EChartsVersion + ` (Apache License 2.0), embedded in this page: it opens offline.</footer>
</body>
</html>
`))
