package sim

import (
	"math"
	"time"

	"github.com/lm-warden/warden/hardware"
)

// StepTime holds the parameters of the step-time model. Zero fields take
// the defaults below; a farm spec may override them in its `step_time:`
// block, and calibration against a real farm's Prometheus data fits them.
type StepTime struct {
	// PrefillEfficiency is the fraction of the GPUs' peak dense FLOPs that
	// the compute-bound part of a step reaches.
	PrefillEfficiency float64 `yaml:"prefill_efficiency" json:"prefill_efficiency"`
	// BandwidthEfficiency is the fraction of the GPUs' memory bandwidth that
	// the memory-bound part of a step reaches (weights and KV reads).
	BandwidthEfficiency float64 `yaml:"bandwidth_efficiency" json:"bandwidth_efficiency"`
	// StepOverhead is a constant added to every step (scheduling, kernel
	// launches, sampling).
	StepOverhead Duration `yaml:"step_overhead" json:"step_overhead"`
}

// Defaults of the step-time model.
//
// Datacenter planners derate peak figures to roughly 0.3-0.45 of FLOPs in
// prefill and 0.8 of bandwidth, plus about 0.1 ms per step.
// A single card with 2048-token chunks runs larger, better shaped GEMMs than
// a tensor-parallel group, so the prefill default sits at the top of that
// range, 0.5. On an RTX A4000 with Qwen3-4B this gives about 26 ms per
// decode step with a few short contexts (weights dominate: 8 GB at
// 358 GB/s) and 2.6 s to prefill a cold 10k-token prompt, 2.0 s for the
// 7.3k new tokens of a first agent turn whose 3.5k system prompt is cached.
const (
	DefaultPrefillEfficiency   = 0.5
	DefaultBandwidthEfficiency = 0.8
	DefaultStepOverhead        = 100 * time.Microsecond
)

// withDefaults fills zero fields.
func (st StepTime) withDefaults() StepTime {
	if st.PrefillEfficiency == 0 {
		st.PrefillEfficiency = DefaultPrefillEfficiency
	}
	if st.BandwidthEfficiency == 0 {
		st.BandwidthEfficiency = DefaultBandwidthEfficiency
	}
	if st.StepOverhead == 0 {
		st.StepOverhead = Duration(DefaultStepOverhead)
	}
	return st
}

// validate checks the fields; an error names its key under step_time.
func (st StepTime) validate() error {
	if st.PrefillEfficiency < 0 || st.PrefillEfficiency > 1 {
		return bad("step_time.prefill_efficiency", "must be in (0, 1], got %g", st.PrefillEfficiency)
	}
	if st.BandwidthEfficiency < 0 || st.BandwidthEfficiency > 1 {
		return bad("step_time.bandwidth_efficiency", "must be in (0, 1], got %g", st.BandwidthEfficiency)
	}
	if st.StepOverhead < 0 {
		return bad("step_time.step_overhead", "must be >= 0, got %s", time.Duration(st.StepOverhead))
	}
	return nil
}

// stepModel turns one engine step's batch into a duration: a roofline, plus
// the all-reduces of tensor parallelism, plus a per-step overhead.
//
//	time = max(FLOPs / (peak x TP x prefill_efficiency),
//	           bytes / (bandwidth x TP x bandwidth_efficiency))
//	     + all-reduces x (latency + 2 (TP-1)/TP x tokens x hidden x 2 B / link)
//	     + overhead
//
// The all-reduces are those of Megatron-style tensor parallelism as vLLM
// runs it: each transformer layer ends its attention with o_proj and its
// MLP with down_proj, both RowParallelLinear
// (vllm/model_executor/layers/linear.py RowParallelLinear.forward:
// tensor_model_parallel_all_reduce when reduce_results and tp_size > 1;
// vllm/model_executor/models/llama.py LlamaAttention.o_proj and
// LlamaMLP.down_proj, the same in qwen2.py and qwen3.py), so two per
// layer, and VocabParallelEmbedding sums the embedding once more
// (vllm/model_executor/layers/vocab_parallel_embedding.py). Each sums one
// bf16 hidden vector per token of the step; the forward pass waits for it
// (vLLM does not overlap it with the GEMMs by default), so its time adds.
// A ring all-reduce moves 2 (TP-1)/TP of the data over each GPU's link
// (vLLM's custom all-reduce, vllm/distributed/device_communicators/
// custom_all_reduce.py, used over NVLink and for two PCIe GPUs, moves no
// less); the link and the latency of one all-reduce are the GPU's
// interconnect in hardware's catalogue (NVLink, PCIe, and half the PCIe
// bandwidth where the driver gives no peer access and NCCL stages through
// host memory). With TP 1 there is none.
//
//	FLOPs = 2 x params x scheduled tokens                        (linear layers)
//	      + 4 x q_dim x sum over scheduled tokens of the context   (QK^T and AV,
//	        each 2 x q_dim multiply-adds per attended position, per layer)
//	bytes = weights + KV read of every scheduled request's context
//
// q_dim is num_attention_heads x head_dim (hidden size when unknown). A token
// at position p (1-based) attends to p positions in a global layer and to
// min(p, window) in a sliding-window layer; a request's KV read counts its
// context after the step the same way, at kv_heads x head_dim x 2 (K and V)
// x dtype bytes per layer and position. The KV writes of new tokens and the
// activations are small and ignored.
type stepModel struct {
	linearFlopsPerToken float64 // 2 x params
	attnFlopsPerCtx     float64 // 4 x q_dim, per layer and attended position
	globalLayers        float64
	slidingLayers       float64
	window              int
	weightsBytes        float64 // whole replica
	kvBytesPerLayerTok  float64 // one layer, one position, K and V
	flopsPerSec         float64 // effective, whole replica
	bytesPerSec         float64 // effective, whole replica
	overheadSec         float64
	// The all-reduces of tensor parallelism (0 with TP 1): their fixed
	// time per step, and their time per token of the step.
	allReduceSec         float64
	allReduceSecPerToken float64
}

// newStepModel builds the model of one replica of d.
func newStepModel(d hardware.Deployment, weightsBytes float64, st StepTime) stepModel {
	st = st.withDefaults()
	m := d.Model
	tp := float64(max(d.TensorParallelSize, 1))
	qdim := float64(m.NumAttentionHeads * m.HeadDim)
	if qdim == 0 {
		qdim = float64(m.HiddenSize)
	}
	sliding := 0
	if m.SlidingWindowTokens > 0 {
		sliding = min(m.SlidingLayers, m.NumLayers)
	}
	peak := d.GPU.BF16FLOPS
	if d.WeightsDType == hardware.FP8 && d.GPU.FP8FLOPS > 0 {
		peak = d.GPU.FP8FLOPS // W8A8: the GEMMs run on FP8 tensor cores
	}
	kvDType := d.KVCacheDType
	if kvDType == "" || kvDType == "auto" {
		kvDType = hardware.BF16
	}
	if weightsBytes <= 0 {
		wd := d.WeightsDType
		if wd == "" {
			wd = hardware.BF16
		}
		weightsBytes = float64(m.ParamCount) * wd.Bytes()
	}
	var arSec, arPerToken float64
	if ic := d.GPU.Interconnect; tp > 1 && ic.BytesPerSec > 0 {
		n := allReducesPerStep(m)
		arSec = n * ic.AllReduceLatencySec
		arPerToken = n * 2 * (tp - 1) / tp * float64(m.HiddenSize) * activationBytes / ic.AllReduceBytesPerSec()
	}
	return stepModel{
		allReduceSec:         arSec,
		allReduceSecPerToken: arPerToken,
		linearFlopsPerToken:  2 * float64(m.ParamCount),
		attnFlopsPerCtx:      4 * qdim,
		globalLayers:         float64(m.NumLayers - sliding),
		slidingLayers:        float64(sliding),
		window:               m.SlidingWindowTokens,
		weightsBytes:         weightsBytes,
		kvBytesPerLayerTok:   2 * float64(m.NumKVHeads*m.HeadDim) * kvDType.Bytes(),
		flopsPerSec:          peak * tp * st.PrefillEfficiency,
		bytesPerSec:          d.GPU.MemoryBandwidthBytesPerSec * tp * st.BandwidthEfficiency,
		overheadSec:          time.Duration(st.StepOverhead).Seconds(),
	}
}

// scaled returns m with its effective FLOP/s and bandwidth multiplied by
// k (FarmSpec.SpeedScale; 0 or 1 leave m as it is).
func (m stepModel) scaled(k float64) stepModel {
	if k > 0 && k != 1 {
		m.flopsPerSec *= k
		m.bytesPerSec *= k
		m.allReduceSec /= k
		m.allReduceSecPerToken /= k
	}
	return m
}

// activationBytes is the size of one element of the hidden states the
// all-reduces sum: bf16, whatever the weights' format.
const activationBytes = 2

// allReducesPerStep is the number of all-reduces of one forward pass with
// tensor parallelism: two per layer (o_proj and down_proj) and one for the
// embedding.
func allReducesPerStep(m hardware.Model) float64 { return float64(2*m.NumLayers + 1) }

// allReduce is the time of a step's all-reduces for tokens tokens.
func (m *stepModel) allReduce(tokens int) float64 {
	if m.allReduceSec == 0 {
		return 0
	}
	return m.allReduceSec + float64(tokens)*m.allReduceSecPerToken
}

// chunk is the work of one request in one step: n new tokens after start
// tokens already in its KV cache.
type chunk struct {
	start, n int
}

// sumPositions is the sum of p for p in (a, a+n]: positions attended in a
// global layer by n tokens following a computed ones.
func sumPositions(a, n int) float64 {
	fa, fn := float64(a), float64(n)
	return fn*fa + fn*(fn+1)/2
}

// sumWindowed is the sum of min(p, w) for p in (a, a+n].
func sumWindowed(a, n, w int) float64 {
	switch {
	case a+n <= w:
		return sumPositions(a, n)
	case a >= w:
		return float64(n) * float64(w)
	default:
		inside := w - a
		return sumPositions(a, inside) + float64(n-inside)*float64(w)
	}
}

// cost returns the FLOPs and bytes of one step.
func (m *stepModel) cost(batch []chunk) (flops, bytes float64) {
	bytes = m.weightsBytes
	for _, c := range batch {
		flops += m.linearFlopsPerToken * float64(c.n)
		ctx := c.start + c.n
		attn := m.globalLayers * sumPositions(c.start, c.n)
		kv := m.globalLayers * float64(ctx)
		if m.slidingLayers > 0 {
			attn += m.slidingLayers * sumWindowed(c.start, c.n, m.window)
			kv += m.slidingLayers * float64(min(ctx, m.window))
		}
		flops += m.attnFlopsPerCtx * attn
		bytes += m.kvBytesPerLayerTok * kv
	}
	return flops, bytes
}

// seconds is the duration of one step in seconds.
func (m *stepModel) seconds(batch []chunk) float64 {
	flops, bytes := m.cost(batch)
	t := math.Max(flops/m.flopsPerSec, bytes/m.bytesPerSec) + m.overheadSec
	if m.allReduceSec > 0 {
		tokens := 0
		for _, c := range batch {
			tokens += c.n
		}
		t += m.allReduce(tokens)
	}
	return t
}

// micros is the duration of one step in whole microseconds, at least 1.
func (m *stepModel) micros(batch []chunk) int64 {
	return max(int64(math.Ceil(m.seconds(batch)*usPerSec)), 1)
}
