package bench

import (
	"bytes"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lm-warden/warden/sim"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

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
		t.Fatalf("%v (run go test ./bench -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs; if the change is intended, run go test ./bench -update\ngot:\n%s", path, got)
	}
}

// SampleReports are a small prediction (two strategies, two steps) and a
// measurement of it (one bench run per strategy), made by hand.
func SampleReports() (pred, off, on *sim.Report) {
	row := func(s string, n int, sph, tok, p50, p95, busy, hit, stayed float64) sim.Row {
		return sim.Row{Strategy: s, Sessions: n, SessionsPerHour: sim.Float(sph), OutputTokensPerMin: sim.Float(tok),
			TTFBP50: sim.Float(p50), TTFBP95: sim.Float(p95), ReplicasBusy: sim.Float(busy), PrefixHitPct: sim.Float(hit),
			StayedPct: sim.Float(stayed), DurationS: 180}
	}
	nan := math.NaN()
	pred = &sim.Report{Farm: "4x RTX A4000, Qwen3-4B", Rows: []sim.Row{
		row("least-loaded", 4, 120, 9000, 0.5, 1.2, 3.1, 60, 30),
		row("affinity", 4, 130, 9500, 0.3, 0.9, 3.4, 88, 100),
		row("least-loaded", 8, 200, 15000, 1.5, 4, 3.9, 45, 25),
		row("affinity", 8, 240, 17000, 0.6, 2, 3.9, 85, 97.5),
	}}
	off = &sim.Report{Farm: "Qwen/Qwen3-4B-Instruct-2507 at http://127.0.0.1:8080 (openai API)", Rows: []sim.Row{
		row("least-loaded", 4, 110, 8700, 0.55, 1.4, 3, 57.5, nan),
		row("least-loaded", 8, 210, 14000, 1.8, 4.1, 3.8, 47, nan),
	}}
	on = &sim.Report{Farm: "Qwen/Qwen3-4B-Instruct-2507 at http://127.0.0.1:8080 (openai API)", Rows: []sim.Row{
		row("affinity", 4, 130, 9600, 0.28, 0.95, 3.3, 86, 100),
		row("affinity", 8, 230, 0, 0.66, 2.1, 3.7, 83.2, 96),
		row("affinity", 16, 300, 20000, 2, 5, 4, 70, 90),
	}}
	return pred, off, on
}

func TestCompareGolden(t *testing.T) {
	pred, off, on := SampleReports()
	obs, err := MergeReports(off, on)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Compare(pred, obs, CompareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Pairs) != 4 {
		t.Fatalf("%d pairs, want 4", len(c.Pairs))
	}
	if got := strings.Join(c.Unmatched, ", "); got != "observed affinity @ 16" {
		t.Errorf("unmatched %q", got)
	}
	var text bytes.Buffer
	if err := c.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, filepath.Join("testdata", "compare.txt"), text.Bytes())
	js, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, filepath.Join("testdata", "compare.json"), append(js, '\n'))
	// Spot checks of the arithmetic the golden file holds.
	hit := c.Pairs[1].Cells[5] // affinity @ 4, prefix hit %
	if c.Pairs[1].Strategy != "affinity" || math.Abs(hit.Points-(-2)) > 1e-9 || math.Abs(hit.RelErr-(-2.0/88)) > 1e-9 {
		t.Errorf("affinity @ 4 hit cell %+v, want -2 points, -2.27 %%", hit)
	}
	tok := c.Pairs[3].Cells[1] // affinity @ 8: observed 0 tokens
	if tok.RelErr != -1 {
		t.Errorf("0 observed against 17000 predicted: rel err %v, want -1", tok.RelErr)
	}
}

func TestCompareByNamedStrategy(t *testing.T) {
	pred, _, on := SampleReports()
	for i := range on.Rows {
		on.Rows[i].Strategy = DefaultLabel
	}
	if _, err := Compare(pred, on, CompareOptions{}); err == nil || !strings.Contains(err.Error(), "no step matches") {
		t.Fatalf("unlabelled rows: err %v, want no step matches", err)
	}
	c, err := Compare(pred, on, CompareOptions{Strategy: "affinity"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Pairs) != 2 || c.Pairs[0].Observed != DefaultLabel || c.Pairs[0].Strategy != "affinity" {
		t.Fatalf("pairs %+v", c.Pairs)
	}
	if _, err := Compare(pred, on, CompareOptions{Strategy: "hash"}); err == nil || !strings.Contains(err.Error(), `"hash"`) {
		t.Errorf("unknown strategy: err %v", err)
	}
}

func TestMergeReportsRejectsDuplicates(t *testing.T) {
	_, _, on := SampleReports()
	if _, err := MergeReports(on, on); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("err = %v, want a duplicate step", err)
	}
}

func TestFormatError(t *testing.T) {
	hit, ttfb := Columns[5], Columns[2]
	for _, tc := range []struct {
		col  Column
		p, o float64
		want string
	}{
		{hit, 80, 78, "-2.0 pts (-2.5%)"},
		{hit, 0, 0, "+0.0 pts (+0.0%)"},
		{hit, math.NaN(), 50, "-"},
		{ttfb, 0.5, 0.6, "+20.0%"},
		{ttfb, 0, 0.1, "-"},
		{ttfb, 1, 1, "+0.0%"},
	} {
		if got := newCell(tc.col, tc.p, tc.o).FormatError(tc.col); got != tc.want {
			t.Errorf("%s %v -> %v: %q, want %q", tc.col.Key, tc.p, tc.o, got, tc.want)
		}
	}
}
