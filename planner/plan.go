package planner

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/internal/strictyaml"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// Plan is a capacity question: which of these farms, with which routing,
// serves this workload at this concurrency within these targets? It is read
// from a YAML plan file (ParsePlan, LoadPlan; see examples/default.yaml) or
// built in code (the CLI builds one from its flags). Zero fields take the
// defaults documented on each field; Solve checks the plan first.
type Plan struct {
	// Name titles the report; "" makes one from the question.
	Name string `yaml:"name" json:"name,omitempty"`
	// Workload is the load: synthetic agent sessions or a trace.
	Workload WorkloadSpec `yaml:"workload" json:"workload"`
	// Farms are the candidate sets; each expands to GPUs x tensor parallel
	// sizes x replica counts candidates.
	Farms []FarmSet `yaml:"farms" json:"farms"`
	// Prices are per-GPU hourly prices (any currency, the same for all),
	// keyed by catalogue GPU name or alias (price.go). A candidate GPU
	// without one takes the price list's (hardware.LookupPrice, US
	// dollars) when the plan is priced: when it mixes GPU kinds, or gives
	// a price for any; one kind and no price rank by card count.
	Prices map[string]float64 `yaml:"prices" json:"prices,omitempty"`
	// PricesFrom says who gave Prices, for the result's Prices ("--price";
	// "": the plan file).
	PricesFrom string `yaml:"-" json:"-"`
	// Strategies to try; nil means least-loaded and affinity.
	Strategies []string `yaml:"strategies" json:"strategies"`
	// SpillThresholds to try with affinity ("auto" or a count of requests
	// in flight); nil means [auto]. Other strategies have no threshold and
	// run once.
	SpillThresholds []string `yaml:"spill_thresholds" json:"spill_thresholds"`
	// Sessions are the concurrency levels simulated, ascending (sorted and
	// deduplicated; Concurrency and its headroom level are added when
	// missing). nil: 4, 8, 16.
	Sessions []int `yaml:"sessions" json:"sessions"`
	// Concurrency is the number of concurrent sessions the answer is for;
	// 0 means the highest Sessions level.
	Concurrency int `yaml:"concurrency" json:"concurrency"`
	// Headroom is the extra load a candidate must also carry: it meets the
	// targets only if its band's pessimistic edge meets them at Concurrency
	// and at HeadroomLevel(Concurrency, Headroom) sessions too (headroom.go).
	// "20%" in a plan file; nil means DefaultHeadroom (20 %), 0 none.
	Headroom *Percent `yaml:"headroom" json:"headroom,omitempty"`
	// Duration of one measured step; 0 means one minute.
	Duration sim.Duration `yaml:"duration" json:"duration"`
	// Seed of the synthetic sessions; every candidate sees the same ones.
	Seed uint64 `yaml:"seed" json:"seed"`
	// Targets are the service levels a farm must meet; at least one.
	Targets Targets `yaml:"targets" json:"targets"`
	// EveryCandidate simulates every candidate that fits. By default a
	// plan simulates its candidates by cost, cheapest first, and stops
	// once one meets the targets: the dearer ones cannot be the answer
	// (Candidate.NotSimulated says so).
	EveryCandidate bool `yaml:"every_candidate" json:"every_candidate,omitempty"`

	// Parallelism bounds the simulations run at once; 0 means GOMAXPROCS.
	Parallelism int `yaml:"-" json:"-"`
	// Progress, when set, is called now and then with the simulated time
	// done and in total over every simulation of the plan. Calls are
	// serialised; done never decreases.
	Progress func(done, total time.Duration) `yaml:"-" json:"-"`
	// Note, when set, is told what each simulation that starts is, e.g.
	// "16 x H100 SXM, affinity (spill auto), KV x0.85, speed x1, seed 1,
	// 64-308 sessions" (for progress lines). Calls may come from several
	// goroutines at once.
	Note func(what string) `yaml:"-" json:"-"`

	// prices are the resolved hourly prices by canonical GPU name
	// (resolvePrices; Solve sets them), nil to rank by card count.
	prices map[string]float64

	// fullBand (tests) runs every run of the band at every level and
	// probe, with none of the work that cannot change a verdict left out
	// (simulate's second phase, the bisection's first stage).
	fullBand bool
	// noAhead (tests) turns the shared warm-ups off (skip.go).
	noAhead bool
}

// Defaults of a plan.
var (
	DefaultSessions   = []int{4, 8, 16}
	DefaultStrategies = []string{placement.StrategyLeastLoaded, placement.StrategyAffinity}
)

// DefaultDuration is the length of one measured step of a plan: shorter
// than the simulator's three minutes, so that a sweep of many candidates
// stays quick.
const DefaultDuration = time.Minute

// WorkloadSpec is either synthetic agent sessions (the keys of
// traces.Workload, defaults from traces.DefaultWorkload) or a trace file
// replayed in a closed loop at each sessions level.
type WorkloadSpec struct {
	// Trace is the path of a trace file (JSONL, optionally gzipped); in a
	// plan file it is relative to the file. With a trace, no synthetic key
	// may be given.
	Trace string `yaml:"trace" json:"trace,omitempty"`
	// Preset names a workload preset (traces.PresetNames; `warden plan
	// --workload` also takes a workload file): its keys replace the
	// synthetic keys, which may then not be set.
	Preset          string `yaml:"preset" json:"preset,omitempty"`
	traces.Workload `yaml:",inline" json:"synthetic"`
}

// Targets are service levels; a zero field sets no target. A farm meets the
// targets at a sessions level when every set one holds for that step.
type Targets struct {
	TTFBP95MaxS           float64 `yaml:"ttfb_p95_s_max" json:"ttfb_p95_s_max,omitempty"`
	PrefixHitPctMin       float64 `yaml:"prefix_hit_pct_min" json:"prefix_hit_pct_min,omitempty"`
	OutputTokensPerMinMin float64 `yaml:"output_tokens_per_min_min" json:"output_tokens_per_min_min,omitempty"`
	SessionsPerHourMin    float64 `yaml:"sessions_per_hour_min" json:"sessions_per_hour_min,omitempty"`
}

// FarmSet is a family of candidate farms: every GPU kind x tensor parallel
// size x replica count, all serving Model with the same engine arguments.
type FarmSet struct {
	GPUs                []string     `yaml:"gpus" json:"gpus"`
	Replicas            []int        `yaml:"replicas" json:"replicas"`
	TensorParallelSizes []int        `yaml:"tensor_parallel_sizes" json:"tensor_parallel_sizes,omitempty"` // nil: [1]
	Model               string       `yaml:"model" json:"model,omitempty"`
	ModelConfig         string       `yaml:"model_config" json:"model_config,omitempty"` // path of a config.json, relative to the plan file
	WeightsDType        string       `yaml:"weights_dtype" json:"weights_dtype,omitempty"`
	KVCacheDType        string       `yaml:"kv_cache_dtype" json:"kv_cache_dtype,omitempty"`
	VLLM                sim.VLLMSpec `yaml:"vllm" json:"vllm"`
	ScrapeInterval      sim.Duration `yaml:"scrape_interval" json:"scrape_interval,omitempty"`
	StepTime            sim.StepTime `yaml:"step_time" json:"step_time"`
}

// LoadPlan reads and checks a plan file. Relative trace and model_config
// paths are made relative to the file's directory.
func LoadPlan(path string) (Plan, error) { return LoadPlanWith(path, ParseOptions{}) }

// ParseOptions change how a plan file is read.
type ParseOptions struct {
	// DefaultTargets, when set, are the targets of a plan file that sets
	// none (no targets: key at all): the command line's, whose flags have
	// defaults. A file that sets targets: keeps exactly its own.
	DefaultTargets *Targets
}

// LoadPlanWith is LoadPlan with options.
func LoadPlanWith(path string, opts ParseOptions) (Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Plan{}, err
	}
	p, err := ParsePlanWith(data, path, opts)
	if err != nil {
		return Plan{}, err
	}
	dir := filepath.Dir(path)
	rel := func(s string) string {
		if s == "" || filepath.IsAbs(s) {
			return s
		}
		return filepath.Join(dir, s)
	}
	p.Workload.Trace = rel(p.Workload.Trace)
	for i := range p.Farms {
		p.Farms[i].ModelConfig = rel(p.Farms[i].ModelConfig)
	}
	return p, nil
}

// ParsePlan parses and checks a plan; name is used in errors, which read
// "name:line: key: reason" (key a dotted path such as farms[1].replicas).
// Unknown keys, values of the wrong type and values out of range are
// errors; files (traces, model configs) are not opened here.
func ParsePlan(data []byte, name string) (Plan, error) {
	return ParsePlanWith(data, name, ParseOptions{})
}

// ParsePlanWith is ParsePlan with options.
func ParsePlanWith(data []byte, name string, opts ParseOptions) (Plan, error) {
	p := Plan{Workload: WorkloadSpec{Workload: traces.DefaultWorkload()}}
	doc, err := strictyaml.Decode(name, data, &p)
	if err != nil {
		return Plan{}, err
	}
	if doc.Empty() {
		if opts.DefaultTargets != nil {
			return Plan{}, fmt.Errorf("%s: empty plan (want at least farms)", name)
		}
		return Plan{}, fmt.Errorf("%s: empty plan (want at least farms and targets)", name)
	}
	if opts.DefaultTargets != nil && !slices.ContainsFunc(doc.Paths(), func(k string) bool {
		return k == "targets" || strings.HasPrefix(k, "targets.")
	}) {
		p.Targets = *opts.DefaultTargets
	}
	// A trace replaces the synthetic workload: no synthetic key may be set.
	if p.Workload.Trace != "" {
		for _, key := range doc.Paths() { // in file order: the first one is named
			if k, ok := strings.CutPrefix(key, "workload."); ok && k != "trace" {
				return Plan{}, doc.Errorf(key, "a trace workload takes no synthetic keys")
			}
		}
	}
	// So does a preset.
	if p.Workload.Preset != "" {
		for _, key := range doc.Paths() {
			if k, ok := strings.CutPrefix(key, "workload."); ok && k != "preset" {
				return Plan{}, doc.Errorf(key, "a workload preset takes no other workload keys (write a workload file instead)")
			}
		}
		if !traces.IsPresetName(p.Workload.Preset) {
			return Plan{}, doc.Errorf("workload.preset", "%q is not a preset name (the presets: %s)", p.Workload.Preset, strings.Join(traces.PresetNames(), ", "))
		}
		w, err := traces.Preset(p.Workload.Preset)
		if err != nil {
			return Plan{}, doc.Errorf("workload.preset", "%v", err)
		}
		p.Workload.Workload = w
	}
	if err := p.check(false); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			if l, ok := doc.Nearest(fe.Key); ok {
				return Plan{}, fmt.Errorf("%s:%d: %w", name, l, err)
			}
		}
		return Plan{}, fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}

// FieldError is a bad plan value; Key is its dotted YAML path, with
// sequence indexes, e.g. "farms[0].replicas[2]".
type FieldError struct {
	Key    string
	Reason string
}

func (e *FieldError) Error() string { return e.Key + ": " + e.Reason }

func bad(key, format string, args ...any) error {
	return &FieldError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// withDefaults returns the plan with its zero fields filled and its
// sessions sorted, the concurrency and its headroom level among them.
func (p Plan) withDefaults() Plan {
	if p.Workload.Trace == "" && p.Workload.Workload.IsZero() {
		p.Workload.Workload = traces.DefaultWorkload()
	}
	if len(p.Strategies) == 0 {
		p.Strategies = slices.Clone(DefaultStrategies)
	}
	if len(p.SpillThresholds) == 0 {
		p.SpillThresholds = []string{"auto"}
	}
	if len(p.Sessions) == 0 {
		p.Sessions = slices.Clone(DefaultSessions)
	}
	p.Sessions = slices.Clone(p.Sessions)
	if p.Concurrency > 0 && !slices.Contains(p.Sessions, p.Concurrency) {
		p.Sessions = append(p.Sessions, p.Concurrency)
	}
	slices.Sort(p.Sessions)
	p.Sessions = slices.Compact(p.Sessions)
	if p.Concurrency == 0 && len(p.Sessions) > 0 {
		p.Concurrency = p.Sessions[len(p.Sessions)-1]
	}
	if p.Headroom == nil {
		p.Headroom = HeadroomOf(DefaultHeadroom)
	}
	if l := HeadroomLevel(p.Concurrency, p.headroom()); l > 0 && l <= maxSessionsLevel && !slices.Contains(p.Sessions, l) {
		p.Sessions = append(p.Sessions, l)
		slices.Sort(p.Sessions)
	}
	if p.Duration == 0 {
		p.Duration = sim.Duration(DefaultDuration)
	}
	farms := make([]FarmSet, len(p.Farms))
	for i, f := range p.Farms {
		if len(f.TensorParallelSizes) == 0 {
			f.TensorParallelSizes = []int{1}
		}
		farms[i] = f
	}
	p.Farms = farms
	return p
}

// maxSessionsLevel bounds a sessions level (the simulator's own bound is
// higher; a plan beyond this is a typo).
const maxSessionsLevel = 100000

// check validates the plan; with defaults false it checks the values as
// written (ParsePlan), with true after withDefaults (Solve). Errors are
// *FieldError naming the key.
func (p Plan) check(defaults bool) error {
	if !defaults {
		p = p.withDefaults()
	}
	if p.Workload.Trace == "" {
		if err := p.Workload.Validate(); err != nil {
			var fe *traces.FieldError
			if errors.As(err, &fe) {
				return bad("workload."+fe.Key, "%s", fe.Reason)
			}
			return bad("workload", "%v", err)
		}
	}
	if len(p.Farms) == 0 {
		return bad("farms", "required: at least one candidate set (gpus, replicas, model)")
	}
	for i, f := range p.Farms {
		if err := f.check(fmt.Sprintf("farms[%d]", i)); err != nil {
			return err
		}
	}
	if _, _, err := p.resolvePrices(); err != nil {
		return err
	}
	for i, s := range p.Strategies {
		if err := placement.ValidSpec(s); err != nil {
			return bad(fmt.Sprintf("strategies[%d]", i), "%v", err)
		}
		if slices.Index(p.Strategies, s) != i {
			return bad(fmt.Sprintf("strategies[%d]", i), "%q listed twice", s)
		}
	}
	for i, s := range p.SpillThresholds {
		if _, err := placement.ParseSpillThreshold(s); err != nil {
			return bad(fmt.Sprintf("spill_thresholds[%d]", i), "%v", err)
		}
		if slices.Index(p.SpillThresholds, s) != i {
			return bad(fmt.Sprintf("spill_thresholds[%d]", i), "%q listed twice", s)
		}
	}
	if err := p.checkHeadroom(); err != nil {
		return err
	}
	for i, n := range p.Sessions {
		if n < 1 || n > maxSessionsLevel {
			return bad(fmt.Sprintf("sessions[%d]", i), "want 1 to %d concurrent sessions, got %d", maxSessionsLevel, n)
		}
	}
	if p.Concurrency < 0 || p.Concurrency > maxSessionsLevel {
		return bad("concurrency", "want 1 to %d concurrent sessions (0: the highest sessions level), got %d", maxSessionsLevel, p.Concurrency)
	}
	if d := time.Duration(p.Duration); d < time.Second {
		return bad("duration", "want at least 1s per step, got %s", d)
	}
	return p.Targets.validate()
}

func (t Targets) validate() error {
	for _, f := range []struct {
		key string
		v   float64
		max float64
	}{
		{"targets.ttfb_p95_s_max", t.TTFBP95MaxS, math.Inf(1)},
		{"targets.prefix_hit_pct_min", t.PrefixHitPctMin, 100},
		{"targets.output_tokens_per_min_min", t.OutputTokensPerMinMin, math.Inf(1)},
		{"targets.sessions_per_hour_min", t.SessionsPerHourMin, math.Inf(1)},
	} {
		if !(f.v >= 0 && f.v <= f.max) {
			return bad(f.key, "want a number from 0 (no target) to %g, got %g", f.max, f.v)
		}
	}
	if t == (Targets{}) {
		return bad("targets", "required: at least one of ttfb_p95_s_max, prefix_hit_pct_min, output_tokens_per_min_min, sessions_per_hour_min")
	}
	return nil
}

func (f FarmSet) check(key string) error {
	if len(f.GPUs) == 0 {
		return bad(key+".gpus", "required: at least one GPU name (e.g. \"RTX A4000\")")
	}
	for i, g := range f.GPUs {
		if _, err := hardware.LookupGPU(g); err != nil {
			return bad(fmt.Sprintf("%s.gpus[%d]", key, i), "%v", err)
		}
	}
	if len(f.Replicas) == 0 {
		return bad(key+".replicas", "required: at least one replica count")
	}
	for i, n := range f.Replicas {
		if n < 1 || n > 4096 {
			return bad(fmt.Sprintf("%s.replicas[%d]", key, i), "want 1 to 4096, got %d", n)
		}
	}
	for i, n := range f.TensorParallelSizes {
		if n < 1 || n > 64 {
			return bad(fmt.Sprintf("%s.tensor_parallel_sizes[%d]", key, i), "want 1 to 64, got %d", n)
		}
	}
	if f.Model == "" && f.ModelConfig == "" {
		return bad(key+".model", "required: a model name (or model_config: path/to/config.json)")
	}
	if f.Model != "" && f.ModelConfig != "" {
		return bad(key+".model_config", "give model or model_config, not both")
	}
	if f.Model != "" {
		if _, err := hardware.LookupModel(f.Model); err != nil {
			return bad(key+".model", "%v", err)
		}
	}
	// Everything else sim.Resolve checks, on a spec whose KV cache is
	// forced to fit: a farm that does not fit is an answer, not a plan error.
	spec := f.spec(f.GPUs[0], f.Replicas[0], f.TensorParallelSizes[0])
	if spec.ModelConfig != "" {
		return nil // read when solving
	}
	spec.VLLM.NumGPUBlocks = max(spec.VLLM.NumGPUBlocks, 2)
	if _, err := sim.Resolve(spec); err != nil {
		sub, reason, ok := strings.Cut(err.Error(), ": ")
		if ok && !strings.Contains(sub, " ") {
			return bad(key+"."+sub, "%s", reason)
		}
		return bad(key, "%v", err)
	}
	return nil
}

// spec is the sim farm spec of one candidate of the set.
func (f FarmSet) spec(gpu string, replicas, tp int) sim.FarmSpec {
	return sim.FarmSpec{
		Model:              f.Model,
		ModelConfig:        f.ModelConfig,
		WeightsDType:       f.WeightsDType,
		KVCacheDType:       f.KVCacheDType,
		GPU:                gpu,
		Replicas:           replicas,
		TensorParallelSize: tp,
		VLLM:               f.VLLM,
		ScrapeInterval:     f.ScrapeInterval,
		StepTime:           f.StepTime,
	}
}

// title is the report's title.
func (p Plan) title() string {
	return cmp.Or(p.Name, "LM Warden capacity plan")
}
