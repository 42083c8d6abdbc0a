package web

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/lm-warden/warden/planner"
)

// A kpi picks one figure's range out of a band (planner.Band): the report charts and tabulates
// TTFB p95 and the prefix hit rate with theirs.
type kpi func(*planner.Band) planner.Range

func ttfbP95(b *planner.Band) planner.Range   { return b.TTFBP95 }
func prefixHit(b *planner.Band) planner.Range { return b.PrefixHitPct }

// banded says whether the result carries the uncertainty band (a result from before bands has
// no band.kv_scales).
func banded(res *planner.Result) bool { return res.Band.KVScales != nil }

// bandSentence says what the bands in parentheses are, from the result's Band (which KV
// scales, engine speed scales and seeds were run), and what the verdicts mean, with the
// headroom; or that the result has no band.
func bandSentence(res *planner.Result) string {
	band := res.Band
	if len(band.KVScales) == 0 {
		return "This result carries no uncertainty band: each figure is one run at the estimated KV cache size."
	}
	var parts []string
	runs := 1
	if sc := scaleWords(band.KVScales, 2); len(sc) > 1 {
		parts = append(parts, "the KV cache at "+joinAndWeb(sc)+" of its estimated size (not where num_gpu_blocks is given: that is exact)")
		runs *= len(sc)
	}
	if sp := scaleWords(band.SpeedScales, 1); len(sp) > 1 {
		parts = append(parts, "the engine at "+joinAndWeb(sp)+" the speed of the roofline's default efficiencies (not where step_time "+
			"was calibrated, e.g. by warden calibrate)")
		runs *= len(sp)
	}
	sd := make([]string, len(band.Seeds))
	for i, seed := range band.Seeds {
		sd[i] = strconv.FormatUint(seed, 10)
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
	if len(band.SpeedScales) > 0 && words == "" { // a result from before the speed band ran every run at every level
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

// scaleWords writes a band's scales ascending, "x0.85", with digits decimals.
func scaleWords(scales []float64, digits int) []string {
	sorted := slices.Sorted(slices.Values(scales))
	out := make([]string, len(sorted))
	for i, f := range sorted {
		out[i] = "x" + strconv.FormatFloat(f, 'f', digits, 64)
	}
	return out
}

// kpiRange is candidate c's range of one KPI at the wanted concurrency, nil when the result
// carries no band for it.
func kpiRange(c *planner.Candidate, k kpi) *planner.Range {
	if c.KPIs == nil {
		return nil
	}
	r := k(c.KPIs)
	return &r
}

// kpiRuns is the number of runs in candidate c's band at the wanted concurrency (0: none).
func kpiRuns(c *planner.Candidate) int {
	if c.KPIs == nil {
		return 0
	}
	return c.KPIs.Runs
}

// bandEdge is the pessimistic edge of a KPI's range (its Low: the worst run, the highest TTFB
// or the lowest hit %), else v.
func bandEdge(r *planner.Range, v float64) float64 {
	if r != nil && finite(float64(r.Low)) {
		return float64(r.Low)
	}
	return v
}

// withBand is a figure with its band, e.g. "3.11 (3.10-8.36)", "24.87 (nominal run only)" for
// a band of one run (runs 1) in a banded result, or the figure alone when r is nil or an edge
// measured nothing.
func withBand(v float64, r *planner.Range, digits int, runs int) string {
	out := fmtNum(v, digits)
	if r == nil || !finite(float64(r.Low)) || !finite(float64(r.High)) {
		return out
	}
	if runs == 1 {
		return out + " (nominal run only)"
	}
	lo, hi := float64(r.Low), float64(r.High)
	return out + " (" + fmtNum(math.Min(lo, hi), digits) + "-" + fmtNum(math.Max(lo, hi), digits) + ")"
}

// kpiBand is the uncertainty band of one KPI at each sessions level of cfg, its Bands' low and
// high edges: nil, nil when the result carries none (a result from before bands, or a band of
// one run, low = high at every level).
func kpiBand(cfg *planner.Config, k kpi) (low, high []float64) {
	n := len(cfg.Rows)
	if len(cfg.Bands) != n {
		return nil, nil
	}
	lo, hi := nanSlice(n), nanSlice(n)
	found, spread := false, false
	for i := range cfg.Bands {
		r := k(&cfg.Bands[i])
		a, b := float64(r.Low), float64(r.High)
		if finite(a) && finite(b) {
			lo[i], hi[i], found = a, b, true
			spread = spread || a != b
		}
	}
	if found && spread {
		return lo, hi
	}
	return nil, nil
}
