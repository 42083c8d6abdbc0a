package traces

import (
	"math"
	"testing"
	"time"
)

// feedFamilies adds n families of g to f in an order a trace could have:
// each subagent's requests right after the parent's request it follows.
func feedFamilies(f *Fitter, g *Generator, n int) {
	for range n {
		fam, _ := g.NextFamily()
		next := 0
		for j := range fam.Turns {
			f.Add(&fam.Turns[j])
			for next < len(fam.Subagents) && fam.Subagents[next].ParentTurn == j {
				for k := range fam.Subagents[next].Turns {
					f.Add(&fam.Subagents[next].Turns[k])
				}
				next++
			}
		}
	}
}

func near(t *testing.T, what string, got, want, rel float64) {
	t.Helper()
	if math.Abs(got-want) > rel*math.Abs(want) {
		t.Errorf("%s: fitted %.4g, generated from %.4g (within %.0f %%)", what, got, want, 100*rel)
	}
}

// TestFitRecoversPreset: a trace drawn from a preset fits back to it: the
// distributions' means and spreads, the mixture, compaction and subagents.
func TestFitRecoversPreset(t *testing.T) {
	w, err := Preset("claude-code")
	if err != nil {
		t.Fatal(err)
	}
	w.SubagentProbability = 0.05 // enough spawns to fit in 400 sessions
	const B = 512
	f := NewFitter(B, FitOptions{})
	feedFamilies(f, NewGenerator(w, B, 3), 400)
	fit := f.Fit()
	got := fit.Workload
	t.Logf("fit: %+v", fit)
	if fit.Kinds != 1 || fit.Sessions != 400 || len(got.Additions) != 2 {
		t.Fatalf("kinds %d, sessions %d, additions %+v", fit.Kinds, fit.Sessions, got.Additions)
	}
	if sys := w.SystemPromptTokens / B * B; got.SystemPromptTokens != sys {
		t.Errorf("system prompt %d, want its %d full blocks", got.SystemPromptTokens, sys)
	}
	// Turns come clipped at turns_max from a lognormal: their own mean.
	sum := Summarize(w, 3, 400)
	near(t, "turns", float64(got.Turns), sum.TurnsMean, 0.05)
	near(t, "turns sigma", got.TurnsSigma, w.TurnsSigma, 0.15)
	tool, user := got.Additions[0], got.Additions[1]
	// A pause of 30 s or more counts as a person's: a few tool runs (their
	// tail) and a few quick replies change sides.
	near(t, "tool weight", tool.Weight, 0.89, 0.05)
	near(t, "tool tokens", tool.Tokens.Mean, w.Additions[0].Tokens.ClippedMean(), 0.1)
	near(t, "tool tokens sigma", tool.Tokens.Sigma, w.Additions[0].Tokens.Sigma, 0.15)
	near(t, "user tokens", user.Tokens.Mean, w.Additions[1].Tokens.ClippedMean(), 0.2)
	near(t, "answer mean", got.OutputTokensMean, Summarize(w, 3, 400).MeanOutputTokens, 0.1)
	if got.ContextLimit < 150000 || got.ContextLimit > 210000 || got.SummaryTokens.IsZero() {
		t.Errorf("context limit %d, summary %v", got.ContextLimit, got.SummaryTokens)
	}
	near(t, "compaction trigger", got.CompactAt*float64(got.ContextLimit), 0.83*200000, 0.1)
	near(t, "subagent probability", got.SubagentProbability, 0.05, 0.25)
	near(t, "subagents at once", got.SubagentParallel.Mean, w.SubagentParallel.ClippedMean(), 0.2)
	near(t, "subagent turns", float64(got.SubagentTurns), float64(w.SubagentTurns), 0.25)
	if got.SubagentSystemPromptTokens != w.SubagentSystemPromptTokens/B*B || got.SubagentSession != SubagentOwn {
		t.Errorf("subagent system prompt %d, session %q", got.SubagentSystemPromptTokens, got.SubagentSession)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	// The fit is a preset: its sessions look like the trace's.
	again := Summarize(got, 9, 400)
	near(t, "typical context of the fit", float64(again.TypicalContextTokens), float64(sum.TypicalContextTokens), 0.2)
}

// TestFitKindsAndOldKeys: two agent kinds (apart by their system
// prompts) fit apart; a constant shape fits back to the old keys.
func TestFitKindsAndOldKeys(t *testing.T) {
	a := DefaultWorkload()
	a.Turns, a.ThinkTime = 4, 2*time.Second
	b := a
	b.SystemPromptTokens, b.Turns = 9000, 8
	w := DefaultWorkload()
	w.Agents = []Agent{{Name: "a", Weight: 1, Shape: a}, {Name: "b", Weight: 1, Shape: b}}
	f := NewFitter(16, FitOptions{})
	feedFamilies(f, NewGenerator(w, 16, 1), 200)
	fit := f.Fit()
	if fit.Kinds != 2 || len(fit.Workload.Agents) != 2 {
		t.Fatalf("kinds %d: %+v", fit.Kinds, fit.Workload.Agents)
	}
	for _, k := range fit.Workload.Agents {
		s := k.Shape
		if s.SystemPromptTokens != 3488 && s.SystemPromptTokens != 8992 {
			t.Errorf("%s: system prompt %d", k.Name, s.SystemPromptTokens)
		}
		want := 4
		if s.SystemPromptTokens == 8992 {
			want = 8
		}
		if s.Turns != want || s.TurnsSigma != 0 || s.NewTokensPerTurn != 400 || s.ThinkTime != 2*time.Second ||
			s.OutputTokens != OutputMax || s.MaxOutputTokens != 256 || len(s.Additions) != 0 {
			t.Errorf("%s: %+v", k.Name, s)
		}
		near(t, k.Name+" weight", k.Weight, 0.5, 0.2)
	}
	if err := fit.Workload.Validate(); err != nil {
		t.Fatal(err)
	}
}
