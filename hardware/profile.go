package hardware

import (
	"fmt"
	"strings"
)

// This file models vLLM's start-up memory profile (v0.26, V1 engine), one
// function per mechanism, each naming the vLLM file and function it mirrors:
//
//	requested    = total_memory x gpu_memory_utilization    gpu_worker.py Worker.init_device
//	available_kv = requested - weights - torch activation peak - non-torch increase
//	               - the runner's profile_cudagraph_memory()  gpu_worker.py Worker.determine_available_memory
//
// The last term depends on the model runner the worker built: the V1
// runner's estimate (cudaGraphEstimate), or 0 for Model Runner V2
// (modelRunnerV2CUDAGraphBytes); profiledCUDAGraphBytes picks one.
//
// The figures below are derived from component sizes (PyTorch defaults, NCCL
// buffer sizes, vLLM's own logs); none is fitted to the measured anchor
// (RTX 4090, Llama-3.1-8B: 2,588 blocks), which the tests only check within 3%.

// Non-torch memory: what cudaMemGetInfo sees grow between vLLM's init
// snapshot and the end of profile_run that PyTorch's allocator does not
// account for (vllm/utils/mem_utils.py memory_profiling: non_torch_increase
// is measured from the snapshot taken in Worker.init_device).
//
// Not in it: the CUDA context itself (a few hundred MiB) and the NCCL
// communicators vLLM warms up in init_worker_distributed_environment exist
// before that snapshot, so vLLM charges them to nobody; they only lower the
// free memory it checks requested_memory against.
const (
	// KernelImageBytes is the context growth of lazily loaded kernel modules
	// (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) during the first
	// forward and sampler run: PyTorch, cuBLAS, FlashAttention and Triton
	// kernels. vLLM's own log for a single-GPU start in PR #21489 (gemma-3-4b
	// on a B200) reports "0.07 GiB for non-torch memory".
	KernelImageBytes = int64(72 * MiB)
	// CuBLASWorkspaceBytes is one stream's cuBLAS plus cuBLASLt workspace.
	// PyTorch's default CUBLAS_WORKSPACE_CONFIG is ":4096:8" (8 x 4 MiB =
	// 32 MiB) on Hopper and newer and ":4096:2:16:8" (about 8 MiB) before;
	// the cuBLASLt workspace follows it. PyTorch takes these from its caching
	// allocator, so vLLM's log counts them inside the torch peak; we report
	// them here, with the other runtime buffers (the total is the same). One
	// figure for all cards: 32 MiB, at most 24 MiB pessimistic.
	CuBLASWorkspaceBytes = int64(32 * MiB)
	// NCCLBufferBytes is the device buffers of a NCCL communicator created
	// lazily during the profile run (torch.distributed's device group; with
	// TP > 1 only): per channel and direction NCCL_BUFFSIZE (4 MiB, Simple
	// protocol) + the LL128 buffer (about 4.5 MiB) + the LL buffer (256 KiB),
	// for 8 channels and 2 directions of a ring: 8 x 2 x 8.75 MiB = 140 MiB.
	// vLLM's custom all-reduce buffers are allocated before the snapshot.
	NCCLBufferBytes = int64(8 * 2 * (4*MiB + 4*MiB + MiB/2 + MiB/4))
)

// RuntimeOverheadBytes is the single-GPU non-torch memory of the model.
//
// Deprecated: it was a constant calibrated on the anchor; SizeKV now derives
// each part (KVSizing.Memory).
const RuntimeOverheadBytes = KernelImageBytes + CuBLASWorkspaceBytes

// TPCommBytes is the extra non-torch memory with tensor parallelism.
//
// Deprecated: use NCCLBufferBytes.
const TPCommBytes = NCCLBufferBytes

// CUDA graph estimate (vllm/v1/worker/gpu_model_runner.py
// GPUModelRunner.profile_cudagraph_memory, called from
// Worker.determine_available_memory unless enforce_eager, and applied since
// v0.21 because VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1).
const (
	// GraphBytesPerLayer is the memory one captured graph costs per decoder
	// layer beyond its activations: the executable graph's kernel nodes and
	// the segment outputs it keeps in the graph pool. vLLM's own log in PR
	// #21489 reports 0.65 GiB of CUDA graph memory for gemma-3-4b (34 layers)
	// and 67 graphs: 0.65 GiB / 67 / 34 = 0.29 MiB per graph and layer.
	GraphBytesPerLayer = int64(29 * MiB / 100)
	// minGraphBytes is vLLM's floor for the per-graph figure ("Use at least
	// 1 MiB per graph for driver overhead").
	minGraphBytes = int64(MiB)
)

// requestedBytes mirrors vllm/v1/worker/gpu_worker.py Worker.init_device:
// requested_memory = init_snapshot.total_memory x gpu_memory_utilization.
func requestedBytes(totalMemory int64, utilization float64) int64 {
	return int64(float64(totalMemory) * utilization)
}

// ParseECC reads an ECC override as the --ecc flag and farm specs spell it:
// "on" (also true, 1, enabled), "off" (false, 0, disabled), or "" / "default"
// / "auto" for the card's own mode (nil).
func ParseECC(s string) (*bool, error) {
	on, off := true, false
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "default", "auto":
		return nil, nil
	case "on", "true", "1", "enabled":
		return &on, nil
	case "off", "false", "0", "disabled":
		return &off, nil
	}
	return nil, fmt.Errorf("want on or off (or default), got %q", s)
}

// TotalMemory is the CUDA total memory of g with ECC as ecc asks (nil: as
// shipped, g.ECC), and whether ECC is then on. GDDR cards keep ECC check bits
// in 1/16 of their chips (nvidia-smi shows 15/16 of the marketing GiB with
// ECC on), so switching costs or frees that share of the total; HBM keeps
// them out of band. ECC on for a card with no ECC mode, or an override for a
// card whose mode is unknown, is an error.
func TotalMemory(g GPU, ecc *bool) (bytes int64, eccOn bool, err error) {
	def := g.ECC == ECCOn || g.ECC == ECCHBM
	if ecc == nil {
		return g.MemoryBytes, def, nil
	}
	switch {
	case g.ECC == "":
		return 0, false, fmt.Errorf("ECC of %s is unknown (not in the catalogue), so its total memory cannot be adjusted: drop the ECC override (the measured total already reflects the card's mode)", g.Name)
	case g.ECC == ECCNone && *ecc:
		return 0, false, fmt.Errorf("%s has no ECC mode (%s)", g.Name, g.ECCSource)
	case g.ECC == ECCOff && *ecc:
		return g.MemoryBytes * 15 / 16, true, nil
	case g.ECC == ECCOn && !*ecc:
		return g.MemoryBytes * 16 / 15, false, nil
	}
	return g.MemoryBytes, *ecc, nil
}

// forwardActivationBytes mirrors the torch peak of the forward pass in
// vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_run, which calls
// _dummy_run(max_num_tokens) with max_num_batched_tokens tokens. Layers run
// one after the other and free their intermediates, so the peak is one
// layer's: tokens x (3 x intermediate / TP + 4 x hidden) x 2 bytes, the gated
// MLP's gate and up projections and activated tensor plus a few hidden-sized
// residuals and norms (bf16 activations whatever the weights' format).
func forwardActivationBytes(m Model, tp int64, tokens int) int64 {
	return int64(tokens) * (3*int64(mlpWidth(m))/tp + 4*int64(m.HiddenSize)) * 2
}

// samplerRunBytes mirrors the sampler phase of profile_run:
// GPUModelRunner._dummy_sampler_run on one hidden state per request
// (min(max_num_seqs, max_num_batched_tokens) requests). Per request and
// vocabulary entry: the bf16 logits compute_logits returns (2 bytes, held by
// the caller), their fp32 copy in Sampler.forward (4), the top-k/top-p pass
// of vllm/v1/sample/ops/topk_topp_sampler.py (the Triton kernel for batches
// of 8 and more works in place), then random_sample's fp32 probabilities and
// exponential noise (4 + 4): 14 bytes. The forward's hidden states
// (tokens x hidden x 2) are still alive. The dummy metadata sets top_k and
// top_p, so these paths run.
func samplerRunBytes(m Model, seqs, tokens int) int64 {
	reqs := int64(min(seqs, tokens))
	return reqs*int64(vocab(m))*14 + int64(tokens)*int64(m.HiddenSize)*2
}

// activationPeakBytes is profile_run's torch peak increase
// (memory_profiling's torch_peak_increase): the forward and the sampler run
// one after the other, and the forward's intermediates are freed before the
// sampler starts, so the peak is the larger phase.
func activationPeakBytes(forward, sampler int64) int64 { return max(forward, sampler) }

// nonTorchBytes mirrors memory_profiling's non_torch_increase
// (vllm/utils/mem_utils.py), measured from the snapshot of Worker.init_device:
// the kernel images loaded during the profile run and cuBLAS workspaces, and
// with TP > 1 a lazily created NCCL communicator's buffers.
func nonTorchBytes(tp int) int64 {
	b := KernelImageBytes + CuBLASWorkspaceBytes
	if tp > 1 {
		b += NCCLBufferBytes
	}
	return b
}

// CUDAGraphCaptureSizes mirrors vllm/config/vllm.py
// VllmConfig._set_cudagraph_sizes without speculative decoding: the largest
// size is min(max_num_seqs x 2, 512, max_num_batched_tokens), and the sizes
// are [1, 2, 4] + range(8, 256, 8) + range(256, largest + 1, 16) up to it.
func CUDAGraphCaptureSizes(maxNumSeqs, maxNumBatchedTokens int) []int {
	largest := min(maxNumSeqs*2, 512, maxNumBatchedTokens)
	var sizes []int
	for _, s := range []int{1, 2, 4} {
		if s <= largest {
			sizes = append(sizes, s)
		}
	}
	for s := 8; s < 256 && s <= largest; s += 8 {
		sizes = append(sizes, s)
	}
	for s := 256; s <= largest; s += 16 {
		sizes = append(sizes, s)
	}
	return sizes
}

// CUDAGraphEstimate is vLLM's CUDA graph memory estimate for one GPU and the
// capture plan behind it (zero with enforce_eager).
type CUDAGraphEstimate struct {
	Mode string `json:"mode,omitempty"` // "FULL_AND_PIECEWISE" (vLLM's default), "" when eager
	// Graphs per mode: PIECEWISE for every capture size (mixed batches),
	// FULL for the uniform-decode sizes up to max_num_seqs.
	PiecewiseGraphs int `json:"piecewise_graphs"`
	FullGraphs      int `json:"full_graphs"`
	LargestSize     int `json:"largest_capture_size,omitempty"`
	// FirstCaptureBytes is the largest mode's first (largest) capture, which
	// seeds the graph pool; PerGraphBytes is the second capture's increase,
	// which vLLM extrapolates to the other graphs.
	FirstCaptureBytes int64 `json:"first_capture_bytes"`
	PerGraphBytes     int64 `json:"per_graph_bytes"`
	Bytes             int64 `json:"bytes"` // the estimate the V1 runner returns, and vLLM subtracts when V1 runs
}

// cudaGraphEstimate mirrors vllm/v1/worker/gpu_model_runner.py
// GPUModelRunner.profile_cudagraph_memory for CUDAGraphMode
// FULL_AND_PIECEWISE (the default of optimization level O2):
//
//   - capture descriptors (vllm/v1/cudagraph_dispatcher.py
//     CudagraphDispatcher.get_capture_descs): PIECEWISE graphs for every
//     capture size, FULL graphs for the uniform-decode sizes <= max_num_seqs;
//     each mode's list sorted largest first;
//   - per mode, vLLM captures only the first two descriptors into a temporary
//     pool and measures cudaMemGetInfo around each: first_capture is the
//     first, per_graph = max(second, 1 MiB);
//   - total = max(first_capture over modes) + sum over modes of
//     per_graph x (graphs - 1), FULL and PIECEWISE sharing one pool at run
//     time.
//
// Modelled: the first capture holds one layer's activations at the largest
// size of its mode (the pool keeps them) plus one graph's fixed cost; the
// second capture reuses those activations and adds only the fixed cost,
// GraphBytesPerLayer x layers. Assumptions: dense attention (the first FULL
// capture's attention metadata, sized for max_num_batched_tokens of context
// via profile_seq_lens, is small for FlashAttention; issue #50780 shows it is
// not for hybrid GDN models), no LoRA, no speculative decoding. The linear
// extrapolation ignores that graphs reuse each other's pool blocks, which is
// why issues #45178 and #50780 find vLLM's estimate (and so this one) above
// the memory the real capture takes.
func cudaGraphEstimate(m Model, tp int64, maxNumSeqs, maxNumBatchedTokens int) CUDAGraphEstimate {
	sizes := CUDAGraphCaptureSizes(maxNumSeqs, maxNumBatchedTokens)
	if len(sizes) == 0 {
		return CUDAGraphEstimate{}
	}
	e := CUDAGraphEstimate{Mode: "FULL_AND_PIECEWISE", PiecewiseGraphs: len(sizes), LargestSize: sizes[len(sizes)-1]}
	largestFull := 0
	for _, s := range sizes {
		if s <= maxNumSeqs {
			e.FullGraphs++
			largestFull = s
		}
	}
	e.PerGraphBytes = max(GraphBytesPerLayer*int64(m.NumLayers), minGraphBytes)
	first := func(size int) int64 { return forwardActivationBytes(m, tp, size) + e.PerGraphBytes }
	e.FirstCaptureBytes = first(e.LargestSize)
	if e.FullGraphs > 0 {
		e.FirstCaptureBytes = max(e.FirstCaptureBytes, first(largestFull))
	}
	e.Bytes = e.FirstCaptureBytes + e.PerGraphBytes*int64(e.PiecewiseGraphs-1)
	if e.FullGraphs > 0 {
		e.Bytes += e.PerGraphBytes * int64(e.FullGraphs-1)
	}
	return e
}

// modelRunnerV2CUDAGraphBytes mirrors vllm/v1/worker/gpu/model_runner.py
// GPUModelRunner.profile_cudagraph_memory of Model Runner V2, added as a
// placeholder by PR #36520 ("[Model Runner V2] Add dummy
// profile_cudagraph_memory API"): it returns 0 ("NOTE(woosuk): It is TBD
// whether we keep this API or not."), so determine_available_memory
// subtracts nothing for CUDA graphs and the KV cache takes the whole
// requested budget. MRv2 builds its ModelCudaGraphManager in
// initialize_kv_cache and captures in capture_model (from
// Worker.compile_or_warm_up_model), both after the KV cache is allocated:
// the graphs then live in the memory gpu_memory_utilization leaves over,
// which is why issue #49224 reports OOMs at capture with MRv2 the default
// for dense models. PR #53306 ("[Model Runner V2] Reserve CUDA graph
// memory", fixes #49224) was merged in late August 2026, after 0.26.0
// (2026-07-25) and after 0.27.1 was out: which release first carries it is
// not established here.
//
// Issue #50159 measured on 0.26.0 (Qwen2.5-0.5B, RTX PRO 6000): eager, both
// runners hold the same KV tokens; with CUDA graphs on, MRv2 holds 9,040
// tokens (0.10 GiB) more than V1 (V1's estimate, which MRv2 does not
// subtract) and 8,544 tokens (0.10 GiB) fewer than eager. That last 0.10 GiB
// cannot be a CUDA graph term: this function returns 0 and the capture runs
// after the blocks are counted. --enforce-eager also turns torch.compile off
// (optimization level -O0), so it most likely comes from the compiled
// profile_run's torch peak or non-torch memory, the same for both runners;
// this package does not model compiled against eager profile runs for
// either runner. Not established from the thread's excerpts.
func modelRunnerV2CUDAGraphBytes() int64 { return 0 }

// profiledCUDAGraphBytes mirrors the call in vllm/v1/worker/gpu_worker.py
// Worker.determine_available_memory: cudagraph_memory_estimate =
// self.model_runner.profile_cudagraph_memory() when CUDA graphs will be
// captured (applied since v0.21: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1).
// The worker calls whichever runner it built (VLLM_USE_V2_MODEL_RUNNER, or
// the release's default for the model) without branching on it: the V1
// runner returns its estimate v1, Model Runner V2 returns 0. runner is
// ModelRunnerV1 or ModelRunnerV2 (validated by withDeploymentDefaults); v1
// is zero with enforce_eager, when the worker does not call it at all.
func profiledCUDAGraphBytes(runner string, v1 CUDAGraphEstimate) int64 {
	if v1.Mode == "" {
		return 0 // enforce_eager: cudagraph_mode NONE, no profile
	}
	if runner == ModelRunnerV2 {
		return modelRunnerV2CUDAGraphBytes()
	}
	return v1.Bytes
}

func mlpWidth(m Model) int {
	if m.IntermediateSize == 0 {
		return 4 * m.HiddenSize
	}
	return m.IntermediateSize
}

func vocab(m Model) int {
	if m.VocabSize == 0 {
		return defaultVocab
	}
	return m.VocabSize
}
