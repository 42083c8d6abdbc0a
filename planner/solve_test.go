package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/internal/racetest"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// kvBoundPlan is a plan whose answer is known by construction: short
// sessions (a mean context of about 2.1k tokens, 2.45k at the last turn) on
// replicas of exactly 600 KV blocks (9,600 tokens) each, on H100s so fast
// that latency never matters (not even 20 % slower: the speed band). At 12
// concurrent sessions the working set (about 29k tokens) fits in three
// replicas (28.8k, the shared system prompt counted once) but not in two
// (19.2k): two replicas evict what the next turn needs and their hit rate
// collapses, three keep it. It has no headroom (the rule before it: 12
// alone decides); TestSolveHeadroom adds it: 15 sessions do not fit in
// three replicas. Every candidate is simulated, 4 x H100 too (dearer than
// the answer: TestSolveDearerNotSimulated leaves it out).
func kvBoundPlan() Plan {
	return Plan{
		Workload: WorkloadSpec{Workload: traces.Workload{
			SystemPromptTokens: 256, FirstMessageTokens: 1500, Turns: 6, NewTokensPerTurn: 100,
			MaxOutputTokens: 32, OutputTokens: traces.OutputLognormal, OutputTokensMean: 32,
		}},
		Farms: []FarmSet{{
			GPUs: []string{"H100 SXM"}, Replicas: []int{2, 3, 4},
			Model: "Qwen/Qwen3-4B-Instruct-2507",
			VLLM:  sim.VLLMSpec{NumGPUBlocks: 600, MaxNumSeqs: 16},
		}},
		Strategies:     []string{"least-loaded", "affinity"},
		Sessions:       []int{6, 12},
		Concurrency:    12,
		Headroom:       HeadroomOf(0),
		Duration:       sim.Duration(30 * time.Second),
		Seed:           7,
		Targets:        Targets{PrefixHitPctMin: 80},
		EveryCandidate: true,
	}
}

func TestSolveKnownAnswer(t *testing.T) {
	racetest.SimulationOnly(t)
	res, err := Solve(context.Background(), kvBoundPlan())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Candidates) != 3 {
		t.Fatalf("%d candidates, want 3", len(res.Candidates))
	}
	if res.Best != 1 {
		t.Fatalf("best = %d (%s), want 1 (3 x H100 SXM)\n%s", res.Best, res.Answer, dump(res))
	}
	best := res.Candidates[1]
	if got := best.Configs[best.Chosen].Label(); got != "affinity (spill auto)" {
		t.Errorf("routing of the best = %s, want affinity (spill auto)", got)
	}
	// num_gpu_blocks is given: no KV band; no step_time: the speed band, with 3 seeds.
	want := "For 12 concurrent agent sessions on vLLM 0.26, 3 x H100 SXM with affinity (spill auto) is the cheapest farm by card count that meets prefix hit >= 80 % " +
		"at the band's pessimistic edge (engine speed x0.8 and x1.2, 3 seeds); it meets them up to 12 sessions."
	if res.Answer != want {
		t.Errorf("answer\n%q\nwant\n%q", res.Answer, want)
	}
	if res.Reconcile == "" || res.Reconcile != res.Candidates[1].Reconcile ||
		!strings.Contains(res.Reconcile, "the 256-token system prompt is shared, cached once rather than 12 times") {
		t.Errorf("reconcile %q: want the answer's sentence, with the shared prompt", res.Reconcile)
	}
	// The bisected limit: two cards meet at 6 and miss at 12 (the levels
	// simulated); the bisection finds that they meet up to 8 and miss at 9.
	two := res.Candidates[0]
	if two.Meets || two.Verdict != VerdictMisses || two.MaxSessions != 8 || two.FailsAt != 9 {
		t.Errorf("2 x H100: meets %v (%s), max sessions %d, fails at %d; want false (misses), 8, 9\n%s", two.Meets, two.Verdict, two.MaxSessions, two.FailsAt, dump(res))
	}
	if len(two.FailsAtMisses) != 1 || two.FailsAtMisses[0].Target != "prefix_hit_pct_min" {
		t.Errorf("2 x H100 at 9 sessions misses %+v, want the hit target", two.FailsAtMisses)
	}
	var probed []int
	for _, b := range two.Probes {
		probed = append(probed, b.Sessions)
	}
	if !slices.Equal(probed, []int{7, 8, 9}) {
		t.Errorf("2 x H100 probed %v, want [7 8 9] (bisection between 6 and 12)", probed)
	}
	if three := res.Candidates[1]; three.KVBand || !three.SpeedBand || three.KPIs == nil || three.KPIs.Runs != 9 {
		t.Errorf("3 x H100: KV band %v, speed band %v, KPIs %+v; want no KV band (num_gpu_blocks given), a speed band and 9 runs",
			three.KVBand, three.SpeedBand, three.KPIs)
	}
	// Four cards still meet at 12: the search goes upwards, to the cap
	// (18: 12 + 6) first, which misses (17 x 2.1k tokens nearly fill 4 x
	// 9.6k, and vLLM 0.26 counts a request blocked at the head of the
	// queue at every step), then bisects: they meet up to 16.
	if four := res.Candidates[2]; !four.Meets || four.MaxSessions != 16 || four.FailsAt != 17 || four.MaxSessionsCap != 18 {
		t.Errorf("4 x H100: meets %v, max sessions %d, fails at %d, cap %d; want true, 16, 17, 18", four.Meets, four.MaxSessions, four.FailsAt, four.MaxSessionsCap)
	} else if i := slices.IndexFunc(four.Probes, func(b Band) bool { return b.Sessions == 18 }); i < 0 || four.Probes[i].Verdict != VerdictMisses {
		t.Errorf("4 x H100 probed %+v, want the cap (18) among them, missing", four.Probes)
	}
	// The rule of thumb agrees: 12 x 2,118 tokens does not fit in 2 x 9,584, fits in 3 x 9,584.
	if res.Workload.TypicalContextTokens != 2118 {
		t.Errorf("typical context %d, want 256+1500+32+2.5*132 = 2118", res.Workload.TypicalContextTokens)
	}
	for i, wantFit := range []bool{false, true, true} {
		if got := res.Candidates[i].RuleOfThumb.Fits; got != wantFit {
			t.Errorf("%s: rule of thumb fits = %v, want %v (%+v)", res.Candidates[i].Name, got, wantFit, res.Candidates[i].RuleOfThumb)
		}
	}
}

// TestSolveHeadroom is kvBoundPlan with 20 % headroom: three replicas meet
// the hit target at 12 sessions (TestSolveKnownAnswer) but 15 (12 + 20 %)
// do not fit in their KV cache, so three are marginal now, their cliff
// found by the bisection between 12 and 15, and the answer is not them.
func TestSolveHeadroom(t *testing.T) {
	racetest.SimulationOnly(t)
	p := kvBoundPlan()
	p.Farms[0].Replicas = []int{3}
	var res [2]*Result
	for i, h := range []float64{0, 0.2} {
		p.Headroom = HeadroomOf(h)
		r, err := Solve(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		res[i] = r
	}
	without, with := &res[0].Candidates[0], &res[1].Candidates[0]
	if !without.Meets || res[0].HeadroomSessions != 0 || !slices.Equal(res[0].Sessions, []int{6, 12}) {
		t.Fatalf("no headroom: meets %v (%s), headroom level %d, levels %v; want true, 0, [6 12]\n%s",
			without.Meets, res[0].Answer, res[0].HeadroomSessions, res[0].Sessions, dump(res[0]))
	}
	if res[1].HeadroomSessions != 15 || !slices.Equal(res[1].Sessions, []int{6, 12, 15}) {
		t.Fatalf("20 %% headroom: level %d, levels %v; want 15 added to [6 12]", res[1].HeadroomSessions, res[1].Sessions)
	}
	if with.Verdict != VerdictMarginal || with.KPIs.Verdict != VerdictMeets || res[1].Best != -1 || res[1].Closest != 0 {
		t.Fatalf("20 %% headroom: verdict %q, band at 12 %q, best %d, closest %d; want marginal, meets, -1, 0\n%s",
			with.Verdict, with.KPIs.Verdict, res[1].Best, res[1].Closest, dump(res[1]))
	}
	// The cliff lies between the wanted concurrency and the headroom level.
	if with.MaxSessions < 12 || with.FailsAt != with.MaxSessions+1 || with.FailsAt > 15 || len(with.FailsAtMisses) == 0 {
		t.Errorf("meets up to %d, fails at %d (%+v); want a cliff N, N+1 with 12 <= N < 15", with.MaxSessions, with.FailsAt, with.FailsAtMisses)
	}
	want := fmt.Sprintf("it meets the targets at 12 sessions but not with 20 %% headroom (15 sessions): at the cliff it meets up to %d, %d misses prefix hit >= 80 %%",
		with.MaxSessions, with.FailsAt)
	if !strings.Contains(res[1].Answer, want) || !strings.Contains(res[1].Answer, "with 20 % headroom (at 12 and at 15 sessions)") {
		t.Errorf("answer\n%q\nwant it to contain\n%q\nand the headroom used", res[1].Answer, want)
	}
}

// TestSolveSpeedBand: a farm set whose step_time gives both efficiencies
// (calibrated) gets no speed axis, the same farm without gets one; the
// calibrated efficiencies here are the defaults, so the calibrated farm's
// runs are the other's runs at speed x1, and the speed axis can only widen
// the band: its pessimistic edge takes the slower engine's TTFB.
func TestSolveSpeedBand(t *testing.T) {
	racetest.SimulationOnly(t)
	p := kvBoundPlan()
	p.Farms[0].Replicas = []int{2}
	p.Sessions, p.Concurrency = []int{8}, 8
	p.Duration = sim.Duration(20 * time.Second)
	p.Strategies = []string{"affinity"}
	cal := p.Farms[0]
	cal.StepTime = sim.StepTime{PrefillEfficiency: sim.DefaultPrefillEfficiency, BandwidthEfficiency: sim.DefaultBandwidthEfficiency}
	p.Farms = append(p.Farms, cal)
	res, err := Solve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Band.SpeedScales, BandSpeedScales) {
		t.Errorf("band speed scales %v, want %v (one candidate is not calibrated)", res.Band.SpeedScales, BandSpeedScales)
	}
	un, ca := &res.Candidates[0], &res.Candidates[1]
	if !un.SpeedBand || un.KPIs.Runs != 9 || ca.SpeedBand || ca.KPIs.Runs != 3 {
		t.Fatalf("uncalibrated: speed band %v, %d runs; calibrated: %v, %d runs; want true, 9 (3 speeds x 3 seeds); false, 3 (seeds)",
			un.SpeedBand, un.KPIs.Runs, ca.SpeedBand, ca.KPIs.Runs)
	}
	u, c := un.KPIs.TTFBP95, ca.KPIs.TTFBP95
	if u.Nominal != c.Nominal {
		t.Errorf("nominal TTFB p95 %v and %v: the calibrated efficiencies are the defaults, want the same run", u.Nominal, c.Nominal)
	}
	if !(u.Low > c.Low) || u.High > c.High {
		t.Errorf("TTFB p95 band uncalibrated %+v, calibrated %+v: want a higher pessimistic edge (the slow engine) and an optimistic one no higher", u, c)
	}
	// All calibrated: no speed axis anywhere, and the answer says none.
	p.Farms = p.Farms[1:]
	res, err = Solve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Band.SpeedScales, []float64{1}) || strings.Contains(res.Answer, "speed") {
		t.Errorf("all calibrated: speed scales %v, answer %q; want [1] and no speed in it", res.Band.SpeedScales, res.Answer)
	}
}

// TestSolveSkipsOnlyDecided: the work left out (the band's runs above the
// last level the nominal run meets, a probe's second stage once its first
// misses) changes no verdict, capacity or routing, nor any band where
// every run was made: the same plan with every run of every band
// (fullBand) decides the same.
func TestSolveSkipsOnlyDecided(t *testing.T) {
	racetest.SimulationOnly(t)
	p := kvBoundPlan()
	p.Farms[0].VLLM.NumGPUBlocks = 0 // the KV axis too: 27 runs
	p.Farms[0].VLLM.MaxNumSeqs = 8
	p.Farms[0].GPUs = []string{"RTX A4000"}
	p.Farms[0].Replicas = []int{1, 2}
	p.Sessions, p.Concurrency = []int{4, 12}, 12
	p.Headroom = nil // 20 %: 15
	p.Duration = sim.Duration(15 * time.Second)
	p.Targets = Targets{TTFBP95MaxS: 0.9, PrefixHitPctMin: 60}
	var res [2]*Result
	for i, full := range []bool{false, true} {
		p.fullBand = full
		r, err := Solve(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		res[i] = r
	}
	lean, full := res[0], res[1]
	if lean.Best != full.Best || lean.Closest != full.Closest {
		t.Errorf("best %d closest %d, with every run %d %d", lean.Best, lean.Closest, full.Best, full.Closest)
	}
	skipped := 0
	for i := range lean.Candidates {
		a, b := &lean.Candidates[i], &full.Candidates[i]
		if a.Verdict != b.Verdict || a.Chosen != b.Chosen || a.MaxSessions != b.MaxSessions || a.FailsAt != b.FailsAt {
			t.Errorf("%s: %s, routing %d, up to %d, fails at %d; with every run %s, %d, %d, %d",
				a.Name, a.Verdict, a.Chosen, a.MaxSessions, a.FailsAt, b.Verdict, b.Chosen, b.MaxSessions, b.FailsAt)
		}
		for k := range a.Configs {
			for l := range a.Configs[k].Bands {
				x, y := a.Configs[k].Bands[l], b.Configs[k].Bands[l]
				if x.Verdict != y.Verdict {
					t.Errorf("%s, %s, %d sessions: verdict %s, with every run %s", a.Name, a.Configs[k].Label(), x.Sessions, x.Verdict, y.Verdict)
				}
				if x.Runs < y.Runs {
					skipped++
					if x.Runs != 1 || a.Configs[k].Checks[l].Meets {
						t.Errorf("%s, %s, %d sessions: %d runs kept where the nominal run meets %v; want every run where it meets, 1 where not",
							a.Name, a.Configs[k].Label(), x.Sessions, x.Runs, a.Configs[k].Checks[l].Meets)
					}
					continue
				}
				xj, _ := json.Marshal(x)
				yj, _ := json.Marshal(y)
				if !bytes.Equal(xj, yj) {
					t.Errorf("%s, %s, %d sessions: band\n%s\nwith every run\n%s", a.Name, a.Configs[k].Label(), x.Sessions, xj, yj)
				}
			}
		}
	}
	staged := 0
	for _, c := range lean.Candidates {
		for _, b := range c.Probes {
			if b.Runs < 27 {
				staged++
				if b.Verdict == VerdictMeets {
					t.Errorf("%s: a probe at %d sessions meets with %d runs of 27", c.Name, b.Sessions, b.Runs)
				}
			}
		}
	}
	// The plan must exercise both: a band left at the nominal run, a probe
	// decided by its first stage (retune its targets if the simulator moves).
	if skipped == 0 || staged == 0 {
		t.Errorf("%d bands left at the nominal run, %d probes decided by their first stage: want some of each", skipped, staged)
	}
}

// TestSolveVariants: a plan tries affinity's variants as routings: each is
// simulated as the variant (the simulator's rows carry its name) and
// reported by its label.
func TestSolveVariants(t *testing.T) {
	racetest.SimulationOnly(t)
	p := kvBoundPlan()
	p.Farms[0].Replicas = []int{3}
	p.Strategies = []string{"affinity", "affinity+kv+admit=30s"}
	p.Sessions, p.Concurrency = []int{12}, 12
	res, err := Solve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	cfgs := res.Candidates[0].Configs
	if len(cfgs) != 2 {
		t.Fatalf("%d configs, want 2", len(cfgs))
	}
	for i, want := range []struct{ label, row string }{
		{"affinity (spill auto)", "affinity"},
		{"affinity (kv, admit 30s, spill auto)", "affinity (kv, admit 30s)"},
	} {
		if got := cfgs[i].Label(); got != want.label {
			t.Errorf("config %d: label %q, want %q", i, got, want.label)
		}
		if got := cfgs[i].Rows[0].Strategy; got != want.row {
			t.Errorf("config %d: simulated as %q, want %q", i, got, want.row)
		}
	}
}

func dump(res *Result) string {
	var b strings.Builder
	for _, c := range res.Candidates {
		for _, cfg := range c.Configs {
			for _, r := range cfg.Rows {
				b.WriteString(c.Name + " " + cfg.Label() + " ")
				json.NewEncoder(&b).Encode(map[string]any{"sessions": r.Sessions, "hit": r.PrefixHitPct, "p95": r.TTFBP95})
			}
		}
	}
	return b.String()
}

func TestSolveNoneMeets(t *testing.T) {
	p := kvBoundPlan()
	// Nothing answers in a microsecond: every candidate misses the TTFB
	// target; two cards also miss the hit rate, so they are not the closest.
	p.Targets.TTFBP95MaxS = 1e-6
	p.EveryCandidate = false // by cost, cheapest first: with none meeting, every tier runs
	res, err := Solve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Best != -1 {
		t.Fatalf("best = %d, want -1 (none meets)", res.Best)
	}
	for _, c := range res.Candidates {
		if c.NotSimulated != "" || len(c.Configs) == 0 {
			t.Errorf("%s left out (%q) although no farm meets the targets", c.Name, c.NotSimulated)
		}
	}
	if res.Skipped.Candidates != 0 {
		t.Errorf("skipped %d candidates, want none", res.Skipped.Candidates)
	}
	if res.Closest != 1 && res.Closest != 2 {
		t.Fatalf("closest = %d, want 3 or 4 cards (they miss one target, 2 cards miss two)\n%s", res.Closest, dump(res))
	}
	c := res.Candidates[res.Closest]
	at := Level(res.Sessions, res.Concurrency)
	if n := len(c.Configs[c.Chosen].Checks[at].Misses); n != 1 {
		t.Errorf("closest misses %d targets, want 1", n)
	}
	prefix := "For 12 concurrent agent sessions on vLLM 0.26, no candidate meets TTFB p95 <= 0.000001 s and prefix hit >= 80 %; the closest is " + c.Name + " with affinity (spill auto), which misses TTFB p95 <= 0.000001 s ("
	if !strings.HasPrefix(res.Answer, prefix) || !strings.HasSuffix(res.Answer, " s).") {
		t.Errorf("answer\n%q\nwant it to start with\n%q", res.Answer, prefix)
	}
}

func TestSolveModelDoesNotFit(t *testing.T) {
	racetest.SimulationOnly(t)
	p := kvBoundPlan()
	p.Farms = append(p.Farms, FarmSet{GPUs: []string{"RTX A4000"}, Replicas: []int{2}, Model: "meta-llama/Llama-3.1-70B-Instruct"})
	p.Farms[0].Replicas = []int{3}
	p.Prices = map[string]float64{"RTX A4000": 0.25} // kinds mix; the H100's from the price list
	res, err := Solve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Candidates) != 2 {
		t.Fatalf("%d candidates, want 2: one that fits, one that does not", len(res.Candidates))
	}
	c := res.Candidates[1]
	if c.Fits || c.Configs != nil || c.Chosen != -1 {
		t.Errorf("70B on an A4000: fits %v, %d configs, chosen %d; want false, none, -1", c.Fits, len(c.Configs), c.Chosen)
	}
	if !strings.Contains(c.Error, "does not fit on RTX A4000") {
		t.Errorf("error %q does not say the model does not fit", c.Error)
	}
	if c.Name != "2 x RTX A4000, meta-llama/Llama-3.1-70B-Instruct" {
		t.Errorf("name %q: with two models the name carries the model", c.Name)
	}
	if res.Best != 0 {
		t.Errorf("best = %d, want the H100 farm (0)", res.Best)
	}
	// Two GPU kinds: ranked by money, the A4000 at the price given, the
	// H100 at the price list's, and the result says so.
	h100, _ := hardware.LookupPrice("H100 SXM")
	want := []PriceUsed{
		{GPU: "H100 SXM", PerGPUHour: h100.USDPerGPUHour, From: PriceFromCatalogue, AsOf: h100.AsOf, Source: h100.Source},
		{GPU: "RTX A4000", PerGPUHour: 0.25, From: "the plan file"},
	}
	if res.CostUnit != "per hour" || !slices.Equal(res.Prices, want) {
		t.Errorf("cost unit %q, prices %+v; want per hour, %+v", res.CostUnit, res.Prices, want)
	}
	if got := res.Candidates[0].Cost; got != 3*h100.USDPerGPUHour {
		t.Errorf("3 x H100 SXM costs %g, want 3 x %g", got, h100.USDPerGPUHour)
	}

	// Nothing fits at all: the answer says so.
	p.Farms = p.Farms[1:]
	res, err = Solve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Best != -1 || res.Closest != -1 || !strings.Contains(res.Answer, "no candidate can run the model") {
		t.Errorf("best %d closest %d answer %q; want -1, -1 and no candidate can run the model", res.Best, res.Closest, res.Answer)
	}
}

// cheapPlan is kvBoundPlan made quicker, for tests that do not need its
// answer: two candidates, 10 s steps; with the default headroom (20 %: a
// level of 15 sessions), so that its results carry every field.
func cheapPlan() Plan {
	p := kvBoundPlan()
	p.Farms[0].Replicas = []int{2, 3}
	p.Duration = sim.Duration(10 * time.Second)
	p.Headroom = nil
	return p
}

func TestSolveDeterministic(t *testing.T) {
	racetest.SimulationOnly(t)
	var out [2][]byte
	for i, par := range []int{1, 3} {
		p := cheapPlan()
		p.Farms[0].Replicas = []int{2}
		p.Farms[0].VLLM.NumGPUBlocks = 0 // with a KV band
		p.Sessions = []int{4, 8}
		p.Concurrency = 8
		p.Parallelism = par
		p.SpillThresholds = []string{"auto", "2"}
		res, err := Solve(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		out[i], err = json.MarshalIndent(res, "", " ")
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0], out[1]) {
		t.Error("two runs of one plan (parallelism 1 and 3) gave different JSON")
	}
}

func TestResultJSONRoundTrip(t *testing.T) {
	res, err := Solve(context.Background(), cheapPlan())
	if err != nil {
		t.Fatal(err)
	}
	// The round trip covers the headroom and the speed band.
	if res.Headroom != 0.2 || res.HeadroomSessions != 15 || !slices.Equal(res.Band.SpeedScales, BandSpeedScales) {
		t.Fatalf("headroom %g at %d sessions, speed scales %v; want 0.2, 15, %v", res.Headroom, res.HeadroomSessions, res.Band.SpeedScales, BandSpeedScales)
	}
	// A NaN figure (a step that measured nothing) must survive as NaN.
	res.Candidates[0].Configs[0].Rows[0].TTFBP95 = sim.Float(math.NaN())
	a, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ReadResult(a)
	if err != nil {
		t.Fatal(err)
	}
	if v := back.Candidates[0].Configs[0].Rows[0].TTFBP95; !math.IsNaN(float64(v)) {
		t.Errorf("null TTFB read back as %v, want NaN", v)
	}
	b, err := json.Marshal(back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("JSON -> ReadResult -> JSON changed the bytes")
	}
	for _, bad := range []string{`{"kind":"other"}`, `{"kind":"warden-plan","best":5}`,
		`{"kind":"warden-plan","concurrency":4,"sessions":[4],"headroom_sessions":5,"candidates":[{"chosen":-1}]}`, `{"kind":"warden-plan","bogus":1}`, `{"kind":"warden-plan","timeline":{"candidate":3}}`, `[`,
		`{"kind":"warden-plan","routing_cards":[{"strategy":"llm-d","candidate":0,"config":0}]}`,
		`{"kind":"warden-plan","candidates":[{"chosen":-1}],"routing_cards":[{"strategy":"llm-d","candidate":0,"config":-1}]}`} {
		if _, err := ReadResult([]byte(bad)); err == nil {
			t.Errorf("ReadResult(%s): no error", bad)
		}
	}
}

func TestSolveCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := cheapPlan()
	p.Parallelism = 2
	var calls atomic.Int64
	p.Progress = func(done, total time.Duration) {
		if calls.Add(1) == 1 {
			cancel()
		}
	}
	_, err := Solve(ctx, p)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Solve after cancel: %v, want context.Canceled", err)
	}
}

func TestSolveProgress(t *testing.T) {
	p := cheapPlan()
	var last, total time.Duration
	p.Progress = func(done, tot time.Duration) {
		if done < last {
			t.Errorf("progress went back from %v to %v", last, done)
		}
		last, total = done, tot
	}
	if _, err := Solve(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	// The sweep is at least every routing's nominal run, 2 candidates x 2
	// strategies x 3 levels (6, 12 and the headroom's 15) x 10 s; the band's
	// other runs and the bisection's probes add whole steps of 10 s.
	if sweep := 2 * 2 * 3 * 10 * time.Second; last != total || total < sweep+20*time.Second || total%(10*time.Second) != 0 {
		t.Errorf("progress ended at %v of %v, want all of the sweep's %v and whole probes", last, total, sweep)
	}
}

func TestForEachFirstError(t *testing.T) {
	boom := errors.New("boom")
	err := forEach(context.Background(), 50, 4, func(ctx context.Context, i int) error {
		switch {
		case i == 7 || i == 9:
			return boom
		case i > 9:
			<-ctx.Done() // later jobs see the cancellation
			return ctx.Err()
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("forEach = %v, want boom", err)
	}
}

func TestSyntheticContext(t *testing.T) {
	got, how := syntheticContext(traces.DefaultWorkload())
	// Answers run to max_output_tokens: 3500 + 7300 + 256 + 2.5 x (400 + 256) = 12,696
	if got != 12696 {
		t.Errorf("typical context of the default workload = %d, want 12696", got)
	}
	if !strings.Contains(how, "12,696 tokens") {
		t.Errorf("how %q does not give the total", how)
	}
}
