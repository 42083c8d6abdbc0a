package planner

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/lm-warden/warden/internal/num"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// describeWorkload computes the typical context of a session and says in a
// few sentences what load the candidates see.
func describeWorkload(p Plan, trace *sim.Trace) WorkloadInfo {
	step := time.Duration(p.Duration)
	if trace != nil {
		ctx, sessions := traceContext(trace)
		hist := traces.NewContextHistogram()
		for _, r := range trace.Requests {
			traces.AddContext(hist, r.PromptTokens)
		}
		return WorkloadInfo{
			Summary:              &traces.WorkloadSummary{Requests: len(trace.Requests), Sessions: sessions, Histogram: traces.TrimContextHistogram(hist)},
			Spec:                 WorkloadSpec{Trace: p.Workload.Trace},
			TypicalContextTokens: ctx,
			TypicalContextHow: fmt.Sprintf("the mean over the trace's %d sessions of each session's mean context "+
				"(prompt + output tokens) over its turns", sessions),
			Description: []string{
				fmt.Sprintf("Trace %s: %s requests in %s sessions, replayed in a closed loop (a session sends its next turn "+
					"when the previous answer finished) with N sessions at a time.", trace.Name, group(int64(len(trace.Requests))), group(int64(sessions))),
				fmt.Sprintf("Each sessions level N runs for up to %s on fresh replicas; each strategy and spill threshold runs apart.", step),
			},
		}
	}
	w := p.Workload.Workload
	sum := traces.Summarize(w, p.Seed, traces.SummarySessions)
	if w.Shaped() {
		return describeShaped(p, w, sum)
	}
	ctx, how := syntheticContext(w)
	desc := []string{
		fmt.Sprintf("Synthetic agent sessions: a system prompt of %s tokens shared by every session, a first message of %s tokens (±%s %%) "+
			"of each session's own, then %d turns in all, each adding %s new tokens and the previous answer; answers of at most %s tokens "+
			"(mean about %s). Closed loop: a session sends its next turn %s after the previous answer finished, and a new session "+
			"starts when one ends, so the number of concurrent sessions stays constant.",
			group(int64(w.SystemPromptTokens)), group(int64(w.FirstMessageTokens)), strconv.FormatFloat(100*w.FirstMessageSpread, 'f', -1, 64),
			w.Turns, group(int64(w.NewTokensPerTurn)), group(int64(w.MaxOutputTokens)), group(int64(math.Round(meanOutput(w)))), thinkTime(w.ThinkTime)),
		fmt.Sprintf("Each strategy starts on cold replicas; the sessions levels %s then run for %s each, one after the other on the same "+
			"replicas (warm caches), seed %d: every candidate sees the same sessions.", joinInts(p.Sessions), step, p.Seed),
	}
	if w.SubagentProbability > 0 {
		desc = append(desc, fmt.Sprintf("After each turn a session spawns a subagent with probability %g (%d turns, a task of %s tokens).",
			w.SubagentProbability, w.SubagentTurns, group(int64(w.SubagentTaskTokens))))
	}
	return WorkloadInfo{
		Spec:                 WorkloadSpec{Preset: p.Workload.Preset, Workload: w},
		TypicalContextTokens: ctx,
		TypicalContextHow:    how,
		Description:          desc,
		Summary:              &sum,
	}
}

// describeShaped describes a workload of distributions (issue 48): its
// typical context and figures are measured on the sessions the plan
// simulates (traces.Summarize with the plan's seed), not computed from
// constants.
func describeShaped(p Plan, w traces.Workload, sum traces.WorkloadSummary) WorkloadInfo {
	step := time.Duration(p.Duration)
	how := fmt.Sprintf("the mean context (prompt + answer) of a request of %s sessions drawn with the plan's seed, as the simulation draws them "+
		"(subagents not counted)", group(int64(sum.Sessions)))
	desc := []string{fmt.Sprintf("Synthetic agent sessions%s: %s. Closed loop: a session sends its next turn after the previous answer "+
		"and the pause before that turn (a tool running, a person replying: the session holds its KV cache but sends nothing), and a "+
		"new session starts when one ends, so the number of concurrent sessions stays constant; subagents run beside their parent, "+
		"which waits for them, and are not counted in it.", workloadName(p.Workload.Preset), joinAnd(shapePhrases(w, sum, true)))}
	if len(w.Agents) > 0 {
		var kinds []string
		for _, a := range w.Agents {
			kinds = append(kinds, fmt.Sprintf("%s (weight %g, %s %s-token system prompt)", a.Name, a.Weight, article(a.Shape.SystemPromptTokens), group(int64(a.Shape.SystemPromptTokens))))
		}
		desc = append(desc, "Agent kinds sharing the farm, each with its own system prompt: "+joinAnd(kinds)+".")
	}
	desc = append(desc, fmt.Sprintf("Each strategy starts on cold replicas; the sessions levels %s then run for %s each, one after the other on the same "+
		"replicas (warm caches), seed %d: every candidate sees the same sessions.", joinInts(p.Sessions), step, p.Seed))
	return WorkloadInfo{
		Spec:                 WorkloadSpec{Preset: p.Workload.Preset, Workload: w},
		TypicalContextTokens: sum.TypicalContextTokens,
		TypicalContextHow:    how,
		Description:          desc,
		Summary:              &sum,
	}
}

// workloadName is " (preset X)" or " (file X)" for a workload chosen by
// name, "" for the plan's own keys.
func workloadName(ref string) string {
	switch {
	case ref == "":
		return ""
	case traces.IsPresetName(ref):
		return " (preset " + ref + ")"
	}
	return " (file " + ref + ")"
}

// shapePhrases says a workload of distributions in a few phrases, its
// figures measured on its sessions; detail adds what the Workload
// assumed line says among its key figures (pauses, subagents).
func shapePhrases(w traces.Workload, sum traces.WorkloadSummary, detail bool) []string {
	var out []string
	if n := w.SystemPromptTokens; n > 0 && len(w.Agents) == 0 {
		out = append(out, fmt.Sprintf("%s %s-token system prompt shared by every session", article(n), group(int64(n))))
	}
	out = append(out, fmt.Sprintf("sessions of %s requests on average (median %d)", strconv.FormatFloat(math.Round(sum.TurnsMean*10)/10, 'f', -1, 64), sum.TurnsP50))
	if len(w.Additions) > 0 && len(w.Agents) == 0 {
		var parts []string
		for _, a := range w.Additions {
			what := "a tool's result"
			if a.Kind == traces.AdditionUser {
				what = "a person's message"
			}
			parts = append(parts, fmt.Sprintf("%s (%s %%, median %s tokens, up to %s)", what, strconv.FormatFloat(math.Round(1000*a.Weight/totalWeight(w.Additions))/10, 'f', -1, 64),
				group(int64(math.Round(a.Tokens.Median()))), group(int64(math.Round(math.Max(a.Tokens.Max, a.Tokens.Mean))))))
		}
		out = append(out, "each later turn adding "+strings.Join(parts, " or "))
	}
	out = append(out, fmt.Sprintf("answers of about %s tokens", group(int64(math.Round(sum.MeanOutputTokens)))))
	if sum.MeanPauseS > 0 && detail {
		out = append(out, fmt.Sprintf("pauses of %s between turns on average", fmtSeconds(sum.MeanPauseS)))
	}
	if w.ContextLimit > 0 && len(w.Agents) == 0 {
		at := w.CompactAt
		if at == 0 {
			at = traces.DefaultCompactAt
		}
		out = append(out, fmt.Sprintf("compaction at %s %% of a %s-token context window (%s compactions per session)", strconv.FormatFloat(100*at, 'f', -1, 64),
			group(int64(w.ContextLimit)), strconv.FormatFloat(math.Round(sum.CompactionsPerSession*100)/100, 'f', -1, 64)))
	}
	if sum.SubagentsPerSession > 0 && detail {
		sp := fmt.Sprintf("%s subagents per session", strconv.FormatFloat(math.Round(sum.SubagentsPerSession*10)/10, 'f', -1, 64))
		if w.SubagentSystemPromptTokens > 0 {
			sp += fmt.Sprintf(" (%s %s-token system prompt of their own)", article(w.SubagentSystemPromptTokens), group(int64(w.SubagentSystemPromptTokens)))
		}
		out = append(out, sp)
	}
	out = append(out, fmt.Sprintf("prompts of %s tokens at the median, %s at the 90th percentile", group(int64(sum.PromptTokensP50)), group(int64(sum.PromptTokensP90))))
	return out
}

// article is "an" before a number read with a vowel first (8, 11 and 18
// thousand, 80...), else "a".
func article(n int) string {
	d := strconv.Itoa(n)
	if d[0] == '8' || (len(d)%3 == 2 && (d[:2] == "11" || d[:2] == "18")) {
		return "an"
	}
	return "a"
}

func totalWeight(a []traces.Addition) float64 {
	var t float64
	for _, x := range a {
		t += x.Weight
	}
	return t
}

// fmtSeconds writes a duration of s seconds to the second (to the tenth
// below 10 s).
func fmtSeconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// shapedLine is the Workload assumed line of a workload of distributions:
// the preset or file, then its key figures (typical context, the share of
// time paused on the answer's farm, subagents), then the shape.
func (w WorkloadInfo) shapedLine() string {
	sum := w.Summary
	figures := []string{fmt.Sprintf("typical context %s tokens", group(int64(w.TypicalContextTokens)))}
	if w.PausedPct > 0 {
		figures = append(figures, fmt.Sprintf("paused %s %% of the time on the answer's farm", strconv.FormatFloat(math.Round(float64(w.PausedPct)), 'f', -1, 64)))
	} else if sum.MeanPauseS > 0 {
		figures = append(figures, fmt.Sprintf("pauses of %s between turns on average", fmtSeconds(sum.MeanPauseS)))
	}
	sub := "no subagents"
	if sum.SubagentsPerSession > 0 {
		sub = fmt.Sprintf("%s subagents per session", strconv.FormatFloat(math.Round(sum.SubagentsPerSession*10)/10, 'f', -1, 64))
	}
	figures = append(figures, sub)
	name := strings.TrimPrefix(workloadName(w.Spec.Preset), " ")
	if name != "" {
		name = strings.Trim(name, "()") + " "
	}
	phrases := shapePhrases(w.Spec.Workload, *sum, false)
	return fmt.Sprintf("Workload assumed: %s(%s): %s.", name, strings.Join(figures, ", "), joinAnd(phrases))
}

func thinkTime(d time.Duration) string {
	if d == 0 {
		return "at once"
	}
	return d.String()
}

// meanOutput is the mean answer length: MaxOutputTokens when answers run to
// it, else the lognormal's mean, capped at MaxOutputTokens (the clipping of
// the tail is ignored).
func meanOutput(w traces.Workload) float64 {
	if w.OutputTokens != traces.OutputLognormal {
		return float64(w.MaxOutputTokens)
	}
	m := w.OutputTokensMean
	if m == 0 {
		m = 0.6 * float64(w.MaxOutputTokens)
	}
	return math.Min(m, float64(w.MaxOutputTokens))
}

// syntheticContext is the mean context of a session over its turns: turn k
// (0-based) holds the system prompt, the first message, k x (new text +
// answer) of the earlier turns, and its own answer, so the mean over T
// turns is system + first + answer + (T-1)/2 x (new + answer).
func syntheticContext(w traces.Workload) (int, string) {
	out := meanOutput(w)
	ctx := float64(w.SystemPromptTokens+w.FirstMessageTokens) + out + float64(w.Turns-1)/2*(float64(w.NewTokensPerTurn)+out)
	n := int(math.Round(ctx))
	how := fmt.Sprintf("the mean context (prompt + answer) over a session's %d turns: system prompt %s + first message %s + answer %s "+
		"+ (%d-1)/2 x (new text %s + answer %s) = %s tokens (subagents not counted)",
		w.Turns, group(int64(w.SystemPromptTokens)), group(int64(w.FirstMessageTokens)), group(int64(math.Round(out))),
		w.Turns, group(int64(w.NewTokensPerTurn)), group(int64(math.Round(out))), group(int64(n)))
	return n, how
}

// traceContext is the mean over sessions of each session's mean context
// (prompt + output) over its turns, and the number of sessions.
func traceContext(t *sim.Trace) (int, int) {
	type acc struct {
		sum   float64
		turns int
	}
	index := map[string]int{}
	var sessions []acc
	for _, r := range t.Requests {
		i, ok := index[r.Session]
		if !ok {
			i = len(sessions)
			index[r.Session] = i
			sessions = append(sessions, acc{})
		}
		sessions[i].sum += float64(r.PromptTokens + r.OutputTokens)
		sessions[i].turns++
	}
	var sum float64
	for _, s := range sessions {
		sum += s.sum / float64(s.turns)
	}
	if len(sessions) == 0 {
		return 0, 0
	}
	return int(math.Round(sum / float64(len(sessions)))), len(sessions)
}

// group writes an integer with thousands separators.
func group(v int64) string { return num.Int(v) }

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return joinAnd(s)
}
