package planner

import (
	"math"
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
			answer: "For 8 concurrent agent sessions, C with affinity (spill auto) is the cheapest farm that meets TTFB p95 <= 2 s and prefix hit >= 80 %.",
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
			if got := chooseConfig(tt.configs, 0); got != tt.want {
				t.Errorf("chose %d, want %d", got, tt.want)
			}
		})
	}
}

func TestAnswerWithPrices(t *testing.T) {
	res := handResult(Targets{SessionsPerHourMin: 5, OutputTokensPerMinMin: 500}, []float64{1.5}, [][]sim.Row{{row(4, 1, 90), row(8, 1, 90)}})
	res.CostUnit = "per hour"
	want := "For 8 concurrent agent sessions, A with affinity (spill auto) is the cheapest farm (1.50 per hour) that meets output >= 500 tokens/min and sessions/h >= 5."
	if got := answer(res); got != want {
		t.Errorf("answer\n%q\nwant\n%q", got, want)
	}
}
