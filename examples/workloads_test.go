package examples_test

import (
	"io/fs"
	"testing"
	"time"

	"github.com/lm-warden/warden/examples"
	"github.com/lm-warden/warden/traces"
)

// TestWorkloadsParse: every example workload parses strictly and is valid.
func TestWorkloadsParse(t *testing.T) {
	names, err := fs.Glob(examples.Workloads, "workloads/*.yaml")
	if err != nil || len(names) == 0 {
		t.Fatalf("workloads %v, %v: want at least one", names, err)
	}
	for _, name := range names {
		data, err := fs.ReadFile(examples.Workloads, name)
		if err != nil {
			t.Fatal(err)
		}
		w, err := traces.ParseWorkload(data, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := w.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestAgents58kShape: the 7 x RTX 5090 workload of issue 14 is what its
// comment says: a first prompt of ~40k tokens growing to ~76k at the last
// turn, ~58k on average, 5 s think time (answers run to max_output_tokens,
// the default answer length).
func TestAgents58kShape(t *testing.T) {
	data, err := fs.ReadFile(examples.Workloads, "workloads/agents-58k.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w, err := traces.ParseWorkload(data, "agents-58k.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if w.OutputTokens != traces.OutputMax {
		t.Fatalf("output_tokens %q, want answers at max_output_tokens", w.OutputTokens)
	}
	first := w.SystemPromptTokens + w.FirstMessageTokens
	last := first + (w.Turns-1)*(w.NewTokensPerTurn+w.MaxOutputTokens)
	mean := (first + last) / 2
	for _, c := range []struct {
		what    string
		got, lo int
		hi      int
	}{{"first prompt", first, 38000, 42000}, {"last prompt", last, 74000, 78000}, {"mean prompt", mean, 56000, 60000}} {
		if c.got < c.lo || c.got > c.hi {
			t.Errorf("%s %d tokens, want %d..%d", c.what, c.got, c.lo, c.hi)
		}
	}
	if w.ThinkTime != 5*time.Second {
		t.Errorf("think_time %s, want 5s", w.ThinkTime)
	}
}
