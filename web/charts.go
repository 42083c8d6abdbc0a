package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"

	"github.com/go-echarts/go-echarts/v2/charts"
	"github.com/go-echarts/go-echarts/v2/opts"
)

// Series is one named line, bar or area: Y[i] belongs to the chart's i-th x value or category.
// A NaN or infinite value is drawn as a gap, and so is a value <= 0 on a log axis.
type Series struct {
	Name string
	Y    []float64
}

// Axis names an axis of an XY chart.
type Axis struct {
	Name string // shown beside the axis, e.g. "sessions" or "TTFB p95 (s)"
	Log  bool   // logarithmic scale (y axes only; values <= 0 become gaps)
	Min  *float64
	Max  *float64
}

// Gauge is one dial of a gauge chart, e.g. the rule-of-thumb ratio of one candidate farm.
type Gauge struct {
	Name  string  // the candidate, shown under the dial
	Value float64 // shown on the dial, in Unit
	Max   float64 // end of the scale; 0 means 100
	Unit  string  // "%" and the like, shown in the title
}

// Chart is one echarts chart with a fixed element id, built by NewLineChart, NewBarChart,
// NewStackedAreaChart or NewGaugeChart from plain float series. Its options are produced by
// go-echarts and are deterministic: the same inputs give byte-identical JSON.
type Chart struct {
	ID     string // element id, unique within a page; [a-z0-9_-], starting with a letter
	Title  string
	Height int // pixels; 0 means 360

	opt optioner
	err error
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

// NewStackedAreaChart draws the series as areas stacked on each other over numeric x values,
// e.g. prompt tokens per second computed and cached: the top edge is the total.
func NewStackedAreaChart(id, title string, x Axis, xs []float64, y Axis, series ...Series) *Chart {
	return newXYChart(id, title, x, xs, y, series, true)
}

func newXYChart(id, title string, x Axis, xs []float64, y Axis, series []Series, stacked bool) *Chart {
	c := &Chart{ID: id, Title: title}
	if err := checkLengths(len(xs), "x values", series); err != nil {
		c.err = err
		return c
	}
	line := charts.NewLine()
	line.SetGlobalOptions(append(commonOpts(id, title),
		charts.WithXAxisOpts(opts.XAxis{Name: x.Name, Type: "value", Min: floatOrNil(x.Min), Max: floatOrNil(x.Max), NameLocation: "middle", NameGap: 28}),
		charts.WithYAxisOpts(yAxis(y)),
	)...)
	line.SetXAxis(nil)
	for _, s := range series {
		data := make([]opts.LineData, 0, len(xs))
		for i, xv := range xs {
			if !finite(xv) {
				continue
			}
			data = append(data, opts.LineData{Value: []any{xv, yValue(s.Y[i], y.Log)}})
		}
		// A gap (a missing step, a NaN) is bridged, so a strategy without one load level still
		// reads as one line; the point itself is not drawn.
		lo := opts.LineChart{ShowSymbol: opts.Bool(len(xs) <= 60), ConnectNulls: opts.Bool(true)}
		if stacked {
			lo.Stack, lo.ShowSymbol = "total", opts.Bool(false)
		}
		so := []charts.SeriesOpts{charts.WithLineChartOpts(lo)}
		if stacked {
			so = append(so, charts.WithAreaStyleOpts(opts.AreaStyle{Opacity: opts.Float(0.6)}))
		}
		line.AddSeries(s.Name, data, so...)
	}
	c.opt = line
	return c
}

// NewBarChart draws grouped bars, one bar per series in each category (e.g. one category per
// strategy or per replica).
func NewBarChart(id, title string, categories []string, y Axis, series ...Series) *Chart {
	c := &Chart{ID: id, Title: title}
	if err := checkLengths(len(categories), "categories", series); err != nil {
		c.err = err
		return c
	}
	bar := charts.NewBar()
	bar.SetGlobalOptions(append(commonOpts(id, title),
		charts.WithXAxisOpts(categoryAxis(len(categories))),
		charts.WithYAxisOpts(yAxis(y)),
	)...)
	bar.SetXAxis(categories)
	for _, s := range series {
		data := make([]opts.BarData, len(s.Y))
		for i, v := range s.Y {
			data[i] = opts.BarData{Value: yValue(v, y.Log)}
		}
		bar.AddSeries(s.Name, data)
	}
	c.opt = bar
	return c
}

// NewGaugeChart draws one dial per gauge side by side, e.g. the rule of thumb per candidate farm.
func NewGaugeChart(id, title string, gauges ...Gauge) *Chart {
	c := &Chart{ID: id, Title: title, Height: 300}
	g := charts.NewGauge()
	g.SetGlobalOptions(append(commonOpts(id, title),
		charts.WithLegendOpts(opts.Legend{Show: opts.Bool(false)}),
		charts.WithTooltipOpts(opts.Tooltip{Show: opts.Bool(true), Trigger: "item"}))...)
	n := len(gauges)
	for i, gg := range gauges {
		maxV := gg.Max
		if maxV <= 0 {
			maxV = 100
		}
		center := fmt.Sprintf("%.1f%%", (float64(i)+0.5)*100/float64(max(n, 1)))
		radius := fmt.Sprintf("%d%%", min(70, 180/max(n, 1)))
		g.AddSeries(gg.Name, []opts.GaugeData{{Name: gg.Name, Value: roundTo(gg.Value, 1)}},
			charts.WithSeriesOpts(func(s *charts.SingleSeries) {
				s.Center = []string{center, "58%"}
				s.Radius = radius
				s.Min = 0
				s.Max = int(math.Ceil(maxV))
				s.Progress = &opts.Progress{Show: opts.Bool(true)}
				s.Detail = &opts.Detail{FontSize: 16}
				s.Title = &opts.Title{Show: opts.Bool(true)}
			}))
	}
	c.opt = g
	return c
}

// commonOpts are the options every chart shares: fixed id, title, legend, tooltip, no animation
// (screenshots and tests see the final frame).
func commonOpts(id, title string) []charts.GlobalOpts {
	return []charts.GlobalOpts{
		charts.WithInitializationOpts(opts.Initialization{ChartID: id}),
		charts.WithTitleOpts(opts.Title{Title: title}),
		charts.WithLegendOpts(opts.Legend{Show: opts.Bool(true), Top: "28"}),
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
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", " ")
	if err := enc.Encode(c.opt.JSON()); err != nil {
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
