package calibrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/metrics/names"
	"github.com/lm-warden/warden/sim"
)

// FitOptions tune the fit of the step-time model.
type FitOptions struct {
	// Step is the simulated time of each concurrency level per evaluation
	// (0: DefaultFitStep). Longer is steadier and slower.
	Step time.Duration
	// MaxIterations bounds the Gauss-Newton iterations (0: 8).
	MaxIterations int
	// Seed of the simulated sessions.
	Seed uint64
}

// DefaultFitStep is the simulated time per concurrency level.
const DefaultFitStep = 5 * time.Minute

// FitInput is what the fit needs: the farm as read (its step_time the
// starting point), the window and the load.
type FitInput struct {
	Spec     sim.FarmSpec
	Model    string
	Window   Window
	Windows  int
	Workload *WorkloadEstimate
	Strategy string
}

// Fit is the step-time model fitted to a farm's latencies.
//
// Method (simulation matching). The step-time model is a roofline per
// engine step, max(FLOPs / (peak x prefill_efficiency), bytes /
// (bandwidth x bandwidth_efficiency)) + overhead, and Prometheus holds no
// per-step data, only per-window sums of per-token and per-request
// latencies. So the fit compares like with like: the window is cut into
// parts, each with its mean concurrency (requests in vLLM); the parts are
// grouped by concurrency level; for each level the observed mean
// inter-token latency (vllm:inter_token_latency_seconds, sum/count) and
// mean prefill time (vllm:request_prefill_time_seconds, else the time to
// first token) are matched with the same figures computed, by the same
// PromQL, on the series of a simulation of the farm under the derived
// workload at that level. The mean inter-token latency is dominated by
// memory-bound decode steps (bandwidth), the prefill time by
// compute-bound prefill chunks (FLOPs); Gauss-Newton on the log residuals
// (log predicted/observed, both figures, all levels) over
// (ln prefill_efficiency, ln bandwidth_efficiency), with a forward
// difference Jacobian (three simulations per iteration, common random
// numbers), converges in a few iterations. The per-step overhead (~0.1 ms
// against decode steps of tens of ms) is not identifiable from these
// histograms and is kept from the base spec (default 100us); Overhead
// says so.
type Fit struct {
	PrefillEfficiency   float64      `json:"prefill_efficiency"`
	BandwidthEfficiency float64      `json:"bandwidth_efficiency"`
	StepOverhead        sim.Duration `json:"step_overhead"`
	Overhead            string       `json:"overhead"` // how the overhead was set
	Initial             sim.StepTime `json:"initial"`
	Iterations          int          `json:"iterations"`
	Converged           bool         `json:"converged"`
	ITLSeries           string       `json:"itl_series"`     // histogram matched for decode ("" none)
	PrefillSeries       string       `json:"prefill_series"` // histogram matched for prefill ("" none)
	Levels              []FitLevel   `json:"levels"`
	// RMSRelErr is the root mean square of the relative errors
	// (predicted/observed - 1) of every matched figure at the solution:
	// the fit's error.
	RMSRelErr float64 `json:"rms_rel_err"`
}

// FitLevel is one concurrency level: observed and predicted means, seconds.
type FitLevel struct {
	Sessions         int       `json:"sessions"`
	Windows          int       `json:"windows"` // parts of the window at this level
	ObservedITL      sim.Float `json:"observed_itl_s"`
	PredictedITL     sim.Float `json:"predicted_itl_s"`
	ObservedPrefill  sim.Float `json:"observed_prefill_s"`
	PredictedPrefill sim.Float `json:"predicted_prefill_s"`
}

// StepTime is the fitted step-time block of a farm spec.
func (f *Fit) StepTime() sim.StepTime {
	return sim.StepTime{PrefillEfficiency: round4(f.PrefillEfficiency), BandwidthEfficiency: round4(f.BandwidthEfficiency), StepOverhead: f.StepOverhead}
}

func round4(v float64) float64 { return math.Round(v*1e4) / 1e4 }

// Bounds of the fitted efficiencies.
const (
	minEfficiency = 0.01
	maxEfficiency = 1.0
)

// histMean is a histogram's observations over windows: sums and counts.
type histMean struct{ sum, count float64 }

func (h histMean) mean() float64 {
	if !(h.count > 0) {
		return math.NaN()
	}
	return h.sum / h.count
}

// level is one concurrency level of the observed window.
type level struct {
	sessions     int
	windows      int
	itl, prefill histMean
}

// firstPresent returns the first of bases (histogram base names) with
// samples of name_count for the model in w.
func firstPresent(ctx context.Context, src metrics.Source, model string, w Window, bases ...string) (string, error) {
	for _, n := range bases {
		ok, err := hasData(ctx, src, sel(n+names.CountSuffix, model), w)
		if err != nil {
			return "", err
		}
		if ok {
			return n, nil
		}
	}
	return "", nil
}

// windowMeans returns per part of w the changes of name_sum and
// name_count.
func windowMeans(ctx context.Context, src metrics.Source, name, model string, w Window, n int) ([]histMean, error) {
	sums, err := deltas(ctx, src, sel(name+names.SumSuffix, model), w, n)
	if err != nil {
		return nil, err
	}
	counts, err := deltas(ctx, src, sel(name+names.CountSuffix, model), w, n)
	if err != nil {
		return nil, err
	}
	out := make([]histMean, n)
	for i := range out {
		if finite(sums[i]) && finite(counts[i]) && counts[i] > 0 {
			out[i] = histMean{sums[i], counts[i]}
		}
	}
	return out, nil
}

// FitStepTime fits the step-time model of in.Spec to the latencies that src
// holds for in.Model in in.Window (see Fit for the method). It returns a
// nil Fit and a warning when the latency histograms are missing (the
// spec's step_time is then kept).
func FitStepTime(ctx context.Context, src metrics.Source, in FitInput, o FitOptions) (*Fit, []string, error) {
	if o.Step <= 0 {
		o.Step = DefaultFitStep
	}
	if o.MaxIterations <= 0 {
		o.MaxIterations = 8
	}
	n := in.Windows
	if n <= 0 {
		n = DefaultWindows
	}
	w, m := in.Window, in.Model
	var warns []string
	itlName, err := firstPresent(ctx, src, m, w, names.VLLMInterTokenLatency, "vllm:time_per_output_token_seconds")
	if err != nil {
		return nil, nil, err
	}
	pfName, err := firstPresent(ctx, src, m, w, names.VLLMRequestPrefillTime, names.VLLMTimeToFirstToken)
	if err != nil {
		return nil, nil, err
	}
	if itlName == "" && pfName == "" {
		return nil, []string{fmt.Sprintf("step_time not fitted: none of %s, %s, %s has data in the window; the spec keeps its step_time (defaults: prefill_efficiency %g, bandwidth_efficiency %g)",
			names.VLLMInterTokenLatency, names.VLLMRequestPrefillTime, names.VLLMTimeToFirstToken, sim.DefaultPrefillEfficiency, sim.DefaultBandwidthEfficiency)}, nil
	}
	if itlName == "" {
		warns = append(warns, fmt.Sprintf("%s missing: bandwidth_efficiency not fitted (kept)", names.VLLMInterTokenLatency))
	} else if itlName != names.VLLMInterTokenLatency {
		warns = append(warns, fmt.Sprintf("%s missing: decode matched on %s instead", names.VLLMInterTokenLatency, itlName))
	}
	if pfName == "" {
		warns = append(warns, fmt.Sprintf("%s and %s missing: prefill_efficiency not fitted (kept)", names.VLLMRequestPrefillTime, names.VLLMTimeToFirstToken))
	} else if pfName != names.VLLMRequestPrefillTime {
		warns = append(warns, fmt.Sprintf("%s missing: prefill matched on %s (it includes queueing)", names.VLLMRequestPrefillTime, pfName))
	}

	// Observed levels.
	step := w.Len() / time.Duration(n)
	conc, err := gaugeMeans(ctx, src, inVLLM(m), w, n, resolution(step))
	if err != nil {
		return nil, nil, err
	}
	scale := 1.0 // sessions per request in vLLM (think time)
	if in.Workload != nil && in.Workload.Sessions > 0 {
		var s float64
		var k int
		for _, c := range conc {
			if finite(c) {
				s, k = s+c, k+1
			}
		}
		if k > 0 && s > 0 {
			scale = in.Workload.Sessions / (s / float64(k))
		}
	}
	var itl, pf []histMean
	if itlName != "" {
		if itl, err = windowMeans(ctx, src, itlName, m, w, n); err != nil {
			return nil, nil, err
		}
	}
	if pfName != "" {
		if pf, err = windowMeans(ctx, src, pfName, m, w, n); err != nil {
			return nil, nil, err
		}
	}
	var levels []level
	for i, c := range conc {
		if !finite(c) || c < 0.5 {
			continue
		}
		s := max(1, int(math.Round(c*scale)))
		j := slices.IndexFunc(levels, func(l level) bool { return l.sessions == s })
		if j < 0 {
			levels = append(levels, level{sessions: s})
			j = len(levels) - 1
		}
		l := &levels[j]
		l.windows++
		if itl != nil {
			l.itl.sum += itl[i].sum
			l.itl.count += itl[i].count
		}
		if pf != nil {
			l.prefill.sum += pf[i].sum
			l.prefill.count += pf[i].count
		}
	}
	slices.SortFunc(levels, func(a, b level) int { return a.sessions - b.sessions })
	if len(levels) == 0 {
		return nil, nil, &NoDataError{Series: []string{names.VLLMNumRequestsRunning}, Model: m, Window: w, Source: src.String()}
	}

	init := in.Spec.StepTime
	if init.PrefillEfficiency == 0 {
		init.PrefillEfficiency = sim.DefaultPrefillEfficiency
	}
	if init.BandwidthEfficiency == 0 {
		init.BandwidthEfficiency = sim.DefaultBandwidthEfficiency
	}
	if init.StepOverhead == 0 {
		init.StepOverhead = sim.Duration(sim.DefaultStepOverhead)
	}
	p := &problem{in: in, o: o, levels: levels, itlName: itlName, pfName: pfName, base: init, cache: map[[2]float64]*eval{}}
	fit, err := p.solve(ctx)
	if err != nil {
		return nil, nil, err
	}
	fit.Initial = init
	fit.ITLSeries, fit.PrefillSeries = itlName, pfName
	if fit.RMSRelErr > 0.15 {
		warns = append(warns, fmt.Sprintf("the fit's error is %.0f%% (RMS of predicted/observed - 1): the simulated farm reproduces these latencies poorly", 100*fit.RMSRelErr))
	}
	if !fit.Converged {
		warns = append(warns, fmt.Sprintf("the step-time fit did not converge in %d iterations", fit.Iterations))
	}
	return fit, warns, nil
}

// problem is one fit: the observed levels and the simulations that
// predict them.
type problem struct {
	in      FitInput
	o       FitOptions
	levels  []level
	itlName string
	pfName  string
	base    sim.StepTime

	mu    sync.Mutex
	cache map[[2]float64]*eval
}

// eval is one simulation's predicted means per level.
type eval struct {
	itl, prefill []float64
	resid        []float64
}

// at simulates the farm with efficiencies exp(x) and returns its
// predictions and log residuals.
func (p *problem) at(ctx context.Context, x [2]float64) (*eval, error) {
	p.mu.Lock()
	if e, ok := p.cache[x]; ok {
		p.mu.Unlock()
		return e, nil
	}
	p.mu.Unlock()
	spec := p.in.Spec
	spec.StepTime = sim.StepTime{PrefillEfficiency: math.Exp(x[0]), BandwidthEfficiency: math.Exp(x[1]), StepOverhead: p.base.StepOverhead}
	farm, err := sim.Resolve(spec)
	if err != nil {
		return nil, fmt.Errorf("calibrate: fit: %w", err)
	}
	sessions := []int{p.levels[0].sessions} // a warm-up step, not compared
	for _, l := range p.levels {
		sessions = append(sessions, l.sessions)
	}
	var st *metrics.Store
	e := sim.Experiment{
		Farm:       farm,
		Strategies: []string{p.in.Strategy},
		Sessions:   sessions,
		Duration:   p.o.Step,
		Seed:       p.o.Seed,
		OnStore:    func(_ string, s *metrics.Store) { st = s },
	}
	if p.in.Workload != nil {
		e.Workload = p.in.Workload.Workload
	}
	if _, err := sim.Run(ctx, e); err != nil {
		return nil, fmt.Errorf("calibrate: fit: %w", err)
	}
	simSrc := &metrics.StoreSource{St: st}
	w := Window{Start: time.UnixMilli(0), End: time.UnixMilli(0).Add(p.o.Step * time.Duration(len(sessions)))}
	ev := &eval{itl: make([]float64, len(p.levels)), prefill: make([]float64, len(p.levels))}
	read := func(name string, obs func(level) histMean, out []float64) error {
		if name == "" {
			for i := range out {
				out[i] = math.NaN()
			}
			return nil
		}
		ms, err := windowMeans(ctx, simSrc, name, p.in.Model, w, len(sessions))
		if err != nil {
			return err
		}
		for i, l := range p.levels {
			out[i] = ms[i+1].mean()
			o := obs(l).mean()
			if finite(o) && o > 0 {
				r := math.Log(out[i] / o)
				if !finite(r) {
					r = math.Log(1e3) // the simulation measured nothing: far off
				}
				ev.resid = append(ev.resid, r)
			}
		}
		return nil
	}
	if err := read(p.itlName, func(l level) histMean { return l.itl }, ev.itl); err != nil {
		return nil, err
	}
	if err := read(p.pfName, func(l level) histMean { return l.prefill }, ev.prefill); err != nil {
		return nil, err
	}
	if len(ev.resid) == 0 {
		return nil, errors.New("calibrate: fit: no level has an observed latency to match")
	}
	p.mu.Lock()
	p.cache[x] = ev
	p.mu.Unlock()
	return ev, nil
}

// solve runs Gauss-Newton over x = (ln pe, ln be); a parameter whose
// figure is missing stays fixed.
func (p *problem) solve(ctx context.Context) (*Fit, error) {
	const h = 0.08 // forward-difference step in log space
	lo, hi := math.Log(minEfficiency), math.Log(maxEfficiency)
	x := [2]float64{math.Log(p.base.PrefillEfficiency), math.Log(p.base.BandwidthEfficiency)}
	free := [2]bool{p.pfName != "", p.itlName != ""}
	fit := &Fit{StepOverhead: p.base.StepOverhead,
		Overhead: fmt.Sprintf("kept at %s: a per-step constant this small against decode steps is not identifiable from latency histograms", time.Duration(p.base.StepOverhead))}
	best, bestSS, stale := x, math.Inf(1), 0
	for it := 0; it < p.o.MaxIterations; it++ {
		fit.Iterations = it + 1
		pts := [][2]float64{x}
		for k := range 2 {
			if free[k] {
				y := x
				y[k] += h
				if y[k] > hi {
					y[k] = x[k] - h
				}
				pts = append(pts, y)
			}
		}
		evs := make([]*eval, len(pts))
		errs := make([]error, len(pts))
		var wg sync.WaitGroup
		for i, pt := range pts {
			wg.Go(func() { evs[i], errs[i] = p.at(ctx, pt) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		r0 := evs[0].resid
		if ss := sumSq(r0); ss < bestSS*0.99 {
			bestSS, best, stale = ss, x, 0
		} else if stale++; stale >= 2 {
			fit.Converged = true // no better point in two iterations: noise level reached
			break
		}
		// Jacobian columns of the free parameters.
		var cols [][]float64
		var idx []int
		j := 1
		for k := range 2 {
			if !free[k] {
				continue
			}
			d := pts[j][k] - x[k]
			col := make([]float64, len(r0))
			for i := range r0 {
				col[i] = (evs[j].resid[i] - r0[i]) / d
			}
			cols, idx = append(cols, col), append(idx, k)
			j++
		}
		delta := gaussNewtonStep(cols, r0)
		step := 0.0
		for c, k := range idx {
			dk := math.Max(-0.7, math.Min(0.7, delta[c]))
			nx := math.Max(lo, math.Min(hi, x[k]+dk))
			step = math.Max(step, math.Abs(nx-x[k]))
			x[k] = nx
		}
		if step < 0.01 {
			fit.Converged = true
			break
		}
	}
	final, err := p.at(ctx, x)
	if err != nil {
		return nil, err
	}
	if sumSq(final.resid) > bestSS {
		// The simulations are noisy near the optimum: keep the best point seen.
		x = best
		if final, err = p.at(ctx, x); err != nil {
			return nil, err
		}
	}
	fit.PrefillEfficiency, fit.BandwidthEfficiency = math.Exp(x[0]), math.Exp(x[1])
	var ss float64
	var k int
	for i, l := range p.levels {
		fl := FitLevel{Sessions: l.sessions, Windows: l.windows, ObservedITL: sim.Float(l.itl.mean()), PredictedITL: sim.Float(final.itl[i]),
			ObservedPrefill: sim.Float(l.prefill.mean()), PredictedPrefill: sim.Float(final.prefill[i])}
		for _, pr := range [][2]float64{{final.itl[i], l.itl.mean()}, {final.prefill[i], l.prefill.mean()}} {
			if finite(pr[0]) && finite(pr[1]) && pr[1] > 0 {
				e := pr[0]/pr[1] - 1
				ss += e * e
				k++
			}
		}
		fit.Levels = append(fit.Levels, fl)
	}
	if k > 0 {
		fit.RMSRelErr = math.Sqrt(ss / float64(k))
	}
	return fit, nil
}

// gaussNewtonStep solves the normal equations (J'J + mu I) d = -J'r for
// one or two columns, with a small ridge mu for stability.
func gaussNewtonStep(cols [][]float64, r []float64) []float64 {
	dot := func(a, b []float64) float64 {
		s := 0.0
		for i := range a {
			s += a[i] * b[i]
		}
		return s
	}
	const mu = 1e-6
	switch len(cols) {
	case 1:
		a := dot(cols[0], cols[0]) + mu
		return []float64{-dot(cols[0], r) / a}
	case 2:
		a, b, d := dot(cols[0], cols[0])+mu, dot(cols[0], cols[1]), dot(cols[1], cols[1])+mu
		g0, g1 := -dot(cols[0], r), -dot(cols[1], r)
		det := a*d - b*b
		if math.Abs(det) < 1e-12 {
			return []float64{g0 / a, g1 / d}
		}
		return []float64{(d*g0 - b*g1) / det, (a*g1 - b*g0) / det}
	}
	return nil
}

func sumSq(r []float64) float64 {
	s := 0.0
	for _, v := range r {
		s += v * v
	}
	return s
}
