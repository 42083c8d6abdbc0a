package planner

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/lm-warden/warden/calibrate"
	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/sim"
)

// ObservedOptions turn a plan into "the farm you have, under the load you
// have, and the candidates you name": the current farm and its load are
// read from a Prometheus server (package calibrate) instead of a plan
// file.
type ObservedOptions struct {
	Source metrics.Source
	// Calibrate names the model, the window and the GPU (see
	// calibrate.Options); its Workload, when set, replaces the load
	// derived from the metrics (a journal).
	Calibrate calibrate.Options
	// Replicas are extra replica counts of the current GPU to try besides
	// the current one.
	Replicas []int
	// Tolerance marks a KPI's verdict in the comparison (0: 0.1).
	Tolerance float64
}

// Observation is the prediction of the current farm set against what its
// Prometheus observed over the same window: the simulated farm
// (calibrated, under the derived load, with the routing in use, at the
// concurrency of each part of the window) and the live one, every KPI of
// metrics/kpi.promql evaluated by the same PromQL on both.
type Observation struct {
	Source      string                 `json:"source"`
	Model       string                 `json:"model"`
	Start       time.Time              `json:"start"`
	End         time.Time              `json:"end"`
	Strategy    string                 `json:"strategy"`
	Calibration *calibrate.Calibration `json:"calibration"`
	Sessions    []int                  `json:"sessions"` // simulated concurrency of each part of the window
	Tolerance   float64                `json:"tolerance"`
	KPIs        []calibrate.Comparison `json:"kpis"`
	Predicted   map[string]sim.Float   `json:"predicted"` // every KPI value of the simulation, by key
	Observed    map[string]sim.Float   `json:"observed"`
}

// SolveObserved calibrates the current farm from o.Source, makes it the
// first candidate of p (at its replica count and any o.Replicas) with the
// derived workload at the observed concurrency, solves the plan, and adds
// the prediction-vs-observation comparison to the result. p's own farms are
// further candidates; its workload is replaced; its concurrency, when 0,
// becomes the observed one.
func SolveObserved(ctx context.Context, p Plan, o ObservedOptions) (*Result, error) {
	cal, err := calibrate.Calibrate(ctx, o.Source, o.Calibrate)
	if err != nil {
		return nil, err
	}
	spec := cal.Spec
	replicas := append([]int{spec.Replicas}, o.Replicas...)
	slices.Sort(replicas)
	current := FarmSet{
		GPUs:                []string{spec.GPU},
		Replicas:            slices.Compact(replicas),
		TensorParallelSizes: []int{max(spec.TensorParallelSize, 1)},
		Model:               spec.Model,
		ModelConfig:         spec.ModelConfig,
		WeightsDType:        spec.WeightsDType,
		KVCacheDType:        spec.KVCacheDType,
		VLLM:                spec.VLLM,
		ScrapeInterval:      spec.ScrapeInterval,
		StepTime:            spec.StepTime,
	}
	p.Farms = append([]FarmSet{current}, p.Farms...)
	p.Workload = WorkloadSpec{Workload: cal.Workload.Workload}
	observed := max(1, int(math.Round(cal.Workload.Sessions)))
	if p.Concurrency == 0 {
		p.Concurrency = observed
	}
	if len(p.Sessions) == 0 {
		p.Sessions = []int{observed}
	}
	if !slices.Contains(p.Sessions, observed) {
		p.Sessions = append(p.Sessions, observed)
	}
	if len(p.Strategies) == 0 {
		p.Strategies = slices.Clone(DefaultStrategies)
	}
	if !slices.Contains(p.Strategies, cal.Strategy) {
		p.Strategies = append([]string{cal.Strategy}, p.Strategies...)
	}
	if p.Name == "" {
		p.Name = fmt.Sprintf("The farm you have (%s), under the load you have", spec.Name)
	}
	// The farm you have is the point of this plan, whatever it costs:
	// every candidate is simulated, none left out for a cheaper one.
	p.EveryCandidate = true
	res, err := Solve(ctx, p)
	if err != nil {
		return nil, err
	}
	obs, err := observe(ctx, o, cal, p.Seed)
	if err != nil {
		return nil, err
	}
	res.Observation = obs
	return roundTrip(res)
}

// observe simulates the calibrated farm over the window, part by part at
// the observed concurrency, and compares every KPI with the live farm's.
func observe(ctx context.Context, o ObservedOptions, cal *calibrate.Calibration, seed uint64) (*Observation, error) {
	w := cal.Window
	farm, err := sim.Resolve(cal.Spec)
	if err != nil {
		return nil, fmt.Errorf("plan: the calibrated farm: %w", err)
	}
	var sessions []int
	for _, p := range cal.Workload.Windows {
		n := float64(p.Sessions)
		if math.IsNaN(n) {
			n = cal.Workload.Sessions
		}
		sessions = append(sessions, max(1, int(math.Round(n))))
	}
	if len(sessions) == 0 {
		sessions = []int{max(1, int(math.Round(cal.Workload.Sessions)))}
	}
	parts := len(sessions)
	sessions = mergeRuns(sessions)
	step := (w.Len() / time.Duration(parts) * time.Duration(parts/len(sessions))).Truncate(time.Millisecond)
	var st *metrics.Store
	_, err = sim.Run(ctx, sim.Experiment{
		Farm:       farm,
		Strategies: []string{cal.Strategy},
		Workload:   cal.Workload.Workload,
		Sessions:   sessions,
		Duration:   step,
		Seed:       seed,
		OnStore:    func(_ string, s *metrics.Store) { st = s },
	})
	if err != nil {
		return nil, fmt.Errorf("plan: simulating the current farm: %w", err)
	}
	simWindow := step * time.Duration(len(sessions))
	pred, err := metrics.KPIValues(ctx, &metrics.StoreSource{St: st}, farm.Spec.Model, time.UnixMilli(0).Add(simWindow), simWindow)
	if err != nil {
		return nil, fmt.Errorf("plan: simulated KPIs: %w", err)
	}
	obs, err := metrics.KPIValues(ctx, o.Source, cal.Model, w.End, simWindow)
	if err != nil {
		return nil, fmt.Errorf("plan: observed KPIs: %w", err)
	}
	tol := o.Tolerance
	if tol == 0 {
		tol = 0.1
	}
	return &Observation{
		Source: cal.Source, Model: cal.Model, Start: w.End.Add(-simWindow), End: w.End, Strategy: cal.Strategy,
		Calibration: cal, Sessions: sessions, Tolerance: tol,
		KPIs:      calibrate.Compare(nil, pred, obs, tol),
		Predicted: floats(pred), Observed: floats(obs),
	}, nil
}

func floats(m map[string]float64) map[string]sim.Float {
	out := make(map[string]sim.Float, len(m))
	for k, v := range m {
		out[k] = sim.Float(v)
	}
	return out
}

// mergeRuns merges runs of equal consecutive levels when every run has the
// same length (so that one step duration still fits them all): a session
// is then not cut at every part's end. Otherwise it returns levels.
func mergeRuns(levels []int) []int {
	var out []int
	var runs []int
	for i, l := range levels {
		if i > 0 && l == levels[i-1] {
			runs[len(runs)-1]++
			continue
		}
		out, runs = append(out, l), append(runs, 1)
	}
	for _, r := range runs {
		if r != runs[0] {
			return levels
		}
	}
	return out
}
