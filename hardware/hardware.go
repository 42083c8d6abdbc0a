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
}

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
}

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
}

// KVSizing is the result of sizing one replica's KV cache the way vLLM does.
type KVSizing struct {
	KVBytesPerToken    int64 `json:"kv_bytes_per_token"`    // whole replica (all TP ranks)
	WeightsBytes       int64 `json:"weights_bytes"`         // per GPU
	OverheadBytes      int64 `json:"overhead_bytes"`        // per GPU: activations, non-torch, CUDA graphs
	UsableBytes        int64 `json:"usable_bytes"`          // per GPU: memory x utilization
	KVBytes            int64 `json:"kv_bytes"`              // per GPU
	KVBlocksPerReplica int   `json:"kv_blocks_per_replica"` // vLLM num_gpu_blocks
	KVTokensPerReplica int   `json:"kv_tokens_per_replica"` // blocks x block_size

	KVBytesPerTokenPerGPU int64 `json:"kv_bytes_per_token_per_gpu"` // one TP rank's share
	// Overhead broken down (per GPU); OverheadBytes is their sum.
	ActivationBytes     int64 `json:"activation_bytes"`       // forward pass of MaxNumBatchedTokens tokens
	SamplerBytes        int64 `json:"sampler_bytes"`          // fp32 logits of MaxNumSeqs sequences
	RuntimeBytes        int64 `json:"runtime_bytes"`          // non-torch memory, CUDA graphs (calibrated constant)
	MaxNumSeqs          int   `json:"max_num_seqs"`           // as used (defaults resolved)
	MaxNumBatchedTokens int   `json:"max_num_batched_tokens"` // as used (defaults resolved)
}
