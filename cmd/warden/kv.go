package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/internal/num"
	"github.com/lm-warden/warden/sim"
	"github.com/spf13/cobra"
)

// kvOptions are the flags of `warden kv`.
type kvOptions struct {
	GPU                  string
	Model                string
	ModelConfig          string
	WeightsDType         string
	KVCacheDType         string
	GPUMemoryUtilization float64
	TensorParallelSize   int
	BlockSize            int
	MaxModelLen          int
	Context              int
	Sessions             int
	Replicas             int
	MaxNumSeqs           int
	MaxNumBatchedTokens  int
	ECC                  string
	EnforceEager         bool
	VLLMVersion          string // "": sim.DefaultVLLMVersion
	JSON                 bool
	// probe lists local GPUs for --gpu auto; hardware.Probe outside tests.
	probe func() ([]hardware.DetectedGPU, error)
}

// vLLM accepts these block sizes on CUDA.
var validBlockSizes = []int{1, 8, 16, 32, 64, 128}

func newKVCmd() *cobra.Command {
	opts := &kvOptions{probe: hardware.Probe}
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Size the KV cache of a vLLM replica (tokens and blocks) and check sessions x context",
		Long: `Size one vLLM replica's KV cache the way vLLM's start-up profiler does
(gpu_worker.py determine_available_memory): requested memory (CUDA total, less
1/16 with --ecc on for a GDDR card, x gpu_memory_utilization) minus the weights,
the torch activation peak (a max_num_batched_tokens forward, or the sampler's
dummy run over max_num_seqs requests), non-torch memory (kernel images, cuBLAS
workspace, NCCL with tensor parallelism) and what the model runner's
profile_cudagraph_memory returns (none with --enforce-eager), in blocks of
block_size tokens.

--vllm-version picks the release (default: the simulator's) and, through
warden's vLLM version table, the model runner it runs for the model: the V1
runner subtracts its CUDA graph estimate; Model Runner V2 (the default for
dense models since 0.25) returns 0 (vLLM PR #36520) and captures its graphs
after the KV cache is allocated, in the memory gpu_memory_utilization leaves.
The output says which runner and which ECC mode (as the card ships, or --ecc)
it assumed.

With --context and --sessions it applies the rule of thumb: concurrent sessions x
their typical context must stay below the KV cache of the whole farm
(--replicas replicas), or prefix-cache hit rates collapse whatever the routing.

--gpu auto reads the local GPU through NVML (and fails without the driver).
JSON keys: kv_tokens_per_replica, kv_blocks_per_replica, kv_bytes_per_token,
weights_bytes, fits and sessions_that_fit (null without --context/--sessions),
"memory": {requested_bytes, weights_bytes, activation_peak_bytes,
non_torch_bytes, cuda_graph_bytes, kv_bytes}, per GPU, whose last five add up to
requested_bytes; vllm_version, model_runner ("v1" or "v2") and
model_runner_note; ecc (on or off as sized), ecc_set_by ("catalogue", "--ecc"
or "nvml"), ecc_cost_bytes (what ECC takes from the CUDA total) and ecc_note.`,
		Example: `  warden kv --gpu "RTX A4000" --model Qwen/Qwen3-4B-Instruct-2507
  warden kv --gpu a4000 --model qwen3-4b --replicas 4 --context 13000 --sessions 16
  warden kv --gpu 5090 --model gemma-3-27b-it --weights-dtype int4 --max-model-len 65536 --json
  warden kv --gpu h100 --model llama-3.1-70b --tensor-parallel-size 4
  warden kv --gpu a4000 --model qwen3-4b --max-num-seqs 32 --ecc on --enforce-eager
  warden kv --gpu a4000 --model qwen3-4b --max-num-seqs 32 --vllm-version 0.21
  warden kv --gpu auto --model-config ./my-model/config.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runKV(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.GPU, "gpu", "", `GPU name or alias from the catalogue ("RTX A4000", "h100"), or "auto" to read it through NVML`)
	f.StringVar(&opts.Model, "model", "", "model name or alias from the catalogue (e.g. Qwen/Qwen3-4B-Instruct-2507, llama-3.1-8b)")
	f.StringVar(&opts.ModelConfig, "model-config", "", "path of a Hugging Face config.json (instead of --model)")
	f.StringVar(&opts.WeightsDType, "weights-dtype", "", "weights format: bf16, fp8 or int4 (default: the model's, bf16 unless its config says quantized)")
	f.StringVar(&opts.KVCacheDType, "kv-cache-dtype", "auto", "KV cache format: auto (bf16) or fp8")
	f.Float64Var(&opts.GPUMemoryUtilization, "gpu-memory-utilization", hardware.DefaultGPUMemoryUtilization, "fraction of the GPU's total memory vLLM may use, in (0, 1]")
	f.IntVar(&opts.TensorParallelSize, "tensor-parallel-size", hardware.DefaultTensorParallelSize, "GPUs per replica; must divide the attention heads")
	f.IntVar(&opts.BlockSize, "block-size", hardware.DefaultBlockSize, "tokens per KV block (1, 8, 16, 32, 64 or 128)")
	f.IntVar(&opts.MaxModelLen, "max-model-len", 0, "vLLM's --max-model-len; an error if one sequence of it would not fit (0: not checked)")
	f.IntVar(&opts.Context, "context", 0, "typical context of one session, in tokens (with --sessions)")
	f.IntVar(&opts.Sessions, "sessions", 0, "concurrent sessions (with --context)")
	f.IntVar(&opts.Replicas, "replicas", 1, "replicas in the farm (data_parallel_size)")
	f.IntVar(&opts.MaxNumSeqs, "max-num-seqs", 0, "vLLM's --max-num-seqs (0: vLLM's default for the GPU, 256 or 1024)")
	f.IntVar(&opts.MaxNumBatchedTokens, "max-num-batched-tokens", 0, "vLLM's --max-num-batched-tokens (0: vLLM's default for the GPU, 2048 or 8192)")
	f.StringVar(&opts.ECC, "ecc", "", "ECC mode: on or off (default: as the card ships; ECC on costs a GDDR card 1/16 of its memory)")
	f.BoolVar(&opts.EnforceEager, "enforce-eager", false, "vLLM's --enforce-eager: no CUDA graphs, so no CUDA graph memory is reserved")
	f.StringVar(&opts.VLLMVersion, "vllm-version", sim.DefaultVLLMVersion, `vLLM release ("0.26", "0.26.1"): picks the model runner it runs for the model, whose profile decides the CUDA graph memory`)
	f.BoolVar(&opts.JSON, "json", false, "print JSON")
	cmd.MarkFlagsMutuallyExclusive("model", "model-config")
	cmd.MarkFlagsRequiredTogether("context", "sessions")
	return cmd
}

// kvReport is what `warden kv` prints; its JSON keys are part of the CLI's
// contract (see the command's help).
type kvReport struct {
	GPU                  string  `json:"gpu"`
	GPUDetected          string  `json:"gpu_detected,omitempty"` // NVML's name with --gpu auto
	Model                string  `json:"model"`
	ParamCount           int64   `json:"param_count"`
	WeightsDType         string  `json:"weights_dtype"`
	KVCacheDType         string  `json:"kv_cache_dtype"`
	TensorParallelSize   int     `json:"tensor_parallel_size"`
	GPUMemoryUtilization float64 `json:"gpu_memory_utilization"`
	BlockSize            int     `json:"block_size"`
	MaxModelLen          int     `json:"max_model_len,omitempty"`
	Replicas             int     `json:"replicas"`
	EnforceEager         bool    `json:"enforce_eager"`
	// VLLMVersion is the release sized for ("0.26"); it picked
	// KVSizing.ModelRunner, which ModelRunnerNote explains.
	VLLMVersion     string `json:"vllm_version"`
	ModelRunnerNote string `json:"model_runner_note"`
	// The ECC mode sized (KVSizing.ECC): who set it ("catalogue": as the
	// card ships; "--ecc": the override; "nvml": a card not in the
	// catalogue, as measured), what it takes from the CUDA total, and why.
	ECCSetBy     string `json:"ecc_set_by"`
	ECCCostBytes int64  `json:"ecc_cost_bytes"`
	ECCNote      string `json:"ecc_note"`
	hardware.KVSizing
	FarmKVTokens int `json:"farm_kv_tokens"`
	// Rule of thumb; null when --context/--sessions are not given.
	Fits            *bool    `json:"fits"`
	SessionsThatFit *int     `json:"sessions_that_fit"`
	Sessions        int      `json:"sessions,omitempty"`
	ContextTokens   int      `json:"context_tokens,omitempty"`
	DemandRatio     *float64 `json:"demand_ratio,omitempty"` // sessions x context / farm KV tokens

	gpuMemoryBytes    int64 // for the text output
	modelMaxPositions int
	seqsDefaulted     bool // max_num_seqs is vLLM's default, not given
}

func (o *kvOptions) validate() error {
	var errs []string
	if o.GPU == "" {
		errs = append(errs, `--gpu is required (a catalogue name such as "RTX A4000", or auto)`)
	}
	if o.Model == "" && o.ModelConfig == "" {
		errs = append(errs, "one of --model or --model-config is required")
	}
	if !(o.GPUMemoryUtilization > 0 && o.GPUMemoryUtilization <= 1) {
		errs = append(errs, fmt.Sprintf("--gpu-memory-utilization must be in (0, 1], got %g", o.GPUMemoryUtilization))
	}
	if o.TensorParallelSize < 1 {
		errs = append(errs, fmt.Sprintf("--tensor-parallel-size must be >= 1, got %d", o.TensorParallelSize))
	}
	if !slices.Contains(validBlockSizes, o.BlockSize) {
		errs = append(errs, fmt.Sprintf("--block-size must be one of 1, 8, 16, 32, 64, 128, got %d", o.BlockSize))
	}
	if o.MaxModelLen < 0 {
		errs = append(errs, fmt.Sprintf("--max-model-len must be >= 0, got %d", o.MaxModelLen))
	}
	if o.Replicas < 1 {
		errs = append(errs, fmt.Sprintf("--replicas must be >= 1, got %d", o.Replicas))
	}
	if o.MaxNumSeqs < 0 || o.MaxNumBatchedTokens < 0 {
		errs = append(errs, fmt.Sprintf("--max-num-seqs and --max-num-batched-tokens must be >= 1 (or 0 for vLLM's default), got %d and %d", o.MaxNumSeqs, o.MaxNumBatchedTokens))
	}
	if (o.Context != 0 || o.Sessions != 0) && (o.Context < 1 || o.Sessions < 1) {
		errs = append(errs, fmt.Sprintf("--context and --sessions must both be >= 1, got %d and %d", o.Context, o.Sessions))
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

func runKV(_ context.Context, opts *kvOptions, out io.Writer) error {
	r, err := sizeReport(opts)
	if err != nil {
		return err
	}
	if opts.JSON {
		return writeJSON(out, r)
	}
	return printKV(out, r)
}

// sizeReport validates the options, resolves GPU and model, and sizes.
func sizeReport(opts *kvOptions) (*kvReport, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	weights, err := hardware.ParseDType(opts.WeightsDType)
	if err != nil {
		return nil, fmt.Errorf("--weights-dtype: %w", err)
	}
	kvd, err := hardware.ParseDType(opts.KVCacheDType)
	if err != nil || kvd == hardware.INT4 {
		return nil, fmt.Errorf("--kv-cache-dtype: want auto, bf16 or fp8, got %q", opts.KVCacheDType)
	}
	ecc, err := hardware.ParseECC(opts.ECC)
	if err != nil {
		return nil, fmt.Errorf("--ecc: %w", err)
	}
	v := opts.VLLMVersion
	if v == "" {
		v = sim.DefaultVLLMVersion // as a farm spec's vllm.version
	}
	version, err := sim.ParseVLLMVersion(v)
	if err != nil {
		return nil, fmt.Errorf("--vllm-version: %w", err)
	}
	gpu, detected, err := resolveGPU(opts)
	if err != nil {
		return nil, err
	}
	var model hardware.Model
	if opts.ModelConfig != "" {
		model, err = hardware.LoadHFConfig(opts.ModelConfig)
	} else {
		model, err = hardware.LookupModel(opts.Model)
	}
	if err != nil {
		return nil, err
	}
	runner := sim.VLLMBehaviourFor(version, model).ModelRunner
	d := hardware.Deployment{
		GPU: gpu, Model: model,
		WeightsDType: weights, KVCacheDType: kvd,
		TensorParallelSize:   opts.TensorParallelSize,
		GPUMemoryUtilization: opts.GPUMemoryUtilization,
		BlockSize:            opts.BlockSize,
		MaxModelLen:          opts.MaxModelLen,
		MaxNumSeqs:           opts.MaxNumSeqs,
		MaxNumBatchedTokens:  opts.MaxNumBatchedTokens,
		ECC:                  ecc,
		EnforceEager:         opts.EnforceEager,
		ModelRunner:          runner,
	}
	s, err := hardware.SizeKV(d)
	if err != nil {
		if ecc != nil && strings.HasPrefix(err.Error(), "ecc: ") {
			return nil, fmt.Errorf("--ecc %s: %w", opts.ECC, errors.Unwrap(err))
		}
		return nil, err
	}
	if weights == "" {
		weights = model.WeightsDType
	}
	if weights == "" {
		weights = hardware.BF16
	}
	if kvd == "" {
		kvd = hardware.BF16
	}
	r := &kvReport{
		GPU: gpu.Name, GPUDetected: detected, Model: model.Name, ParamCount: model.ParamCount,
		WeightsDType: string(weights), KVCacheDType: string(kvd),
		TensorParallelSize: opts.TensorParallelSize, GPUMemoryUtilization: opts.GPUMemoryUtilization,
		BlockSize: opts.BlockSize, MaxModelLen: opts.MaxModelLen, Replicas: opts.Replicas,
		EnforceEager:    opts.EnforceEager,
		VLLMVersion:     fmt.Sprintf("%d.%d", version[0], version[1]),
		ModelRunnerNote: runnerNote(version, model),
		KVSizing:        s,
		FarmKVTokens:    s.KVTokensPerReplica * opts.Replicas,
		Sessions:        opts.Sessions, ContextTokens: opts.Context,
		gpuMemoryBytes: gpu.MemoryBytes, modelMaxPositions: model.MaxPositionTokens,
		seqsDefaulted: opts.MaxNumSeqs == 0,
	}
	r.ECCSetBy, r.ECCCostBytes, r.ECCNote = eccAssumption(gpu, ecc, s.ECC)
	if opts.Context > 0 {
		v := hardware.RuleOfThumb(opts.Sessions, opts.Context, r.FarmKVTokens)
		r.Fits, r.SessionsThatFit, r.DemandRatio = &v.Fits, &v.SessionsThatFit, &v.Ratio
	}
	return r, nil
}

// runnerName is how the text output names a model runner.
func runnerName(runner string) string {
	if runner == hardware.ModelRunnerV2 {
		return "Model Runner V2"
	}
	return "V1 model runner"
}

// runnerNote says which model runner release version runs for m and since
// when, as warden's vLLM version table (sim.VLLMBehaviourFor) has it.
func runnerNote(version [2]int, m hardware.Model) string {
	runnerAt := func(minor int) string {
		return sim.VLLMBehaviourFor([2]int{version[0], minor}, m).ModelRunner
	}
	b := sim.VLLMBehaviourFor(version, m)
	runner := b.ModelRunner
	note := fmt.Sprintf("%s: vLLM %d.%d's default for this model", runnerName(runner), version[0], version[1])
	if b.ModelRunnerSwitch != "" {
		note += " (" + b.ModelRunnerSwitch + ")"
	}
	if runner != hardware.ModelRunnerV2 {
		for minor := version[1] + 1; minor <= version[1]+64; minor++ {
			if runnerAt(minor) == hardware.ModelRunnerV2 {
				return note + fmt.Sprintf("; Model Runner V2 from %d.%d", version[0], minor)
			}
		}
	}
	return note
}

// eccAssumption says who set the ECC mode the sizing assumed (eccOn), what
// it takes from g's CUDA total, and why, in a sentence: as the catalogue
// says the card ships, or as the --ecc override asks (override non-nil).
func eccAssumption(g hardware.GPU, override *bool, eccOn bool) (setBy string, costBytes int64, note string) {
	on, off := true, false
	totalOn, _, errOn := hardware.TotalMemory(g, &on)
	totalOff, _, errOff := hardware.TotalMemory(g, &off)
	share := int64(0) // what ECC's check bits take on a GDDR card with an ECC mode
	if errOn == nil && errOff == nil {
		share = totalOff - totalOn
	}
	if eccOn {
		costBytes = share
	}
	state := map[bool]string{true: "on", false: "off"}[eccOn]
	switch {
	case g.ECC == "":
		return "nvml", 0, "unknown: not in the catalogue, so sized on the CUDA total NVML reports, in whatever mode the card runs"
	case override == nil:
		setBy = "catalogue"
		switch g.ECC {
		case hardware.ECCNone:
			note = fmt.Sprintf("none: the %s has no ECC mode (catalogue)", g.Name)
		case hardware.ECCHBM:
			note = "on, as HBM always runs it (catalogue): check bits out of band, no memory cost"
		case hardware.ECCOn:
			note = fmt.Sprintf("on, as the %s ships (catalogue): check bits take 1/16 of its memory, %s; --ecc off would give that back", g.Name, gib(share))
		default:
			note = fmt.Sprintf("off, as the %s ships (catalogue); --ecc on would cost 1/16 of its memory, %s", g.Name, gib(share))
		}
		return setBy, costBytes, note
	}
	setBy = "--ecc"
	shipped := map[bool]string{true: "ships with it on", false: "ships with it off"}[g.ECC == hardware.ECCOn]
	switch {
	case g.ECC == hardware.ECCNone:
		note = fmt.Sprintf("off (--ecc off): the %s has no ECC mode", g.Name)
	case g.ECC == hardware.ECCHBM:
		note = fmt.Sprintf("%s (--ecc %s): HBM keeps check bits out of band, so the memory is the same either way", state, state)
	case eccOn == (g.ECC == hardware.ECCOn):
		if eccOn {
			note = fmt.Sprintf("on (--ecc on, as the %s ships): check bits take 1/16 of its memory, %s", g.Name, gib(share))
		} else {
			note = fmt.Sprintf("off (--ecc off, as the %s ships); on would cost 1/16 of its memory, %s", g.Name, gib(share))
		}
	case eccOn:
		note = fmt.Sprintf("on (--ecc on; the %s %s): costs 1/16 of its memory, %s", g.Name, shipped, gib(share))
	default:
		note = fmt.Sprintf("off (--ecc off; the %s %s): gives back the 1/16 its check bits took, %s", g.Name, shipped, gib(share))
	}
	return setBy, costBytes, note
}

// resolveGPU looks the GPU up, or with "auto" reads it through NVML. Several
// GPUs of one kind are fine (the first is sized); mixed kinds are an error.
func resolveGPU(opts *kvOptions) (gpu hardware.GPU, detected string, err error) {
	if !strings.EqualFold(opts.GPU, "auto") {
		gpu, err = hardware.LookupGPU(opts.GPU)
		return gpu, "", err
	}
	found, err := opts.probe()
	if err != nil {
		return gpu, "", fmt.Errorf("--gpu auto: %w; pass --gpu NAME instead (`warden gpus --catalog` lists them)", err)
	}
	if len(found) == 0 {
		return gpu, "", errors.New("--gpu auto: NVML lists no GPU; pass --gpu NAME instead")
	}
	for _, g := range found[1:] {
		if g.Name != found[0].Name {
			return gpu, "", fmt.Errorf("--gpu auto: this machine has different GPUs (%q, %q); pass --gpu NAME", found[0].Name, g.Name)
		}
	}
	return found[0].AsGPU(), found[0].Name, nil
}

func printKV(out io.Writer, r *kvReport) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	gpuLine := fmt.Sprintf("%s (%s CUDA total)", r.GPU, gib(r.gpuMemoryBytes))
	if r.GPUDetected != "" {
		gpuLine += ", detected as " + r.GPUDetected
	}
	fmt.Fprintf(tw, "GPU\t%s\n", gpuLine)
	fmt.Fprintf(tw, "model\t%s (%.2fB params, %s weights, %s KV cache)\n", r.Model, float64(r.ParamCount)/1e9, r.WeightsDType, r.KVCacheDType)
	fmt.Fprintf(tw, "replica\t%d GPU(s): tensor_parallel_size %d, gpu_memory_utilization %g, block_size %d\n",
		r.TensorParallelSize, r.TensorParallelSize, r.GPUMemoryUtilization, r.BlockSize)
	fmt.Fprintf(tw, "runner\t%s\n", r.ModelRunnerNote)
	fmt.Fprintf(tw, "ECC\t%s\n", r.ECCNote)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "KV bytes per token\t%s\t(per GPU: %s)\n", kib(r.KVBytesPerToken), kib(r.KVBytesPerTokenPerGPU))
	fmt.Fprintf(tw, "scheduler\tmax_num_seqs %d, max_num_batched_tokens %d\n", r.MaxNumSeqs, r.MaxNumBatchedTokens)
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.seqsDefaulted {
		// A plan sizes each candidate with its own max_num_seqs (the
		// built-in plan's is 32): the same card then shows a larger cache.
		fmt.Fprintf(out, "note: max_num_seqs %d is vLLM's default; warden plan sizes each candidate with its own (the built-in plan's is 32), "+
			"and a smaller one leaves more KV cache (the sampler's dummy run and the CUDA graphs grow with it): --max-num-seqs sizes for yours\n", r.MaxNumSeqs)
	}
	m := r.Memory
	ecc := "ECC off"
	if r.ECC {
		ecc = "ECC on"
	}
	nonTorch := "kernel images, cuBLAS workspace"
	if r.TensorParallelSize > 1 {
		nonTorch += ", NCCL buffers"
	}
	graphs := "--enforce-eager: none"
	if g := r.CUDAGraphs; g.Mode != "" {
		graphs = fmt.Sprintf("%s: %d piecewise + %d full graphs up to %d tokens", g.Mode, g.PiecewiseGraphs, g.FullGraphs, g.LargestSize)
		if r.ModelRunner == hardware.ModelRunnerV2 {
			graphs = fmt.Sprintf("Model Runner V2: profile_cudagraph_memory returns 0, vLLM PR #36520; V1 would estimate %s for %s", gib(g.Bytes), graphs)
		} else {
			graphs = "V1 runner's estimate for " + graphs
		}
	}
	fmt.Fprintln(out, "\nmemory per GPU (vLLM's determine_available_memory)")
	for _, row := range []struct {
		label string
		bytes int64
		note  string
	}{
		{"requested", m.RequestedBytes, fmt.Sprintf("%s CUDA total, %s, x %g", gib(r.TotalMemoryBytes), ecc, r.GPUMemoryUtilization)},
		{"- weights", m.WeightsBytes, ""},
		{"- activation peak", m.ActivationPeakBytes, fmt.Sprintf("forward of %s tokens %s; sampler run over %s seqs %s",
			thousands(r.MaxNumBatchedTokens), gib(r.ActivationBytes), thousands(min(r.MaxNumSeqs, r.MaxNumBatchedTokens)), gib(r.SamplerBytes))},
		{"- non-torch", m.NonTorchBytes, nonTorch},
		{"- CUDA graphs", m.CUDAGraphBytes, graphs},
		{"= KV cache", m.KVBytes, ""},
	} {
		line := fmt.Sprintf("  %-18s %10s", row.label, gib(row.bytes))
		if row.note != "" {
			line += "  (" + row.note + ")"
		}
		fmt.Fprintln(out, line)
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "KV blocks per replica\t%s\n", thousands(r.KVBlocksPerReplica))
	fmt.Fprintf(tw, "KV tokens per replica\t%s\n", thousands(r.KVTokensPerReplica))
	fmt.Fprintf(tw, "KV tokens, farm\t%s\t(%d replica(s), %d GPU(s))\n", thousands(r.FarmKVTokens), r.Replicas, r.Replicas*r.TensorParallelSize)
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.ModelRunner == hardware.ModelRunnerV2 && r.CUDAGraphs.Bytes > 0 {
		fmt.Fprintf(out, "\nnote: Model Runner V2 captures its CUDA graphs after the KV cache is allocated, in the %s that gpu_memory_utilization leaves; V1 would have set %s aside for them (vLLM issue #49224: OOM at capture when that is short)\n",
			gib(r.TotalMemoryBytes-r.UsableBytes), gib(r.CUDAGraphs.Bytes))
	}
	if r.MaxModelLen == 0 && r.modelMaxPositions > r.KVTokensPerReplica {
		fmt.Fprintf(out, "\nnote: vLLM's default max_model_len for this model (%s) exceeds the KV cache; start it with --max-model-len <= %d\n",
			thousands(r.modelMaxPositions), r.KVTokensPerReplica)
	}
	if r.Fits != nil {
		verdict := "fits"
		cmp := "<="
		if !*r.Fits {
			verdict, cmp = "does NOT fit: expect prefix-cache hit rates to collapse", ">"
		}
		fmt.Fprintf(out, "\nrule of thumb: %d sessions x %s tokens = %s %s %s farm KV tokens (%.0f%%): %s; %d sessions fit\n",
			r.Sessions, thousands(r.ContextTokens), thousands(r.Sessions*r.ContextTokens), cmp, thousands(r.FarmKVTokens),
			100**r.DemandRatio, verdict, *r.SessionsThatFit)
	}
	return nil
}

// thousands formats n with commas: 41408 -> "41,408".
func thousands(n int) string { return num.Int(int64(n)) }
