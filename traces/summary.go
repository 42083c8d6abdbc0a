package traces

import (
	"math"
	"slices"
	"time"
)

// WorkloadSummary is what a workload's sessions look like, measured on a
// sample of them drawn as a simulation draws them (same seed, same
// sessions): the figures a plan states and the context lengths its report
// charts.
type WorkloadSummary struct {
	Sessions int `json:"sessions"` // top-level sessions sampled
	Requests int `json:"requests"` // their requests, their subagents' included
	// TypicalContextTokens is the mean context (prompt + answer) of a
	// top-level session's request: what a session in progress holds, on
	// average over its requests (the rule of thumb's "typical context").
	TypicalContextTokens int `json:"typical_context_tokens"`
	// Context percentiles over every request sampled (prompt tokens).
	PromptTokensP50 int `json:"prompt_tokens_p50"`
	PromptTokensP90 int `json:"prompt_tokens_p90"`
	PromptTokensMax int `json:"prompt_tokens_max"`
	// TurnsMean and TurnsP50: requests per top-level session.
	TurnsMean float64 `json:"turns_mean"`
	TurnsP50  int     `json:"turns_p50"`
	// MeanOutputTokens over every request.
	MeanOutputTokens float64 `json:"mean_output_tokens"`
	// MeanPauseS is the mean pause before a later request of a session
	// (think_ms), subagents' included.
	MeanPauseS float64 `json:"mean_pause_s"`
	// CompactionsPerSession and SubagentsPerSession are means over the
	// top-level sessions.
	CompactionsPerSession float64 `json:"compactions_per_session"`
	SubagentsPerSession   float64 `json:"subagents_per_session"`
	// Histogram counts the sampled requests by prompt length, in buckets
	// of equal width on a log scale (ContextBuckets).
	Histogram []ContextBucket `json:"histogram"`
}

// ContextBucket is one bar of a context-length histogram: the requests
// whose prompt is in [LoTokens, HiTokens).
type ContextBucket struct {
	LoTokens int `json:"lo_tokens"`
	HiTokens int `json:"hi_tokens"`
	Requests int `json:"requests"`
}

// ContextBucketEdges are the histogram's bucket edges, tokens: four a
// power of two from 1k to 1M (a prompt under 1k falls in the first,
// over 1M in the last).
var ContextBucketEdges = func() []int {
	var e []int
	for x := 10.0; x <= 20.0001; x += 0.5 {
		e = append(e, int(math.Round(math.Exp2(x))))
	}
	return e
}()

// NewContextHistogram returns empty buckets on ContextBucketEdges.
func NewContextHistogram() []ContextBucket {
	e := ContextBucketEdges
	h := make([]ContextBucket, len(e)+1)
	h[0] = ContextBucket{LoTokens: 0, HiTokens: e[0]}
	for i := 1; i < len(e); i++ {
		h[i] = ContextBucket{LoTokens: e[i-1], HiTokens: e[i]}
	}
	h[len(e)] = ContextBucket{LoTokens: e[len(e)-1], HiTokens: math.MaxInt32}
	return h
}

// AddContext counts a request of prompt tokens in h.
func AddContext(h []ContextBucket, prompt int) {
	i, _ := slices.BinarySearchFunc(h, prompt, func(b ContextBucket, p int) int {
		switch {
		case p < b.LoTokens:
			return 1
		case p >= b.HiTokens:
			return -1
		}
		return 0
	})
	h[min(i, len(h)-1)].Requests++
}

// TrimContextHistogram drops the empty buckets at both ends.
func TrimContextHistogram(h []ContextBucket) []ContextBucket {
	lo, hi := 0, len(h)
	for lo < hi && h[lo].Requests == 0 {
		lo++
	}
	for hi > lo && h[hi-1].Requests == 0 {
		hi--
	}
	return h[lo:hi]
}

// SummarySessions is how many top-level sessions Summarize draws by
// default: enough for percentiles within a few per cent on the presets.
const SummarySessions = 2000

// Summarize draws sessions top-level sessions of w (and their subagents)
// with the simulator's generator and seed, without hashing their blocks,
// and measures them.
func Summarize(w Workload, seed uint64, sessions int) WorkloadSummary {
	g := NewGenerator(w, 16, seed)
	g.noHash = true
	hist := NewContextHistogram()
	var prompts, turns []int
	var ctxSum, ctxN, outSum, pauseSum float64
	var pauses, compactions, subagents int
	sum := WorkloadSummary{Sessions: sessions}
	count := func(s *Session, top bool) {
		for j := range s.Turns {
			r := &s.Turns[j]
			prompts = append(prompts, r.PromptTokens)
			AddContext(hist, r.PromptTokens)
			outSum += float64(r.OutputTokens)
			if top {
				ctxSum += float64(r.PromptTokens + r.OutputTokens)
				ctxN++
			}
			if j > 0 {
				pauseSum += float64(r.ThinkMs) / 1000
				pauses++
				// A compaction's answer starts the next prompt afresh: the
				// prompt after it is shorter than the context before.
				if prev := &s.Turns[j-1]; top && r.PromptTokens < prev.PromptTokens+prev.OutputTokens {
					compactions++
				}
			}
		}
	}
	for range sessions {
		s, _ := g.NextFamily()
		count(&s, true)
		turns = append(turns, len(s.Turns))
		subagents += len(s.Subagents)
		for i := range s.Subagents {
			count(&s.Subagents[i], false)
		}
	}
	sum.Requests = len(prompts)
	if sum.Requests == 0 {
		return sum
	}
	slices.Sort(prompts)
	slices.Sort(turns)
	q := func(v []int, p float64) int { return v[min(len(v)-1, int(p*float64(len(v))))] }
	sum.TypicalContextTokens = int(math.Round(ctxSum / max(ctxN, 1)))
	sum.PromptTokensP50, sum.PromptTokensP90, sum.PromptTokensMax = q(prompts, 0.5), q(prompts, 0.9), prompts[len(prompts)-1]
	var tsum int
	for _, t := range turns {
		tsum += t
	}
	sum.TurnsMean = float64(tsum) / float64(len(turns))
	sum.TurnsP50 = q(turns, 0.5)
	sum.MeanOutputTokens = outSum / float64(sum.Requests)
	if pauses > 0 {
		sum.MeanPauseS = pauseSum / float64(pauses)
	}
	sum.CompactionsPerSession = float64(compactions) / float64(sessions)
	sum.SubagentsPerSession = float64(subagents) / float64(sessions)
	sum.Histogram = TrimContextHistogram(hist)
	return sum
}

// MeanPause is the mean pause before a later turn that w says (the
// additions' mixture, else think_time), and the share of it spent on
// tools: what a reader needs to know of a workload's pauses before any
// simulation.
func (w Workload) MeanPause() (time.Duration, float64) {
	if len(w.Additions) == 0 {
		return w.ThinkTime, 0
	}
	var total, tool, weight float64
	for _, a := range w.Additions {
		m := a.Think.ClippedMean() * a.Weight
		total += m
		weight += a.Weight
		if a.Kind == AdditionTool {
			tool += m
		}
	}
	mean := time.Duration(total / weight * float64(time.Second))
	if total == 0 {
		return mean, 0
	}
	return mean, tool / total
}

// SharedPrefixTokens is the system prompt every session of w shares with
// the others of its kind, the least over its agent kinds and their
// subagents' own system prompts: what a router may count once per replica
// rather than once per conversation.
func (w Workload) SharedPrefixTokens() int {
	if len(w.Agents) == 0 {
		n := w.SystemPromptTokens
		if w.SubagentProbability > 0 && w.SubagentSystemPromptTokens > 0 {
			n = min(n, w.SubagentSystemPromptTokens)
		}
		return n
	}
	n := math.MaxInt
	for _, a := range w.Agents {
		n = min(n, a.Shape.SharedPrefixTokens())
	}
	return n
}

// Shaped reports whether w uses the keys of issue 48 (distributions,
// compaction, subagents beyond the old keys, agent kinds): whether its
// sessions must be drawn to be described.
func (w Workload) Shaped() bool {
	return w.TurnsSigma > 0 || len(w.Additions) > 0 || w.ContextLimit > 0 || !w.SubagentParallel.IsZero() ||
		w.SubagentTurnsSigma > 0 || w.SubagentSystemPromptTokens > 0 || w.SubagentSession != "" || len(w.Agents) > 0
}
