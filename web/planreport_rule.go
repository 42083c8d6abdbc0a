package web

import (
	"fmt"
	"math"

	"github.com/lm-warden/warden/planner"
)

// planRuleOfThumb shows concurrency x typical context against each farm's KV cache: a table
// and a dial per farm, and the rule beside the simulation, one sentence per candidate.
func planRuleOfThumb(res *planner.Result) Section {
	t, gauges, top := ruleTable(res)
	s := Section{
		Heading: "Rule of thumb: sessions x context against the KV cache",
		Paragraphs: []string{
			"The rule of thumb: concurrent sessions times their typical context should stay below the farm's total KV cache, or the " +
				"cache has to evict what a session will need again. It is a quick check, not the verdict: it counts the shared system " +
				"prompt once per session and every conversation at its typical length at the same moment, so a farm over it can still " +
				"meet the targets; the simulation decides. A dial shows the demand as a percentage of the farm's KV cache, green up to " +
				"100 %; beyond, amber where the simulation finds the farm meets the targets (or is marginal), red where it misses them, " +
				"grey where it was not simulated (a cheaper farm meets the targets). The dials end at " + fmtNum(min(100*math.Ceil(top/100), ruleDialMax), 0) +
				" %; a needle at the end may be further over, and the figure in its centre says how far.",
			"Typical context: " + res.Workload.TypicalContextHow + ".",
		},
		Tables: []Table{t},
	}
	// The rule of thumb and the simulation side by side, one sentence per candidate.
	rec := Table{Caption: "The rule of thumb and the simulation, side by side", Header: []string{"candidate", "rule of thumb", "how they agree or why they differ"}, Prose: true}
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if c.Fits && c.Reconcile != "" {
			rec.Rows = append(rec.Rows, []string{c.Name, ruleCell(c), c.Reconcile})
		}
	}
	if len(rec.Rows) > 0 {
		s.Tables = append(s.Tables, rec)
	}
	s.Charts = gaugeCharts(gauges, top)
	return s
}

// ruleTable is the rule of thumb per candidate that fits, its dials, and the highest demand in
// % of a farm's KV cache (at least 100).
func ruleTable(res *planner.Result) (Table, []Gauge, float64) {
	t := Table{
		Caption: fmt.Sprintf("%d sessions x %s tokens of typical context against the farm's KV cache", res.Concurrency, fmtInt(int64(res.Workload.TypicalContextTokens))),
		Header:  []string{"candidate", "KV blocks per replica", "KV tokens per replica", "KV tokens, farm", "demand, tokens", "ratio %", "sessions that fit", "verdict"},
	}
	var gauges []Gauge
	top := 100.0
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Fits {
			continue
		}
		v := c.RuleOfThumb
		verdict := planner.RuleOfThumbVerdict(c)
		t.Rows = append(t.Rows, []string{c.Name, fmtInt(int64(c.NumGPUBlocks)), fmtInt(int64(c.KVTokensPerReplica)), fmtInt(c.KVTokensTotal),
			fmtInt(v.DemandTokens), fmtNum(100*v.Ratio, 0), fmtInt(int64(v.SessionsThatFit)), verdict})
		gauges = append(gauges, ruleGauge(c))
		top = math.Max(top, 100*v.Ratio)
	}
	return t, gauges, top
}

// ruleGauge is candidate c's dial: its demand in % of its KV cache, coloured beyond 100 % by
// what the simulation found.
func ruleGauge(c *planner.Candidate) Gauge {
	v := c.RuleOfThumb
	g := Gauge{Name: c.Name, Value: 100 * v.Ratio, Unit: "%"}
	if c.Verdict != "" && c.Verdict != planner.VerdictMisses {
		g.OverColor = amber // beyond 100 %: over the rule, yet the simulation does not find a miss
	}
	if !v.Fits && c.Verdict != "" {
		g.Name += "\nsimulated: " + c.Verdict // under the dial, what the simulation says
	}
	if c.NotSimulated != "" {
		g.OverColor = notSimulatedGrey // no verdict to colour it with
		if !v.Fits {
			g.Name += "\nnot simulated"
		}
	}
	return g
}

// gaugeCharts share the dials among as few charts as gaugesPerChart allows, each dial's scale
// ending at 100 % rounded up past top, at most ruleDialMax: a dial to 2,300 % crowds its ticks
// unreadably, and past 3 times the cache the figure matters more than the needle (a needle at
// the end is further over; the dial's centre says how far).
func gaugeCharts(gauges []Gauge, top float64) []*Chart {
	scale := min(100*math.Ceil(top/100), ruleDialMax)
	// As many charts as gaugesPerChart needs, the dials shared evenly
	// (six make two rows of three, not one of four and one of two).
	nCharts := (len(gauges) + gaugesPerChart - 1) / gaugesPerChart
	per := 0
	if nCharts > 0 {
		per = (len(gauges) + nCharts - 1) / nCharts
	}
	var charts []*Chart
	for k := 0; k < len(gauges); k += per {
		part := gauges[k:min(k+per, len(gauges))]
		for j := range part {
			part[j].Max = scale
		}
		title := "Demand as % of the farm's KV cache"
		if nCharts > 1 {
			title += fmt.Sprintf(" (%d of %d)", k/per+1, nCharts)
		}
		charts = append(charts, NewGaugeChart(fmt.Sprintf("rule-%d", k/per+1), title, part...))
	}
	return charts
}

// ruleCell is the rule-of-thumb ratio and verdict, e.g. "125 % (over)".
func ruleCell(c *planner.Candidate) string {
	v := c.RuleOfThumb
	verdict := "fits"
	if !v.Fits {
		verdict = "over"
	}
	return fmtNum(100*v.Ratio, 0) + " % (" + verdict + ")"
}

// ruleDialMax is where the rule-of-thumb dials end, in % of the KV cache.
const ruleDialMax = 300.0

// notSimulatedGrey is the arc beyond 100 % of a farm not simulated
// (Candidate.NotSimulated): neither amber nor red, as nothing was found.
const notSimulatedGrey = "#bbbbbb"

// amber marks a farm over the rule of thumb that the simulation finds meets the targets.
const amber = "#fac858"

// gaugesPerChart keeps the dials of one gauge chart readable: with more,
// their scale's labels overlap (a 320-pixel chart gives each of six dials a
// radius of about 40 pixels).
const gaugesPerChart = 4
