package planner

import (
	"fmt"
	"math"
	"strings"
)

// reconcile is one sentence that sets a candidate's rule of thumb (the
// wanted concurrency x the typical context against the farm's KV cache)
// beside what the simulation gives at that concurrency with its chosen
// routing, and says why they differ: a shared system prompt is cached once,
// not once per session; the band's low edge (KV x0.85) makes the rule
// tighter; the prompt tokens missed are split into their causes (never
// computed, evicted, cached on another replica).
func reconcile(res *Result, c *Candidate, p Plan) string {
	if !c.Fits || c.Chosen < 0 || c.KPIs == nil {
		return ""
	}
	v := c.RuleOfThumb
	n := res.Concurrency
	over := "over"
	if v.Fits {
		over = "within it"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "By the rule of thumb %d sessions x %s tokens are %s %% of the farm's KV cache of %s tokens (%d x %s blocks x %d), %s",
		n, group(int64(res.Workload.TypicalContextTokens)), fmtPct(100*v.Ratio), group(c.KVTokensTotal),
		c.Replicas, group(int64(c.NumGPUBlocks)), c.KVTokensPerReplica/max(c.NumGPUBlocks, 1), over)
	if c.KVBand && float64(c.KVTokensTotalBand.Low) > 0 {
		fmt.Fprintf(&b, " (%s %% if the cache is %s %% smaller)", fmtPct(100*float64(v.DemandTokens)/float64(c.KVTokensTotalBand.Low)),
			pct(1-BandKVScales[1]))
	}
	shared := 0
	if p.Workload.Trace == "" {
		shared = p.Workload.SystemPromptTokens
	}
	if shared > 0 && n > 1 && c.KVTokensTotal > 0 {
		held := v.DemandTokens - int64(n-1)*int64(shared)
		fmt.Fprintf(&b, "; the %s-token system prompt is shared, cached once rather than %d times, so the sessions hold about %s tokens, %s %% of it",
			group(int64(shared)), n, group(held), fmtPct(100*float64(held)/float64(c.KVTokensTotal)))
	}
	k := c.KPIs
	fmt.Fprintf(&b, "; the simulation gives prefix hit %.1f %% with %s", float64(k.PrefixHitPct.Nominal), c.Configs[c.Chosen].label())
	if k.Runs > 1 {
		fmt.Fprintf(&b, " (band's low edge %.1f %%)", float64(k.PrefixHitPct.Low))
	}
	row := &c.Configs[c.Chosen].Rows[Level(res.Sessions, res.Concurrency)]
	if m := row.MissTokens; m.Total() > 0 {
		t := float64(m.Total())
		fmt.Fprintf(&b, "; of the prompt tokens it computes, %.0f %% were never computed before (new text), %.0f %% had been evicted, %.0f %% were cached only on another replica and %.0f %% are partial blocks",
			100*float64(m.Cold)/t, 100*float64(m.Evicted)/t, 100*float64(m.Elsewhere)/t, 100*float64(m.Partial)/t)
	}
	b.WriteString(".")
	return b.String()
}

// fmtPct writes a percentage with no decimals, one below 10.
func fmtPct(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "-"
	case math.Abs(v) < 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}
