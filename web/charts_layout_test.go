package web

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lm-warden/warden/sim"
)

// TestLegendWrapsNotPages: a legend of many candidates wraps onto rows and
// the plot starts lower, instead of paging (a printout named 4 of 18); a
// chart of a few keeps its one-row layout.
func TestLegendWrapsNotPages(t *testing.T) {
	xs := []float64{10, 20, 40}
	var many []Series
	for i := range 11 {
		many = append(many, Series{Name: fmt.Sprintf("%d x H100 SXM (%d replicas at TP 4)", 4*(i+1), i+1), Y: []float64{1, 2, float64(i)}})
	}
	c := NewLineChart("many", "t", Axis{Name: "sessions"}, xs, Axis{Name: "s"}, many...)
	o := decodeOptions(t, c)
	legend, grid := firstOption(o, "legend"), firstOption(o, "grid")
	if legend["type"] != "plain" || grid["top"] == "70" || c.height() <= 360 {
		t.Errorf("11 long names: legend %v, grid top %v, height %d; want a plain (wrapping) legend, the plot lower, the chart taller", legend["type"], grid["top"], c.height())
	}
	few := NewLineChart("few", "t", Axis{Name: "sessions"}, xs, Axis{Name: "s"}, many[:2]...)
	if l := firstOption(decodeOptions(t, few), "legend"); l["type"] != "scroll" || few.height() != 360 {
		t.Errorf("2 names: legend %v, height %d; want the one-row layout kept", l, few.height())
	}
}

// TestStaggerMarks: labels of vertical marks a few units apart go on rows
// of their own (the KV-full labels of a mixed plan overprinted); far apart
// ones share the first row.
func TestStaggerMarks(t *testing.T) {
	at := func(x float64) *Mark { return &Mark{Name: fmt.Sprintf("KV full: %.1f", x), X: ptr(x)} }
	marks := []*Mark{at(7.0), at(1.8), at(3.5), at(6.7), at(26.9), at(47.4)}
	StaggerMarks(marks, 0, 60, 900)
	rows := map[float64]int{}
	for _, m := range marks {
		rows[*m.X] = m.Row
	}
	if rows[1.8] == rows[3.5] || rows[6.7] == rows[7.0] {
		t.Errorf("rows %v: close labels share a row", rows)
	}
	if rows[26.9] != 0 || rows[47.4] != 0 {
		t.Errorf("rows %v: far labels should stay on the first row", rows)
	}
	c := NewLineChart("kv", "t", Axis{Name: "sessions"}, []float64{10, 20}, Axis{Name: "s"},
		Series{Name: "a", Y: []float64{1, 2}, Marks: []Mark{*marks[0], *marks[1], *marks[2]}})
	if c.height() <= 360 || !strings.Contains(string(mustJSON(t, c)), `"offset"`) {
		t.Errorf("lifted labels: height %d, offsets in the options: want room made and the labels lifted", c.height())
	}
}

// firstOption is the option key's object, or the first of its list.
func firstOption(o map[string]any, key string) map[string]any {
	var out map[string]any
	forEach(o, key, func(m map[string]any) {
		if out == nil {
			out = m
		}
	})
	return out
}

func mustJSON(t *testing.T, c *Chart) []byte {
	t.Helper()
	b, err := c.OptionsJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSimReportOneLevelBars: a sim of one sessions level draws bars, one
// per strategy, where lines over one level were single dots.
func TestSimReportOneLevelBars(t *testing.T) {
	rep := &sim.Report{Farm: "f", Rows: []sim.Row{
		{Strategy: "least-loaded", Sessions: 8, TTFBP50: 1, TTFBP95: 2, PrefixHitPct: 50, OutputTokensPerMin: 100, ReplicasBusy: 2},
		{Strategy: "affinity", Sessions: 8, TTFBP50: 0.5, TTFBP95: 1, PrefixHitPct: 85, OutputTokensPerMin: 120, ReplicasBusy: 3},
	}}
	r := SimReport(rep, SimReportOptions{})
	for _, c := range r.Sections[0].Charts {
		o := decodeOptions(t, c)
		series := o["series"].([]any)
		if typ := series[0].(map[string]any)["type"]; typ != "bar" {
			t.Errorf("chart %s: %v, want bars for one level", c.ID, typ)
		}
		if !strings.Contains(c.Title, "at 8 sessions") {
			t.Errorf("chart %s: title %q, want the level named", c.ID, c.Title)
		}
	}
}
