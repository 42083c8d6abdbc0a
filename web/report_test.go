package web

import (
	"bytes"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// sampleCharts covers every chart constructor, with gaps (NaN, zero on a log axis).
func sampleCharts() []*Chart {
	sessions := []float64{8, 16, 32, 64}
	secs := []float64{0, 15, 30, 45, 60}
	return []*Chart{
		NewLineChart("ttfb", "TTFB p50 and p95 vs sessions", Axis{Name: "sessions"}, sessions,
			Axis{Name: "seconds", Log: true},
			Series{Name: "affinity p50", Y: []float64{0.05, 0.06, 0.09, 0.4}},
			Series{Name: "affinity p95", Y: []float64{0.2, 0.25, 0.5, 3.1}},
			Series{Name: "least-loaded p95", Y: []float64{0.3, 0, 2.2, math.NaN()}}),
		NewBarChart("hit", "Prefix cache hit %", []string{"hash", "least-loaded", "affinity"},
			Axis{Name: "%"}, Series{Name: "hit %", Y: []float64{61.5, 22.25, 88}}),
		NewStackedAreaChart("prompt", "Prompt tokens per second", Axis{Name: "time (s)"}, secs,
			Axis{Name: "tokens/s"},
			Series{Name: "computed", Y: []float64{100, 200, 150, 120, 90}},
			Series{Name: "cached", Y: []float64{0, 800, 900, 950, 1000}}),
		NewGaugeChart("rule", "Sessions x context / total KV",
			Gauge{Name: "2x H100", Value: 143.27, Max: 200, Unit: "%"},
			Gauge{Name: "4x H100", Value: 71.6, Max: 200, Unit: "%"}),
	}
}

func sampleReport() *Report {
	c := sampleCharts()
	return &Report{
		Title:    "Capacity report <test>",
		Question: "How many cards for 64 agent sessions?",
		Answer:   "Four H100s with affinity routing serve 64 sessions at a TTFB p95 of 0.5 s.",
		Sections: []Section{
			{
				Heading:    "Per strategy",
				Paragraphs: []string{"Workload: 64 sessions & a shared system prompt of <8k> tokens."},
				Tables: []Table{{
					Caption: "At 64 sessions",
					Header:  []string{"strategy", "hit %", "TTFB p95 (s)"},
					Rows:    [][]string{{"affinity", "88.0", "0.50"}, {"hash", "61.5", "1.20"}},
				}},
				Charts: c[:2],
			},
			{
				Heading: "Over time",
				Charts:  c[2:],
				Definitions: []Definition{{Name: "prefix_hit_pct", Title: "Prefix cache hit rate", Unit: "%",
					Expr: `100 * sum(rate(vllm:prefix_cache_hits_total[5m])) / sum(rate(vllm:prefix_cache_queries_total[5m]))`}},
			},
		},
	}
}

func TestChartOptionsGolden(t *testing.T) {
	for _, c := range sampleCharts() {
		t.Run(c.ID, func(t *testing.T) {
			got, err := c.OptionsJSON()
			if err != nil {
				t.Fatal(err)
			}
			again, _ := c.OptionsJSON()
			if !bytes.Equal(got, again) {
				t.Fatal("OptionsJSON differs between two calls")
			}
			checkGolden(t, filepath.Join("testdata", "chart-"+c.ID+".json"), got)
		})
	}
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./web -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output; if the change is intended, run go test ./web -update\ngot:\n%s", path, got)
	}
}

func TestChartOptionsHaveNoGaps(t *testing.T) {
	// JSON has no NaN: the NaN and the zero on the log axis must have become "-".
	got, err := sampleCharts()[0].OptionsJSON()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(got), `"-"`); n != 2 {
		t.Errorf(`options hold %d "-" gaps, want 2 (one NaN, one zero on a log axis)`, n)
	}
	if !strings.Contains(string(got), `"type": "log"`) {
		t.Error("y axis is not logarithmic")
	}
}

func TestRenderDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	if err := sampleReport().Render(&a); err != nil {
		t.Fatal(err)
	}
	if err := sampleReport().Render(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two renders of the same report differ")
	}
	html := a.String()
	for _, want := range []string{
		`<p class="answer" id="answer">Four H100s with affinity routing serve 64 sessions at a TTFB p95 of 0.5 s.</p>`,
		`<title>Capacity report &lt;test&gt;</title>`,
		`64 sessions &amp; a shared system prompt of &lt;8k&gt; tokens.`,
		`<td>affinity</td><td>88.0</td><td>0.50</td>`,
		`<div class="chart" id="ttfb" style="height:360px"></div>`,
		`wardenDraw("ttfb", {`,
		`vllm:prefix_cache_hits_total`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	for _, bad := range []string{`src="http`, `href="http`, `<link`, "__f__"} {
		if strings.Contains(html, bad) {
			t.Errorf("rendered page contains %q: it must fetch nothing", bad)
		}
	}
}

func TestRenderEscapesChartText(t *testing.T) {
	r := &Report{Title: "x", Sections: []Section{{Charts: []*Chart{
		NewBarChart("evil", "</script><script>alert(1)</script>", []string{"</script>"}, Axis{},
			Series{Name: "a&b", Y: []float64{1}}),
	}}}}
	var buf bytes.Buffer
	if err := r.Render(&buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "alert(1)</script>") {
		t.Error("chart title ended the script element")
	}
}

func TestRenderErrors(t *testing.T) {
	line := func(id string, ys ...float64) *Chart {
		return NewLineChart(id, "t", Axis{}, []float64{1, 2}, Axis{}, Series{Name: "s", Y: ys})
	}
	tests := []struct {
		name    string
		section Section
		want    string
	}{
		{"duplicate id", Section{Charts: []*Chart{line("a", 1, 2), line("a", 1, 2)}}, `chart id "a" used twice`},
		{"bad id", Section{Charts: []*Chart{line("A b", 1, 2)}}, `chart id "A b"`},
		{"short series", Section{Charts: []*Chart{line("a", 1)}}, `series "s" has 1 values, want one per x (2 x values)`},
		{"nil chart", Section{Charts: []*Chart{nil}}, "nil chart"},
		{"zero chart", Section{Charts: []*Chart{{ID: "z"}}}, "not built by a web.New*Chart constructor"},
		{"ragged table", Section{Tables: []Table{{Caption: "c", Header: []string{"a", "b"}, Rows: [][]string{{"1"}}}}},
			`table 0 ("c") row 0: 1 cells, header has 2`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Report{Title: "x", Sections: []Section{tt.section}}
			err := r.Render(&bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Render error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestEChartsCanBeInlined(t *testing.T) {
	if bytes.Contains(bytes.ToLower(echartsJS), []byte("</script")) || bytes.Contains(echartsJS, []byte("<!--")) {
		t.Fatal("echarts.min.js contains </script or <!--: it cannot be inlined in a script element as is")
	}
	if !bytes.Contains(echartsJS[:4096], []byte("echarts")) {
		t.Fatal("embedded echarts.min.js does not look like echarts")
	}
}

func BenchmarkRenderReport(b *testing.B) {
	r := sampleReport()
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := r.Render(&buf); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzRenderText: no text in a report, however hostile, adds or ends a script element.
func FuzzRenderText(f *testing.F) {
	f.Add("t", "</script><script>alert(1)</script>", "<!--", "a&b")
	f.Add("\u2028", "\x00", "]]>", `"'`)
	f.Fuzz(func(t *testing.T, title, series, category, cell string) {
		r := &Report{Title: title, Answer: cell, Sections: []Section{{
			Heading: title, Paragraphs: []string{cell},
			Tables: []Table{{Caption: cell, Header: []string{series}, Rows: [][]string{{category}}}},
			Charts: []*Chart{
				NewBarChart("a", title, []string{category}, Axis{Name: cell}, Series{Name: series, Y: []float64{1}}),
				NewLineChart("b", title, Axis{Name: cell}, []float64{1}, Axis{}, Series{Name: series, Y: []float64{2}}),
			},
			Definitions: []Definition{{Name: series, Title: title, Expr: cell}},
		}}}
		var buf bytes.Buffer
		if err := r.Render(&buf); err != nil {
			t.Fatal(err)
		}
		out := strings.ToLower(buf.String())
		// head: echarts + draw helper; then one script per chart.
		if n := strings.Count(out, "<script"); n != 4 {
			t.Errorf("%d <script openings, want 4", n)
		}
		if n := strings.Count(out, "</script"); n != 4 {
			t.Errorf("%d </script closings, want 4", n)
		}
	})
}
