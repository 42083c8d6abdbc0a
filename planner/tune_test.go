package planner

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
)

// TestJournalFiles: --journal's files, globs and directories, replayed
// oldest first: FILE.N before FILE.N-1 before FILE, as the proxy rotates.
func TestJournalFiles(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"j.jsonl", "j.jsonl.1", "j.jsonl.2", "j.jsonl.10", "other.jsonl", ".hidden"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, filepath.Join(dir, n))
		}
		return out
	}
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"one file", p("j.jsonl"), p("j.jsonl")},
		{"rotations given newest first", p("j.jsonl", "j.jsonl.1", "j.jsonl.2"), p("j.jsonl.2", "j.jsonl.1", "j.jsonl")},
		{"glob", []string{filepath.Join(dir, "j.jsonl*")}, p("j.jsonl.10", "j.jsonl.2", "j.jsonl.1", "j.jsonl")},
		{"directory", []string{dir}, p("j.jsonl.10", "j.jsonl.2", "j.jsonl.1", "j.jsonl", "other.jsonl")},
		{"given twice", append(p("j.jsonl.1"), filepath.Join(dir, "j.jsonl*")), p("j.jsonl.10", "j.jsonl.2", "j.jsonl.1", "j.jsonl")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := JournalFiles(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("files\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

// TestTuneRecommend: the rule on rows made up to isolate each clause.
func TestTuneRecommend(t *testing.T) {
	row := func(variant string, p95, tok float64) TuneRow {
		v, err := placement.ParseSpec(variant)
		if err != nil {
			t.Fatal(err)
		}
		return TuneRow{Variant: variant, Name: v.Label(), Options: numOptions(v),
			TTFBP95: sim.Float(p95), OutputTokensPerMin: sim.Float(tok), Spec: v}
	}
	nan := math.NaN()
	for _, tt := range []struct {
		name string
		rows []TuneRow
		want string
		ref  float64
	}{
		{"more tokens but a worse tail loses", []TuneRow{row("least-loaded", 2, 1000), row("affinity", 3, 1200), row("affinity+kv", 1.5, 1100)}, "affinity (kv)", 2},
		{"a tie goes to fewer options", []TuneRow{row("least-loaded", 2, 1000), row("affinity", 1.9, 1100), row("affinity+kv+admit", 1.8, 1105)}, "affinity", 1.9},
		{"past the tie, more options win", []TuneRow{row("affinity", 2, 1000), row("affinity+kv+admit", 1.8, 1020)}, "affinity (kv, admit)", 2},
		{"a tie among plain ones goes to the first", []TuneRow{row("least-loaded", 2, 1000), row("affinity", 2, 1000)}, "least-loaded", 2},
		{"priced is recommended on its merits", []TuneRow{row("affinity", 2, 1000), row("affinity+priced", 1, 2000)}, "affinity (priced)", 2},
		{"no measure is no candidate", []TuneRow{row("affinity", nan, nan), row("least-loaded", 3, 900)}, "least-loaded", 3},
		{"without plain strategies, the reference is the variants'", []TuneRow{row("affinity+kv", 4, 900), row("affinity+admit=10s", 2, 800), row("affinity+priced", 1, 700)}, "affinity (priced)", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := &TuneResult{Variants: tt.rows}
			if err := Recommend(res); err != nil {
				t.Fatal(err)
			}
			if got := res.Variants[res.Recommended].Name; got != tt.want || float64(res.Reference) != tt.ref {
				t.Errorf("recommended %q with reference %v, want %q with %v (%s)", got, res.Reference, tt.want, tt.ref, res.Why)
			}
		})
	}
	if err := Recommend(&TuneResult{Variants: []TuneRow{row("affinity", nan, nan)}}); err == nil {
		t.Error("no TTFB anywhere: no error")
	}
}
