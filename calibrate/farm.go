package calibrate

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/metrics/names"
	"github.com/lm-warden/warden/sim"
)

// Options say what to calibrate.
type Options struct {
	Model  string // model_name in vLLM's series; also the catalogue model unless Base.Model is set
	Window Window
	// GPU is the catalogue GPU of the farm (metrics do not name it);
	// required unless Base.GPU is set.
	GPU string
	// Base is the starting spec: weights and KV dtypes, tensor parallel
	// size, routing. Calibration overwrites model, gpu, replicas,
	// vllm.block_size, vllm.num_gpu_blocks, vllm.max_num_seqs (when
	// exposed) and step_time.
	Base sim.FarmSpec
	// Windows is the number of parts the window is cut into (0:
	// DefaultWindows).
	Windows int
	// Workload, when set, is the load to fit with (e.g. from a journal);
	// nil derives it from the source.
	Workload *WorkloadEstimate
	// Fit tunes the fit of the step-time model.
	Fit FitOptions
}

// Calibration is a farm read from its metrics: the farm spec the simulator
// uses as is, what each figure came from, and the fit.
type Calibration struct {
	Spec   sim.FarmSpec `json:"spec"`
	Model  string       `json:"model"`
	Source string       `json:"source"`
	Window Window       `json:"window"`

	Engines      int `json:"engines"`
	BlockSize    int `json:"block_size"`
	NumGPUBlocks int `json:"num_gpu_blocks"`
	// KVTokensPerReplica is num_gpu_blocks x block_size, vLLM's figure.
	KVTokensPerReplica int    `json:"kv_tokens_per_replica"`
	MaxNumSeqs         int    `json:"max_num_seqs"`
	MaxNumSeqsFrom     string `json:"max_num_seqs_from"`
	MaxRunningSeen     int    `json:"max_running_seen"`

	Strategy    string            `json:"strategy"` // the routing that served the window
	StrategyHow string            `json:"strategy_how"`
	Workload    *WorkloadEstimate `json:"workload"`
	Fit         *Fit              `json:"fit"`
	Warnings    []string          `json:"warnings,omitempty"`
}

// engineConfig is what vllm:cache_config_info says of one engine.
type engineConfig struct {
	instance, engine        string
	blockSize, numGPUBlocks int
	gpuMemUtil              float64
	maxNumSeqs, maxBatched  int
	maxModelLen             int
}

// Calibrate reads the farm that served opts.Model in opts.Window: its
// engines, their KV cache (vllm:cache_config_info: num_gpu_blocks x
// block_size, exact), max_num_seqs when a config-info series exposes it,
// the routing in use, the workload, and the step-time model fitted to the
// observed latencies (see Fit). Required series that are missing give a
// *NoDataError naming them; optional ones a warning saying what was
// assumed.
func Calibrate(ctx context.Context, src metrics.Source, o Options) (*Calibration, error) {
	w, m := o.Window, o.Model
	if m == "" {
		return nil, fmt.Errorf("calibrate: no model name (want the model_name of vLLM's series)")
	}
	if err := metrics.Ping(ctx, src, w.End); err != nil {
		return nil, err
	}
	if err := CheckModel(ctx, src, m, w); err != nil {
		return nil, err
	}
	spec := o.Base
	if spec.Model == "" {
		spec.Model = m
	}
	if o.GPU != "" {
		spec.GPU = o.GPU
	}
	if spec.GPU == "" {
		return nil, fmt.Errorf("calibrate: the GPU is not in the metrics: name it (--gpu, a catalogue name such as \"RTX A4000\")")
	}
	if _, err := hardware.LookupModel(spec.Model); err != nil && spec.ModelConfig == "" {
		return nil, fmt.Errorf("calibrate: model %q is not in the catalogue (give the farm's model_config in a base spec): %w", spec.Model, err)
	}
	c := &Calibration{Model: m, Source: src.String(), Window: w}

	// Engines and their KV caches.
	rng := promDur(w.Len())
	running := sel(names.VLLMNumRequestsRunning, m)
	engines, err := src.Instant(ctx, fmt.Sprintf("max_over_time(%s[%s])", running, rng), w.End)
	if err != nil {
		return nil, err
	}
	if len(engines) == 0 {
		return nil, &NoDataError{Series: []string{names.VLLMNumRequestsRunning}, Model: m, Window: w, Source: src.String()}
	}
	c.Engines = len(engines)
	for _, e := range engines {
		c.MaxRunningSeen = max(c.MaxRunningSeen, int(e.F))
	}
	cfgs, err := cacheConfigs(ctx, src, m, w)
	if err != nil {
		return nil, err
	}
	if len(cfgs) == 0 {
		return nil, &NoDataError{Series: []string{names.VLLMCacheConfigInfo + " (labels num_gpu_blocks, block_size)"}, Model: m, Window: w, Source: src.String()}
	}
	blocks, bs := cfgs[0].numGPUBlocks, cfgs[0].blockSize
	for _, e := range cfgs[1:] {
		if e.numGPUBlocks != blocks || e.blockSize != bs {
			c.Warnings = append(c.Warnings, fmt.Sprintf("engines differ in KV cache (%d x %d tokens on one, %d x %d on another): the farm spec takes the smallest",
				blocks, bs, e.numGPUBlocks, e.blockSize))
		}
		if e.numGPUBlocks*e.blockSize < blocks*bs {
			blocks, bs = e.numGPUBlocks, e.blockSize
		}
	}
	if len(cfgs) != c.Engines {
		c.Warnings = append(c.Warnings, fmt.Sprintf("%d engines serve %s but %d carry %s: the others are assumed alike", c.Engines, m, len(cfgs), names.VLLMCacheConfigInfo))
	}
	c.BlockSize, c.NumGPUBlocks, c.KVTokensPerReplica = bs, blocks, blocks*bs
	spec.VLLM.BlockSize, spec.VLLM.NumGPUBlocks = bs, blocks
	if u := cfgs[0].gpuMemUtil; u > 0 && u <= 1 {
		spec.VLLM.GPUMemoryUtilization = u
	}
	if l := cfgs[0].maxModelLen; l > 0 {
		spec.VLLM.MaxModelLen = l
	}
	if n := cfgs[0].maxBatched; n > 0 {
		spec.VLLM.MaxNumBatchedTokens = n
	}
	switch {
	case cfgs[0].maxNumSeqs > 0:
		spec.VLLM.MaxNumSeqs = cfgs[0].maxNumSeqs
		c.MaxNumSeqsFrom = names.VLLMCacheConfigInfo + " label max_num_seqs"
	case spec.VLLM.MaxNumSeqs > 0:
		c.MaxNumSeqsFrom = "the base farm spec"
	default:
		c.MaxNumSeqsFrom = "vLLM's default for the GPU (not exposed in metrics)"
	}
	spec.Replicas = c.Engines
	if spec.Name == "" {
		spec.Name = fmt.Sprintf("%d x %s, %s (calibrated from %s)", c.Engines*max(spec.TensorParallelSize, 1), spec.GPU, m, src)
	}

	// The routing in use.
	if c.Strategy, c.StrategyHow, err = RunningStrategy(ctx, src, m, w); err != nil {
		return nil, err
	}
	spec.Routing.Strategy = c.Strategy

	// Resolve once with the defaults, to report max_num_seqs and check.
	farm, err := sim.Resolve(spec)
	if err != nil {
		return nil, fmt.Errorf("calibrate: the farm read from %s does not resolve: %w", src, err)
	}
	c.MaxNumSeqs = farm.Spec.VLLM.MaxNumSeqs
	if cfgs[0].maxNumSeqs == 0 && o.Base.VLLM.MaxNumSeqs == 0 {
		c.Warnings = append(c.Warnings, fmt.Sprintf("max_num_seqs is not in the metrics: assumed %d (vLLM's default on %s; at most %d requests ran at once on one engine in the window); set it with --max-num-seqs",
			c.MaxNumSeqs, farm.GPU.Name, c.MaxRunningSeen))
	}
	if c.MaxRunningSeen > c.MaxNumSeqs {
		c.Warnings = append(c.Warnings, fmt.Sprintf("%d requests ran at once on one engine, above max_num_seqs %d: raised to match", c.MaxRunningSeen, c.MaxNumSeqs))
		spec.VLLM.MaxNumSeqs = c.MaxRunningSeen
	}

	// The load, then the step-time fit.
	wl := o.Workload
	if wl == nil {
		if wl, err = DeriveWorkload(ctx, src, WorkloadOptions{Model: m, Window: w, Windows: o.Windows}); err != nil {
			return nil, err
		}
	}
	c.Workload = wl
	fit, warns, err := FitStepTime(ctx, src, FitInput{Spec: spec, Model: m, Window: w, Windows: o.Windows, Workload: wl, Strategy: c.Strategy}, o.Fit)
	if err != nil {
		return nil, err
	}
	c.Warnings = append(c.Warnings, warns...)
	c.Fit = fit
	if fit != nil {
		spec.StepTime = fit.StepTime()
	}
	c.Spec = spec
	return c, nil
}

// cacheConfigs reads vllm:cache_config_info for the engines that serve
// the model: the info series carries no model_name, so it is matched to
// vllm:num_requests_running{model_name=...} on (instance, engine). When
// that match finds nothing and the source holds a single model, every
// info series is taken.
func cacheConfigs(ctx context.Context, src metrics.Source, model string, w Window) ([]engineConfig, error) {
	rng := promDur(w.Len())
	info := fmt.Sprintf("last_over_time(%s[%s])", names.VLLMCacheConfigInfo, rng)
	joined := fmt.Sprintf("%s * on (instance, engine) group_left () (max by (instance, engine) (last_over_time(%s[%s])) * 0 + 1)",
		info, sel(names.VLLMNumRequestsRunning, model), rng)
	v, err := src.Instant(ctx, joined, w.End)
	if err != nil {
		return nil, err
	}
	if len(v) == 0 {
		models, err := Models(ctx, src, w)
		if err != nil {
			return nil, err
		}
		if len(models) == 1 {
			if v, err = src.Instant(ctx, info, w.End); err != nil {
				return nil, err
			}
		}
	}
	var out []engineConfig
	for _, s := range v {
		l := s.Metric
		atoi := func(name string) int {
			n, _ := strconv.Atoi(l.Get(name))
			return n
		}
		e := engineConfig{
			instance:     l.Get("instance"),
			engine:       l.Get(names.LabelEngine),
			blockSize:    atoi(names.LabelBlockSize),
			numGPUBlocks: atoi(names.LabelNumGPUBlocks),
			maxNumSeqs:   atoi("max_num_seqs"),
			maxBatched:   atoi("max_num_batched_tokens"),
			maxModelLen:  atoi("max_model_len"),
		}
		e.gpuMemUtil, _ = strconv.ParseFloat(l.Get(names.LabelGPUMemoryUtilization), 64)
		if e.blockSize > 0 && e.numGPUBlocks > 1 {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b engineConfig) int {
		if a.instance != b.instance {
			if a.instance < b.instance {
				return -1
			}
			return 1
		}
		ea, _ := strconv.Atoi(a.engine)
		eb, _ := strconv.Atoi(b.engine)
		return ea - eb
	})
	return out, nil
}

// finite reports whether v is a number.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
