package planner

import (
	"reflect"
	"strings"
	"testing"

	"github.com/lm-warden/warden/traces"
)

// TestPlanWorkloadPreset: a plan file names a preset; with it no other
// workload key may be set, and the name must be a preset's.
func TestPlanWorkloadPreset(t *testing.T) {
	p, err := ParsePlan([]byte(minimal+"workload:\n  preset: codex\n"), "plan.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := traces.Preset("codex")
	if p.Workload.Preset != "codex" || !reflect.DeepEqual(p.Workload.Workload, want) {
		t.Fatalf("workload %+v", p.Workload)
	}
	for _, tc := range []struct{ yaml, err string }{
		{"workload:\n  preset: codex\n  turns: 3\n", "plan.yaml:9: workload.turns: a workload preset takes no other workload keys"},
		{"workload:\n  preset: cursor\n", `plan.yaml:8: workload.preset: no workload preset "cursor"`},
		{"workload:\n  preset: my.yaml\n", `plan.yaml:8: workload.preset: "my.yaml" is not a preset name`},
	} {
		if _, err := ParsePlan([]byte(minimal+tc.yaml), "plan.yaml"); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.err)
		}
	}
}

// TestShapedWorkloadLine: a workload of distributions is described by
// what its drawn sessions measure, and its line names the preset and its
// key figures; the bench's line, named, says it is the preset.
func TestShapedWorkloadLine(t *testing.T) {
	p := Plan{Workload: WorkloadSpec{Preset: "claude-code"}, Seed: 1, Sessions: []int{8}}
	p.Workload.Workload, _ = traces.Preset("claude-code")
	info := describeWorkload(p, nil)
	sum := traces.Summarize(p.Workload.Workload, 1, traces.SummarySessions)
	if info.TypicalContextTokens != sum.TypicalContextTokens || info.Summary == nil || len(info.Summary.Histogram) < 5 {
		t.Fatalf("typical context %d (drawn: %d), summary %v", info.TypicalContextTokens, sum.TypicalContextTokens, info.Summary)
	}
	info.PausedPct = 71.4
	line := info.WorkloadLine()
	for _, want := range []string{"Workload assumed: preset claude-code (typical context 83,884 tokens, paused 71 % of the time on the answer's farm, 2.5 subagents per session): ",
		"an 18,000-token system prompt", "a tool's result (89 %", "a person's message (11 %", "compaction at 83 % of a 200,000-token context window"} {
		if !strings.Contains(line, want) {
			t.Errorf("line lacks %q:\n%s", want, line)
		}
	}
	if len(line) > 700 {
		t.Errorf("line of %d characters: too long for the terminal's summary", len(line))
	}
	bench := Plan{Workload: WorkloadSpec{Preset: "bench", Workload: traces.DefaultWorkload()}, Seed: 1, Sessions: []int{8}}
	if got := describeWorkload(bench, nil).WorkloadLine(); !strings.HasPrefix(got, "Workload assumed (preset bench): a 3,500-token system prompt") {
		t.Errorf("bench by name: %s", got)
	}
	if got := article(18000) + " " + article(11000) + " " + article(8000) + " " + article(3500) + " " + article(1800); got != "an an an a a" {
		t.Errorf("articles %q", got)
	}
}
