package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lm-warden/warden/placement"
)

// TestQuickComparison runs the comparison's loads cut short (make
// compare-peers runs them whole): every head-to-head strategy has a row at
// each level, warden's and a peer's alike, each load says where a peer
// beats warden or that none does, and the same seeds print the same bytes.
func TestQuickComparison(t *testing.T) {
	t.Chdir(filepath.Join("..", ".."))
	// Under the race detector (make test) the 4 x A4000 load alone: the
	// others simulate 7 replicas for minutes, 80 s under -race; what they
	// add is their farms and the trace's import, which run without it.
	only := "abcd"
	if raceEnabled {
		only = "a"
	}
	var a, b bytes.Buffer
	if err := run(context.Background(), &a, []uint64{5}, placement.HeadToHead(), true, only); err != nil {
		t.Fatal(err)
	}
	if !raceEnabled { // the same bytes again (the simulator's own tests check it under -race)
		if err := run(context.Background(), &b, []uint64{5}, placement.HeadToHead(), true, "a"); err != nil {
			t.Fatal(err)
		}
		if i := strings.Index(a.String(), "\n### (b)"); i < 0 || a.String()[:i] != b.String() {
			t.Error("the same seed printed different tables")
		}
	}
	out := a.String()
	for _, l := range loads(true) {
		if !strings.Contains(only, l.key) {
			continue
		}
		if !strings.Contains(out, "### ("+l.key+") ") {
			t.Errorf("no table of load %s", l.key)
		}
		for _, n := range l.sessions {
			for _, s := range placement.HeadToHead() {
				row := "| " + strconv.Itoa(n) + " | " + placement.SpecLabel(s) + " | "
				if !strings.Contains(out, row) {
					t.Errorf("load %s: no row %q", l.key, row)
				}
			}
		}
	}
	if n := strings.Count(out, "\n- "); n < len(only) {
		t.Errorf("%d verdict lines, want one or more per level:\n%s", n, out)
	}
	if testing.Verbose() {
		os.Stdout.WriteString(out)
	}
}

// TestBeats: a peer beats warden only where its worst seed is better than
// warden's best seed.
func TestBeats(t *testing.T) {
	cells := map[string]*cell{
		key(8, "affinity"):                     {hit: []float64{80, 82, 84}, adm: []float64{90, 90, 90}, p95: []float64{10, 12, 14}, out: []float64{100, 110, 120}},
		key(8, "affinity (kv, priced, admit)"): {hit: []float64{70, 71, 72}, adm: []float64{90, 91, 92}, p95: []float64{30, 31, 32}, out: []float64{90, 95, 100}},
		key(8, "llm-d"):                        {hit: []float64{85, 86, 87}, adm: []float64{92.5, 93, 93}, p95: []float64{13, 15, 16}, out: []float64{121, 125, 130}},
		key(8, "dynamo"):                       {hit: []float64{60, 90, 91}, adm: []float64{60, 95, 96}, p95: []float64{9, 9.5, 20}, out: []float64{50, 60, 70}},
	}
	labels := []string{"affinity", "affinity (kv, priced, admit)", "llm-d", "dynamo"}
	got := strings.Join(beats(8, labels, cells), "\n")
	// hit: dynamo has the best median (90) but its worst seed (60) is
	// under warden's best (84): within the spread. TTFB p95: dynamo's
	// median 9.5, worst 20: within. Output: llm-d 121-130 over 100-120.
	// At admission: dynamo's median (95) is the best peer's, but its worst
	// seed (60) is within; llm-d (92.5-93) is not the best peer, so no
	// verdict either.
	want := "8 sessions, output tok/min: llm-d 125 (121-130) beats warden's best, affinity, 110 (100-120)"
	if got != want {
		t.Errorf("beats =\n%s\nwant\n%s", got, want)
	}
}
