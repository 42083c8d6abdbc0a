package web

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/go-echarts/go-echarts/v2/charts"
	"github.com/go-echarts/go-echarts/v2/opts"
)

// Series is one named line, bar or area: Y[i] belongs to the chart's i-th x value or category.
// A NaN or infinite value is drawn as a gap, and so is a value <= 0 on a log axis.
type Series struct {
	Name string
	Y    []float64
	// Low and High, when set (one value per x, like Y), are the edges of the series' band
	// (e.g. the KPI with the KV cache 15 % smaller and 10 % larger than estimated): drawn as
	// thin dashed lines in the series' colour with the space between them shaded. Line charts
	// only.
	Low, High []float64
	// Marks are lines drawn in the series' colour (markLine): a target (Y set) or a point on
	// the x axis (X set), e.g. where sessions x context fills this farm's KV cache.
	Marks []Mark
}

// Mark is one straight line across an XY chart, labelled with Name: horizontal at Y, or
// vertical at X. Color "" keeps the series' colour.
type Mark struct {
	Name  string
	X, Y  *float64
	Color string
	// Row lifts a vertical mark's label by that many label heights, so
	// that the labels of lines a few units apart do not overprint
	// (StaggerMarks sets it); the plot starts lower to make room.
	Row int
}

// markLabelHeight is the height of one row of mark labels, in pixels.
const markLabelHeight = 16

// StaggerMarks gives vertical marks whose labels would overprint on an
// axis from lo to hi (labels about labelChars characters wide, on a plot
// about plotPx pixels wide) rows of their own: each goes on the lowest row
// where it keeps clear of the labels already there. The marks are taken in
// order of x.
func StaggerMarks(marks []*Mark, lo, hi float64, plotPx int) {
	if hi <= lo {
		return
	}
	slices.SortStableFunc(marks, func(a, b *Mark) int { return cmp.Compare(*a.X, *b.X) })
	var rowEnd []float64 // per row, the x where its last label ends, in pixels
	for _, m := range marks {
		if m.X == nil {
			continue
		}
		x := (*m.X - lo) / (hi - lo) * float64(plotPx)
		w := float64(7 * len(m.Name))
		start := x - w/2
		row := 0
		for row < len(rowEnd) && rowEnd[row] > start {
			row++
		}
		if row == len(rowEnd) {
			rowEnd = append(rowEnd, 0)
		}
		rowEnd[row] = x + w/2 + 4
		m.Row = row
	}
}

// palette is echarts 5's default colour list: series get explicit colours from it so that a
// band's edges and marks share their series' colour.
var palette = []string{"#5470c6", "#91cc75", "#fac858", "#ee6666", "#73c0de", "#3ba272", "#fc8452", "#9a60b4", "#ea7ccc"}

// symbols and dashes tell apart lines that lie on each other.
var (
	symbols = []string{"circle", "rect", "triangle", "diamond", "emptyCircle", "roundRect", "pin", "arrow"}
	dashes  = []string{"solid", "dashed", "dotted"}
)

// Axis names an axis of an XY chart.
type Axis struct {
	Name string // shown beside the axis, e.g. "sessions" or "TTFB p95 (s)"
	Log  bool   // logarithmic scale (y axes only; values <= 0 become gaps)
	Min  *float64
	Max  *float64
	// Seconds says the values are seconds and Name says so ("seconds"):
	// bars on a log axis then draw milliseconds when a bar or mark is
	// under a second (NewBarChart).
	Seconds bool
}

// Gauge is one dial of a gauge chart, e.g. the rule-of-thumb ratio of one candidate farm.
type Gauge struct {
	Name  string  // the candidate, shown under the dial
	Value float64 // shown on the dial, in Unit
	Max   float64 // end of the scale; 0 means 100
	Unit  string  // "%" and the like, shown in the title
	// OverColor is the arc's colour beyond 100 on a "%" dial (a ratio's limit); "" is red.
	// Amber says "over, yet fine": a farm over the rule of thumb that the simulation finds meets.
	OverColor string
}

// Chart is one echarts chart with a fixed element id, built by NewLineChart, NewBarChart,
// NewStackedAreaChart or NewGaugeChart from plain float series. Its options are produced by
// go-echarts and are deterministic: the same inputs give byte-identical JSON.
type Chart struct {
	ID     string // element id, unique within a page; [a-z0-9_-], starting with a letter
	Title  string
	Height int // pixels; 0 means 360

	opt     optioner
	err     error
	patches []func(map[string]any) // applied to the options after go-echarts built them
}

// optioner is what every go-echarts chart type provides.
type optioner interface {
	Validate()
	JSON() map[string]any
}

var chartIDPattern = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)

// NewLineChart draws one line per series over numeric x values (a value axis, so uneven steps
// such as 8, 16, 32, 64 sessions keep their distances). Use y.Log for latencies.
func NewLineChart(id, title string, x Axis, xs []float64, y Axis, series ...Series) *Chart {
	return newXYChart(id, title, x, xs, y, series, false)
}

// NewStackedAreaChart draws the series as areas stacked on each other over evenly spaced x
// values (a step's sample times), e.g. prompt tokens per second computed and cached: the top
// edge is the total. The x axis is a category axis of the xs: echarts stacks the first value
// dimension, so with a value x axis it would add up the x values (times) instead of the y.
func NewStackedAreaChart(id, title string, x Axis, xs []float64, y Axis, series ...Series) *Chart {
	c := &Chart{ID: id, Title: title}
	if err := checkLengths(len(xs), "x values", series); err != nil {
		c.err = err
		return c
	}
	line := charts.NewLine()
	cats := make([]string, len(xs))
	for i, v := range xs {
		cats[i] = strconv.FormatFloat(v, 'f', -1, 64)
	}
	xa := opts.XAxis{Name: x.Name, Type: "category", NameLocation: "middle", NameGap: 28}
	line.SetGlobalOptions(append(commonOpts(id, title), charts.WithXAxisOpts(xa), charts.WithYAxisOpts(yAxis(y)))...)
	line.SetXAxis(cats)
	c.patches = append(c.patches, func(m map[string]any) {
		if xa, ok := m["xAxis"].([]any); ok && len(xa) > 0 {
			xa[0].(map[string]any)["boundaryGap"] = false // areas start at the first sample
		}
	})
	for k, s := range series {
		data := make([]opts.LineData, len(xs))
		for i := range xs {
			data[i] = opts.LineData{Value: yValue(s.Y[i], y.Log)}
		}
		line.AddSeries(s.Name, data,
			charts.WithLineChartOpts(opts.LineChart{Stack: "total", ShowSymbol: opts.Bool(false)}), withColor(palette[k%len(palette)]),
			charts.WithAreaStyleOpts(opts.AreaStyle{Opacity: opts.Float(0.6)}))
	}
	c.opt = line
	return c
}

func newXYChart(id, title string, x Axis, xs []float64, y Axis, series []Series, stacked bool) *Chart {
	c := &Chart{ID: id, Title: title}
	if err := checkLengths(len(xs), "x values", series); err != nil {
		c.err = err
		return c
	}
	for _, s := range series {
		if (s.Low != nil && len(s.Low) != len(xs)) || (s.High != nil && len(s.High) != len(xs)) {
			c.err = fmt.Errorf("series %q: band edges want one value per x (%d)", s.Name, len(xs))
			return c
		}
	}
	series = mergeIdentical(series)
	line := charts.NewLine()
	line.SetGlobalOptions(append(commonOpts(id, title),
		charts.WithXAxisOpts(opts.XAxis{Name: x.Name, Type: "value", Min: floatOrNil(x.Min), Max: floatOrNil(x.Max), NameLocation: "middle", NameGap: 28}),
		charts.WithYAxisOpts(yAxis(y)),
	)...)
	line.SetXAxis(nil)
	points := func(ys []float64) []opts.LineData {
		data := make([]opts.LineData, 0, len(xs))
		for i, xv := range xs {
			if !finite(xv) {
				continue
			}
			data = append(data, opts.LineData{Value: []any{xv, yValue(ys[i], y.Log)}})
		}
		return data
	}
	var bands []band
	for k, s := range series {
		color := palette[k%len(palette)]
		// A gap (a missing step, a NaN) is bridged, so a strategy without one load level still
		// reads as one line; the point itself is not drawn.
		lo := opts.LineChart{ShowSymbol: opts.Bool(len(xs) <= 60), ConnectNulls: opts.Bool(true),
			Symbol: symbols[k%len(symbols)]}
		so := []charts.SeriesOpts{charts.WithLineChartOpts(lo), withColor(color),
			charts.WithLineStyleOpts(opts.LineStyle{Type: lineDash(k, len(series))})}
		if ml := markLines(s.Marks, color); ml != nil {
			so = append(so, charts.WithSeriesOpts(func(ss *charts.SingleSeries) { ss.MarkLines = ml }))
		}
		line.AddSeries(s.Name, points(s.Y), so...)
		if s.Low != nil && s.High != nil {
			bands = append(bands, band{name: s.Name, color: color, low: s.Low, high: s.High})
		}
	}
	for _, b := range bands {
		// The edges as thin dashed lines; the shading between them is a polygon drawn by
		// a custom series (a stacked area would stack x on this value x axis).
		edge := func(ys []float64) {
			line.AddSeries(b.name+" band", points(ys),
				charts.WithLineChartOpts(opts.LineChart{ShowSymbol: opts.Bool(false), ConnectNulls: opts.Bool(true)}), withColor(b.color),
				charts.WithLineStyleOpts(opts.LineStyle{Type: "dashed", Width: 1, Opacity: opts.Float(0.7)}))
		}
		edge(b.low)
		edge(b.high)
	}
	markRows, vertical := 0, false
	for _, s := range series {
		for _, mk := range s.Marks {
			markRows = max(markRows, mk.Row)
			vertical = vertical || mk.X != nil
		}
	}
	if vertical {
		// The labels of vertical marks sit on the plot's top edge, where
		// the y axis's name is too ("prefix hit %" over "KV full: 1.8"
		// near the axis): the name goes one row above the highest label.
		markRows++
		gap := 12 + markRows*markLabelHeight
		c.patches = append(c.patches, func(m map[string]any) {
			forEach(m, "yAxis", func(a map[string]any) { a["nameGap"] = gap })
		})
	}
	c.fitLegend(seriesNames(series), markRows)
	if len(bands) > 0 {
		c.patches = append(c.patches, func(m map[string]any) { addBandAreas(m, xs, bands, y.Log) })
		// The legend names the lines only: a band is shaded in its line's colour, and
		// its entries pushed the last lines onto a second legend page.
		names := make([]any, 0, len(series))
		for _, s := range series {
			names = append(names, s.Name)
		}
		c.patches = append(c.patches, func(m map[string]any) {
			if l, ok := m["legend"].(map[string]any); ok {
				l["data"] = names
			} else if ls, ok := m["legend"].([]any); ok && len(ls) > 0 {
				if l, ok := ls[0].(map[string]any); ok {
					l["data"] = names
				}
			}
		})
	}
	c.opt = line
	return c
}

func withColor(c string) charts.SeriesOpts {
	return charts.WithSeriesOpts(func(s *charts.SingleSeries) { s.Color = c })
}

// lineDash is solid for charts of one or two lines, else it cycles so that lines lying on
// each other stay visible.
func lineDash(k, n int) string {
	if n <= 2 {
		return "solid"
	}
	return dashes[k%len(dashes)]
}

// band is one series' band: its edges, drawn in its colour.
type band struct {
	name, color string
	low, high   []float64
}

// addBandAreas adds one shaded polygon per band (an echarts custom series whose one item is
// the outline: low edge left to right, high edge back), legend-linked to the band's edges.
func addBandAreas(m map[string]any, xs []float64, bands []band, log bool) {
	series, _ := m["series"].([]any)
	for _, b := range bands {
		var pts [][]float64
		for i, x := range xs {
			if finite(x) && finite(b.low[i]) && finite(b.high[i]) && (!log || b.low[i] > 0) {
				pts = append(pts, []float64{x, b.low[i]})
			}
		}
		for i := len(xs) - 1; i >= 0; i-- {
			if finite(xs[i]) && finite(b.low[i]) && finite(b.high[i]) && (!log || b.low[i] > 0) {
				pts = append(pts, []float64{xs[i], b.high[i]})
			}
		}
		if len(pts) < 4 {
			continue
		}
		flat := make([]any, 0, 2*len(pts))
		for _, p := range pts {
			flat = append(flat, p[0], p[1])
		}
		series = append(series, map[string]any{
			"type": "custom", "name": b.name + " band", "silent": true, "z": 1,
			"color":      b.color,
			"renderItem": "__band__",
			"data":       []any{flat},
			"encode":     map[string]any{"x": 0, "y": 1},
			"tooltip":    map[string]any{"show": false},
		})
	}
	m["series"] = series
}

// markLines turns marks into an echarts markLine (nil without marks).
func markLines(marks []Mark, color string) *opts.MarkLines {
	if len(marks) == 0 {
		return nil
	}
	ml := &opts.MarkLines{MarkLineStyle: opts.MarkLineStyle{Symbol: []string{"none", "none"}}}
	for _, mk := range marks {
		c := mk.Color
		if c == "" {
			c = color
		}
		item := map[string]any{"name": mk.Name,
			"label": map[string]any{"formatter": mk.Name, "position": "insideEndTop", "color": c,
				"backgroundColor": "rgba(255,255,255,0.85)", "padding": 2}, // legible over a bar or a line
			"lineStyle": map[string]any{"type": "dashed", "color": c, "width": 1.5}}
		switch {
		case mk.Y != nil:
			item["yAxis"] = *mk.Y
		case mk.X != nil:
			item["xAxis"] = *mk.X
			// Above the plot, level, over the line's top end: off the data; a label
			// that would overprint a neighbour's is lifted a row (Row).
			item["label"].(map[string]any)["position"] = "end"
			if mk.Row > 0 {
				item["label"].(map[string]any)["offset"] = []any{0, -markLabelHeight * mk.Row}
			}
		default:
			continue
		}
		ml.Data = append(ml.Data, item)
	}
	return ml
}

// mergeIdentical folds series with the same values into one named after all of them, e.g.
// "least-loaded = affinity (spill auto)": identical lines would hide each other.
func mergeIdentical(series []Series) []Series {
	out := make([]Series, 0, len(series))
	for _, s := range series {
		merged := false
		for j := range out {
			if s.Low == nil && out[j].Low == nil && len(s.Marks) == 0 && sameValues(out[j].Y, s.Y) {
				out[j].Name += " = " + s.Name
				merged = true
				break
			}
		}
		if !merged {
			out = append(out, s)
		}
	}
	return out
}

func sameValues(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !(math.IsNaN(a[i]) && math.IsNaN(b[i])) {
			return false
		}
	}
	return true
}

// NewBarChart draws grouped bars, one bar per series in each category (e.g. one category per
// strategy or per replica).
func NewBarChart(id, title string, categories []string, y Axis, series ...Series) *Chart {
	c := &Chart{ID: id, Title: title}
	if err := checkLengths(len(categories), "categories", series); err != nil {
		c.err = err
		return c
	}
	if y.Log {
		y, series = logBars(y, series)
	}
	bar := charts.NewBar()
	bar.SetGlobalOptions(append(commonOpts(id, title),
		charts.WithXAxisOpts(categoryAxis(len(categories))),
		charts.WithYAxisOpts(yAxis(y)),
	)...)
	bar.SetXAxis(categories)
	if len(categories) > 6 {
		// Slanted labels reach left of their bar: the first one's start would be cut off.
		longest := len(categories[0])
		c.patches = append(c.patches, func(m map[string]any) {
			forEach(m, "grid", func(g map[string]any) { g["left"] = strconv.Itoa(max(60, 6*longest-20)) })
		})
	}
	for _, s := range series {
		data := make([]opts.BarData, len(s.Y))
		for i, v := range s.Y {
			data[i] = opts.BarData{Value: yValue(v, y.Log)}
		}
		var so []charts.SeriesOpts
		if ml := markLines(s.Marks, ""); ml != nil {
			so = append(so, charts.WithSeriesOpts(func(ss *charts.SingleSeries) { ss.MarkLines = ml }))
		}
		bar.AddSeries(s.Name, data, so...)
	}
	c.fitLegend(seriesNames(series), 0)
	c.opt = bar
	return c
}

// logBars readies bars for a log axis. echarts grows every bar on a log
// axis from 1 (barGrid's value axis start), so a value under 1 hung down
// from it, the fastest strategy's bar the longest. Seconds under one are
// drawn as milliseconds instead (values, horizontal marks and the axis
// name), and the axis starts at the power of ten at or below the smallest
// value, where the bars, clipped to the grid, then begin.
func logBars(y Axis, series []Series) (Axis, []Series) {
	lo := math.Inf(1)
	for _, s := range series {
		for _, v := range s.Y {
			if finite(v) && v > 0 {
				lo = min(lo, v)
			}
		}
		for _, m := range s.Marks {
			if m.Y != nil && finite(*m.Y) && *m.Y > 0 {
				lo = min(lo, *m.Y)
			}
		}
	}
	if math.IsInf(lo, 1) {
		return y, series
	}
	if lo < 1 && y.Seconds {
		y.Name = strings.Replace(y.Name, "seconds", "milliseconds", 1)
		scaled := make([]Series, len(series))
		for i, s := range series {
			s.Y = slices.Clone(s.Y)
			for k := range s.Y {
				s.Y[k] *= 1000
			}
			s.Marks = slices.Clone(s.Marks)
			for k, m := range s.Marks {
				if m.Y != nil {
					s.Marks[k].Y = ptr(*m.Y * 1000)
				}
			}
			scaled[i] = s
		}
		series, lo = scaled, lo*1000
	}
	if y.Min == nil {
		y.Min = ptr(math.Pow(10, math.Floor(math.Log10(lo))))
	}
	return y, series
}

func seriesNames(series []Series) []string {
	names := make([]string, len(series))
	for i, s := range series {
		names[i] = s.Name
	}
	return names
}

// Layout of a chart's top: the legend's rows, then the rows of mark labels.
const (
	legendRowHeight = 22
	legendWidthPx   = 800 // 80 % of a report's chart, about 1,000 px wide
)

// labelCharPx is the width of a character of a legend or axis label at
// echarts' 12 px default font, about.
const labelCharPx = 7

// legendRows is how many rows a legend of names takes when it wraps
// within legendWidthPx (labelCharPx a character, and 35 for the symbol
// and the gap).
func legendRows(names []string) int {
	rows, used := 1, 0
	for _, n := range names {
		w := 35 + labelCharPx*len(n)
		if used > 0 && used+w > legendWidthPx {
			rows, used = rows+1, 0
		}
		used += w
	}
	return rows
}

// fitLegend makes room at the top for a legend that names every series
// (it wraps onto more rows rather than paging: a printout names every
// candidate) and for markRows rows of lifted mark labels: the plot starts
// lower and the chart grows by as much.
func (c *Chart) fitLegend(names []string, markRows int) {
	rows := legendRows(names)
	if rows <= 1 && markRows == 0 {
		return
	}
	extra := (rows-1)*legendRowHeight + markRows*markLabelHeight
	c.Height = c.height() + extra
	c.patches = append(c.patches, func(m map[string]any) {
		forEach(m, "legend", func(l map[string]any) { l["type"] = "plain" })
		forEach(m, "grid", func(g map[string]any) { g["top"] = strconv.Itoa(70 + extra) })
	})
}

// forEach calls f with the option key's object, or each of its objects
// when it is a list.
func forEach(m map[string]any, key string, f func(map[string]any)) {
	switch v := m[key].(type) {
	case map[string]any:
		f(v)
	case []any:
		for _, e := range v {
			if o, ok := e.(map[string]any); ok {
				f(o)
			}
		}
	}
}

// NewGaugeChart draws one dial per gauge side by side, e.g. the rule of thumb per candidate farm.
// Each dial reads in its Unit with the value as a table shows it (no decimals for "%"), its
// scale marks 100 (when inside it) with the arc green below and red above, and the labels sit
// inside the ticks; the candidate's name is under the dial and in the legend.
func NewGaugeChart(id, title string, gauges ...Gauge) *Chart {
	c := &Chart{ID: id, Title: title, Height: 320}
	g := charts.NewGauge()
	g.SetGlobalOptions(append(commonOpts(id, title),
		charts.WithTooltipOpts(opts.Tooltip{Show: opts.Bool(true), Trigger: "item"}),
		// Each dial is named under it: a legend would only repeat the names, and page them.
		charts.WithLegendOpts(opts.Legend{Show: opts.Bool(false)}))...)
	n := len(gauges)
	type dial struct {
		max   float64
		unit  string
		split int
		over  string
		text  string // the value as the dial's centre says it
	}
	var dials []dial
	for i, gg := range gauges {
		maxV := gg.Max
		if maxV <= 0 {
			maxV = 100
		}
		maxV = math.Ceil(maxV)
		// Few labels, 100 among them: every 25 up to 100, else every 100
		// (every 50 where the end is not a multiple of 100); a dial beside
		// three others has room for no more.
		split := 4
		if maxV > 100 && math.Mod(maxV, 50) == 0 {
			split = int(maxV / 50)
			if math.Mod(maxV, 100) == 0 {
				split = int(maxV / 100)
			}
		}
		over := gg.OverColor
		if over == "" {
			over = "#ee6666"
		}
		digits := 1
		if gg.Unit == "%" {
			digits = 0
		}
		text := fmtNum(gg.Value, digits)
		if gg.Unit != "" {
			text += " " + gg.Unit
		}
		dials = append(dials, dial{max: maxV, unit: gg.Unit, split: split, over: over, text: text})
		center := fmt.Sprintf("%.1f%%", (float64(i)+0.5)*100/float64(max(n, 1)))
		radius := fmt.Sprintf("%d%%", min(70, 280/max(n, 1)))
		// A value past the end of the scale pins the needle there; the
		// centre says the value (text).
		// The legend names the candidate alone; the lines after its name
		// (e.g. "simulated: meets") are the dial's title's.
		legend, _, _ := strings.Cut(gg.Name, "\n")
		g.AddSeries(legend, []opts.GaugeData{{Name: gg.Name, Value: roundTo(min(gg.Value, maxV), digits)}},
			charts.WithSeriesOpts(func(s *charts.SingleSeries) {
				s.Center = []string{center, "55%"}
				s.Radius = radius
				s.Min = 0
				s.Max = int(maxV)
				s.Color = palette[i%len(palette)]
			}))
	}
	c.patches = append(c.patches, func(m map[string]any) {
		series, _ := m["series"].([]any)
		for i, sv := range series {
			s, ok := sv.(map[string]any)
			if !ok || i >= len(dials) {
				continue
			}
			d := dials[i]
			unit := ""
			if d.unit != "" {
				unit = " " + d.unit
			}
			s["splitNumber"] = d.split
			s["progress"] = map[string]any{"show": false}
			s["pointer"] = map[string]any{"show": true, "width": 5, "length": "60%"}
			// The arc: green up to 100 (the limit of a ratio in %), red (or OverColor) beyond.
			stops := []any{[]any{1, "#91cc75"}}
			if d.max > 100 && d.unit == "%" {
				stops = []any{[]any{100 / d.max, "#91cc75"}, []any{1, d.over}}
			}
			s["axisLine"] = map[string]any{"lineStyle": map[string]any{"width": 10, "color": stops}}
			s["axisTick"] = map[string]any{"distance": -10, "length": 6, "splitNumber": 5}
			s["splitLine"] = map[string]any{"distance": -10, "length": 12}
			s["axisLabel"] = map[string]any{"distance": 16, "fontSize": 10, "formatter": "{value}" + unit}
			s["title"] = map[string]any{"show": true, "offsetCenter": []any{0, "88%"}, "fontSize": 13, "lineHeight": 17}
			s["detail"] = map[string]any{"fontSize": 16, "offsetCenter": []any{0, "36%"}, "formatter": d.text}
		}
	})
	c.opt = g
	return c
}

// WithCategoryName names the category (x) axis of a bar chart, e.g. "candidate" or "replica".
func (c *Chart) WithCategoryName(name string) *Chart {
	c.patches = append(c.patches, func(m map[string]any) {
		if xa, ok := m["xAxis"].([]any); ok && len(xa) > 0 {
			x := xa[0].(map[string]any)
			gap := 28
			if al, ok := x["axisLabel"].(map[string]any); ok && al["rotate"] != nil && al["rotate"] != 0 {
				gap = slantedLabelsDepth(x["data"]) + 16 // below the slanted labels
			}
			x["name"], x["nameLocation"], x["nameGap"] = name, "middle", gap
		}
	})
	return c
}

// slantedLabelsDepth is how far below the axis category labels slanted
// by categoryAxis's 30 degrees reach, in pixels: the longest label's width
// (labelCharPx a character) times sin 30, and
// the line's height. A fixed gap put the axis name in the middle of labels
// such as "8 x H100 SXM (2 replicas at TP 4)".
func slantedLabelsDepth(data any) int {
	longest := 0
	vs, _ := data.([]any) // the options' JSON, read back
	for _, v := range vs {
		if t, ok := v.(string); ok {
			longest = max(longest, len([]rune(t)))
		}
	}
	return max(36, longest*labelCharPx/2+14)
}

// commonOpts are the options every chart shares: fixed id, title, legend, tooltip, no animation
// (screenshots and tests see the final frame).
func commonOpts(id, title string) []charts.GlobalOpts {
	return []charts.GlobalOpts{
		charts.WithInitializationOpts(opts.Initialization{ChartID: id}),
		charts.WithTitleOpts(opts.Title{Title: title}),
		charts.WithLegendOpts(opts.Legend{Show: opts.Bool(true), Top: "28", Type: "scroll", Left: "center", Width: "80%"}),
		charts.WithTooltipOpts(opts.Tooltip{Show: opts.Bool(true), Trigger: "axis"}),
		charts.WithGridOpts(opts.Grid{Top: "70", Left: "60", Right: "30", Bottom: "50", ContainLabel: opts.Bool(true)}),
		charts.WithAnimation(false),
	}
}

// categoryAxis labels every category, slanted when there are many.
func categoryAxis(n int) opts.XAxis {
	x := opts.XAxis{Type: "category", AxisLabel: &opts.AxisLabel{Interval: "0"}}
	if n > 6 {
		x.AxisLabel.Rotate = 30
	}
	return x
}

func yAxis(a Axis) opts.YAxis {
	y := opts.YAxis{Name: a.Name, Type: "value", Min: floatOrNil(a.Min), Max: floatOrNil(a.Max)}
	if a.Log {
		y.Type = "log"
	}
	return y
}

func checkLengths(n int, what string, series []Series) error {
	for _, s := range series {
		if len(s.Y) != n {
			return fmt.Errorf("series %q has %d values, want one per x (%d %s)", s.Name, len(s.Y), n, what)
		}
	}
	return nil
}

// yValue maps values echarts cannot draw to "-", echarts' marker for a missing point
// (JSON has no NaN; a log axis has no zero).
func yValue(v float64, log bool) any {
	if !finite(v) || (log && v <= 0) {
		return "-"
	}
	return v
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func floatOrNil(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func roundTo(v float64, digits int) any {
	if !finite(v) {
		return "-"
	}
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// Err reports why the chart cannot be drawn (mismatched series lengths, a bad id), or nil.
func (c *Chart) Err() error {
	if c.err != nil {
		return fmt.Errorf("chart %q: %w", c.ID, c.err)
	}
	if !chartIDPattern.MatchString(c.ID) {
		return fmt.Errorf("chart id %q: want lower-case letters, digits, '-' or '_', starting with a letter", c.ID)
	}
	if c.opt == nil {
		return fmt.Errorf("chart %q: not built by a web.New*Chart constructor", c.ID)
	}
	return nil
}

// OptionsJSON returns the chart's echarts options as indented JSON, keys sorted, HTML-escaped
// (so the text is safe inside a <script> element). Golden tests compare this text.
func (c *Chart) OptionsJSON() ([]byte, error) {
	if err := c.Err(); err != nil {
		return nil, err
	}
	c.opt.Validate()
	var v any = c.opt.JSON()
	if len(c.patches) > 0 {
		// Options go-echarts has no field for: through a generic map.
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("chart %q: options: %w", c.ID, err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("chart %q: options: %w", c.ID, err)
		}
		for _, p := range c.patches {
			p(m)
		}
		v = m
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", " ")
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("chart %q: options: %w", c.ID, err)
	}
	return buf.Bytes(), nil
}

func (c *Chart) height() int {
	if c.Height > 0 {
		return c.Height
	}
	return 360
}
