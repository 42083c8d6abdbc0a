package planner

import (
	"fmt"
	"math"
	"strconv"
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
		return WorkloadInfo{
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
		Spec:                 WorkloadSpec{Workload: w},
		TypicalContextTokens: ctx,
		TypicalContextHow:    how,
		Description:          desc,
	}
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
