package planner

import (
	"math"
	"strings"
	"testing"

	"github.com/lm-warden/warden/sim"
)

func TestCapacity(t *testing.T) {
	levels := []int{4, 8, 16, 32}
	tests := []struct {
		name      string
		meets     []bool
		max, fail int
	}{
		{"all", []bool{true, true, true, true}, 32, 0},
		{"stops", []bool{true, true, false, false}, 8, 16},
		{"none", []bool{false, false, false, false}, 0, 0},
		{"starts late (a throughput target)", []bool{false, true, true, false}, 16, 32},
		{"recovers: first run only", []bool{true, false, true, true}, 4, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checks := make([]Check, len(tt.meets))
			for i, m := range tt.meets {
				checks[i].Meets = m
			}
			if mx, f := capacity(levels, checks); mx != tt.max || f != tt.fail {
				t.Errorf("capacity = %d, fails at %d; want %d, %d", mx, f, tt.max, tt.fail)
			}
		})
	}
}

func row(n int, p95, hit float64) sim.Row {
	return sim.Row{Sessions: n, TTFBP95: sim.Float(p95), PrefixHitPct: sim.Float(hit),
		OutputTokensPerMin: 1000, SessionsPerHour: 10}
}

// handResult is a result decided from made-up rows: the decision logic
// without the simulator.
func handResult(targets Targets, costs []float64, rows [][]sim.Row) *Result {
	res := &Result{Kind: Kind, Concurrency: 8, Sessions: []int{4, 8}, Targets: targets, CostUnit: "cards", Best: -1, Closest: -1}
	for i, rs := range rows {
		res.Candidates = append(res.Candidates, Candidate{
			Name: string(rune('A' + i)), Fits: true, Cost: costs[i], Cards: int(costs[i]),
			Configs: []Config{{Strategy: "affinity", Spill: "auto", Rows: rs}},
		})
	}
	res.decide()
	return res
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name          string
		targets       Targets
		costs         []float64
		rows          [][]sim.Row
		best, closest int
		answer        string
	}{
		{
			name: "cheapest that meets", targets: Targets{TTFBP95MaxS: 2, PrefixHitPctMin: 80}, costs: []float64{4, 2, 3},
			rows: [][]sim.Row{
				{row(4, 1, 90), row(8, 1, 90)},
				{row(4, 1, 90), row(8, 3, 90)}, // cheapest, too slow at 8
				{row(4, 1, 90), row(8, 1.5, 85)},
			},
			best: 2, closest: -1,
			answer: "For 8 concurrent agent sessions, C with affinity (spill auto) is the cheapest farm by card count that meets TTFB p95 <= 2 s and prefix hit >= 80 %; it meets them up to at least 8 sessions (the highest level simulated).",
		},
		{
			name: "closest: fewer misses beats a smaller total shortfall", targets: Targets{TTFBP95MaxS: 2, PrefixHitPctMin: 80}, costs: []float64{2, 3},
			rows: [][]sim.Row{
				{row(4, 1, 90), row(8, 2.1, 79)}, // misses both, by 5 % and 1.25 %
				{row(4, 1, 90), row(8, 2.8, 85)}, // misses one, by 40 %
			},
			best: -1, closest: 1,
			answer: "For 8 concurrent agent sessions, no candidate meets TTFB p95 <= 2 s and prefix hit >= 80 %; the closest is B with affinity (spill auto), which misses TTFB p95 <= 2 s (2.80 s).",
		},
		{
			name: "closest: smaller shortfall, then cheaper", targets: Targets{PrefixHitPctMin: 80}, costs: []float64{3, 2, 1},
			rows: [][]sim.Row{
				{row(4, 1, 90), row(8, 1, 70)},
				{row(4, 1, 90), row(8, 1, 70)},
				{row(4, 1, 90), row(8, 1, 60)},
			},
			best: -1, closest: 1,
			answer: "For 8 concurrent agent sessions, no candidate meets prefix hit >= 80 %; the closest is B with affinity (spill auto), which misses prefix hit >= 80 % (70.0 %).",
		},
		{
			name: "nothing measured is far", targets: Targets{TTFBP95MaxS: 2}, costs: []float64{1, 2},
			rows: [][]sim.Row{
				{row(4, 1, 90), row(8, math.NaN(), 0)},
				{row(4, 1, 90), row(8, 9, 90)}, // 3.5 x over, still closer than no value
			},
			best: -1, closest: 1,
			answer: "For 8 concurrent agent sessions, no candidate meets TTFB p95 <= 2 s; the closest is B with affinity (spill auto), which misses TTFB p95 <= 2 s (9.00 s).",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := handResult(tt.targets, tt.costs, tt.rows)
			if res.Best != tt.best || res.Closest != tt.closest {
				t.Errorf("best %d closest %d, want %d %d", res.Best, res.Closest, tt.best, tt.closest)
			}
			if got := answer(res); got != tt.answer {
				t.Errorf("answer\n%q\nwant\n%q", got, tt.answer)
			}
		})
	}
}

func TestChooseConfig(t *testing.T) {
	targets := Targets{PrefixHitPctMin: 80}
	mk := func(s string, p95, hit float64) Config {
		c := Config{Strategy: s, Rows: []sim.Row{row(8, p95, hit)}}
		c.Checks = []Check{targets.check(&c.Rows[0])}
		c.Bands = []Band{targets.nominalBand(c.Rows[0], 1)}
		return c
	}
	tests := []struct {
		name    string
		configs []Config
		want    int
	}{
		{"lowest p95 among those that meet", []Config{mk("a", 1, 50), mk("b", 3, 85), mk("c", 2, 81)}, 2},
		{"ties keep plan order", []Config{mk("a", 2, 90), mk("b", 2, 90)}, 0},
		{"none meets: closest", []Config{mk("a", 1, 50), mk("b", 9, 79)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chooseConfig(tt.configs, 0, -1); got != tt.want {
				t.Errorf("chose %d, want %d", got, tt.want)
			}
		})
	}
}

func TestAnswerWithPrices(t *testing.T) {
	res := handResult(Targets{SessionsPerHourMin: 5, OutputTokensPerMinMin: 500}, []float64{1.5}, [][]sim.Row{{row(4, 1, 90), row(8, 1, 90)}})
	res.CostUnit = "per hour"
	want := "For 8 concurrent agent sessions, A with affinity (spill auto) is the cheapest farm by price (1.50 per hour) that meets output >= 500 tokens/min and sessions/h >= 5; it meets them up to at least 8 sessions (the highest level simulated)."
	if got := answer(res); got != want {
		t.Errorf("answer\n%q\nwant\n%q", got, want)
	}
}

// bandResult is handResult with band runs: runs[i][v] are candidate i's rows
// in run v of variants(1, true, false) (nominal first), one per level (4, 8).
func bandResult(targets Targets, costs []float64, runs [][][]sim.Row) *Result {
	res := &Result{Kind: Kind, Concurrency: 8, Sessions: []int{4, 8}, Seed: 1, Targets: targets, CostUnit: "cards", Best: -1, Closest: -1,
		Band: BandInfo{KVScales: BandKVScales, Seeds: []uint64{1, 2, 3}}}
	vs := variants(1, true, false)
	for i, rs := range runs {
		res.Candidates = append(res.Candidates, Candidate{
			Name: string(rune('A' + i)), Fits: true, Cost: costs[i], Cards: int(costs[i]),
			Configs: []Config{{Strategy: "affinity", Spill: "auto", Rows: rs[0], runs: rs, vs: vs, banded: len(rs[0])}},
		})
	}
	res.decide()
	return res
}

// sameRuns is every run of the band with the same rows, but run bad (an
// index in variants(1, true, false)) with badRows.
func sameRuns(rows []sim.Row, bad int, badRows []sim.Row) [][]sim.Row {
	out := make([][]sim.Row, len(variants(1, true, false)))
	for v := range out {
		out[v] = rows
		if v == bad {
			out[v] = badRows
		}
	}
	return out
}

// TestDecideMarginal is the known answer of the band: the nominal run meets,
// the KV cache 15 % smaller misses the hit target -> "marginal", and the
// sentence says so and why.
func TestDecideMarginal(t *testing.T) {
	targets := Targets{TTFBP95MaxS: 10, PrefixHitPctMin: 75}
	good := []sim.Row{row(4, 1, 90), row(8, 2, 85)}
	kvSmall := BandSeeds // variants(1, true, false)[BandSeeds] is KV x0.85, seed 1
	if v := variants(1, true, false)[kvSmall]; v.kvScale != 0.85 || v.seed != 1 {
		t.Fatalf("run %d is %+v, want KV x0.85, seed 1", kvSmall, v)
	}
	marginal := sameRuns(good, kvSmall, []sim.Row{row(4, 1, 88), row(8, 3, 61.2)})
	allGood := sameRuns(good, -1, nil)

	res := bandResult(targets, []float64{2, 4}, [][][]sim.Row{marginal, allGood})
	a, b := &res.Candidates[0], &res.Candidates[1]
	if a.Verdict != VerdictMarginal || a.Meets || b.Verdict != VerdictMeets || !b.Meets {
		t.Fatalf("verdicts %q (meets %v), %q (meets %v); want marginal, meets", a.Verdict, a.Meets, b.Verdict, b.Meets)
	}
	if k := a.KPIs; k == nil || k.PrefixHitPct.Low != 61.2 || k.PrefixHitPct.Nominal != 85 || k.PrefixHitPct.High != 85 || k.TTFBP95.Low != 3 || k.TTFBP95.High != 2 {
		t.Errorf("A's KPIs %+v: want hit low 61.2, nominal 85, high 85; TTFB p95 low (pessimistic) 3, high 2", a.KPIs)
	}
	if res.Best != 1 || len(res.Marginal) != 1 || res.Marginal[0] != 0 {
		t.Errorf("best %d, marginal %v; want 1, [0]", res.Best, res.Marginal)
	}
	want := "For 8 concurrent agent sessions, B with affinity (spill auto) is the cheapest farm by card count that meets TTFB p95 <= 10 s and prefix hit >= 75 % " +
		"at the band's pessimistic edge (KV x0.85 and x1.10, 3 seeds); it meets them up to at least 8 sessions (the highest level simulated). " +
		"A with affinity (spill auto) is cheaper but marginal: it meets at the nominal KV size; misses prefix hit >= 75 % (61.2 %) " +
		"if the KV cache is 15 % smaller than estimated: one replica's measured num_gpu_blocks decides it (the plan says how to measure before buying)."
	if got := answer(res); got != want {
		t.Errorf("answer\n%q\nwant\n%q", got, want)
	}

	// Alone, the marginal farm is the closest, and the sentence says why.
	res = bandResult(targets, []float64{2}, [][][]sim.Row{marginal})
	if res.Best != -1 || res.Closest != 0 {
		t.Errorf("best %d closest %d, want -1 0", res.Best, res.Closest)
	}
	want = "For 8 concurrent agent sessions, no candidate meets TTFB p95 <= 10 s and prefix hit >= 75 % at the band's pessimistic edge (KV x0.85 and x1.10, 3 seeds); " +
		"the closest is A with affinity (spill auto), which is marginal: it meets at the nominal KV size; misses prefix hit >= 75 % (61.2 %) " +
		"if the KV cache is 15 % smaller than estimated: one replica's measured num_gpu_blocks decides it (the plan says how to measure before buying)."
	if got := answer(res); got != want {
		t.Errorf("answer\n%q\nwant\n%q", got, want)
	}

	// Another seed's run at the nominal KV size misses: marginal for noise.
	seed3 := 2 // variants(1, true, false)[2] is KV x1, seed 3
	res = bandResult(targets, []float64{2}, [][][]sim.Row{sameRuns(good, seed3, []sim.Row{row(4, 1, 90), row(8, 12, 85)})})
	if c := &res.Candidates[0]; c.Verdict != VerdictMarginal || !strings.Contains(c.Why, "misses TTFB p95 <= 10 s (12.00 s) with other sessions (seed 3)") {
		t.Errorf("verdict %q, why %q", c.Verdict, c.Why)
	}
}

// TestDecidePriceTieBreak: equal prices go to the farm with more headroom
// (the band's low edge), then to fewer cards.
func TestDecidePriceTieBreak(t *testing.T) {
	a := &Candidate{Cost: 1, Cards: 2, MaxSessions: 8}
	b := &Candidate{Cost: 1, Cards: 1, MaxSessions: 12}
	c := &Candidate{Cost: 1, Cards: 1, MaxSessions: 8}
	if !betterFarm(b, a, 0) || betterFarm(a, b, 0) {
		t.Error("more headroom should win at the same price")
	}
	if !betterFarm(c, a, 0) {
		t.Error("fewer cards should win at the same price and headroom")
	}
}

// decide checks every row, finds each candidate's routing and capacity, and
// picks the best candidate (or the closest). Solve runs the two halves with
// the bisection of each candidate's capacity between them.
func (res *Result) decide() {
	res.decideConfigs()
	res.explain()
	res.pick()
}
