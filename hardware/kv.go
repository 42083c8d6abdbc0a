package hardware

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Byte units.
const (
	MiB = 1 << 20
	GiB = 1 << 30
)

// defaultVocab is assumed for the sampler when a Model has no VocabSize.
const defaultVocab = 128256

// Defaults applied by SizeKV to zero fields of a Deployment.
const (
	DefaultGPUMemoryUtilization = 0.9
	DefaultBlockSize            = 16
	DefaultTensorParallelSize   = 1
)

// VLLMSchedulerDefaults returns vLLM's default max_num_seqs and
// max_num_batched_tokens for online serving (the OpenAI API server) on g:
// 1024 and 8192 on GPUs with at least 70 GiB that are not A100s, 256 and
// 2048 elsewhere. It is the one copy of the rule (the simulator's farm
// defaults, KV sizing and the proxy's auto spill threshold all call it).
//
// vLLM: vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults (called by
// _set_default_max_num_seqs_and_batched_tokens_args when neither flag is
// given): device_memory >= 70 * GiB_bytes and "a100" not in device_name,
// where device_memory is current_platform.get_device_total_memory() (on
// CUDA, the device's total memory as torch reports it: g.MemoryBytes) and
// device_name its lower-cased name; the A100 is left out because a large
// max_num_batched_tokens lowered its throughput (vLLM pull request 17885).
// Held there by tests/engine/test_arg_utils.py,
// test_defaults_with_usage_context. The TPU and CPU platforms' own values
// do not apply to the GPUs of this catalogue; vLLM then caps a defaulted
// max_num_seqs at max_num_batched_tokens, which these pairs never reach.
func VLLMSchedulerDefaults(g GPU) (maxNumSeqs, maxNumBatchedTokens int) {
	if g.MemoryBytes >= 70*GiB && !strings.Contains(strings.ToUpper(g.Name), "A100") {
		return 1024, 8192
	}
	return 256, 2048
}

// ParseDType reads a dtype as vLLM's flags spell it: bf16 (also bfloat16,
// fp16, float16, half: same size), fp8 (fp8_e4m3, fp8_e5m2), int4 (awq, gptq,
// 4bit). "auto" and "" return "" so the caller can pick the default.
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return "", nil
	case "bf16", "bfloat16", "fp16", "float16", "half":
		return BF16, nil
	case "fp8", "fp8_e4m3", "fp8_e5m2":
		return FP8, nil
	case "int4", "awq", "gptq", "4bit", "w4a16":
		return INT4, nil
	}
	return "", fmt.Errorf("unknown dtype %q (want bf16, fp8 or int4)", s)
}

// ParseModelRunner reads a model runner as Deployment.ModelRunner takes it:
// "v1" (also "" for the default) or "v2", in any case.
func ParseModelRunner(s string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", ModelRunnerV1:
		return ModelRunnerV1, nil
	case ModelRunnerV2:
		return ModelRunnerV2, nil
	}
	return "", fmt.Errorf("want %q (vllm/v1/worker/gpu_model_runner.py) or %q (Model Runner V2, vllm/v1/worker/gpu/model_runner.py), got %q", ModelRunnerV1, ModelRunnerV2, s)
}

// WeightsBytes is the memory the weights of m take in dtype w, over all GPUs.
// Quantized formats keep the embeddings and lm_head in 16 bits, as vLLM's
// fp8, AWQ and GPTQ loaders do; int4 adds an fp16 scale per group of 128.
func WeightsBytes(m Model, w DType) int64 {
	if w == "" {
		w = BF16
	}
	params := float64(m.ParamCount)
	if w == BF16 {
		return int64(params * 2)
	}
	emb := float64(m.VocabSize) * float64(m.HiddenSize)
	if !m.TieWordEmbeddings {
		emb *= 2
	}
	emb = min(emb, params)
	perParam := w.Bytes()
	if w == INT4 {
		perParam += 2.0 / 128
	}
	return int64((params-emb)*perParam + emb*2)
}

// SizeKV sizes one replica's KV cache the way vLLM's start-up profiler does
// (vllm/v1/worker/gpu_worker.py Worker.determine_available_memory; the
// mechanisms are in profile.go), per GPU:
//
//	requested = CUDA total memory (after the ECC override) x gpu_memory_utilization
//	KV bytes  = requested - weights / TP
//	            - torch activation peak (max of a max_num_batched_tokens forward
//	              and the sampler's dummy run over max_num_seqs requests)
//	            - non-torch memory (kernel images, cuBLAS workspace, NCCL with TP > 1)
//	            - the runner's profile_cudagraph_memory(): the V1 runner's
//	              FULL_AND_PIECEWISE estimate, 0 for Model Runner V2 (PR
//	              #36520), 0 with EnforceEager
//	blocks    = floor(KV bytes / (block_size x KV bytes per token per GPU))
//	tokens    = blocks x block_size
//
// KV bytes per token per GPU = 2 x layers x kv_heads_per_gpu x head_dim x KV
// dtype bytes, with kv_heads_per_gpu = kv_heads / TP when kv_heads >= TP and 1
// (replicated) otherwise.
//
// Sliding-window layers hold at most the window. vLLM's hybrid allocator
// gives them their own block groups; for one per-token figure SizeKV counts a
// sliding layer at window / context of a full layer, where context is
// MaxModelLen, else the model's max position: exact for sequences of that
// length, pessimistic (for capacity) for longer ones and optimistic for many
// short ones.
//
// Zero fields take defaults: weights bf16, KV cache bf16 ("auto"), TP 1,
// gpu_memory_utilization 0.9, block_size 16, max_num_seqs and
// max_num_batched_tokens as vLLM picks them for the GPU, ECC as the card
// ships, CUDA graphs on, the V1 model runner. MaxModelLen 0 is not checked
// (vLLM would use the model's max position, which often exceeds the KV cache
// of small cards: set it explicitly).
//
// Errors: invalid fields (among them an ECC override the card cannot take
// and a ModelRunner other than "", "v1" and "v2"); *NoFitError when the
// weights and overhead leave no room for a block; *MaxModelLenError when
// MaxModelLen tokens do not fit.
func SizeKV(d Deployment) (KVSizing, error) {
	d, err := withDeploymentDefaults(d)
	if err != nil {
		return KVSizing{}, err
	}
	s := size(d)
	if s.KVBlocksPerReplica <= 0 {
		return KVSizing{}, noFit(d, s)
	}
	if d.MaxModelLen > s.KVTokensPerReplica {
		return KVSizing{}, &MaxModelLenError{MaxModelLen: d.MaxModelLen, KVTokens: s.KVTokensPerReplica}
	}
	return s, nil
}

func withDeploymentDefaults(d Deployment) (Deployment, error) {
	if d.GPU.MemoryBytes <= 0 {
		return d, fmt.Errorf("gpu %q: memory_bytes: want > 0", d.GPU.Name)
	}
	if err := d.Model.Validate(); err != nil {
		return d, fmt.Errorf("model %q: %w", d.Model.Name, err)
	}
	if d.WeightsDType == "" {
		d.WeightsDType = d.Model.WeightsDType
	}
	if d.WeightsDType == "" {
		d.WeightsDType = BF16
	}
	if d.KVCacheDType == "" {
		d.KVCacheDType = BF16
	}
	switch d.WeightsDType {
	case BF16, FP8, INT4:
	default:
		return d, fmt.Errorf("weights dtype %q: want bf16, fp8 or int4", d.WeightsDType)
	}
	switch d.KVCacheDType {
	case BF16, FP8:
	default:
		return d, fmt.Errorf("kv cache dtype %q: want bf16 (auto) or fp8", d.KVCacheDType)
	}
	if d.TensorParallelSize == 0 {
		d.TensorParallelSize = DefaultTensorParallelSize
	}
	if d.GPUMemoryUtilization == 0 {
		d.GPUMemoryUtilization = DefaultGPUMemoryUtilization
	}
	if d.BlockSize == 0 {
		d.BlockSize = DefaultBlockSize
	}
	seqs, batched := VLLMSchedulerDefaults(d.GPU)
	if d.MaxNumSeqs == 0 {
		d.MaxNumSeqs = seqs
	}
	if d.MaxNumBatchedTokens == 0 {
		d.MaxNumBatchedTokens = batched
	}
	if _, _, err := TotalMemory(d.GPU, d.ECC); err != nil {
		return d, fmt.Errorf("ecc: %w", err)
	}
	runner, err := ParseModelRunner(d.ModelRunner)
	if err != nil {
		return d, fmt.Errorf("model_runner: %w", err)
	}
	d.ModelRunner = runner
	m, tp := d.Model, d.TensorParallelSize
	switch {
	case !(d.GPUMemoryUtilization > 0 && d.GPUMemoryUtilization <= 1):
		return d, fmt.Errorf("gpu_memory_utilization: want a fraction in (0, 1], got %g", d.GPUMemoryUtilization)
	case tp < 1:
		return d, fmt.Errorf("tensor_parallel_size: want >= 1, got %d", tp)
	case m.NumAttentionHeads%tp != 0:
		return d, fmt.Errorf("tensor_parallel_size %d does not divide the %d attention heads of %s", tp, m.NumAttentionHeads, m.Name)
	case m.NumKVHeads >= tp && m.NumKVHeads%tp != 0:
		return d, fmt.Errorf("tensor_parallel_size %d does not divide the %d KV heads of %s", tp, m.NumKVHeads, m.Name)
	case m.NumKVHeads < tp && tp%m.NumKVHeads != 0:
		return d, fmt.Errorf("tensor_parallel_size %d is not a multiple of the %d KV heads of %s", tp, m.NumKVHeads, m.Name)
	case d.BlockSize < 1:
		return d, fmt.Errorf("block_size: want >= 1, got %d", d.BlockSize)
	case d.MaxModelLen < 0:
		return d, fmt.Errorf("max_model_len: want >= 0, got %d", d.MaxModelLen)
	case m.MaxPositionTokens > 0 && d.MaxModelLen > m.MaxPositionTokens:
		return d, fmt.Errorf("max_model_len %d is greater than the model's max_position_embeddings (%d)", d.MaxModelLen, m.MaxPositionTokens)
	case d.MaxNumSeqs < 1 || d.MaxNumBatchedTokens < 1:
		return d, fmt.Errorf("max_num_seqs and max_num_batched_tokens: want >= 1, got %d and %d", d.MaxNumSeqs, d.MaxNumBatchedTokens)
	}
	return d, nil
}

// size computes the sizing of a validated deployment with defaults applied.
// KVBytes may be negative (no fit); blocks are then 0.
func size(d Deployment) KVSizing {
	m, tp := d.Model, int64(d.TensorParallelSize)
	kvHeads := int64(m.NumKVHeads) / tp
	if kvHeads == 0 {
		kvHeads = 1 // fewer KV heads than ranks: each rank holds a replica of one
	}
	perLayer := 2 * kvHeads * int64(m.HeadDim) * int64(d.KVCacheDType.Bytes())
	layers := float64(m.NumLayers - m.SlidingLayers)
	if m.SlidingLayers > 0 {
		layers += float64(m.SlidingLayers) * slidingFraction(m, d.MaxModelLen)
	}
	perTokenGPU := int64(math.Ceil(float64(perLayer) * layers))

	total, eccOn, _ := TotalMemory(d.GPU, d.ECC) // checked in withDeploymentDefaults
	s := KVSizing{
		KVBytesPerToken:       perTokenGPU * tp,
		KVBytesPerTokenPerGPU: perTokenGPU,
		WeightsBytes:          ceilDiv(WeightsBytes(m, d.WeightsDType), tp),
		UsableBytes:           requestedBytes(total, d.GPUMemoryUtilization),
		ActivationBytes:       forwardActivationBytes(m, tp, d.MaxNumBatchedTokens),
		SamplerBytes:          samplerRunBytes(m, d.MaxNumSeqs, d.MaxNumBatchedTokens),
		MaxNumSeqs:            d.MaxNumSeqs,
		MaxNumBatchedTokens:   d.MaxNumBatchedTokens,
		TotalMemoryBytes:      total,
		ECC:                   eccOn,
		ModelRunner:           d.ModelRunner,
	}
	if !d.EnforceEager {
		s.CUDAGraphs = cudaGraphEstimate(m, tp, d.MaxNumSeqs, d.MaxNumBatchedTokens)
	}
	s.Memory = MemoryBreakdown{
		RequestedBytes:      s.UsableBytes,
		WeightsBytes:        s.WeightsBytes,
		ActivationPeakBytes: activationPeakBytes(s.ActivationBytes, s.SamplerBytes),
		NonTorchBytes:       nonTorchBytes(d.TensorParallelSize),
		CUDAGraphBytes:      profiledCUDAGraphBytes(d.ModelRunner, s.CUDAGraphs),
	}
	s.RuntimeBytes = s.Memory.NonTorchBytes + s.Memory.CUDAGraphBytes
	s.OverheadBytes = s.Memory.ActivationPeakBytes + s.RuntimeBytes
	s.KVBytes = s.UsableBytes - s.WeightsBytes - s.OverheadBytes
	s.Memory.KVBytes = s.KVBytes
	if s.KVBytes > 0 {
		s.KVBlocksPerReplica = int(s.KVBytes / (int64(d.BlockSize) * perTokenGPU))
		s.KVTokensPerReplica = s.KVBlocksPerReplica * d.BlockSize
	}
	return s
}

// slidingFraction is the share of a full layer's per-token KV that a sliding
// layer costs, averaged over a sequence of the context SizeKV assumes.
func slidingFraction(m Model, maxModelLen int) float64 {
	ctx := maxModelLen
	if ctx == 0 {
		ctx = m.MaxPositionTokens
	}
	if ctx == 0 || m.SlidingWindowTokens >= ctx {
		return 1
	}
	return float64(m.SlidingWindowTokens) / float64(ctx)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// NoFitError says that a model's weights and overhead leave no room for the
// KV cache, by how much, and what would fit instead.
type NoFitError struct {
	GPU, Model         string
	WeightsDType       DType
	TensorParallelSize int
	UsableBytes        int64 // per GPU
	NeededBytes        int64 // per GPU: weights + overhead + one KV block
	// Suggestions that do fit, e.g. "tensor_parallel_size 4",
	// "weights dtype int4"; empty when none of TP <= 8 or a smaller dtype does.
	Suggestions []string
}

// ShortBytes is how much memory per GPU is missing.
func (e *NoFitError) ShortBytes() int64 { return e.NeededBytes - e.UsableBytes }

func (e *NoFitError) Error() string {
	msg := fmt.Sprintf("%s with %s weights does not fit on %s with tensor_parallel_size %d: it needs %.2f GiB per GPU, %.2f GiB usable; short by %.2f GiB",
		e.Model, e.WeightsDType, e.GPU, e.TensorParallelSize,
		float64(e.NeededBytes)/GiB, float64(e.UsableBytes)/GiB, float64(e.ShortBytes())/GiB)
	if len(e.Suggestions) == 0 {
		return msg + "; no tensor_parallel_size up to 8 fits, with these weights or with fp8 or int4 ones: pick a larger GPU"
	}
	return msg + "; try " + strings.Join(e.Suggestions, " or ")
}

func noFit(d Deployment, s KVSizing) *NoFitError {
	e := &NoFitError{
		GPU: d.GPU.Name, Model: d.Model.Name, WeightsDType: d.WeightsDType,
		TensorParallelSize: d.TensorParallelSize,
		UsableBytes:        s.UsableBytes,
		NeededBytes:        s.WeightsBytes + s.OverheadBytes + int64(d.BlockSize)*s.KVBytesPerTokenPerGPU,
	}
	fits := func(alt Deployment) bool {
		alt, err := withDeploymentDefaults(alt)
		return err == nil && size(alt).KVBlocksPerReplica > 0
	}
	// For the weights' own dtype and each lighter one, the fewest GPUs per
	// replica (up to 8) that hold it; a lighter dtype is named only when
	// it needs fewer GPUs than the heavier ones before it.
	best := 1 << 30
	for _, w := range []DType{d.WeightsDType, FP8, INT4} {
		if w != d.WeightsDType && w.Bytes() >= d.WeightsDType.Bytes() {
			continue
		}
		for _, tp := range []int{1, 2, 4, 8} {
			if tp < d.TensorParallelSize || tp >= best || (w == d.WeightsDType && tp == d.TensorParallelSize) {
				continue
			}
			alt := d
			alt.WeightsDType, alt.TensorParallelSize = w, tp
			if !fits(alt) {
				continue
			}
			switch {
			case w == d.WeightsDType:
				e.Suggestions = append(e.Suggestions, fmt.Sprintf("tensor_parallel_size %d", tp))
			case tp == d.TensorParallelSize:
				e.Suggestions = append(e.Suggestions, "weights dtype "+string(w))
			default:
				e.Suggestions = append(e.Suggestions, fmt.Sprintf("weights dtype %s with tensor_parallel_size %d", w, tp))
			}
			best = tp
			break
		}
	}
	return e
}

// MaxModelLenError is vLLM's start-up failure when one sequence of
// max_model_len tokens would not fit in the KV cache.
type MaxModelLenError struct {
	MaxModelLen int
	KVTokens    int // KV capacity of the replica
}

func (e *MaxModelLenError) Error() string {
	return fmt.Sprintf("max_model_len (%d) is larger than the maximum number of tokens that can be stored in KV cache (%d); increase gpu_memory_utilization or decrease max_model_len", e.MaxModelLen, e.KVTokens)
}

// IsNoFit reports whether err is (or wraps) a *NoFitError.
func IsNoFit(err error) bool {
	var nf *NoFitError
	return errors.As(err, &nf)
}

// Verdict is the field's rule of thumb: concurrent sessions x their typical
// context must stay below the farm's total KV cache, or prefix-cache hit rates
// collapse whatever the routing.
type Verdict struct {
	Fits            bool    `json:"fits"`              // demand <= capacity
	SessionsThatFit int     `json:"sessions_that_fit"` // capacity / context (0 when context <= 0)
	Ratio           float64 `json:"ratio"`             // demand / capacity (0 when capacity is 0: JSON has no infinity)
	DemandTokens    int64   `json:"demand_tokens"`     // sessions x context
	CapacityTokens  int64   `json:"capacity_tokens"`   // total KV tokens of the farm
}

// RuleOfThumb checks sessions x contextTokens against totalKVTokens (the KV
// capacity of the whole farm: tokens per replica x replicas).
func RuleOfThumb(sessions, contextTokens, totalKVTokens int) Verdict {
	v := Verdict{
		DemandTokens:   int64(max(sessions, 0)) * int64(max(contextTokens, 0)),
		CapacityTokens: int64(max(totalKVTokens, 0)),
	}
	v.Fits = v.DemandTokens <= v.CapacityTokens
	if contextTokens > 0 {
		v.SessionsThatFit = int(v.CapacityTokens / int64(contextTokens))
	}
	if v.CapacityTokens > 0 {
		v.Ratio = float64(v.DemandTokens) / float64(v.CapacityTokens)
	}
	return v
}
