package planner

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/sim"
)

// The uncertainty band. Before a server runs, the KV cache is an estimate
// (hardware.SizeKV) good to about +-15 %, the engine's speed is the
// roofline's (sim.StepTime) with default efficiencies, not a measurement of
// the card, and one seed of synthetic sessions is one draw of many: every
// candidate, routing and sessions level is simulated at each of
// BandKVScales (sim.FarmSpec.KVCapacityScale) with each of BandSpeedScales
// (sim.FarmSpec.SpeedScale) with each of BandSeeds seeds (the plan's seed,
// seed+1, ...). A candidate whose vllm.num_gpu_blocks is given (read back
// from a running server: exact) gets no KV axis; one whose step_time gives
// both efficiencies (calibrated, e.g. by `warden calibrate`) gets no speed
// axis; both keep the seeds.
//
// How the axes combine. The band is the full product KV x speed x seeds
// (27 runs per routing and level for an uncalibrated farm, 9 with one
// axis, 3 with none), not the axes one at a time: the pessimistic edge must
// hold the joint corner (KV x0.85 with speed x0.8, where a smaller cache
// recomputes more prompt tokens on a slower engine and the two add up near
// the cliff), and nothing makes a figure monotonic in either axis, so the
// corners off the diagonal are run too: a faster engine runs more turns a
// minute and fills the cache sooner (2 x RTX A4000 with affinity at 8
// sessions of the built-in plan gave its lowest hit rate with KV x0.85 and
// the engine 20 % faster, not at the slow corner). The work is kept down by
// leaving out only runs that cannot change a verdict, and saying so:
//   - the sweep (solve.go's simulate) runs each routing's nominal run first
//     and the band's other runs only up to the highest level at which the
//     nominal run meets every target: above it the verdict is already
//     "misses" (the pessimistic edge is never better than the nominal run),
//     and those levels keep the nominal run alone (Band.Runs 1; the reports
//     say "nominal run only");
//   - a bisection probe (bisect.go) runs the nominal run and the pessimistic
//     corner's seeds first, and the other runs only when none of those
//     misses: a probe that meets holds every run;
//   - upwards, the bisection probes its cap first, so a farm that still
//     meets there takes one probe of the full band, not three;
//   - and that probe's band runs are the sweep's, gone on one step to the
//     cap: their warm-up is not simulated twice (skip.go).
//
// Result.Skipped counts each of these (skip.go), and the reports say it.
//
// Every run of a sweep simulates the levels in a row, so one run serves
// every level it reaches.
var (
	BandKVScales    = []float64{1, 0.85, 1.10}
	BandSpeedScales = []float64{1, 0.8, 1.2}
)

// BandSeeds is the number of seeds of the band (the plan's seed first).
const BandSeeds = 3

// Calibrated reports whether a step-time block was measured rather than
// left to the roofline's defaults: both efficiencies that the speed band
// scales are given (as `warden calibrate` writes them). A farm set that
// gives only one still gets the speed band: the other is a default.
func Calibrated(st sim.StepTime) bool {
	return st.PrefillEfficiency > 0 && st.BandwidthEfficiency > 0
}

// Verdicts of a candidate (and of one routing at one sessions level).
const (
	// VerdictMeets: the band's pessimistic edge meets every target (for a
	// candidate: at the wanted concurrency and, with the plan's headroom,
	// at the headroom level too).
	VerdictMeets = "meets"
	// VerdictMarginal: the nominal run (nominal KV size and speed, the
	// plan's seed) meets every target, the pessimistic edge does not; or
	// (a candidate) the pessimistic edge meets at the wanted concurrency but
	// not at the headroom level.
	VerdictMarginal = "marginal"
	// VerdictMisses: the nominal run misses a target.
	VerdictMisses = "misses"
)

// BandInfo says which runs make the band.
type BandInfo struct {
	// KVScales are the KV capacity scales simulated, the nominal 1 first
	// (only [1] when no candidate has a KV band).
	KVScales []float64 `json:"kv_scales"`
	// SpeedScales are the engine speed scales simulated, the nominal 1
	// first (only [1] when every candidate was calibrated; absent in a
	// result from before the speed band).
	SpeedScales []float64 `json:"speed_scales,omitempty"`
	// Seeds are the seeds simulated, the plan's seed first.
	Seeds []uint64 `json:"seeds"`
}

// Range is one KPI over the band. Low is the pessimistic edge over every
// run (KV scale x speed scale x seed): the lowest value of a figure that
// should be high (prefix hit %, output tokens per minute, sessions per
// hour), the highest of one that should be low (TTFB); a run that measured
// nothing makes Low null (NaN). High is the optimistic edge the same way,
// Nominal the nominal run's value (KV x1, speed x1, the plan's seed). So
// for TTFB Low >= High.
type Range struct {
	Low     sim.Float `json:"low"`
	Nominal sim.Float `json:"nominal"`
	High    sim.Float `json:"high"`
}

// Band is one routing at one sessions level over the band's runs.
type Band struct {
	Sessions           int   `json:"sessions"`
	Runs               int   `json:"runs"` // runs in the band (1: nominal only)
	TTFBP95            Range `json:"ttfb_p95_s"`
	TTFBP50            Range `json:"ttfb_p50_s"`
	PrefixHitPct       Range `json:"prefix_hit_pct"`
	OutputTokensPerMin Range `json:"output_tokens_per_min"`
	SessionsPerHour    Range `json:"sessions_per_hour"`
	// Verdict is VerdictMeets, VerdictMarginal or VerdictMisses.
	Verdict string `json:"verdict"`
	// Misses are the targets the pessimistic edge misses, each with the
	// run that gives that edge (empty when Verdict is meets).
	Misses []BandMiss `json:"misses,omitempty"`
}

// BandMiss is a target missed by the band's pessimistic edge, and the run
// that gives it.
type BandMiss struct {
	Miss
	KVScale float64 `json:"kv_scale"`
	// SpeedScale is the run's engine speed scale (0 in a result from
	// before the speed band: read as 1).
	SpeedScale float64 `json:"speed_scale,omitempty"`
	Seed       uint64  `json:"seed"`
}

// variant is one run of the band.
type variant struct {
	kvScale, speedScale float64
	seed                uint64
	farm                int // index of the run's farm in candFarms.farms: one per (KV, speed) pair
}

// variants lists the band's runs of a candidate, the nominal one first:
// every KV scale (only 1 when kvBand is false) with every speed scale (only
// 1 when speedBand is false) with every seed.
func variants(seed uint64, kvBand, speedBand bool) []variant {
	kv, speed := BandKVScales, BandSpeedScales
	if !kvBand {
		kv = kv[:1]
	}
	if !speedBand {
		speed = speed[:1]
	}
	var out []variant
	for i, k := range kv {
		for j, s := range speed {
			for n := range BandSeeds {
				out = append(out, variant{kvScale: k, speedScale: s, seed: seed + uint64(n), farm: i*len(speed) + j})
			}
		}
	}
	return out
}

// band computes the band of one level from the runs' rows there (runs[0]
// the nominal one) and checks the targets on both edges.
func (t Targets) band(runs []sim.Row, vs []variant) Band {
	nom := &runs[0]
	b := Band{Sessions: nom.Sessions, Runs: len(runs)}
	get := func(f func(*sim.Row) float64, isMax bool) (Range, int) {
		r := Range{Nominal: sim.Float(f(nom))}
		worst, best := f(nom), f(nom)
		wi := 0
		for i := range runs {
			v := f(&runs[i])
			switch {
			case math.IsNaN(v):
				if !math.IsNaN(worst) {
					worst, wi = v, i
				}
				continue
			case math.IsNaN(worst):
			case isMax && v > worst, !isMax && v < worst:
				worst, wi = v, i
			}
			if math.IsNaN(best) || (isMax && v < best) || (!isMax && v > best) {
				best = v
			}
		}
		r.Low, r.High = sim.Float(worst), sim.Float(best)
		return r, wi
	}
	var worstRun [4]int
	b.TTFBP95, worstRun[0] = get(func(r *sim.Row) float64 { return float64(r.TTFBP95) }, true)
	b.TTFBP50, _ = get(func(r *sim.Row) float64 { return float64(r.TTFBP50) }, true)
	b.PrefixHitPct, worstRun[1] = get(func(r *sim.Row) float64 { return float64(r.PrefixHitPct) }, false)
	b.OutputTokensPerMin, worstRun[2] = get(func(r *sim.Row) float64 { return float64(r.OutputTokensPerMin) }, false)
	b.SessionsPerHour, worstRun[3] = get(func(r *sim.Row) float64 { return float64(r.SessionsPerHour) }, false)

	low := sim.Row{Sessions: nom.Sessions, TTFBP95: b.TTFBP95.Low, PrefixHitPct: b.PrefixHitPct.Low,
		OutputTokensPerMin: b.OutputTokensPerMin.Low, SessionsPerHour: b.SessionsPerHour.Low}
	lc := t.check(&low)
	for _, m := range lc.Misses {
		for i, ts := range targetSpecs {
			if ts.key == m.Target {
				v := vs[worstRun[i]]
				b.Misses = append(b.Misses, BandMiss{Miss: m, KVScale: v.kvScale, SpeedScale: v.speedScale, Seed: v.seed})
			}
		}
	}
	switch {
	case lc.Meets:
		b.Verdict = VerdictMeets
	case t.check(nom).Meets:
		b.Verdict = VerdictMarginal
	default:
		b.Verdict = VerdictMisses
	}
	return b
}

// nominalBand is the band of a level simulated once (no runs kept).
func (t Targets) nominalBand(r sim.Row, seed uint64) Band {
	return t.band([]sim.Row{r}, []variant{{kvScale: 1, speedScale: 1, seed: seed}})
}

// verdictRank orders verdicts, meets first.
func verdictRank(v string) int {
	switch v {
	case VerdictMeets:
		return 0
	case VerdictMarginal:
		return 1
	}
	return 2
}

// runPhrase says what a band run changes from the nominal one, e.g. "if
// the KV cache is 15 % smaller than estimated", "if the engine is 20 %
// slower than the roofline's defaults", "with other sessions (seed 3)", or
// all three: "if the KV cache is 15 % smaller than estimated and the
// engine 20 % slower than the roofline's defaults, with other sessions
// (seed 3)". A speed scale of 0 (a result from before the speed band) is 1.
func runPhrase(kvScale, speedScale float64, seed, nominalSeed uint64) string {
	s := scalePhrase(kvScale, speedScale)
	if seed != nominalSeed {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("with other sessions (seed %d)", seed)
	}
	if s == "" {
		return "in the nominal run"
	}
	return s
}

// scalePhrase is runPhrase's condition on the KV size and the engine's
// speed, "" for the nominal ones.
func scalePhrase(kvScale, speedScale float64) string {
	var conds []string
	switch {
	case kvScale < 1:
		conds = append(conds, fmt.Sprintf("the KV cache is %s %% smaller than estimated", pct(1-kvScale)))
	case kvScale > 1:
		conds = append(conds, fmt.Sprintf("the KV cache is %s %% larger than estimated", pct(kvScale-1)))
	}
	engine := "the engine is"
	if len(conds) > 0 {
		engine = "the engine" // "... smaller than estimated and the engine 20 % slower ..."
	}
	switch {
	case speedScale > 0 && speedScale < 1:
		conds = append(conds, fmt.Sprintf("%s %s %% slower than the roofline's defaults", engine, pct(1-speedScale)))
	case speedScale > 1:
		conds = append(conds, fmt.Sprintf("%s %s %% faster than the roofline's defaults", engine, pct(speedScale-1)))
	}
	if len(conds) == 0 {
		return ""
	}
	return "if " + strings.Join(conds, " and ")
}

// missesPhrase says which targets a band's pessimistic edge misses and in
// which runs, the misses of one KV size and speed together: "TTFB p95 <=
// 10 s (11.12 s, seed 3) and prefix hit >= 75 % (37.3 %, seed 1) if the
// KV cache is 15 % smaller than estimated and the engine 20 % slower than
// the roofline's defaults"; "TTFB p95 <= 10 s (12.00 s) with other
// sessions (seed 3)". Groups of different runs are joined by "; ".
func (t Targets) missesPhrase(ms []BandMiss, nominalSeed uint64) string {
	type group struct {
		kv, speed float64
		ms        []BandMiss
	}
	var groups []*group
	for _, m := range ms {
		speed := m.SpeedScale
		if speed == 0 {
			speed = 1
		}
		i := slices.IndexFunc(groups, func(g *group) bool { return g.kv == m.KVScale && g.speed == speed })
		if i < 0 {
			groups = append(groups, &group{kv: m.KVScale, speed: speed})
			i = len(groups) - 1
		}
		groups[i].ms = append(groups[i].ms, m)
	}
	var out []string
	for _, g := range groups {
		oneSeed := !slices.ContainsFunc(g.ms, func(m BandMiss) bool { return m.Seed != g.ms[0].Seed })
		var items []string
		for _, m := range g.ms {
			if oneSeed {
				items = append(items, t.MissPhrase(m.Miss))
			} else {
				items = append(items, fmt.Sprintf("%s (%s, seed %d)", phraseOf(t, m.Target), fmtValue(m.Miss), m.Seed))
			}
		}
		tail := scalePhrase(g.kv, g.speed)
		if oneSeed {
			tail = runPhrase(g.kv, g.speed, g.ms[0].Seed, nominalSeed)
		}
		s := joinAnd(items)
		if tail != "" {
			s += " " + tail
		}
		out = append(out, s)
	}
	return strings.Join(out, "; ")
}

func pct(f float64) string { return strconv.FormatFloat(math.Round(100*f*10)/10, 'f', -1, 64) }

// marginalWhy says why a band is marginal: what the nominal run meets,
// which targets the pessimistic edge misses in which run, and what would
// decide it, e.g. "meets at the nominal KV size; misses prefix hit >= 75 %
// (61.2 %) if the KV cache is 15 % smaller than estimated: one replica's
// measured num_gpu_blocks decides it (...)", or, for a miss on a slower
// engine, "meets at the roofline's speed; misses ...: one replica's
// measured step time decides it (...)"; the result's BuyerCheck says how
// to measure them without owning the card (buyer.go).
func (t Targets) marginalWhy(b Band, nominalSeed uint64) string {
	if b.Verdict != VerdictMarginal {
		return ""
	}
	kv, speed := false, false
	for _, m := range b.Misses {
		kv = kv || m.KVScale != 1
		speed = speed || (m.SpeedScale != 0 && m.SpeedScale != 1)
	}
	missed := t.missesPhrase(b.Misses, nominalSeed)
	switch {
	case kv && speed:
		return "meets at the nominal KV size and speed; misses " + missed +
			": one replica's measured num_gpu_blocks and step time decide it (warden calibrate; the plan says how to measure before buying)"
	case kv:
		return "meets at the nominal KV size; misses " + missed + ": one replica's measured num_gpu_blocks decides it (the plan says how to measure before buying)"
	case speed:
		return "meets at the roofline's speed; misses " + missed +
			": one replica's measured step time decides it (warden calibrate; the plan says how to measure before buying)"
	}
	return "meets in the nominal run; misses " + missed +
		": the margin is within the run-to-run spread of the sessions; simulate longer steps (duration) to decide"
}
