package web

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/web/webtest"
)

// samplePlanResult is a small planner result made by hand (so that the golden files change
// only when the report does): two candidates that fit, with two routings at two levels, one
// missing value (NaN), and one candidate whose model does not fit.
func samplePlanResult() *planner.Result {
	res := &planner.Result{
		Kind: planner.Kind, Title: "Sample plan", Concurrency: 8, Sessions: []int{4, 8}, DurationS: 60, Seed: 1,
		Question:   "How many cards, of which kind, and which routing, for 8 concurrent agent sessions within TTFB p95 <= 10 s and prefix hit >= 80 %?",
		Answer:     "For 8 concurrent agent sessions, 3 x RTX A4000 with affinity (spill auto) is the cheapest farm that meets TTFB p95 <= 10 s and prefix hit >= 80 %.",
		Strategies: []string{"least-loaded", "affinity"}, Spills: []string{"auto"},
		Targets:  planner.Targets{TTFBP95MaxS: 10, PrefixHitPctMin: 80},
		CostUnit: "cards", Best: 1, Closest: -1,
		Workload: planner.WorkloadInfo{TypicalContextTokens: 12338, TypicalContextHow: "the mean context over a session's 6 turns",
			Description: []string{"Synthetic agent sessions."}},
	}
	for ci, n := range []int{2, 3} {
		c := planner.Candidate{
			Name: map[int]string{2: "2 x RTX A4000", 3: "3 x RTX A4000"}[n], GPU: "RTX A4000", Model: "Qwen/Qwen3-4B-Instruct-2507",
			Replicas: n, TensorParallelSize: 1, Cards: n, Cost: float64(n), Fits: true, MaxNumSeqs: 32,
			NumGPUBlocks: 2464, KVTokensPerReplica: 39408, KVTokensTotal: int64(39408 * n),
			RuleOfThumb: hardware.RuleOfThumb(8, 12338, 39408*n),
			Chosen:      1, Meets: n == 3, MaxSessions: 4 + 4*ci, FailsAt: 8 * (1 - ci),
		}
		for k, s := range []string{"least-loaded", "affinity"} {
			cfg := planner.Config{Strategy: s}
			if s == "affinity" {
				cfg.Spill = "auto"
			}
			for _, sess := range []int{4, 8} {
				f := float64(sess) / 4
				row := sim.Row{
					Strategy: s, Sessions: sess, DurationS: 60,
					SessionsPerHour: sim.Float(40 * f), OutputTokensPerMin: sim.Float(5000 * f),
					TTFBP50: sim.Float(f * float64(4-n) * float64(2-k)), TTFBP95: sim.Float(3 * f * float64(4-n) * float64(2-k)),
					ReplicasBusy: sim.Float(math.Min(float64(n), f)), PrefixHitPct: sim.Float(50 + 20*float64(k) + 5*float64(ci)),
					StayedPct: sim.Float(50 + 40*float64(k)), MissTokens: sim.MissTokens{Cold: 100000, Evicted: int64(20000 * (2 - k)), Elsewhere: 5000, Partial: 700},
					Finished: int64(300 * sess),
				}
				if s == "least-loaded" && sess == 8 && n == 2 {
					row.TTFBP95 = sim.Float(math.NaN())
				}
				for r := range n {
					row.Replicas = append(row.Replicas, sim.ReplicaRow{Replica: r, Requests: int64(100*sess + 7*r), KVUsageMean: sim.Float(0.5 + 0.1*float64(r))})
				}
				cfg.Rows = append(cfg.Rows, row)
				meets := n == 3 && k == 1
				ch := planner.Check{Sessions: sess, Meets: meets}
				if !meets {
					ch.Misses = []planner.Miss{{Target: "prefix_hit_pct_min", Value: row.PrefixHitPct, Limit: 80, Shortfall: 0.1}}
				}
				cfg.Checks = append(cfg.Checks, ch)
			}
			c.Configs = append(c.Configs, cfg)
		}
		res.Candidates = append(res.Candidates, c)
	}
	res.Timeline = sampleTimeline()
	res.Candidates = append(res.Candidates, planner.Candidate{
		Name: "1 x RTX A4000, meta-llama/Llama-3.1-70B-Instruct", GPU: "RTX A4000", Model: "meta-llama/Llama-3.1-70B-Instruct",
		Replicas: 1, TensorParallelSize: 1, Cards: 1, Cost: 1, Chosen: -1,
		Error: "meta-llama/Llama-3.1-70B-Instruct with bf16 weights does not fit on RTX A4000",
	})
	return res
}

// sampleTimeline is the answer's (3 x RTX A4000, affinity) timeline over a 60 s step at 5 s:
// load and KV use ramping up per replica, one missing point (NaN), and prompt tokens whose
// cached share grows as the cache warms.
func sampleTimeline() *planner.Timeline {
	tl := &planner.Timeline{Candidate: 1, Config: 1, Sessions: 8, StepS: 5}
	q := func(name, expr string) planner.QuerySeries {
		return planner.QuerySeries{Name: name, Title: name, Unit: "x", Query: expr}
	}
	tl.InFlight = q("in_flight_by_replica", `avg by (replica) (avg_over_time(warden_in_flight{model="Qwen/Qwen3-4B-Instruct-2507"}[5s]))`)
	tl.KVUsage = q("kv_usage_by_engine", `100 * avg by (instance, engine) (avg_over_time(vllm:kv_cache_usage_perc{model_name="Qwen/Qwen3-4B-Instruct-2507"}[5s]))`)
	tl.PromptCached = q("prompt_tokens_per_s_cached", "cached")
	tl.PromptComputed = q("prompt_tokens_per_s_computed", "computed")
	var cached, computed planner.TimeSeries
	for k := 1; k <= 12; k++ {
		tl.TimesS = append(tl.TimesS, float64(5*k))
		f := float64(k) / 12
		cached.Values = append(cached.Values, sim.Float(4000*f))
		computed.Values = append(computed.Values, sim.Float(3000-1500*f))
	}
	for r := range 3 {
		load := planner.TimeSeries{Label: strconv.Itoa(r)}
		kv := planner.TimeSeries{Label: strconv.Itoa(r)}
		for k := 1; k <= 12; k++ {
			load.Values = append(load.Values, sim.Float(math.Min(float64(k), float64(2+r))))
			kv.Values = append(kv.Values, sim.Float(math.Min(100, float64(8*k+5*r))))
		}
		if r == 2 {
			load.Values[3] = sim.Float(math.NaN())
		}
		tl.InFlight.Series = append(tl.InFlight.Series, load)
		tl.KVUsage.Series = append(tl.KVUsage.Series, kv)
	}
	tl.PromptCached.Series = []planner.TimeSeries{cached}
	tl.PromptComputed.Series = []planner.TimeSeries{computed}
	return tl
}

func TestPlanReportGolden(t *testing.T) {
	r := PlanReport(samplePlanResult())
	if r.Answer != samplePlanResult().Answer || r.Question == "" {
		t.Errorf("answer %q, question %q: want the result's", r.Answer, r.Question)
	}
	var ids []string
	for _, c := range r.Charts() {
		ids = append(ids, c.ID)
		got, err := c.OptionsJSON()
		if err != nil {
			t.Fatal(err)
		}
		checkGolden(t, filepath.Join("testdata", "plan-"+c.ID+".json"), got)
	}
	want := "overview-hit-lines overview-ttfb-lines overview-ttfb overview-hit overview-capacity rule-1 " +
		"timeline-in-flight timeline-kv timeline-prompt " +
		"c1-ttfb c1-hit c1-tokens c1-busy c1-replica-requests c1-replica-kv " +
		"c2-ttfb c2-hit c2-tokens c2-busy c2-replica-requests c2-replica-kv"
	if got := strings.Join(ids, " "); got != want {
		t.Errorf("chart ids\n%s\nwant\n%s", got, want)
	}
	var a, b bytes.Buffer
	if err := r.Render(&a); err != nil {
		t.Fatal(err)
	}
	if err := PlanReport(samplePlanResult()).Render(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two renders of one result differ")
	}
	html := a.String()
	for _, want := range []string{"does not fit on RTX A4000", "3 x RTX A4000 (answer)", "prefix_hit_pct", "sum(vllm:prefix_cache_hits_total",
		"Over time: 3 x RTX A4000 with affinity (spill auto) at 8 sessions", "in_flight_by_replica",
		"avg_over_time(warden_in_flight{model=&#34;Qwen/Qwen3-4B-Instruct-2507&#34;}[5s])"} {
		if !strings.Contains(html, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestPlanReportDrawsOfflineInChromium solves the built-in plan, saves its result as JSON, reads
// it back, and opens the report in headless Chromium with the network blocked: every chart
// drew, nothing was logged or requested, and the answer sentence is on the page. The report of
// the saved result is byte-identical to the fresh one.
func TestPlanReportDrawsOfflineInChromium(t *testing.T) {
	b := webtest.Find(t)
	p, err := planner.ParsePlan(planner.DefaultPlan, planner.DefaultPlanName)
	if err != nil {
		t.Fatal(err)
	}
	res, err := planner.Solve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := planner.ReadResult(data)
	if err != nil {
		t.Fatal(err)
	}
	var fresh, again bytes.Buffer
	r := PlanReport(res)
	if err := r.Render(&fresh); err != nil {
		t.Fatal(err)
	}
	if err := PlanReport(saved).Render(&again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh.Bytes(), again.Bytes()) {
		t.Error("the report of the saved JSON result differs from the fresh one")
	}
	path := filepath.Join(t.TempDir(), "plan.html")
	if err := os.WriteFile(path, fresh.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got := b.Check(t, "file://"+path)
	if want := len(r.Charts()); got.Canvases != want || want < 10 {
		t.Errorf("page drew %d canvases, want one per chart (%d, at least 10)", got.Canvases, want)
	}
	if len(got.Console) > 0 {
		t.Errorf("console messages: %q", got.Console)
	}
	if len(got.Blocked) > 0 {
		t.Errorf("the page tried to reach the network: %q", got.Blocked)
	}
	if !strings.Contains(got.Text, res.Answer) {
		t.Errorf("page text lacks the answer %q", res.Answer)
	}
	checkChartsInDOM(t, r, got.DOM)
	if !strings.Contains(got.Text, "Per replica over the step") {
		t.Error("page lacks the per-replica table of the timeline (the lines can lie on each other)")
	}
	if strings.Contains(got.Text, "cost (cards)") {
		t.Error(`the table still has a "cost (cards)" column repeating "cards"`)
	}
}

// TestSampleReportChartsInChromium draws the hand-made result's report: every chart drew, with
// its title, axis names with units and a legend, as echarts holds them after drawing.
func TestSampleReportChartsInChromium(t *testing.T) {
	b := webtest.Find(t)
	r := PlanReport(samplePlanResult())
	var buf bytes.Buffer
	if err := r.Render(&buf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "sample.html")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got := b.Check(t, "file://"+path)
	if len(got.Console) > 0 || len(got.Blocked) > 0 {
		t.Errorf("console %q, blocked %q: want none", got.Console, got.Blocked)
	}
	checkChartsInDOM(t, r, got.DOM)
}

// TestPlanReportRuleOfThumbAgrees: when the answer's farm is over the rule of thumb yet meets the
// targets, the report says so once, in the answer, and does not contradict it: its rule-of-thumb
// table says "over the rule of thumb; simulated: meets" (not "expect hit rates to collapse"), the
// dial beyond 100 % is amber, not red, and names the simulated verdict; a farm that misses keeps
// its red arc. The workload the plan assumed is one line under the answer.
func TestPlanReportRuleOfThumbAgrees(t *testing.T) {
	res := samplePlanResult()
	res.Workload.Spec.SystemPromptTokens, res.Workload.Spec.FirstMessageTokens, res.Workload.Spec.Turns = 3500, 7300, 6
	res.Workload.Spec.NewTokensPerTurn, res.Workload.Spec.MaxOutputTokens = 400, 256
	best := &res.Candidates[1]
	best.KVTokensTotal = 90000
	best.RuleOfThumb = hardware.RuleOfThumb(8, 12338, 90000)
	best.Verdict, best.Meets = planner.VerdictMeets, true
	res.Candidates[0].Verdict = planner.VerdictMisses
	if best.RuleOfThumb.Fits || res.Candidates[0].RuleOfThumb.Fits {
		t.Fatal("want both candidates over the rule of thumb")
	}
	answer := res.Answer
	res.Answer += " " + res.RuleOfThumbWords() // as planner.Solve does
	r := PlanReport(res)
	if !strings.HasPrefix(r.Answer, answer+" 3 x RTX A4000 meets the targets at 8 sessions although 8 x 12,338 tokens") ||
		!strings.HasSuffix(r.Answer, "the simulation, not the rule, decides.") {
		t.Errorf("answer %q: want the result's, then the sentence that reconciles the rule of thumb", r.Answer)
	}
	if len(r.Notes) != 1 || !strings.HasPrefix(r.Notes[0], "Workload assumed: a 3,500-token system prompt shared by every session") {
		t.Errorf("notes %q: want the workload in one line", r.Notes)
	}
	var page bytes.Buffer
	if err := r.Render(&page); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	for _, bad := range []string{"to collapse", "collapse whatever"} {
		if strings.Contains(html, bad) {
			t.Errorf("report says %q beside an answer that meets the targets", bad)
		}
	}
	for _, want := range []string{"over the rule of thumb; simulated: meets", "over the rule of thumb; simulated: misses",
		`<p class="note">Workload assumed:`, "each conversation stays on the replica", "(8 of 32)"} {
		if !strings.Contains(html, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	dials := ruleDials(t, r)
	if len(dials) != 2 {
		t.Fatalf("%d dials, want 2", len(dials))
	}
	for i, want := range []struct{ name, over string }{{"2 x RTX A4000\nsimulated: misses", "#ee6666"}, {"3 x RTX A4000\nsimulated: meets", amber}} {
		s := dials[i]
		stops := s.AxisLine.LineStyle.Color
		if len(s.Data) != 1 || s.Data[0].Name != want.name || len(stops) != 2 || stops[1][1] != want.over {
			t.Errorf("dial %d: name %q, arc %v; want %q and %s beyond 100 %%", i, s.Data, stops, want.name, want.over)
		}
	}
}

// TestPlanReportNotSimulated: a candidate left out because a cheaper farm meets the targets
// (planner's tiers) is listed apart with why, has no row among the simulated ones, and its
// rule-of-thumb dial, over 100 %, is grey and says "not simulated" (neither amber nor red: the
// simulation found nothing), while the legend names it alone.
func TestPlanReportNotSimulated(t *testing.T) {
	res := samplePlanResult()
	res.Candidates = append(res.Candidates, planner.Candidate{
		Name: "4 x RTX A4000 (small KV)", GPU: "RTX A4000", Model: "Qwen/Qwen3-4B-Instruct-2507",
		Replicas: 4, TensorParallelSize: 1, Cards: 4, Cost: 4, Fits: true, Chosen: -1,
		NumGPUBlocks: 500, KVTokensPerReplica: 8000, KVTokensTotal: 32000,
		RuleOfThumb:  hardware.RuleOfThumb(8, 12338, 32000),
		NotSimulated: "it takes more cards than 3 x RTX A4000, which meets the targets",
	})
	r := PlanReport(res)
	var page bytes.Buffer
	if err := r.Render(&page); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	for _, want := range []string{"Candidates not simulated: a cheaper one meets the targets",
		"It takes more cards than 3 x RTX A4000, which meets the targets.", "grey where it was not simulated"} {
		if !strings.Contains(html, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	overview := r.Sections[0].Tables[0]
	for _, row := range overview.Rows {
		if strings.HasPrefix(row[0], "4 x RTX A4000") {
			t.Errorf("the candidate not simulated has a row among the simulated ones: %q", row)
		}
	}
	found := false
	for _, s := range ruleDials(t, r) {
		if s.Name != "4 x RTX A4000 (small KV)" {
			continue
		}
		found = true
		stops := s.AxisLine.LineStyle.Color
		if len(s.Data) != 1 || s.Data[0].Name != "4 x RTX A4000 (small KV)\nnot simulated" || len(stops) != 2 || stops[1][1] != notSimulatedGrey {
			t.Errorf("dial: data %q, arc %v; want the name with \"not simulated\" and grey beyond 100 %%", s.Data, stops)
		}
	}
	if !found {
		t.Errorf("no dial whose legend names the candidate alone")
	}
}

// ruleDial is one dial of a report's first rule-of-thumb chart, as its options say.
type ruleDial struct {
	Name     string
	Data     []struct{ Name string }
	AxisLine struct {
		LineStyle struct{ Color [][]any }
	}
}

// ruleDials reads the dials of r's first rule-of-thumb chart (rule-1).
func ruleDials(t *testing.T, r *Report) []ruleDial {
	t.Helper()
	var rule *Chart
	for _, c := range r.Charts() {
		if c.ID == "rule-1" {
			rule = c
		}
	}
	if rule == nil {
		t.Fatal("no rule-of-thumb dials")
	}
	js, err := rule.OptionsJSON()
	if err != nil {
		t.Fatal(err)
	}
	var opt struct{ Series []ruleDial }
	if err := json.Unmarshal(js, &opt); err != nil {
		t.Fatal(err)
	}
	return opt.Series
}

// BenchmarkPlanReport builds the plan report of the sample result: what
// `warden plan --out` and `warden report --from` do before rendering.
func BenchmarkPlanReport(b *testing.B) {
	res := samplePlanResult()
	b.ReportAllocs()
	for b.Loop() {
		PlanReport(res)
	}
}
