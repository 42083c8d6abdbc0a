package planner

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/sim"
)

// The uncertainty band. Before a server runs, the KV cache is an estimate
// (hardware.SizeKV) good to about +-15 %, and one seed of synthetic
// sessions is one draw of many: every candidate, routing and sessions level
// is simulated at each of BandKVScales (sim.FarmSpec.KVCapacityScale) with
// each of BandSeeds seeds (the plan's seed, seed+1, ...). A candidate whose
// vllm.num_gpu_blocks is given (read back from a running server: exact)
// gets no KV band, only the seeds.
var BandKVScales = []float64{1, 0.85, 1.10}

// BandSeeds is the number of seeds of the band (the plan's seed first).
const BandSeeds = 3

// Verdicts of a candidate (and of one routing at one sessions level).
const (
	// VerdictMeets: the band's pessimistic edge meets every target.
	VerdictMeets = "meets"
	// VerdictMarginal: the nominal run (nominal KV size, the plan's seed)
	// meets every target, the pessimistic edge does not.
	VerdictMarginal = "marginal"
	// VerdictMisses: the nominal run misses a target.
	VerdictMisses = "misses"
)

// BandInfo says which runs make the band.
type BandInfo struct {
	// KVScales are the KV capacity scales simulated, the nominal 1 first
	// (only [1] when no candidate has a KV band).
	KVScales []float64 `json:"kv_scales"`
	// Seeds are the seeds simulated, the plan's seed first.
	Seeds []uint64 `json:"seeds"`
}

// Range is one KPI over the band. Low is the pessimistic edge over every
// run (KV scale x seed): the lowest value of a figure that should be high
// (prefix hit %, output tokens per minute, sessions per hour), the highest
// of one that should be low (TTFB); a run that measured nothing makes Low
// null (NaN). High is the optimistic edge the same way, Nominal the
// nominal run's value (KV x1, the plan's seed). So for TTFB Low >= High.
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
	Seed    uint64  `json:"seed"`
}

// variant is one run of the band.
type variant struct {
	kvScale float64
	seed    uint64
}

// variants lists the band's runs of a candidate, the nominal one first:
// every KV scale (only 1 when kvBand is false) with every seed.
func variants(seed uint64, kvBand bool) []variant {
	scales := BandKVScales
	if !kvBand {
		scales = scales[:1]
	}
	var out []variant
	for _, s := range scales {
		for k := range BandSeeds {
			out = append(out, variant{s, seed + uint64(k)})
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
				b.Misses = append(b.Misses, BandMiss{Miss: m, KVScale: v.kvScale, Seed: v.seed})
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
	return t.band([]sim.Row{r}, []variant{{1, seed}})
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
// the KV cache is 15 % smaller than estimated" or "with other sessions
// (seed 3)".
func runPhrase(kvScale float64, seed, nominalSeed uint64) string {
	var parts []string
	switch {
	case kvScale < 1:
		parts = append(parts, fmt.Sprintf("if the KV cache is %s %% smaller than estimated", pct(1-kvScale)))
	case kvScale > 1:
		parts = append(parts, fmt.Sprintf("if the KV cache is %s %% larger than estimated", pct(kvScale-1)))
	}
	if seed != nominalSeed {
		parts = append(parts, fmt.Sprintf("with other sessions (seed %d)", seed))
	}
	if len(parts) == 0 {
		return "in the nominal run"
	}
	return strings.Join(parts, " and ")
}

func pct(f float64) string { return strconv.FormatFloat(math.Round(100*f*10)/10, 'f', -1, 64) }

// marginalWhy says why a band is marginal, e.g. "meets at the nominal KV
// size; misses prefix hit >= 75 % (61.2 %) if the KV cache is 15 % smaller
// than estimated: read num_gpu_blocks from a running server to decide".
func (t Targets) marginalWhy(b Band, nominalSeed uint64) string {
	if b.Verdict != VerdictMarginal {
		return ""
	}
	kv := false
	var missed []string
	for _, m := range b.Misses {
		kv = kv || m.KVScale != 1
		missed = append(missed, t.MissPhrase(m.Miss)+" "+runPhrase(m.KVScale, m.Seed, nominalSeed))
	}
	if kv {
		return "meets at the nominal KV size; misses " + joinAnd(missed) + ": read num_gpu_blocks from a running server to decide"
	}
	return "meets in the nominal run; misses " + joinAnd(missed) +
		": the margin is within the run-to-run spread of the sessions; simulate longer steps (duration) to decide"
}
