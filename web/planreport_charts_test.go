package web

import (
	"bytes"
	"encoding/json"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
)

// decodeOptions is a chart's options as generic JSON.
func decodeOptions(t *testing.T, c *Chart) map[string]any {
	t.Helper()
	raw, err := c.OptionsJSON()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// The stacked area chart must stack the values (y), not the time axis: echarts stacks the
// first value dimension, so the x axis has to be a category axis of the sample times and each
// point a plain value. The golden file keeps the whole option text.
func TestStackedAreaStacksValues(t *testing.T) {
	c := NewStackedAreaChart("stacked", "Prompt tokens per second, computed and cached", Axis{Name: "seconds into the step"},
		[]float64{5, 10, 15, 20}, Axis{Name: "tokens/s", Min: ptr(0.0)},
		Series{Name: "computed", Y: []float64{100, 200, math.NaN(), 400}},
		Series{Name: "cached", Y: []float64{1000, 2000, 3000, 4000}})
	m := decodeOptions(t, c)
	x := m["xAxis"].([]any)[0].(map[string]any)
	if x["type"] != "category" || x["boundaryGap"] != false {
		t.Errorf("x axis %v: want a category axis without boundary gap", x)
	}
	if diff := cmp.Diff([]any{"5", "10", "15", "20"}, x["data"]); diff != "" {
		t.Errorf("x categories (-want +got):\n%s", diff)
	}
	series := m["series"].([]any)
	want := [][]any{{100.0, 200.0, "-", 400.0}, {1000.0, 2000.0, 3000.0, 4000.0}}
	for i, sv := range series {
		s := sv.(map[string]any)
		if s["stack"] != "total" || s["areaStyle"] == nil {
			t.Errorf("series %d: stack %v, areaStyle %v: want stacked areas", i, s["stack"], s["areaStyle"])
		}
		var got []any
		for _, d := range s["data"].([]any) {
			got = append(got, d.(map[string]any)["value"])
		}
		if diff := cmp.Diff(want[i], got); diff != "" {
			t.Errorf("series %d values: want plain y values, not [x, y] pairs (-want +got):\n%s", i, diff)
		}
	}
	got, _ := c.OptionsJSON()
	checkGolden(t, filepath.Join("testdata", "chart-stacked.json"), got)
}

// A series with a band gets dashed edges (one legend entry with the shading) and a custom
// series with the outline; marks become markLines.
func TestLineChartBandAndMarks(t *testing.T) {
	c := NewLineChart("band", "Prefix-cache hit rate against sessions", Axis{Name: "concurrent sessions"}, []float64{4, 8, 16},
		Axis{Name: "prefix hit %", Min: ptr(0.0), Max: ptr(100.0)},
		Series{Name: "3 x A4000", Y: []float64{80, 75, 60}, Low: []float64{70, 60, 40}, High: []float64{85, 80, 70},
			Marks: []Mark{{Name: "KV full at 10.7 sessions", X: ptr(10.7)}, {Name: "target: hit >= 75 %", Y: ptr(75.0), Color: "#d62728"}}})
	m := decodeOptions(t, c)
	series := m["series"].([]any)
	var names, types []string
	for _, sv := range series {
		s := sv.(map[string]any)
		names = append(names, s["name"].(string))
		types = append(types, s["type"].(string))
	}
	if diff := cmp.Diff([]string{"3 x A4000", "3 x A4000 band", "3 x A4000 band", "3 x A4000 band"}, names); diff != "" {
		t.Errorf("series names (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"line", "line", "line", "custom"}, types); diff != "" {
		t.Errorf("series types (-want +got):\n%s", diff)
	}
	// The legend names the line alone (a band's entries paged the legend; issue 40).
	legend, _ := m["legend"].(map[string]any)
	if legend == nil {
		if ls, _ := m["legend"].([]any); len(ls) > 0 {
			legend, _ = ls[0].(map[string]any)
		}
	}
	if diff := cmp.Diff([]any{"3 x A4000"}, legend["data"]); diff != "" {
		t.Errorf("legend data (-want +got):\n%s", diff)
	}
	poly := series[3].(map[string]any)
	if diff := cmp.Diff([]any{[]any{4.0, 70.0, 8.0, 60.0, 16.0, 40.0, 16.0, 70.0, 8.0, 80.0, 4.0, 85.0}}, poly["data"]); diff != "" {
		t.Errorf("band outline (-want +got):\n%s", diff)
	}
	ml := series[0].(map[string]any)["markLine"].(map[string]any)["data"].([]any)
	if len(ml) != 2 || ml[0].(map[string]any)["xAxis"] != 10.7 || ml[1].(map[string]any)["yAxis"] != 75.0 {
		t.Errorf("markLine data %v: want the KV-full x and the target y", ml)
	}
	got, _ := c.OptionsJSON()
	checkGolden(t, filepath.Join("testdata", "chart-band.json"), got)
}

// A routing's band is its Bands' low and high edges at each level; none where the result has
// no band for the KPI, or where the band is one run (low = high everywhere).
func TestKPIBand(t *testing.T) {
	rng := func(low, high float64) planner.Range {
		return planner.Range{Low: sim.Float(low), High: sim.Float(high)}
	}
	cfg := &planner.Config{Rows: make([]sim.Row, 2), Bands: []planner.Band{
		{TTFBP95: rng(4, 2.5), PrefixHitPct: rng(math.NaN(), math.NaN())},
		{TTFBP95: rng(9, 4), PrefixHitPct: rng(math.NaN(), math.NaN())},
	}}
	lo, hi := kpiBand(cfg, ttfbP95)
	if diff := cmp.Diff([]float64{4, 9}, lo); diff != "" {
		t.Errorf("low (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]float64{2.5, 4}, hi); diff != "" {
		t.Errorf("high (-want +got):\n%s", diff)
	}
	if lo, hi := kpiBand(cfg, prefixHit); lo != nil || hi != nil {
		t.Errorf("a KPI without a band: got %v %v, want nil", lo, hi)
	}
	flat := &planner.Config{Rows: make([]sim.Row, 1), Bands: []planner.Band{{TTFBP95: rng(3, 3)}}}
	if lo, _ := kpiBand(flat, ttfbP95); lo != nil {
		t.Errorf("a flat band: got %v, want nil", lo)
	}
	if lo, _ := kpiBand(&planner.Config{Rows: make([]sim.Row, 2)}, ttfbP95); lo != nil {
		t.Errorf("a result from before bands: got %v, want nil", lo)
	}
}

func TestIdenticalLinesMerge(t *testing.T) {
	c := NewLineChart("same", "Replicas busy", Axis{Name: "sessions"}, []float64{1, 2}, Axis{Name: "replicas"},
		Series{Name: "least-loaded", Y: []float64{2, 2}}, Series{Name: "affinity", Y: []float64{2, 2}},
		Series{Name: "hash", Y: []float64{1, math.NaN()}})
	var names []string
	for _, sv := range decodeOptions(t, c)["series"].([]any) {
		names = append(names, sv.(map[string]any)["name"].(string))
	}
	if diff := cmp.Diff([]string{"least-loaded = affinity", "hash"}, names); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
}

func TestSessionsPerHourCell(t *testing.T) {
	for _, tt := range []struct {
		d    float64
		want string
	}{{60, "1 m"}, {30, "30 s"}, {90, "1.5 m"}, {7200, "2 h"}, {600, "10 m"}} {
		if got := fmtSpan(tt.d); got != tt.want {
			t.Errorf("fmtSpan(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

// The dials read like the table: "%", no decimals, 100 % a labelled tick where green turns red.
func TestGaugeDials(t *testing.T) {
	c := NewGaugeChart("g", "Demand as % of the farm's KV cache", Gauge{Name: "2 x A4000", Value: 224.24, Max: 300, Unit: "%"})
	s := decodeOptions(t, c)["series"].([]any)[0].(map[string]any)
	if v := s["data"].([]any)[0].(map[string]any)["value"]; v != 224.0 {
		t.Errorf("value %v, want 224 (as the table rounds it)", v)
	}
	if s["splitNumber"] != 3.0 || s["max"] != 300.0 {
		t.Errorf("splitNumber %v max %v: want 3 labels of 100 up to 300 (a mixed plan's dial to 2,300 %% crowded 23)", s["splitNumber"], s["max"])
	}
	// Past the end of the scale the needle stops there and the centre tells the figure.
	over := decodeOptions(t, NewGaugeChart("o", "t", Gauge{Name: "1 x L40S", Value: 2270.4, Max: 300, Unit: "%"}))["series"].([]any)[0].(map[string]any)
	if v, d := over["data"].([]any)[0].(map[string]any)["value"], over["detail"].(map[string]any)["formatter"]; v != 300.0 || d != "2,270 %" {
		t.Errorf("a value of 2,270 %% on a dial to 300: needle at %v, centre %q; want 300 and \"2,270 %%\"", v, d)
	}
	if f := s["axisLabel"].(map[string]any)["formatter"]; f != "{value} %" {
		t.Errorf("axis label formatter %v, want the unit", f)
	}
	stops := s["axisLine"].(map[string]any)["lineStyle"].(map[string]any)["color"].([]any)
	if first := stops[0].([]any)[0].(float64); math.Abs(first-1.0/3) > 1e-9 {
		t.Errorf("arc stops %v: want green up to 100 of 300", stops)
	}
}

// chartAttrs are the data-* attributes the page's draw helper wrote on each chart element,
// from echarts' own options after drawing.
var chartElement = regexp.MustCompile(`<div class="chart" id="([^"]+)"([^>]*)>`)
var dataAttr = regexp.MustCompile(`data-([a-z-]+)="([^"]*)"`)

func chartAttrs(dom string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, m := range chartElement.FindAllStringSubmatch(dom, -1) {
		a := map[string]string{}
		for _, d := range dataAttr.FindAllStringSubmatch(m[2], -1) {
			a[d[1]] = d[2]
		}
		out[m[1]] = a
	}
	return out
}

// units are the words an axis name must contain to say its unit.
var units = []string{"%", "seconds", "tokens/s", "tokens/min", "requests", "replicas", "sessions", "tokens", "cards"}

// checkChartsInDOM checks, for every chart of the report, what Chromium's echarts drew: a
// canvas, the title, axis names with units and a legend (XY charts).
func checkChartsInDOM(t *testing.T, r *Report, dom string) {
	t.Helper()
	attrs := chartAttrs(dom)
	for _, c := range r.Charts() {
		a, ok := attrs[c.ID]
		if !ok {
			t.Errorf("chart %s: no element in the page", c.ID)
			continue
		}
		if a["drawn"] != "yes" {
			t.Errorf("chart %s: not drawn (attributes %v)", c.ID, a)
			continue
		}
		if a["title"] != strings.ReplaceAll(c.Title, "'", "&#39;") && a["title"] != c.Title {
			t.Errorf("chart %s: title %q, want %q", c.ID, a["title"], c.Title)
		}
		if a["type"] == "gauge" {
			continue // each dial is named under it: no legend
		}
		if a["legend"] == "" {
			t.Errorf("chart %s: no legend", c.ID)
		}
		for _, axis := range []string{"x-names", "y-names"} {
			name := a[axis]
			if !containsAny(name, units) && !(axis == "x-names" && (name == "candidate" || name == "replica" || name == "routing")) {
				t.Errorf("chart %s: %s %q: want an axis name with its unit", c.ID, axis, name)
			}
		}
	}
}

func containsAny(s string, subs []string) bool {
	for _, u := range subs {
		if strings.Contains(s, u) {
			return true
		}
	}
	return false
}

// A result that carries the planner's band, verdict and reconcile sentence shows them: the
// band in the table and shaded in the first charts, "marginal" with its reason, and the
// reconcile sentence beside the rule of thumb.
func TestPlanReportShowsBand(t *testing.T) {
	res := samplePlanResult()
	res.Band = planner.BandInfo{KVScales: []float64{1, 0.85, 1.1}, SpeedScales: []float64{1, 0.8, 1.2}, Seeds: []uint64{1, 2, 3}}
	rng := func(low, nominal, high float64) planner.Range {
		return planner.Range{Low: sim.Float(low), Nominal: sim.Float(nominal), High: sim.Float(high)}
	}
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Fits {
			continue
		}
		c.Verdict = planner.VerdictMarginal
		c.Why = "meets at the nominal KV size; misses prefix hit >= 80 % if the KV cache is 15 % smaller than estimated"
		c.Reconcile = "the 3.5k system prompt is shared"
		c.KPIs = &planner.Band{TTFBP95: rng(9.5, 6, 5), PrefixHitPct: rng(70, 85, 88)}
		for k := range c.Configs {
			cfg := &c.Configs[k]
			cfg.Bands = nil
			for range cfg.Rows {
				cfg.Bands = append(cfg.Bands, planner.Band{TTFBP95: rng(9, 6, 5), PrefixHitPct: rng(60, 85, 90)})
			}
		}
	}
	r := PlanReport(res)
	var buf bytes.Buffer
	if err := r.Render(&buf); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, want := range []string{"TTFB p95 s (band)", "(5.00-9.50)", "(70.0-88.0)", "marginal (see below)",
		"Why the marginal candidates are marginal", "it meets at the nominal KV size; misses prefix hit",
		"the 3.5k system prompt is shared", "its KV cache as estimated, 15 % smaller and 10 % larger",
		"its engine as estimated, 20 % slower and 20 % faster", "seeds 1, 2 and 3", "27 runs per routing and level"} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, c := range r.Charts() {
		// Two candidates in the overview; two routings in each candidate's charts (p95 only).
		if !slices.Contains([]string{"overview-hit-lines", "overview-ttfb-lines", "c1-hit", "c1-ttfb", "c2-hit", "c2-ttfb"}, c.ID) {
			continue
		}
		custom := 0
		for _, sv := range decodeOptions(t, c)["series"].([]any) {
			if sv.(map[string]any)["type"] == "custom" {
				custom++
			}
		}
		if custom != 2 {
			t.Errorf("chart %s: %d shaded bands, want one per candidate or routing (2)", c.ID, custom)
		}
	}
}

// TestPlanReportHeadroom: a result with a headroom says it where a verdict is given: the
// answer's row ("yes, at 8 and, with 20 % headroom, at 10"), the band's sentence, the
// candidate's section and the settings; a band of the nominal run alone says so instead of a
// range of one value; without headroom none of it appears.
func TestPlanReportHeadroom(t *testing.T) {
	res := samplePlanResult()
	res.Sessions = []int{4, 8, 10}
	for i := range res.Candidates {
		c := &res.Candidates[i]
		for k := range c.Configs {
			cfg := &c.Configs[k]
			r, ch := cfg.Rows[1], cfg.Checks[1]
			r.Sessions, ch.Sessions = 10, 10
			cfg.Rows, cfg.Checks = append(cfg.Rows, r), append(cfg.Checks, ch)
		}
		if c.Fits {
			c.Verdict = map[bool]string{true: planner.VerdictMeets, false: planner.VerdictMisses}[c.Meets]
			c.KPIs = &planner.Band{Runs: 1, TTFBP95: planner.Range{Low: 6, Nominal: 6, High: 6}, PrefixHitPct: planner.Range{Low: 85, Nominal: 85, High: 85}}
		}
	}
	res.Band = planner.BandInfo{KVScales: []float64{1, 0.85, 1.1}, SpeedScales: []float64{1, 0.8, 1.2}, Seeds: []uint64{1, 2, 3}}
	render := func(res *planner.Result) string {
		var buf bytes.Buffer
		if err := PlanReport(res).Render(&buf); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	res.Headroom, res.HeadroomSessions = 0.2, 10
	page := render(res)
	for _, want := range []string{
		"yes, at 8 and, with 20 % headroom, at 10",
		"A candidate meets the targets only if the pessimistic edge does at 8 sessions and, with 20 % headroom, at 10",
		"it meets the targets at 8 sessions and, with 20 % headroom, at 10",
		"20 % (a farm must also meet the targets at 10 sessions)",
		"(nominal run only)",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	res.Headroom, res.HeadroomSessions = 0, 0
	page = render(res)
	if strings.Contains(page, "% headroom") || !strings.Contains(page, "none (the wanted concurrency alone decides)") {
		t.Error("without headroom: the report names one, or its settings do not say there is none")
	}
}
