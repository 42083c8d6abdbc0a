package web

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// PlanReport turns a capacity plan's result into a report: the question and the answer at the
// top; the candidates compared at the wanted concurrency (table and charts across candidates);
// the rule-of-thumb gauge per candidate; the answer's farm over time at the wanted concurrency
// (per-replica requests in flight and KV use, prompt tokens per second cached and computed: the
// result's Timeline, PromQL range queries, with their text); one section per candidate that
// fits with the seed-style table per routing and its charts (TTFB p50/p95 on a log scale, prefix
// hit %, output tokens per minute, replicas busy, per-replica step figures); the workload and
// settings used; and the PromQL that defines each figure. The same result gives the same bytes.
func PlanReport(res *planner.Result) *Report {
	r := &Report{
		Title:    res.Title,
		Question: res.Question,
		Answer:   res.Answer,
	}
	if w := res.Workload.WorkloadLine(); w != "" {
		r.Notes = []string{w}
	}
	if len(res.VLLMReleases) > 0 {
		r.Notes = append(r.Notes, "vLLM release simulated: "+strings.Join(res.VLLMReleases, ", ")+
			". The release decides admission, vLLM's own balancer and the KV cache's size (sim/testdata/vllm says what each does): "+
			"the answer holds for it; --vllm-version plans for another.")
	}
	if w := res.PricesWords(); w != "" {
		r.Notes = append(r.Notes, w)
	}
	at := planner.Level(res.Sessions, res.Concurrency)
	r.Sections = append(r.Sections, planOverview(res, at))
	if bc := res.BuyerCheck; bc != nil {
		r.Sections = append(r.Sections, buyerSection(bc))
	}
	r.Sections = append(r.Sections, planRuleOfThumb(res))
	if res.Timeline != nil {
		r.Sections = append(r.Sections, planTimeline(res))
	}
	for i := range res.Candidates {
		if c := &res.Candidates[i]; c.Fits && len(c.Configs) > 0 {
			r.Sections = append(r.Sections, planCandidate(res, i, at))
		}
	}
	if res.Observation != nil {
		r.Sections = append(r.Sections, ObservedSection(res.Observation))
	}
	r.Sections = append(r.Sections, planSettings(res), definitionsSection(nil))
	return r
}

// buyerSection is the plan's BuyerCheck: what to rent for an hour and run
// to decide a marginal answer, or the margin to buy instead.
func buyerSection(bc *planner.BuyerCheck) Section {
	t := Table{Caption: "One hour on one rented replica", Header: []string{"step", "what", "command"}, Prose: true}
	for i, st := range bc.Steps {
		cmd := st.Command
		if cmd == "" {
			cmd = "-"
		}
		t.Rows = append(t.Rows, []string{strconv.Itoa(i + 1), st.Why, cmd})
	}
	s := Section{
		Heading:    "Before buying: measure what decides it",
		Paragraphs: []string{bc.Lead(), "Then " + bc.Then},
		Tables:     []Table{t},
	}
	if bc.Margin != "" {
		s.Paragraphs = append(s.Paragraphs, bc.Margin)
	}
	return s
}

// chosenRow is candidate c's row at level index at with its chosen routing, or nil.
func chosenRow(c *planner.Candidate, at int) *sim.Row {
	if !c.Fits || c.Chosen < 0 || at < 0 || at >= len(c.Configs[c.Chosen].Rows) {
		return nil
	}
	return &c.Configs[c.Chosen].Rows[at]
}

// planOverview compares the candidates at the wanted concurrency.
func planOverview(res *planner.Result, at int) Section {
	// With card counts as the cost the cost column would repeat the cards column.
	byCards := res.CostUnit == "cards" || res.CostUnit == ""
	header := []string{"candidate", "cards"}
	if !byCards {
		header = append(header, "cost "+res.CostUnit, "cost per 1,000 session-turns")
	}
	banded := jsonPath(jsonOf(res), "band", "kv_scales") != nil
	p95Head, hitHead := "TTFB p95 s", "prefix hit %"
	if banded {
		p95Head, hitHead = "TTFB p95 s (band)", "prefix hit % (band)"
	}
	t := Table{
		Caption: fmt.Sprintf("Candidates at %d concurrent sessions, each with its best routing", res.Concurrency),
		Header: append(header, "routing", "meets targets", p95Head, hitHead,
			"output tok/min", "sessions/h", "meets up to", "stops at", "sessions x context / KV"),
	}
	var notFit, dearer Table
	whys := Table{Caption: "Why the marginal candidates are marginal", Header: []string{"candidate", "why"}, Prose: true}
	var names []string
	var p95s, hits, maxes []float64
	var p95Edge, hitEdge []float64 // the band's pessimistic edge, when the result has a band
	for i := range res.Candidates {
		c := &res.Candidates[i]
		name := c.Name
		switch i {
		case res.Best:
			name += " (answer)"
		case res.Closest:
			name += " (closest)"
		}
		if !c.Fits {
			notFit.Rows = append(notFit.Rows, []string{c.Name, strconv.Itoa(c.Cards), c.Error})
			continue
		}
		if c.NotSimulated != "" {
			dearer.Rows = append(dearer.Rows, []string{c.Name, strconv.Itoa(c.Cards), strings.ToUpper(c.NotSimulated[:1]) + c.NotSimulated[1:] + "."})
			continue
		}
		x := chosenRow(c, at)
		meets := "no"
		if c.Meets {
			meets = "yes"
			if res.HeadroomSessions > 0 {
				meets = fmt.Sprintf("yes, at %d and, with %s %% headroom, at %d", res.Concurrency, fmtPctOf(res.Headroom), res.HeadroomSessions)
			}
		} else if x != nil {
			meets = "misses " + strings.Join(missedPhrases(res, c, at), ", ")
		}
		cj := jsonOf(c)
		if v, _ := jsonPath(cj, "verdict").(string); v == "marginal" {
			meets = "marginal"
			if why, _ := jsonPath(cj, "why").(string); why != "" {
				// Said in a table of its own below: a long sentence reads badly in a narrow cell.
				meets += " (see below)"
				whys.Rows = append(whys.Rows, []string{c.Name, "it " + why + "."})
			}
		}
		routing, p95, hit, p95Cell, hitCell, tok, sph := "-", math.NaN(), math.NaN(), "-", "-", math.NaN(), "-"
		if x != nil {
			routing = c.Configs[c.Chosen].Label()
			p95, hit = float64(x.TTFBP95), float64(x.PrefixHitPct)
			runs, _ := jsonPath(cj, "kpis", "runs").(float64)
			p95Cell = withBand(p95, jsonPath(cj, "kpis", "ttfb_p95_s"), 2, runs)
			hitCell = withBand(hit, jsonPath(cj, "kpis", "prefix_hit_pct"), 1, runs)
			tok, sph = float64(x.OutputTokensPerMin), sessionsPerHour(x, res.DurationS)
		}
		row := []string{name, strconv.Itoa(c.Cards)}
		if !byCards {
			per1k := "-"
			if v, ok := jsonPath(cj, "cost_per_1k_turns").(float64); ok {
				per1k = fmtNum(v, 3)
			}
			row = append(row, fmtCost(c.Cost, res.CostUnit), per1k)
		}
		t.Rows = append(t.Rows, append(row, routing, meets,
			p95Cell, hitCell, fmtNum(tok, 0), sph,
			upToCell(c), levelOrDash(c.FailsAt), ruleCell(c),
		))
		names = append(names, c.Name)
		p95s = append(p95s, p95)
		hits = append(hits, hit)
		p95Edge = append(p95Edge, bandEdge(jsonPath(cj, "kpis", "ttfb_p95_s"), p95))
		hitEdge = append(hitEdge, bandEdge(jsonPath(cj, "kpis", "prefix_hit_pct"), hit))
		maxes = append(maxes, float64(c.MaxSessions))
	}
	s := Section{
		Heading: "Candidates compared",
		Paragraphs: []string{
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
		},
		Tables: []Table{t},
	}
	if words := res.RoutingWords(); len(words) > 0 {
		// What each routing named does, in plain words, after the sentence that says how one is chosen.
		s.Paragraphs = slices.Insert(s.Paragraphs, 1, "The routings: "+strings.Join(words, " "))
	}
	if len(whys.Rows) > 0 {
		s.Tables = append(s.Tables, whys)
	}
	if len(dearer.Rows) > 0 {
		dearer.Caption = "Candidates not simulated: a cheaper one meets the targets, so they cannot be the answer (every_candidate: true in the plan, or --every-candidate, simulates them)"
		dearer.Header = []string{"candidate", "cards", "why"}
		dearer.Prose = true
		s.Tables = append(s.Tables, dearer)
	}
	if len(notFit.Rows) > 0 {
		notFit.Caption = "Candidates whose model does not fit (not simulated)"
		notFit.Header = []string{"candidate", "cards", "why"}
		s.Tables = append(s.Tables, notFit)
	}
	if len(names) == 0 {
		return s
	}
	xs := make([]float64, len(res.Sessions))
	for i, n := range res.Sessions {
		xs[i] = float64(n)
	}
	var p95Lines, hitLines []Series
	xMax := xs[len(xs)-1]
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Fits || c.Chosen < 0 {
			continue
		}
		cfg := &c.Configs[c.Chosen]
		rows := cfg.Rows
		p95 := Series{Name: c.Name, Y: column(rows, func(r *sim.Row) float64 { return float64(r.TTFBP95) })}
		hit := Series{Name: c.Name, Y: column(rows, func(r *sim.Row) float64 { return float64(r.PrefixHitPct) })}
		p95.Low, p95.High = kpiBand(cfg, "ttfb_p95_s")
		hit.Low, hit.High = kpiBand(cfg, "prefix_hit_pct")
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
	sessions := Axis{Name: "concurrent sessions", Min: ptr(0.0), Max: ptr(niceCeil(xMax * 1.05))}
	candidates := "candidate"
	s.Charts = []*Chart{
		NewLineChart("overview-hit-lines", "Prefix-cache hit rate against sessions, each candidate with its routing",
			sessions, xs, Axis{Name: "prefix hit %", Min: ptr(0.0), Max: ptr(100.0)}, hitLines...),
		NewLineChart("overview-ttfb-lines", "TTFB p95 against sessions, each candidate with its routing",
			sessions, xs, Axis{Name: "TTFB p95, seconds", Log: true}, p95Lines...),
		NewBarChart("overview-ttfb", fmt.Sprintf("TTFB p95 at %d sessions", res.Concurrency), names, Axis{Name: "seconds", Log: true},
			barsWithEdge(banded, Series{Name: "TTFB p95", Y: p95s, Marks: targetMarks(res, "ttfb")}, p95Edge)...).WithCategoryName(candidates),
		NewBarChart("overview-hit", fmt.Sprintf("Prefix-cache hit rate at %d sessions", res.Concurrency), names, Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)},
			barsWithEdge(banded, Series{Name: "prefix hit %", Y: hits, Marks: targetMarks(res, "hit")}, hitEdge)...).WithCategoryName(candidates),
		NewBarChart("overview-capacity", "Highest sessions level that meets the targets", names, Axis{Name: "sessions", Min: ptr(0.0)},
			Series{Name: "meets up to", Y: maxes}).WithCategoryName(candidates),
	}
	return s
}

// bandSentence says what the bands in parentheses are, from the result's "band" (which KV
// scales, engine speed scales and seeds were run), and what the verdicts mean, with the
// headroom; or that the result has no band.
func bandSentence(res *planner.Result) string {
	m := jsonOf(res)
	scales, _ := jsonPath(m, "band", "kv_scales").([]any)
	speeds, _ := jsonPath(m, "band", "speed_scales").([]any)
	seeds, _ := jsonPath(m, "band", "seeds").([]any)
	if len(scales) == 0 {
		return "This result carries no uncertainty band: each figure is one run at the estimated KV cache size."
	}
	list := func(vs []any, digits int) []string {
		var fs []float64
		for _, v := range vs {
			if f, ok := v.(float64); ok {
				fs = append(fs, f)
			}
		}
		slices.Sort(fs)
		var out []string
		for _, f := range fs {
			out = append(out, "x"+strconv.FormatFloat(f, 'f', digits, 64))
		}
		return out
	}
	var parts []string
	runs := 1
	if sc := list(scales, 2); len(sc) > 1 {
		parts = append(parts, "the KV cache at "+joinAndWeb(sc)+" of its estimated size (not where num_gpu_blocks is given: that is exact)")
		runs *= len(sc)
	}
	if sp := list(speeds, 1); len(sp) > 1 {
		parts = append(parts, "the engine at "+joinAndWeb(sp)+" the speed of the roofline's default efficiencies (not where step_time "+
			"was calibrated, e.g. by warden calibrate)")
		runs *= len(sp)
	}
	var sd []string
	for _, v := range seeds {
		if f, ok := v.(float64); ok {
			sd = append(sd, strconv.FormatFloat(f, 'f', -1, 64))
		}
	}
	parts = append(parts, "the sessions of seeds "+joinAndWeb(sd))
	runs *= max(len(sd), 1)
	s := fmt.Sprintf("Band (in parentheses, and shaded in the charts): the lowest and highest of each figure over %s, every "+
		"combination of them: %d runs per routing and level. ", joinAndWeb(parts), runs)
	words := res.BandWords()
	if words != "" {
		// The same plain words as the terminal's [band] line, which say what the nominal run alone means.
		s = "Band (in parentheses, and shaded in the charts): " + words + " "
	}
	if speeds != nil && words == "" { // a result from before the speed band ran every run at every level
		s += fmt.Sprintf("Where the nominal run (estimated KV size, the roofline's speed, seed %s) already misses a target, "+
			"the band cannot change the verdict and that level keeps the nominal run alone. ", firstOr(sd, "-"))
	}
	if res.HeadroomSessions > 0 {
		return s + fmt.Sprintf("A candidate meets the targets only if the pessimistic edge does at %d sessions and, with %s %% "+
			"headroom, at %d; it is marginal when only the nominal run does at %d, or when the pessimistic edge meets them at %d "+
			"but not at %d (near a cache cliff a few more sessions, or a few %% less KV, flip the outcome).",
			res.Concurrency, fmtPctOf(res.Headroom), res.HeadroomSessions, res.Concurrency, res.Concurrency, res.HeadroomSessions)
	}
	return s + "A candidate meets the targets only if the pessimistic edge does; marginal: only the nominal run does."
}

// fmtPctOf writes a fraction as a percentage, 0.2 as "20".
func fmtPctOf(f float64) string { return strconv.FormatFloat(roundF(100*f, 1), 'f', -1, 64) }

// joinAndWeb joins "a", "a and b", "a, b and c".
func joinAndWeb(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

func firstOr(items []string, def string) string {
	if len(items) == 0 {
		return def
	}
	return items[0]
}

// bandEdge is the pessimistic edge of a KPI's band object (its "low": the worst run, the
// highest TTFB or the lowest hit %), else v.
func bandEdge(r any, v float64) float64 {
	m, _ := r.(map[string]any)
	if lo, ok := m["low"].(float64); ok {
		return lo
	}
	return v
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

// withBand is a figure with its band, e.g. "3.11 (3.10-8.36)", "24.87 (nominal run only)" for
// a band of one run (runs 1) in a banded result, or the figure alone when r is not a band
// object.
func withBand(v float64, r any, digits int, runs float64) string {
	out := fmtNum(v, digits)
	m, _ := r.(map[string]any)
	lo, okL := m["low"].(float64)
	hi, okH := m["high"].(float64)
	switch {
	case okL && okH && runs == 1:
		out += " (nominal run only)"
	case okL && okH:
		a, b := math.Min(lo, hi), math.Max(lo, hi)
		out += " (" + fmtNum(a, digits) + "-" + fmtNum(b, digits) + ")"
	}
	return out
}

// jsonOf is v's JSON form as generic values (nil when it has none): the report reads the
// planner's newer fields (bands, verdicts, prices, reconcile) by their JSON names, so that a
// result without them still renders.
func jsonOf(v any) map[string]any {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return m
}

// jsonPath walks object keys; nil when one is missing.
func jsonPath(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		o, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = o[k]
	}
	return v
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

// ruleDialMax is where the rule-of-thumb dials end, in % of the KV cache.
const ruleDialMax = 300.0

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

// kpiBand reads the uncertainty band of one KPI (its JSON key, e.g. "ttfb_p95_s") at each
// sessions level of cfg: objects {"low":..,"nominal":..,"high":..} in the config's JSON,
// either in each row or in any list with one element per level (the planner's "bands").
// nil, nil when the result carries none (a result from before bands, or a band of one run).
func kpiBand(cfg *planner.Config, key string) (low, high []float64) {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, nil
	}
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return nil, nil
	}
	return bandFromJSON(m, len(cfg.Rows), key)
}

// bandFromJSON is kpiBand on a config's JSON object m with n levels.
func bandFromJSON(m map[string]any, n int, key string) (low, high []float64) {
	lists := []string{"rows"}
	for k, v := range m {
		if l, ok := v.([]any); ok && len(l) == n && k != "rows" {
			lists = append(lists, k)
		}
	}
	slices.Sort(lists[1:])
	for _, name := range lists {
		l, _ := m[name].([]any)
		if len(l) != n {
			continue
		}
		lo, hi := nanSlice(n), nanSlice(n)
		found, spread := false, false
		for i, e := range l {
			obj, _ := e.(map[string]any)
			r, _ := obj[key].(map[string]any)
			if r == nil {
				continue
			}
			a, okA := r["low"].(float64)
			b, okB := r["high"].(float64)
			if okA && okB {
				lo[i], hi[i], found = a, b, true
				spread = spread || a != b
			}
		}
		if found && spread {
			return lo, hi
		}
	}
	return nil, nil
}

// sessionsPerHour is the row's sessions per hour, or, when no session finished in the step,
// says so ("none finished in a 1 m step") instead of a 0 that reads as a measured rate.
func sessionsPerHour(x *sim.Row, durationS float64) string {
	if v := float64(x.SessionsPerHour); finite(v) && v > 0 {
		return fmtNum(v, 0)
	}
	d := float64(x.DurationS)
	if !(d > 0) {
		d = durationS
	}
	return "no session finished in a " + fmtSpan(d) + " step"
}

// fmtSpan writes a duration in seconds the way a reader says it: "45 s", "1 m", "1.5 h".
func fmtSpan(s float64) string {
	switch {
	case s >= 3600 && math.Mod(s, 360) == 0:
		return strconv.FormatFloat(s/3600, 'f', -1, 64) + " h"
	case s >= 60 && math.Mod(s, 6) == 0:
		return strconv.FormatFloat(s/60, 'f', -1, 64) + " m"
	}
	return strconv.FormatFloat(roundF(s, 1), 'f', -1, 64) + " s"
}

func roundF(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten... of a quarter of it, so an axis
// ends on a round tick just past v.
func niceCeil(v float64) float64 {
	if !(v > 0) {
		return 1
	}
	step := math.Pow(10, math.Floor(math.Log10(v/4)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v/(m*step) <= 5 {
			return math.Ceil(v/(m*step)) * m * step
		}
	}
	return math.Ceil(v/(10*step)) * 10 * step
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

// ruleCell is the rule-of-thumb ratio and verdict, e.g. "125 % (over)".
func ruleCell(c *planner.Candidate) string {
	v := c.RuleOfThumb
	verdict := "fits"
	if !v.Fits {
		verdict = "over"
	}
	return fmtNum(100*v.Ratio, 0) + " % (" + verdict + ")"
}

// notSimulatedGrey is the arc beyond 100 % of a farm not simulated
// (Candidate.NotSimulated): neither amber nor red, as nothing was found.
const notSimulatedGrey = "#bbbbbb"

// amber marks a farm over the rule of thumb that the simulation finds meets the targets.
const amber = "#fac858"

// gaugesPerChart keeps the dials of one gauge chart readable: with more,
// their scale's labels overlap (a 320-pixel chart gives each of six dials a
// radius of about 40 pixels).
const gaugesPerChart = 4

// planRuleOfThumb shows concurrency x typical context against each farm's KV cache.
func planRuleOfThumb(res *planner.Result) Section {
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
		gauges = append(gauges, g)
		top = math.Max(top, 100*v.Ratio)
	}
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
		if r, _ := jsonPath(jsonOf(c), "reconcile").(string); c.Fits && r != "" {
			rec.Rows = append(rec.Rows, []string{c.Name, ruleCell(c), r})
		}
	}
	if len(rec.Rows) > 0 {
		s.Tables = append(s.Tables, rec)
	}
	// The scale ends at 100 % rounded up past the highest demand, at most
	// ruleDialMax: a dial to 2,300 % crowds its ticks unreadably, and past 3
	// times the cache the figure matters more than the needle (a needle at
	// the end is further over; the dial's centre says how far).
	scale := min(100*math.Ceil(top/100), ruleDialMax)
	// As many charts as gaugesPerChart needs, the dials shared evenly
	// (six make two rows of three, not one of four and one of two).
	nCharts := (len(gauges) + gaugesPerChart - 1) / gaugesPerChart
	per := 0
	if nCharts > 0 {
		per = (len(gauges) + nCharts - 1) / nCharts
	}
	for k := 0; k < len(gauges); k += per {
		part := gauges[k:min(k+per, len(gauges))]
		for j := range part {
			part[j].Max = scale
		}
		title := "Demand as % of the farm's KV cache"
		if nCharts > 1 {
			title += fmt.Sprintf(" (%d of %d)", k/per+1, nCharts)
		}
		s.Charts = append(s.Charts, NewGaugeChart(fmt.Sprintf("rule-%d", k/per+1), title, part...))
	}
	return s
}

// column is one figure of each row.
func column(rows []sim.Row, f func(*sim.Row) float64) []float64 {
	out := make([]float64, len(rows))
	for i := range rows {
		out[i] = f(&rows[i])
	}
	return out
}

// planCandidate is one candidate's section: every routing at every level.
func planCandidate(res *planner.Result, i, at int) Section {
	c := &res.Candidates[i]
	id := func(name string) string { return fmt.Sprintf("c%d-%s", i+1, name) }
	xs := make([]float64, len(res.Sessions))
	for k, n := range res.Sessions {
		xs[k] = float64(n)
	}
	t := Table{
		Caption: "Per routing and load (KPIs evaluated with PromQL over each step's window)",
		Header: []string{"sessions", "routing", "sessions/h", "output tok/min", "TTFB p50 s", "TTFB p95 s", "replicas busy",
			"prefix hit %", "stayed %", "unfinished", "preemptions", "targets"},
	}
	for l, n := range res.Sessions {
		for k := range c.Configs {
			cfg := &c.Configs[k]
			x, ch := &cfg.Rows[l], cfg.Checks[l]
			verdict := "met"
			if !ch.Meets {
				var m []string
				for _, miss := range ch.Misses {
					m = append(m, res.Targets.MissPhrase(miss))
				}
				verdict = "misses " + strings.Join(m, ", ")
			}
			t.Rows = append(t.Rows, []string{strconv.Itoa(n), cfg.Label(), sessionsPerHour(x, res.DurationS), fmtNum(float64(x.OutputTokensPerMin), 0),
				fmtNum(float64(x.TTFBP50), 2), fmtNum(float64(x.TTFBP95), 2), fmtNum(float64(x.ReplicasBusy), 1),
				fmtNum(float64(x.PrefixHitPct), 1), fmtNum(float64(x.StayedPct), 1), fmtInt(x.Unfinished), fmtInt(x.Preemptions), verdict})
		}
	}
	perConfig := func(suffix string, f func(*sim.Row) float64) []Series {
		out := make([]Series, 0, len(c.Configs))
		for k := range c.Configs {
			out = append(out, Series{Name: c.Configs[k].Label() + suffix, Y: column(c.Configs[k].Rows, f)})
		}
		return out
	}
	sessions := Axis{Name: "concurrent sessions"}
	ttfb := append(perConfig(" p50", func(r *sim.Row) float64 { return float64(r.TTFBP50) }),
		perConfig(" p95", func(r *sim.Row) float64 { return float64(r.TTFBP95) })...)
	if len(ttfb) > 0 {
		ttfb[0].Marks = targetMarks(res, "ttfb")
	}
	hitSeries := perConfig("", func(r *sim.Row) float64 { return float64(r.PrefixHitPct) })
	if len(hitSeries) > 0 {
		hitSeries[0].Marks = targetMarks(res, "hit")
	}
	// Each routing's band where the result has one: p95 (not p50, to keep the chart readable)
	// and the hit rate.
	for k := range c.Configs {
		ttfb[len(c.Configs)+k].Low, ttfb[len(c.Configs)+k].High = kpiBand(&c.Configs[k], "ttfb_p95_s")
		hitSeries[k].Low, hitSeries[k].High = kpiBand(&c.Configs[k], "prefix_hit_pct")
	}
	chosen := &c.Configs[c.Chosen]

	status := "does not meet the targets at " + strconv.Itoa(res.Concurrency) + " sessions"
	switch {
	case c.Meets && res.HeadroomSessions > 0:
		status = fmt.Sprintf("meets the targets at %d sessions and, with %s %% headroom, at %d", res.Concurrency, fmtPctOf(res.Headroom), res.HeadroomSessions)
	case c.Meets:
		status = "meets the targets at " + strconv.Itoa(res.Concurrency) + " sessions"
	case c.Verdict == planner.VerdictMarginal && c.Why != "":
		status = "is marginal: it " + c.Why
	}
	upTo := "; it meets them up to " + strings.Replace(upToCell(c), ">= ", "at least ", 1) + " sessions"
	if c.MaxSessions == 0 {
		upTo = "; it meets them at no level simulated"
	}
	if c.Verdict == planner.VerdictMarginal && c.KPIs != nil && c.KPIs.Verdict == planner.VerdictMeets && c.Why != "" {
		upTo = "" // marginal for want of headroom: the reason already says where it stops
	}
	s := Section{
		Heading: "Candidate: " + c.Name,
		Paragraphs: []string{
			fmt.Sprintf("%s serving %s, %d replica(s) at tensor parallel size %d, max_num_seqs %d, %s KV blocks (%s tokens) per replica. "+
				"With %s it %s%s.",
				c.Name, c.Model, c.Replicas, c.TensorParallelSize, c.MaxNumSeqs, fmtInt(int64(c.NumGPUBlocks)), fmtInt(int64(c.KVTokensPerReplica)),
				chosen.Label(), status, upTo),
		},
		Tables: []Table{t},
		Charts: []*Chart{
			NewLineChart(id("ttfb"), "Time to first token, p50 and p95, with the TTFB p95 target", sessions, xs, Axis{Name: "seconds", Log: true}, ttfb...),
			NewLineChart(id("hit"), "Prefix-cache hit rate, with the target", sessions, xs, Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)},
				hitSeries...),
			NewLineChart(id("tokens"), "Output tokens per minute", sessions, xs, Axis{Name: "tokens/min"},
				perConfig("", func(r *sim.Row) float64 { return float64(r.OutputTokensPerMin) })...),
			NewLineChart(id("busy"), "Replicas busy (mean)", sessions, xs, Axis{Name: "replicas", Min: ptr(0.0)},
				perConfig("", func(r *sim.Row) float64 { return float64(r.ReplicasBusy) })...),
		},
	}
	// Per replica at the wanted concurrency, each routing: the step's counts and means (the
	// answer's farm also has them over time, in the timeline section).
	if at >= 0 {
		nrep := c.Replicas
		cats := make([]string, nrep)
		for k := range cats {
			cats[k] = "replica " + strconv.Itoa(k)
		}
		var req, kv []Series
		for k := range c.Configs {
			rq, kvm := nanSlice(nrep), nanSlice(nrep)
			for _, rr := range c.Configs[k].Rows[at].Replicas {
				if rr.Replica >= 0 && rr.Replica < nrep {
					rq[rr.Replica] = float64(rr.Requests)
					kvm[rr.Replica] = 100 * float64(rr.KVUsageMean)
				}
			}
			req = append(req, Series{Name: c.Configs[k].Label(), Y: rq})
			kv = append(kv, Series{Name: c.Configs[k].Label(), Y: kvm})
		}
		s.Charts = append(s.Charts,
			NewBarChart(id("replica-requests"), fmt.Sprintf("Requests routed to each replica at %d sessions", res.Concurrency), cats, Axis{Name: "requests"}, req...).WithCategoryName("replica"),
			NewBarChart(id("replica-kv"), fmt.Sprintf("KV cache use per replica at %d sessions (mean over the step)", res.Concurrency), cats,
				Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)}, kv...).WithCategoryName("replica"),
		)
	}
	return s
}

// planTimeline shows the answer's farm over the step at the wanted concurrency: the series of
// PromQL range queries over the simulated metric store, each chart with the query behind it.
func planTimeline(res *planner.Result) Section {
	tl := res.Timeline
	c := &res.Candidates[tl.Candidate]
	label := c.Configs[tl.Config].Label()
	role := "the answer"
	if tl.Candidate != res.Best {
		role = "the closest candidate"
	}
	t := Axis{Name: "seconds into the step"}
	perReplica := func(q planner.QuerySeries) []Series {
		out := make([]Series, 0, len(q.Series))
		for _, s := range q.Series {
			name := "replica " + s.Label
			if s.Label == "" {
				name = "all replicas"
			}
			out = append(out, Series{Name: name, Y: timeValues(s.Values)})
		}
		return out
	}
	farmWide := func(name string, q planner.QuerySeries) Series {
		if len(q.Series) == 0 {
			return Series{Name: name, Y: nanSlice(len(tl.TimesS))}
		}
		return Series{Name: name, Y: timeValues(q.Series[0].Values)}
	}
	step := strconv.FormatFloat(tl.StepS, 'f', -1, 64)
	s := Section{
		Heading: fmt.Sprintf("Over time: %s with %s at %d sessions", c.Name, label, tl.Sessions),
		Paragraphs: []string{
			fmt.Sprintf("%s (%s) run with its routing through the measured step at %d concurrent sessions. Each point is a "+
				"PromQL range query over the series the simulator wrote, evaluated every %s s and covering the %s s before it "+
				"($window below is %s s): the same queries, sent with that step to a Prometheus that scrapes the real farm, "+
				"draw the same charts.", c.Name, role, tl.Sessions, step, step, step),
		},
		Charts: []*Chart{
			NewLineChart("timeline-in-flight", "Requests in flight per replica (mean over each interval)", t, tl.TimesS,
				Axis{Name: "requests", Min: ptr(0.0)}, perReplica(tl.InFlight)...),
			NewLineChart("timeline-kv", "KV cache use per replica (mean over each interval)", t, tl.TimesS,
				Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)}, perReplica(tl.KVUsage)...),
			NewStackedAreaChart("timeline-prompt", "Prompt tokens per second, computed and cached", t, tl.TimesS,
				Axis{Name: "tokens/s", Min: ptr(0.0)}, farmWide("computed", tl.PromptComputed), farmWide("cached", tl.PromptCached)),
		},
	}
	s.Tables = append(s.Tables, replicaSpread(tl))
	for _, q := range []planner.QuerySeries{tl.InFlight, tl.KVUsage, tl.PromptCached, tl.PromptComputed} {
		s.Definitions = append(s.Definitions, Definition{Name: q.Name, Title: q.Title, Unit: q.Unit, Expr: q.Query})
	}
	return s
}

// replicaSpread is the per-replica lines as numbers (mean, lowest, highest over the step):
// lines of replicas that carry the same load lie on each other in the charts.
func replicaSpread(tl *planner.Timeline) Table {
	t := Table{
		Caption: "Per replica over the step (the lines above can lie on each other)",
		Header:  []string{"replica", "in flight, mean", "in flight, min", "in flight, max", "KV use %, mean", "KV use %, min", "KV use %, max"},
	}
	stats := func(v []sim.Float, scale float64) []string {
		n, sum, lo, hi := 0, 0.0, math.Inf(1), math.Inf(-1)
		for _, x := range v {
			if f := float64(x); finite(f) {
				n++
				sum += f
				lo, hi = math.Min(lo, f), math.Max(hi, f)
			}
		}
		if n == 0 {
			return []string{"-", "-", "-"}
		}
		return []string{fmtNum(scale*sum/float64(n), 1), fmtNum(scale*lo, 1), fmtNum(scale*hi, 1)}
	}
	kv := map[string][]sim.Float{}
	for _, s := range tl.KVUsage.Series {
		kv[s.Label] = s.Values
	}
	for _, s := range tl.InFlight.Series {
		name := s.Label
		if name == "" {
			name = "all replicas"
		}
		row := append([]string{name}, stats(s.Values, 1)...)
		t.Rows = append(t.Rows, append(row, stats(kv[s.Label], 1)...))
	}
	return t
}

// timeValues converts a time series to chart values (NaN stays NaN: a gap).
func timeValues(v []sim.Float) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// planSettings shows the workload and the plan's settings.
func planSettings(res *planner.Result) Section {
	spills := strings.Join(res.Spills, ", ")
	cost := "card count"
	if res.CostUnit != "cards" {
		cost = "sum of the GPUs' prices, " + res.CostUnit
	}
	t := Table{
		Caption: "Plan",
		Header:  []string{"setting", "value"},
		Rows: [][]string{
			{"wanted concurrency", strconv.Itoa(res.Concurrency) + " sessions"},
			{"headroom", headroomCell(res)},
			{"sessions levels", joinIntsWeb(res.Sessions)},
			{"step duration", strconv.FormatFloat(res.DurationS, 'f', -1, 64) + " s"},
			{"seed", strconv.FormatUint(res.Seed, 10)},
			{"strategies", strings.Join(res.Strategies, ", ")},
			{"spill thresholds (affinity)", spills},
			{"targets", strings.Join(res.Targets.Phrases(), ", ")},
			{"cost", cost},
			{"typical context", fmtInt(int64(res.Workload.TypicalContextTokens)) + " tokens"},
		},
	}
	paras := slices.Clip(res.Workload.Description)
	if note := res.SkipNote(); note != "" {
		paras = append(paras, note) // what the plan did not simulate, and why
	}
	sec := Section{Heading: "Workload and settings", Paragraphs: paras, Tables: []Table{t}}
	if c := contextChart(res.Workload); c != nil {
		sec.Charts = append(sec.Charts, c)
	}
	return sec
}

// contextChart is the histogram of the prompt lengths of the requests the
// plan simulated (a synthetic workload's sessions drawn with the plan's
// seed, or a trace's requests), with the typical context marked: the
// length the rule of thumb multiplies by the concurrency.
func contextChart(w planner.WorkloadInfo) *Chart {
	if w.Summary == nil || len(w.Summary.Histogram) == 0 {
		return nil
	}
	h := w.Summary.Histogram
	var total int
	for _, b := range h {
		total += b.Requests
	}
	cats := make([]string, len(h))
	pct := make([]float64, len(h))
	typical := -1
	for i, b := range h {
		cats[i] = contextRange(b)
		pct[i] = roundF(100*float64(b.Requests)/float64(total), 1)
		if w.TypicalContextTokens >= b.LoTokens && w.TypicalContextTokens < b.HiTokens {
			typical = i
		}
	}
	title := "Prompt lengths simulated"
	legend := fmt.Sprintf("%% of the %s requests of %s sessions (the plan's seed)", fmtInt(int64(total)), fmtInt(int64(w.Summary.Sessions)))
	if w.Spec.Trace != "" {
		legend = fmt.Sprintf("%% of the trace's %s requests", fmtInt(int64(total)))
	}
	if typical >= 0 {
		title += fmt.Sprintf(" (dashed: typical context, %s)", fmtInt(int64(w.TypicalContextTokens)))
	}
	s := Series{Name: legend, Y: pct}
	if typical >= 0 {
		s.Marks = []Mark{{Name: "typical context " + fmtInt(int64(w.TypicalContextTokens)), X: ptr(float64(typical))}}
	}
	return NewBarChart("workload-context", title, cats, Axis{Name: "% of requests", Min: ptr(0.0)}, s).WithCategoryName("prompt length, tokens")
}

// contextRange names a bucket of the context histogram: "8k-11k".
func contextRange(b traces.ContextBucket) string {
	k := func(v int) string {
		if v >= 1000000 {
			return strconv.FormatFloat(roundF(float64(v)/1e6, 1), 'f', -1, 64) + "M"
		}
		return strconv.Itoa(int(math.Round(float64(v)/1000))) + "k"
	}
	switch {
	case b.LoTokens == 0:
		return "<" + k(b.HiTokens)
	case b.HiTokens >= math.MaxInt32:
		return ">" + k(b.LoTokens)
	}
	return k(b.LoTokens) + "-" + k(b.HiTokens)
}

// headroomCell is the plan's headroom, "20 % (the targets also at 20 sessions)".
func headroomCell(res *planner.Result) string {
	if res.HeadroomSessions == 0 {
		return "none (the wanted concurrency alone decides)"
	}
	return fmt.Sprintf("%s %% (a farm must also meet the targets at %d sessions)", fmtPctOf(res.Headroom), res.HeadroomSessions)
}

func joinIntsWeb(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
