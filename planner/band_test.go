package planner

import (
	"math"
	"strings"
	"testing"

	"github.com/lm-warden/warden/sim"
)

// TestVariants: the band is the full product of its axes (none drops a
// corner), the nominal run first, and each (KV, speed) pair has one farm.
func TestVariants(t *testing.T) {
	tests := []struct {
		name      string
		kv, speed bool
		runs      int
		farms     int
	}{
		{"calibrated, num_gpu_blocks given: seeds only", false, false, 3, 1},
		{"KV band only (calibrated)", true, false, 9, 3},
		{"speed band only (num_gpu_blocks given)", false, true, 9, 3},
		{"both", true, true, 27, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs := variants(5, tt.kv, tt.speed)
			if len(vs) != tt.runs {
				t.Fatalf("%d runs, want %d", len(vs), tt.runs)
			}
			if v := vs[0]; v.kvScale != 1 || v.speedScale != 1 || v.seed != 5 || v.farm != 0 {
				t.Errorf("first run %+v, want the nominal one (KV x1, speed x1, seed 5, farm 0)", v)
			}
			type point struct{ kv, speed float64 }
			seeds := map[point]int{}
			farms := map[point]int{}
			for _, v := range vs {
				p := point{v.kvScale, v.speedScale}
				seeds[p]++
				if f, ok := farms[p]; ok && f != v.farm {
					t.Errorf("%+v: farm %d, and %d for another seed", p, v.farm, f)
				}
				farms[p] = v.farm
			}
			if len(farms) != tt.farms {
				t.Errorf("%d (KV, speed) pairs, want %d", len(farms), tt.farms)
			}
			for p, n := range seeds {
				if n != BandSeeds {
					t.Errorf("%+v has %d seeds, want %d", p, n, BandSeeds)
				}
			}
			corner := point{1, 1}
			if tt.kv {
				corner.kv = 0.85
			}
			if tt.speed {
				corner.speed = 0.8
			}
			if seeds[corner] != BandSeeds {
				t.Errorf("the pessimistic corner %+v has %d runs, want every seed", corner, seeds[corner])
			}
		})
	}
}

func TestCalibrated(t *testing.T) {
	tests := []struct {
		st   sim.StepTime
		want bool
	}{
		{sim.StepTime{}, false},
		{sim.StepTime{StepOverhead: sim.Duration(1000)}, false},
		{sim.StepTime{PrefillEfficiency: 0.4}, false}, // decode is still the default
		{sim.StepTime{BandwidthEfficiency: 0.7}, false},
		{sim.StepTime{PrefillEfficiency: 0.4, BandwidthEfficiency: 0.7}, true}, // as warden calibrate writes it
	}
	for _, tt := range tests {
		if got := Calibrated(tt.st); got != tt.want {
			t.Errorf("Calibrated(%+v) = %v, want %v", tt.st, got, tt.want)
		}
	}
}

// TestBandSlowCorner is the known answer of the speed band: every run of
// the full band meets the targets but one, the joint corner (KV x0.85 with
// the engine 20 % slower): that run gives the pessimistic edge, the band is
// marginal, and the sentence names the run and what would decide it.
func TestBandSlowCorner(t *testing.T) {
	targets := Targets{TTFBP95MaxS: 10, PrefixHitPctMin: 75}
	vs := variants(1, true, true)
	rows := make([]sim.Row, len(vs))
	corner := -1
	for i, v := range vs {
		rows[i] = row(16, 3+float64(i)/100, 85) // every run a little different, all meeting
		if v.kvScale == 0.85 && v.speedScale == 0.8 && v.seed == 2 {
			rows[i] = row(16, 14.5, 60)
			corner = i
		}
	}
	b := targets.band(rows, vs)
	if b.Runs != 27 || b.Verdict != VerdictMarginal {
		t.Fatalf("%d runs, verdict %q; want 27, marginal", b.Runs, b.Verdict)
	}
	if b.TTFBP95.Low != 14.5 || b.PrefixHitPct.Low != 60 || b.TTFBP95.Nominal != 3 {
		t.Errorf("TTFB p95 %+v, hit %+v: want the corner's 14.5 s and 60 %% as the pessimistic edge, nominal 3 s", b.TTFBP95, b.PrefixHitPct)
	}
	if len(b.Misses) != 2 {
		t.Fatalf("misses %+v, want both targets", b.Misses)
	}
	for _, m := range b.Misses {
		if m.KVScale != 0.85 || m.SpeedScale != 0.8 || m.Seed != 2 {
			t.Errorf("miss %+v: want the run KV x0.85, speed x0.8, seed 2 (run %d)", m, corner)
		}
	}
	want := "meets at the nominal KV size and speed; misses TTFB p95 <= 10 s (14.50 s) and prefix hit >= 75 % (60.0 %) " +
		"if the KV cache is 15 % smaller than estimated and the engine 20 % slower than the roofline's defaults, with other sessions (seed 2): " +
		"one replica's measured num_gpu_blocks and step time decide it (warden calibrate; the plan says how to measure before buying)"
	if got := targets.marginalWhy(b, 1); got != want {
		t.Errorf("why\n%q\nwant\n%q", got, want)
	}
	// Without the corner the same runs meet: it alone made the verdict.
	good := targets.band(append(append([]sim.Row(nil), rows[:corner]...), rows[corner+1:]...),
		append(append([]variant(nil), vs[:corner]...), vs[corner+1:]...))
	if good.Verdict != VerdictMeets {
		t.Errorf("without the corner: verdict %q, want meets", good.Verdict)
	}
}

func TestRunPhrase(t *testing.T) {
	tests := []struct {
		kv, speed float64
		seed      uint64
		want      string
	}{
		{1, 1, 1, "in the nominal run"},
		{1, 0, 1, "in the nominal run"}, // a result from before the speed band
		{0.85, 1, 1, "if the KV cache is 15 % smaller than estimated"},
		{1, 0.8, 1, "if the engine is 20 % slower than the roofline's defaults"},
		{1, 1.2, 3, "if the engine is 20 % faster than the roofline's defaults, with other sessions (seed 3)"},
		{1.1, 0.8, 2, "if the KV cache is 10 % larger than estimated and the engine 20 % slower than the roofline's defaults, with other sessions (seed 2)"},
		{1, 1, 3, "with other sessions (seed 3)"},
	}
	for _, tt := range tests {
		if got := runPhrase(tt.kv, tt.speed, tt.seed, 1); got != tt.want {
			t.Errorf("runPhrase(%g, %g, %d) = %q, want %q", tt.kv, tt.speed, tt.seed, got, tt.want)
		}
	}
}

func TestHeadroomLevel(t *testing.T) {
	tests := []struct {
		n    int
		h    float64
		want int
	}{
		{16, 0.2, 20}, // 19.2 up
		{10, 0.2, 12}, // 12.000000000000002 in floating point: still 12
		{12, 0.25, 15},
		{5, 0.2, 6},
		{4, 0.01, 5}, // at least one session more
		{16, 0, 0},   // no headroom
		{16, 1, 32},
	}
	for _, tt := range tests {
		if got := HeadroomLevel(tt.n, tt.h); got != tt.want {
			t.Errorf("HeadroomLevel(%d, %g) = %d, want %d", tt.n, tt.h, got, tt.want)
		}
	}
}

func TestParsePercent(t *testing.T) {
	tests := []struct {
		in   string
		want float64
		err  string
	}{
		{"20%", 0.2, ""},
		{" 12.5 % ", 0.125, ""},
		{"0%", 0, ""},
		{"20", 0, "want a percentage with its % sign"},
		{"0.2", 0, "want a percentage with its % sign"},
		{"x%", 0, "want a percentage such as 20%"},
		{"NaN%", 0, "want a percentage such as 20%"},
	}
	for _, tt := range tests {
		got, err := ParsePercent(tt.in)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("ParsePercent(%q): error %v, want %q", tt.in, err, tt.err)
		case tt.err == "" && (err != nil || math.Abs(got-tt.want) > 1e-12):
			t.Errorf("ParsePercent(%q) = %g, %v; want %g", tt.in, got, err, tt.want)
		}
	}
}

// headroomResult is bandResult (decide_test.go) with a headroom level:
// levels 4, 8 and 10 (8 + 20 %), the answer for 8. runs[i][v] are candidate
// i's rows in run v of variants(1, true, false), one per level.
func headroomResult(targets Targets, costs []float64, runs [][][]sim.Row, headroom float64) *Result {
	res := &Result{Kind: Kind, Concurrency: 8, Sessions: []int{4, 8, 10}, Seed: 1, Targets: targets, CostUnit: "cards", Best: -1, Closest: -1,
		Band: BandInfo{KVScales: BandKVScales, SpeedScales: []float64{1}, Seeds: []uint64{1, 2, 3}}}
	if headroom > 0 {
		res.Headroom, res.HeadroomSessions = headroom, HeadroomLevel(8, headroom)
	}
	vs := variants(1, true, false)
	for i, rs := range runs {
		res.Candidates = append(res.Candidates, Candidate{
			Name: string(rune('A' + i)), Fits: true, Cost: costs[i], Cards: int(costs[i]),
			Configs: []Config{{Strategy: "affinity", Spill: "auto", Rows: rs[0], runs: rs, vs: vs, banded: len(rs[0])}},
		})
	}
	res.decideConfigs()
	return res
}

// TestDecideHeadroom is the known answer of the headroom: farm A meets the
// targets at the band's pessimistic edge at 8 sessions (every run) but
// misses them at 10 (8 + 20 %): it is marginal, and B, which meets at both,
// is the answer although it costs more. The bisection (stubbed here: the
// capacity it would find) puts A's cliff between 8 and 10, and the sentence
// says where. With no headroom A meets and is the answer: the headroom
// level alone makes the difference.
func TestDecideHeadroom(t *testing.T) {
	targets := Targets{TTFBP95MaxS: 10, PrefixHitPctMin: 75}
	cliff := sameRuns([]sim.Row{row(4, 1, 90), row(8, 2, 85), row(10, 15.4, 85)}, -1, nil)
	holds := sameRuns([]sim.Row{row(4, 1, 90), row(8, 2, 85), row(10, 3, 84)}, -1, nil)

	res := headroomResult(targets, []float64{2, 4}, [][][]sim.Row{cliff, holds}, 0.2)
	a, b := &res.Candidates[0], &res.Candidates[1]
	if a.KPIs.Verdict != VerdictMeets {
		t.Fatalf("A's band at 8 sessions: %q, want meets (the test needs it)", a.KPIs.Verdict)
	}
	if a.Verdict != VerdictMarginal || a.Meets || b.Verdict != VerdictMeets || !b.Meets {
		t.Fatalf("verdicts A %q (meets %v), B %q (meets %v); want marginal, meets", a.Verdict, a.Meets, b.Verdict, b.Meets)
	}
	if a.MaxSessions != 8 || a.FailsAt != 10 {
		t.Fatalf("A: the sweep's capacity %d, fails at %d; want 8 and 10", a.MaxSessions, a.FailsAt)
	}
	// What the bisection finds between 8 and 10: meets at 9, misses at 10 would
	// read "up to 9, 10 misses"; here it misses at 9.
	a.FailsAt, a.FailsAtMisses = 9, []BandMiss{{Miss: Miss{Target: "ttfb_p95_s_max", Value: 15, Limit: 10}, KVScale: 0.85, SpeedScale: 0.8, Seed: 3}}
	res.explain()
	res.pick()
	if res.Best != 1 || len(res.Marginal) != 1 || res.Marginal[0] != 0 {
		t.Fatalf("best %d, marginal %v; want 1, [0]", res.Best, res.Marginal)
	}
	want := "For 8 concurrent agent sessions, B with affinity (spill auto) is the cheapest farm by card count that meets TTFB p95 <= 10 s and prefix hit >= 75 % " +
		"at the band's pessimistic edge (KV x0.85 and x1.10, 3 seeds) with 20 % headroom: at 8 and at 10 sessions; it meets them up to at least 10 sessions (the highest level simulated). " +
		"A with affinity (spill auto) is cheaper but marginal: it meets the targets at 8 sessions but not with 20 % headroom (10 sessions): " +
		"at the cliff it meets up to 8, 9 misses TTFB p95 <= 10 s (15.00 s) if the KV cache is 15 % smaller than estimated and the engine 20 % slower than the roofline's defaults, with other sessions (seed 3)."
	if got := answer(res); got != want {
		t.Errorf("answer\n%q\nwant\n%q", got, want)
	}

	// Without the bisection's cliff (it found none between the levels), the
	// sentence says what the headroom level misses, from the sweep.
	res = headroomResult(targets, []float64{2}, [][][]sim.Row{cliff}, 0.2)
	res.Candidates[0].MaxSessions, res.Candidates[0].FailsAt = 0, 0
	res.explain()
	res.pick()
	if c := &res.Candidates[0]; res.Closest != 0 || !strings.HasSuffix(c.Why, "but not with 20 % headroom (10 sessions): at 10 it misses TTFB p95 <= 10 s (15.40 s) in the nominal run") {
		t.Errorf("closest %d, why %q", res.Closest, c.Why)
	}
	if want := "For 8 concurrent agent sessions, no candidate meets TTFB p95 <= 10 s and prefix hit >= 75 % at the band's pessimistic edge (KV x0.85 and x1.10, 3 seeds) " +
		"with 20 % headroom (at 8 and at 10 sessions); the closest is A with affinity (spill auto), which is marginal: it meets the targets at 8 sessions"; !strings.HasPrefix(answer(res), want) {
		t.Errorf("answer\n%q\nwant it to start with\n%q", answer(res), want)
	}

	// Headroom 0: today's rule, 8 alone decides; A is the cheapest that meets.
	res = headroomResult(targets, []float64{2, 4}, [][][]sim.Row{cliff, holds}, 0)
	res.explain()
	res.pick()
	if res.Best != 0 || !res.Candidates[0].Meets || res.Candidates[0].Why != "" {
		t.Errorf("no headroom: best %d, A meets %v, why %q; want A (0), true, none", res.Best, res.Candidates[0].Meets, res.Candidates[0].Why)
	}
	if got := answer(res); strings.Contains(got, "headroom") {
		t.Errorf("no headroom: the answer names one: %q", got)
	}
}

// TestChooseConfigHeadroom: a routing that meets at the concurrency and at
// the headroom level wins over one with a lower TTFB that meets only at
// the concurrency.
func TestChooseConfigHeadroom(t *testing.T) {
	targets := Targets{TTFBP95MaxS: 10}
	mk := func(s string, p95at, p95hat float64) Config {
		c := Config{Strategy: s, Rows: []sim.Row{row(8, p95at, 90), row(10, p95hat, 90)}}
		for l := range c.Rows {
			c.Checks = append(c.Checks, targets.check(&c.Rows[l]))
			c.Bands = append(c.Bands, targets.nominalBand(c.Rows[l], 1))
		}
		return c
	}
	configs := []Config{mk("fast-then-cliff", 1, 20), mk("slower-holds", 4, 6)}
	if got := chooseConfig(configs, 0, 1); got != 1 {
		t.Errorf("with headroom: chose %d, want 1 (meets at both levels)", got)
	}
	if got := chooseConfig(configs, 0, -1); got != 0 {
		t.Errorf("without headroom: chose %d, want 0 (the lower TTFB)", got)
	}
}
