package main

import (
	"strings"
	"testing"
)

// TestPlanWorkloadFlag: --workload replaces the plan's workload with a
// preset or a file, and the answer's line names it.
func TestPlanWorkloadFlag(t *testing.T) {
	out, err := execWarden(t, "plan", "--gpu", "H100 SXM", "--replicas", "1", "--model", "Qwen/Qwen3-4B-Instruct-2507",
		"--workload", "bench", "--sessions", "2", "--duration", "10s", "--out", "", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "Workload assumed (preset bench): a 3,500-token system prompt") {
		t.Errorf("plan output lacks the named workload:\n%s", out)
	}
	for _, tc := range []struct{ ref, want string }{
		{"nope", `--workload: no workload preset "nope"`},
		{"missing.yaml", "--workload: open missing.yaml: no such file"},
	} {
		if _, err := execWarden(t, "plan", "--workload", tc.ref, "--out", ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--workload %s: error %v, want %q", tc.ref, err, tc.want)
		}
	}
}
