package hardware

// Contract shared with sim/ and cmd/warden (owned by the hardware helper, who
// may add fields and functions but keeps these names).

// DType is a number format for weights or the KV cache.
type DType string

const (
	BF16 DType = "bf16"
	FP8  DType = "fp8"
	INT4 DType = "int4"
)

// Bytes returns the bytes per element (0.5 for int4).
func (d DType) Bytes() float64 {
	switch d {
	case FP8:
		return 1
	case INT4:
		return 0.5
	default:
		return 2
	}
}

// GPU is one accelerator kind. Units are in the field names.
type GPU struct {
	Name                       string   `json:"name"`
	Aliases                    []string `json:"aliases,omitempty"`
	Vendor                     string   `json:"vendor"`
	MemoryBytes                int64    `json:"memory_bytes"`
	MemoryBandwidthBytesPerSec float64  `json:"memory_bandwidth_bytes_per_sec"`
	BF16FLOPS                  float64  `json:"bf16_dense_flops"`
	FP8FLOPS                   float64  `json:"fp8_dense_flops,omitempty"` // 0: no FP8 tensor cores
	Source                     string   `json:"source"`

	// MemoryBytes above is the total CUDA reports (what vLLM multiplies by
	// gpu_memory_utilization); MarketingMemoryGB is the figure on the box
	// (binary: "24 GB" is 24 GiB of chips) and MemoryNote says where
	// MemoryBytes comes from.
	MarketingMemoryGB float64  `json:"marketing_memory_gb,omitempty"`
	MemoryNote        string   `json:"memory_note,omitempty"`
	NVMLNames         []string `json:"nvml_names,omitempty"` // device names NVML reports for this GPU

	// ECC is the card's ECC mode as shipped, the mode MemoryBytes is
	// measured in: ECCOn, ECCOff, ECCNone (no ECC mode) or ECCHBM (always
	// on, no capacity cost); "" means unknown (e.g. a GPU read through NVML
	// that is not in the catalogue). Deployment.ECC overrides the mode.
	ECC       string `json:"ecc,omitempty"`
	ECCSource string `json:"ecc_source,omitempty"`

	// Interconnect joins the cards of one tensor-parallel group; zero for
	// a GPU read through NVML that is not in the catalogue.
	Interconnect Interconnect `json:"interconnect,omitzero"`
}

// Interconnect is what the cards of a tensor-parallel group exchange their
// partial sums over (catalog/gpus.yaml; sim/steptime.go prices a step's
// all-reduces with it).
type Interconnect struct {
	Kind string `json:"kind"` // "PCIe 4.0 x16", "NVLink 4 (NVSwitch)"
	// BytesPerSec is one GPU's bandwidth to the others, each way.
	BytesPerSec float64 `json:"bytes_per_sec"`
	// PeerToPeer is false where the driver gives no peer access
	// (GeForce): every transfer is staged through host memory, crossing
	// the link twice.
	PeerToPeer bool `json:"peer_to_peer"`
	// AllReduceLatencySec is the time of one small all-reduce.
	AllReduceLatencySec float64 `json:"all_reduce_latency_sec"`
	Source              string  `json:"source"`
}

// AllReduceBytesPerSec is the bandwidth an all-reduce moves its data at:
// BytesPerSec, halved without peer access (through host memory each byte
// crosses the link twice).
func (ic Interconnect) AllReduceBytesPerSec() float64 {
	if !ic.PeerToPeer {
		return ic.BytesPerSec / 2
	}
	return ic.BytesPerSec
}

// ECC modes of GPU.ECC.
const (
	ECCOn   = "on"   // GDDR, ECC on as shipped: 1/16 of the chips hold check bits
	ECCOff  = "off"  // GDDR, ECC available but off as shipped
	ECCNone = "none" // no ECC mode (GeForce)
	ECCHBM  = "hbm"  // HBM: ECC always active, stored out of band
)

// Model is the architecture of one model, as far as sizing and step time need it.
type Model struct {
	Name              string   `json:"name"`
	Aliases           []string `json:"aliases,omitempty"`
	NumLayers         int      `json:"num_layers"`
	HiddenSize        int      `json:"hidden_size"`
	NumAttentionHeads int      `json:"num_attention_heads"`
	NumKVHeads        int      `json:"num_kv_heads"`
	HeadDim           int      `json:"head_dim"`
	ParamCount        int64    `json:"param_count"`
	// Sliding-window layout: SlidingWindowTokens > 0 and SlidingLayers of
	// NumLayers use the window; the rest are global (full context).
	SlidingWindowTokens int    `json:"sliding_window_tokens,omitempty"`
	SlidingLayers       int    `json:"sliding_layers,omitempty"`
	MaxPositionTokens   int    `json:"max_position_tokens,omitempty"`
	Source              string `json:"source"`

	IntermediateSize  int  `json:"intermediate_size,omitempty"` // MLP width (0: unknown, 4 x hidden assumed)
	VocabSize         int  `json:"vocab_size,omitempty"`
	TieWordEmbeddings bool `json:"tie_word_embeddings,omitempty"`
	// ParamCountEstimated is true when ParamCount was derived from the
	// architecture (LoadHFConfig) rather than copied from the published weights.
	ParamCountEstimated bool `json:"param_count_estimated,omitempty"`
	// WeightsDType is the format of the published weights ("" means bf16);
	// LoadHFConfig sets it from quantization_config.
	WeightsDType DType `json:"weights_dtype,omitempty"`
	// Experts is the number of routed experts of a mixture-of-experts
	// model (config.json num_experts or num_local_experts); 0 is a dense
	// model. vLLM runs the data-parallel ranks of a MoE model in lockstep
	// (DPEngineCoreProc) and those of a dense one independently.
	Experts int `json:"experts,omitempty"`
}

// vLLM's model runners (Deployment.ModelRunner).
const (
	ModelRunnerV1 = "v1" // vllm/v1/worker/gpu_model_runner.py GPUModelRunner
	ModelRunnerV2 = "v2" // vllm/v1/worker/gpu/model_runner.py (Model Runner V2)
)

// IsMoE reports whether m is a mixture-of-experts model.
func (m Model) IsMoE() bool { return m.Experts > 0 }

// Deployment is one vLLM replica: a model on tensor_parallel_size GPUs.
type Deployment struct {
	GPU                  GPU
	Model                Model
	WeightsDType         DType   // default bf16
	KVCacheDType         DType   // default: bf16 ("auto")
	TensorParallelSize   int     // default 1
	GPUMemoryUtilization float64 // default 0.9
	BlockSize            int     // default 16
	MaxModelLen          int     // 0: not checked (see SizeKV)
	MaxNumSeqs           int     // default: vLLM's, 256 (1024 on >= 70 GiB non-A100 GPUs)
	MaxNumBatchedTokens  int     // default: vLLM's, 2048 (8192 on >= 70 GiB non-A100 GPUs)
	// ModelRunner is vLLM's model runner: ModelRunnerV1 ("" means V1) or
	// ModelRunnerV2, which profiles CUDA graph memory differently at
	// start-up (profile.go: cudaGraphEstimate, modelRunnerV2CUDAGraphBytes).
	// Which one a release runs for a model is sim's version table
	// (sim.VLLMBehaviourFor). Other values are an error.
	ModelRunner string
	// ECC overrides the card's ECC mode (nil: as the catalogue says the
	// card ships, GPU.ECC). Turning ECC on for a GDDR card that ships with
	// it off costs 1/16 of its memory; off for one that ships with it on
	// gives that back; HBM cards are unchanged; ECC on for a card without
	// an ECC mode is an error. ParseECC reads "on", "off" or "default".
	ECC *bool
	// EnforceEager is vLLM's --enforce-eager: no CUDA graphs, so no CUDA
	// graph memory estimate is subtracted.
	EnforceEager bool
}

// KVSizing is the result of sizing one replica's KV cache the way vLLM does.
type KVSizing struct {
	KVBytesPerToken    int64 `json:"kv_bytes_per_token"`    // whole replica (all TP ranks)
	WeightsBytes       int64 `json:"weights_bytes"`         // per GPU
	OverheadBytes      int64 `json:"overhead_bytes"`        // per GPU: activation peak + non-torch + CUDA graphs
	UsableBytes        int64 `json:"usable_bytes"`          // per GPU: requested memory, total x utilization (= Memory.RequestedBytes)
	KVBytes            int64 `json:"kv_bytes"`              // per GPU (= Memory.KVBytes)
	KVBlocksPerReplica int   `json:"kv_blocks_per_replica"` // vLLM num_gpu_blocks
	KVTokensPerReplica int   `json:"kv_tokens_per_replica"` // blocks x block_size

	KVBytesPerTokenPerGPU int64 `json:"kv_bytes_per_token_per_gpu"` // one TP rank's share

	// The parts of the activation peak (per GPU). vLLM's profile_run runs
	// the forward pass and then the sampler, so the torch peak is the larger
	// of the two phases, not their sum (see ActivationPeakBytes).
	ActivationBytes int64 `json:"activation_bytes"` // forward pass of MaxNumBatchedTokens tokens
	SamplerBytes    int64 `json:"sampler_bytes"`    // sampler dummy run: MaxNumSeqs x vocab logits, plus the forward's hidden states
	// RuntimeBytes is NonTorchBytes + CUDAGraphBytes.
	//
	// Deprecated: it was a calibrated constant; read Memory.NonTorchBytes
	// and Memory.CUDAGraphBytes.
	RuntimeBytes        int64 `json:"runtime_bytes"`
	MaxNumSeqs          int   `json:"max_num_seqs"`           // as used (defaults resolved)
	MaxNumBatchedTokens int   `json:"max_num_batched_tokens"` // as used (defaults resolved)

	// TotalMemoryBytes is the CUDA total the sizing started from, after the
	// ECC override; ECC says whether ECC is on (HBM cards: always).
	TotalMemoryBytes int64 `json:"total_memory_bytes"`
	ECC              bool  `json:"ecc"`
	// ModelRunner is the runner whose start-up profile sized the cache:
	// ModelRunnerV1 or ModelRunnerV2 (Deployment.ModelRunner, "" resolved
	// to V1). It decides what Memory.CUDAGraphBytes holds.
	ModelRunner string `json:"model_runner"`
	// CUDAGraphs is the V1 runner's capture plan and CUDA graph estimate
	// (GPUModelRunner.profile_cudagraph_memory), worked out for either
	// runner so that a V2 sizing can show what V1 would have subtracted;
	// zero with EnforceEager. Only the V1 runner subtracts it: what this
	// sizing subtracted is Memory.CUDAGraphBytes.
	CUDAGraphs CUDAGraphEstimate `json:"cuda_graphs"`

	// Memory is vLLM's determine_available_memory split, per GPU: the five
	// parts after RequestedBytes add up to it exactly.
	Memory MemoryBreakdown `json:"memory"`
}

// MemoryBreakdown is one GPU's memory as vLLM's profiler splits it
// (vllm/v1/worker/gpu_worker.py Worker.determine_available_memory):
//
//	RequestedBytes = WeightsBytes + ActivationPeakBytes + NonTorchBytes + CUDAGraphBytes + KVBytes
type MemoryBreakdown struct {
	RequestedBytes      int64 `json:"requested_bytes"`       // total_memory x gpu_memory_utilization
	WeightsBytes        int64 `json:"weights_bytes"`         // model_memory_usage, weights / TP
	ActivationPeakBytes int64 `json:"activation_peak_bytes"` // torch peak increase of profile_run
	NonTorchBytes       int64 `json:"non_torch_bytes"`       // non-torch increase since the init snapshot
	CUDAGraphBytes      int64 `json:"cuda_graph_bytes"`      // what the runner's profile_cudagraph_memory returned: V1's estimate, 0 for Model Runner V2 (and with enforce_eager)
	KVBytes             int64 `json:"kv_bytes"`              // the remainder: available KV cache memory
}
