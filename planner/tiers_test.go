package planner

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/lm-warden/warden/internal/racetest"
)

// TestSolveDearerNotSimulated: by default a plan leaves out the candidates
// dearer than a farm that meets the targets (tiers.go). The answer, and
// every candidate it simulated, are byte for byte those of the same plan
// with every candidate simulated; the one left out says why, in the
// result, its JSON and the skip note. (When none meets, nothing is left
// out: TestSolveNoneMeets.)
func TestSolveDearerNotSimulated(t *testing.T) {
	racetest.SimulationOnly(t)
	p := sharedWarmUpPlan() // 2, 3 and 4 x H100, 15-second steps; 3 is the answer
	all, _ := solveJSON(t, p)
	p.EveryCandidate = false
	some, _ := solveJSON(t, p)
	if some.Answer != all.Answer || some.Best != all.Best || some.Reconcile != all.Reconcile || !slices.Equal(some.Marginal, all.Marginal) {
		t.Fatalf("answer %q (best %d)\nwith every candidate %q (best %d): want the same", some.Answer, some.Best, all.Answer, all.Best)
	}
	for i := range some.Candidates {
		got, want := some.Candidates[i], all.Candidates[i]
		if i == 2 {
			if got.NotSimulated != "it takes more cards than 3 x H100 SXM, which meets the targets" ||
				len(got.Configs) != 0 || got.Chosen != -1 || got.Verdict != "" || got.Probes != nil {
				t.Errorf("4 x H100: not simulated %q, %d configs, chosen %d, verdict %q: want it left out for 3 x H100", got.NotSimulated, len(got.Configs), got.Chosen, got.Verdict)
			}
			// What needs no simulation is still said: the KV cache and the rule of thumb.
			if got.KVTokensTotal != want.KVTokensTotal || got.RuleOfThumb != want.RuleOfThumb {
				t.Errorf("4 x H100: KV %d, rule %+v; want %d, %+v", got.KVTokensTotal, got.RuleOfThumb, want.KVTokensTotal, want.RuleOfThumb)
			}
			continue
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if !bytes.Equal(g, w) {
			t.Errorf("%s differs from the plan that simulates every candidate:\n%s", got.Name, firstDiff(g, w))
		}
	}
	if !bytes.Contains(mustJSON(t, some), []byte(`"not_simulated": "it takes more cards than 3 x H100 SXM`)) {
		t.Errorf("the JSON does not say why 4 x H100 was not simulated")
	}
	if s := some.Skipped; s.Candidates != 1 || s.Steps >= all.Skipped.Steps || all.Skipped.Candidates != 0 {
		t.Errorf("skipped %+v (every candidate: %+v): want 1 candidate and fewer steps", *s, *all.Skipped)
	}
	if note := some.SkipNote(); !strings.Contains(note, "cannot be the answer: 1 candidate (every_candidate: true in a plan file, or --every-candidate, simulates them)") {
		t.Errorf("skip note %q does not say a candidate was left out", note)
	}

}

// TestTiersByCost: tiers are by cost, equal costs together whatever the
// plan order, one tier of all with EveryCandidate, and candidates that do
// not fit in none.
func TestTiersByCost(t *testing.T) {
	costs := []float64{4, 2, 0, 4, 3, 2} // 0: does not fit
	res := &Result{}
	cands := make([]*candFarms, len(costs))
	for i, c := range costs {
		res.Candidates = append(res.Candidates, Candidate{Cost: c})
		if c > 0 {
			cands[i] = &candFarms{}
		}
	}
	show := func(tiers [][]*candFarms) string {
		var out []string
		for _, tier := range tiers {
			var in []int
			for i, cf := range tier {
				if cf != nil {
					in = append(in, i)
				}
			}
			out = append(out, fmt.Sprint(in))
		}
		return strings.Join(out, " ")
	}
	if got, want := show(Plan{}.tiers(res, cands)), "[1 5] [4] [0 3]"; got != want {
		t.Errorf("tiers %s, want %s", got, want)
	}
	if got, want := show(Plan{EveryCandidate: true}.tiers(res, cands)), "[0 1 3 4 5]"; got != want {
		t.Errorf("every candidate: tiers %s, want %s", got, want)
	}
}

func mustJSON(t *testing.T, res *Result) []byte {
	t.Helper()
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return data
}
