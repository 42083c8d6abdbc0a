package web

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lm-warden/warden/bench"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/web/webtest"
)

// sampleComparison compares a hand-made prediction (two strategies, two steps) with a
// measurement that misses one step and one column.
func sampleComparison(t testing.TB) *bench.Comparison {
	t.Helper()
	row := func(s string, n int, f, hit, stayed float64) sim.Row {
		return sim.Row{Strategy: s, Sessions: n, SessionsPerHour: sim.Float(100 * f), OutputTokensPerMin: sim.Float(9000 * f),
			TTFBP50: sim.Float(0.4 * f), TTFBP95: sim.Float(1.1 * f), ReplicasBusy: sim.Float(3 * f), PrefixHitPct: sim.Float(hit),
			StayedPct: sim.Float(stayed), DurationS: 180}
	}
	pred := &sim.Report{Farm: "4x RTX A4000, Qwen3-4B", Rows: []sim.Row{
		row("least-loaded", 4, 1, 60, 30), row("affinity", 4, 1.1, 88, 100),
		row("least-loaded", 8, 1.2, 45, 25), row("affinity", 8, 1.3, 85, 97),
	}}
	obs := &sim.Report{Farm: "bench </script> of http://127.0.0.1:8080", Rows: []sim.Row{
		row("least-loaded", 4, 0.95, 58, math.NaN()), row("affinity", 4, 1.05, 86, 99),
		row("affinity", 8, 1.4, 83, 96),
	}}
	c, err := bench.Compare(pred, obs, bench.CompareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCompareReportGolden(t *testing.T) {
	r := CompareReport(sampleComparison(t), CompareReportOptions{})
	var ids []string
	for _, c := range r.Charts() {
		ids = append(ids, c.ID)
		got, err := c.OptionsJSON()
		if err != nil {
			t.Fatal(err)
		}
		checkGolden(t, filepath.Join("testdata", "compare-"+c.ID+".json"), got)
	}
	want := "cmp-sessions-per-hour cmp-output-tokens-per-min cmp-ttfb-p50-s cmp-ttfb-p95-s cmp-replicas-busy cmp-prefix-hit-pct cmp-stayed-pct"
	if got := strings.Join(ids, " "); got != want {
		t.Errorf("chart ids\n%s\nwant\n%s", got, want)
	}
	if !strings.Contains(r.Answer, "prefix hit % within 2.0 points") || !strings.Contains(r.Answer, "3 matched steps") {
		t.Errorf("answer %q, want the worst hit difference over 3 steps", r.Answer)
	}
	var a, b bytes.Buffer
	if err := r.Render(&a); err != nil {
		t.Fatal(err)
	}
	if err := CompareReport(sampleComparison(t), CompareReportOptions{}).Render(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two renders of one comparison differ")
	}
	html := a.String()
	for _, s := range []string{"predicted least-loaded @ 8", "-2.0 pts (-2.3%)", "prefix_hit_pct"} {
		if !strings.Contains(html, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	if strings.Contains(html, "bench </script>") {
		t.Error("a farm name was not escaped")
	}
}

// TestCompareReportDrawsOfflineInChromium opens the report in headless Chromium with the network
// blocked: every chart drew, nothing was logged or requested, the answer is on the page.
func TestCompareReportDrawsOfflineInChromium(t *testing.T) {
	b := webtest.Find(t)
	r := CompareReport(sampleComparison(t), CompareReportOptions{})
	var buf bytes.Buffer
	if err := r.Render(&buf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "compare.html")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got := b.Check(t, "file://"+path)
	if want := len(r.Charts()); got.Canvases != want || want != len(bench.Columns) {
		t.Errorf("page drew %d canvases, want one per chart (%d, one per column)", got.Canvases, want)
	}
	if len(got.Console) > 0 {
		t.Errorf("console messages: %q", got.Console)
	}
	if len(got.Blocked) > 0 {
		t.Errorf("the page tried to reach the network: %q", got.Blocked)
	}
	if !strings.Contains(got.Text, r.Answer) {
		t.Errorf("page text lacks the answer %q", r.Answer)
	}
}
