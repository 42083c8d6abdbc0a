package web

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/planner"
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
	if len(res.RoutingCards) > 0 {
		r.Sections = append(r.Sections, planRoutingCards(res, at))
	}
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
