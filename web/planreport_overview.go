package web

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
)

// planOverview compares the candidates at the wanted concurrency: the table, what makes the
// marginal ones marginal, the candidates not simulated or that do not fit, and the charts.
func planOverview(res *planner.Result, at int) Section {
	// With card counts as the cost the cost column would repeat the cards column.
	byCards := res.CostUnit == "cards" || res.CostUnit == ""
	tables, bars := overviewTables(res, at, byCards)
	s := Section{Heading: "Candidates compared", Paragraphs: overviewParagraphs(res, byCards), Tables: tables}
	if len(bars.names) > 0 {
		s.Charts = overviewCharts(res, bars)
	}
	return s
}

// overviewParagraphs say what the overview's table and charts show.
func overviewParagraphs(res *planner.Result, byCards bool) []string {
	paras := []string{
		fmt.Sprintf("Targets: %s, at %d concurrent sessions. A farm's routing is the strategy and spill threshold that meets the "+
			"targets there with the lowest TTFB p95 (when none meets, the one closest to them). \"Meets up to\" is the highest "+
			"number of concurrent sessions found to meet the targets with that routing; \"stops at\" is the first found to miss them.",
			strings.Join(res.Targets.Phrases(), ", "), res.Concurrency),
		"When no candidate meets the targets, the closest is the one that misses the fewest targets, then the one whose " +
			"figures are nearest their limits (the sum of each shortfall relative to its limit), then the cheapest.",
		costSentence(res, byCards),
		bandSentence(res),
		"The first two charts are the ones to read first: each candidate's prefix-cache hit rate and TTFB p95 against the " +
			"number of concurrent sessions, with the targets as red dashed lines and, in each candidate's colour, a dashed " +
			"vertical line where sessions x typical context equals the farm's KV cache (\"KV full\"); where the result carries " +
			"the uncertainty band (described above) it is shaded.",
	}
	if words := res.RoutingWords(); len(words) > 0 {
		// What each routing named does, in plain words, after the sentence that says how one is chosen.
		paras = slices.Insert(paras, 1, "The routings: "+strings.Join(words, " "))
	}
	return paras
}

// overviewBars are the simulated candidates' figures at the wanted concurrency, for the bar
// charts: nominal, the band's pessimistic edge, and the most sessions each meets the targets at.
type overviewBars struct {
	names             []string
	p95s, hits, maxes []float64
	p95Edge, hitEdge  []float64
}

// overviewTables are the candidates at the wanted concurrency, one row each that was
// simulated, then the tables of why the marginal ones are marginal, of those not simulated and
// of those that do not fit (each only when it has rows).
func overviewTables(res *planner.Result, at int, byCards bool) ([]Table, overviewBars) {
	header := []string{"candidate", "cards"}
	if !byCards {
		header = append(header, "cost "+res.CostUnit, "cost per 1,000 session-turns")
	}
	p95Head, hitHead := "TTFB p95 s", "prefix hit %"
	if banded(res) {
		p95Head, hitHead = "TTFB p95 s (band)", "prefix hit % (band)"
	}
	t := Table{
		Caption: fmt.Sprintf("Candidates at %d concurrent sessions, each with its best routing", res.Concurrency),
		Header: append(header, "routing", "meets targets", p95Head, hitHead,
			"output tok/min", "sessions/h", "meets up to", "stops at", "sessions x context / KV"),
	}
	whys := Table{Caption: "Why the marginal candidates are marginal", Header: []string{"candidate", "why"}, Prose: true}
	dearer := Table{
		Caption: "Candidates not simulated: a cheaper one meets the targets, so they cannot be the answer (every_candidate: true in the plan, or --every-candidate, simulates them)",
		Header:  []string{"candidate", "cards", "why"}, Prose: true,
	}
	notFit := Table{Caption: "Candidates whose model does not fit (not simulated)", Header: []string{"candidate", "cards", "why"}}
	var bars overviewBars
	for i := range res.Candidates {
		c := &res.Candidates[i]
		switch {
		case !c.Fits:
			notFit.Rows = append(notFit.Rows, []string{c.Name, strconv.Itoa(c.Cards), c.Error})
			continue
		case c.NotSimulated != "":
			dearer.Rows = append(dearer.Rows, []string{c.Name, strconv.Itoa(c.Cards), strings.ToUpper(c.NotSimulated[:1]) + c.NotSimulated[1:] + "."})
			continue
		}
		if c.Verdict == planner.VerdictMarginal && c.Why != "" {
			// Said in a table of its own: a long sentence reads badly in a narrow cell.
			whys.Rows = append(whys.Rows, []string{c.Name, "it " + c.Why + "."})
		}
		row, p95, hit := overviewRow(res, i, at, byCards)
		t.Rows = append(t.Rows, row)
		bars.names = append(bars.names, c.Name)
		bars.p95s = append(bars.p95s, p95)
		bars.hits = append(bars.hits, hit)
		bars.p95Edge = append(bars.p95Edge, bandEdge(kpiRange(c, ttfbP95), p95))
		bars.hitEdge = append(bars.hitEdge, bandEdge(kpiRange(c, prefixHit), hit))
		bars.maxes = append(bars.maxes, float64(c.MaxSessions))
	}
	tables := []Table{t}
	for _, extra := range []Table{whys, dearer, notFit} {
		if len(extra.Rows) > 0 {
			tables = append(tables, extra)
		}
	}
	return tables, bars
}

// overviewRow is simulated candidate i's row of the overview's table, with its nominal TTFB p95
// and hit % at the wanted concurrency (NaN when it has no row there).
func overviewRow(res *planner.Result, i, at int, byCards bool) (row []string, p95, hit float64) {
	c := &res.Candidates[i]
	name := c.Name
	switch i {
	case res.Best:
		name += " (answer)"
	case res.Closest:
		name += " (closest)"
	}
	x := chosenRow(c, at)
	routing, p95, hit, p95Cell, hitCell, tok, sph := "-", math.NaN(), math.NaN(), "-", "-", math.NaN(), "-"
	if x != nil {
		routing = c.Configs[c.Chosen].Label()
		p95, hit = float64(x.TTFBP95), float64(x.PrefixHitPct)
		p95Cell = withBand(p95, kpiRange(c, ttfbP95), 2, kpiRuns(c))
		hitCell = withBand(hit, kpiRange(c, prefixHit), 1, kpiRuns(c))
		tok, sph = float64(x.OutputTokensPerMin), sessionsPerHour(x, res.DurationS)
	}
	row = []string{name, strconv.Itoa(c.Cards)}
	if !byCards {
		per1k := "-"
		if v := c.CostPer1kTurns; v != nil && finite(float64(*v)) {
			per1k = fmtNum(float64(*v), 3)
		}
		row = append(row, fmtCost(c.Cost, res.CostUnit), per1k)
	}
	row = append(row, routing, meetsCell(res, c, x != nil, at), p95Cell, hitCell, fmtNum(tok, 0), sph,
		upToCell(c), levelOrDash(c.FailsAt), ruleCell(c))
	return row, p95, hit
}

// meetsCell is a candidate's "meets targets" cell: yes (with the headroom), marginal (the
// reason in the table below the overview), or what it misses at the wanted concurrency.
func meetsCell(res *planner.Result, c *planner.Candidate, hasRow bool, at int) string {
	switch {
	case c.Verdict == planner.VerdictMarginal && c.Why != "":
		return "marginal (see below)"
	case c.Verdict == planner.VerdictMarginal:
		return "marginal"
	case c.Meets && res.HeadroomSessions > 0:
		return fmt.Sprintf("yes, at %d and, with %s %% headroom, at %d", res.Concurrency, fmtPctOf(res.Headroom), res.HeadroomSessions)
	case c.Meets:
		return "yes"
	case hasRow:
		return "misses " + strings.Join(missedPhrases(res, c, at), ", ")
	}
	return "no"
}

// overviewCharts are the candidates' hit rate and TTFB p95 against sessions (each with its
// routing, the band shaded, where its KV cache fills and, for the answer, how far it meets the
// targets), then bars at the wanted concurrency and of the most sessions each meets them at.
func overviewCharts(res *planner.Result, bars overviewBars) []*Chart {
	xs := make([]float64, len(res.Sessions))
	for i, n := range res.Sessions {
		xs[i] = float64(n)
	}
	hitLines, p95Lines, xMax := overviewLines(res, xs)
	sessions := Axis{Name: "concurrent sessions", Min: ptr(0.0), Max: ptr(niceCeil(xMax * 1.05))}
	candidates := "candidate"
	return []*Chart{
		NewLineChart("overview-hit-lines", "Prefix-cache hit rate against sessions, each candidate with its routing",
			sessions, xs, Axis{Name: "prefix hit %", Min: ptr(0.0), Max: ptr(100.0)}, hitLines...),
		NewLineChart("overview-ttfb-lines", "TTFB p95 against sessions, each candidate with its routing",
			sessions, xs, Axis{Name: "TTFB p95, seconds", Log: true}, p95Lines...),
		NewBarChart("overview-ttfb", fmt.Sprintf("TTFB p95 at %d sessions", res.Concurrency), bars.names, Axis{Name: "seconds", Log: true, Seconds: true},
			barsWithEdge(banded(res), Series{Name: "TTFB p95", Y: bars.p95s, Marks: targetMarks(res, "ttfb")}, bars.p95Edge)...).WithCategoryName(candidates),
		NewBarChart("overview-hit", fmt.Sprintf("Prefix-cache hit rate at %d sessions", res.Concurrency), bars.names, Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)},
			barsWithEdge(banded(res), Series{Name: "prefix hit %", Y: bars.hits, Marks: targetMarks(res, "hit")}, bars.hitEdge)...).WithCategoryName(candidates),
		NewBarChart("overview-capacity", "Highest sessions level that meets the targets", bars.names, Axis{Name: "sessions", Min: ptr(0.0)},
			Series{Name: "meets up to", Y: bars.maxes}).WithCategoryName(candidates),
	}
}

// overviewLines are the hit-rate and TTFB p95 lines of every simulated candidate with its
// routing, their marks (KV full, the answer's reach, the targets) and the highest sessions
// figure the axis must reach.
func overviewLines(res *planner.Result, xs []float64) (hitLines, p95Lines []Series, xMax float64) {
	xMax = xs[len(xs)-1]
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Fits || c.Chosen < 0 {
			continue
		}
		cfg := &c.Configs[c.Chosen]
		rows := cfg.Rows
		p95 := Series{Name: c.Name, Y: column(rows, func(r *sim.Row) float64 { return float64(r.TTFBP95) })}
		hit := Series{Name: c.Name, Y: column(rows, func(r *sim.Row) float64 { return float64(r.PrefixHitPct) })}
		p95.Low, p95.High = kpiBand(cfg, ttfbP95)
		hit.Low, hit.High = kpiBand(cfg, prefixHit)
		// A farm whose cache fills well past the levels simulated gets no line: it would
		// stretch the axis past the data (the rule-of-thumb table says where it fills).
		if full, ok := kvFullSessions(res, c); ok && full <= 1.25*xs[len(xs)-1] {
			m := Mark{Name: fmt.Sprintf("KV full: %s", fmtNum(full, 1)), X: ptr(roundF(full, 2))}
			p95.Marks, hit.Marks = []Mark{m}, []Mark{m}
			xMax = math.Max(xMax, full)
		}
		// The answer's "meets them up to N sessions" may lie past the levels
		// simulated (the bisection tries further): the axis reaches it, and a
		// mark in the answer's colour says where.
		if i == res.Best && c.MaxSessions > int(xs[len(xs)-1]) {
			label := fmt.Sprintf("meets up to %d", c.MaxSessions)
			if c.FailsAt == 0 {
				label = fmt.Sprintf("meets up to >= %d", c.MaxSessions)
			}
			m := Mark{Name: label, X: ptr(float64(c.MaxSessions))}
			p95.Marks, hit.Marks = append(p95.Marks, m), append(hit.Marks, m)
			xMax = math.Max(xMax, float64(c.MaxSessions))
		}
		p95Lines = append(p95Lines, p95)
		hitLines = append(hitLines, hit)
	}
	// Labels of marks a few sessions apart are lifted onto rows of their own.
	var vertical []*Mark
	for k := range p95Lines {
		for j := range p95Lines[k].Marks {
			if p95Lines[k].Marks[j].X != nil {
				vertical = append(vertical, &p95Lines[k].Marks[j])
			}
		}
	}
	StaggerMarks(vertical, 0, niceCeil(xMax*1.05), chartPlotPx)
	for k := range hitLines {
		copy(hitLines[k].Marks, p95Lines[k].Marks)
	}
	if len(p95Lines) > 0 {
		p95Lines[0].Marks = append(p95Lines[0].Marks, targetMarks(res, "ttfb")...)
		hitLines[0].Marks = append(hitLines[0].Marks, targetMarks(res, "hit")...)
	}
	return hitLines, p95Lines, xMax
}

// chosenRow is candidate c's row at level index at with its chosen routing, or nil.
func chosenRow(c *planner.Candidate, at int) *sim.Row {
	if !c.Fits || c.Chosen < 0 || at < 0 || at >= len(c.Configs[c.Chosen].Rows) {
		return nil
	}
	return &c.Configs[c.Chosen].Rows[at]
}

// costSentence says what "cheapest" means in the table.
func costSentence(res *planner.Result, byCards bool) string {
	switch {
	case byCards:
		return "One GPU kind and no prices given: \"cheapest\" is by card count, the same order as by money."
	case len(res.Prices) > 0:
		return "\"Cheapest\" is by money: each farm's GPUs at their price per GPU-hour (the prices, and where each comes from, are under the answer)."
	}
	return "\"Cheapest\" is by the price per hour given for each GPU."
}

// chartPlotPx is about the width of a report chart's plot, in pixels.
const chartPlotPx = 900

// kvFullSessions is the number of concurrent sessions whose typical context fills candidate
// c's KV cache (farm KV tokens / typical context tokens): the rule of thumb's 100 % point.
func kvFullSessions(res *planner.Result, c *planner.Candidate) (float64, bool) {
	if res.Workload.TypicalContextTokens <= 0 || c.KVTokensTotal <= 0 {
		return 0, false
	}
	return float64(c.KVTokensTotal) / float64(res.Workload.TypicalContextTokens), true
}

// targetMarks are the plan's targets on a chart of kind "ttfb" (TTFB p95, seconds) or "hit"
// (prefix hit %), as red dashed lines.
func targetMarks(res *planner.Result, kind string) []Mark {
	const red = "#d62728"
	switch {
	case kind == "ttfb" && res.Targets.TTFBP95MaxS > 0:
		v := res.Targets.TTFBP95MaxS
		return []Mark{{Name: "target: TTFB p95 <= " + strconv.FormatFloat(v, 'f', -1, 64) + " s", Y: ptr(v), Color: red}}
	case kind == "hit" && res.Targets.PrefixHitPctMin > 0:
		v := res.Targets.PrefixHitPctMin
		return []Mark{{Name: "target: hit >= " + strconv.FormatFloat(v, 'f', -1, 64) + " %", Y: ptr(v), Color: red}}
	}
	return nil
}

// barsWithEdge is nominal, followed in a banded result by the band's pessimistic edge as a
// second, paler bar beside each: a bar chart has no shading to show the band with.
func barsWithEdge(banded bool, nominal Series, edge []float64) []Series {
	nominal.Name += " (nominal run)"
	if !banded {
		return []Series{nominal}
	}
	return []Series{nominal, {Name: "the band's worst run", Y: edge}}
}

// missedPhrases lists the targets candidate c misses at level index at, with the values.
func missedPhrases(res *planner.Result, c *planner.Candidate, at int) []string {
	var out []string
	for _, m := range c.Configs[c.Chosen].Checks[at].Misses {
		out = append(out, res.Targets.MissPhrase(m))
	}
	return out
}

// upToCell is a candidate's "meets up to": "18", ">= 24" when it still meets the targets at
// the highest level tried, "-" when it meets them at no level.
func upToCell(c *planner.Candidate) string {
	if c.MaxSessions > 0 && c.FailsAt == 0 {
		return ">= " + strconv.Itoa(c.MaxSessions)
	}
	return levelOrDash(c.MaxSessions)
}

func levelOrDash(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func fmtCost(v float64, unit string) string {
	if unit == "cards" {
		return fmtNum(v, 0)
	}
	return fmtNum(v, 2)
}
