// Package names is the vocabulary of series and label names that vLLM
// exposes and warden writes, with the histogram bucket bounds and native
// histogram parameters. It imports nothing of Prometheus, so that the
// proxy (live) can name its series without linking the PromQL engine and
// the TSDB. Every package that names a series imports it, package metrics
// included.
package names

import (
	"fmt"
	"math"
)

// Series names exposed by vLLM (V1 engine, names as they appear on /metrics).
// Every vLLM series carries the labels [LabelModelName] and [LabelEngine]
// (the data-parallel rank as a decimal string), except
// [VLLMCacheConfigInfo], which has no model_name.
const (
	VLLMNumRequestsRunning = "vllm:num_requests_running"        // gauge
	VLLMNumRequestsWaiting = "vllm:num_requests_waiting"        // gauge
	VLLMKVCacheUsagePerc   = "vllm:kv_cache_usage_perc"         // gauge, a fraction 0..1 despite the name
	VLLMPrefixCacheQueries = "vllm:prefix_cache_queries_total"  // counter, tokens looked up
	VLLMPrefixCacheHits    = "vllm:prefix_cache_hits_total"     // counter, tokens served from cache
	VLLMPromptTokens       = "vllm:prompt_tokens_total"         // counter
	VLLMGenerationTokens   = "vllm:generation_tokens_total"     // counter
	VLLMNumPreemptions     = "vllm:num_preemptions_total"       // counter
	VLLMRequestSuccess     = "vllm:request_success_total"       // counter, extra label LabelFinishedReason
	VLLMTimeToFirstToken   = "vllm:time_to_first_token_seconds" // histogram base name (see NewHistogram)
	VLLMCacheConfigInfo    = "vllm:cache_config_info"           // gauge = 1, labels engine + Label{BlockSize,NumGPUBlocks,...}

	// Per-request and per-step histograms (base names), as vLLM V1 observes
	// them: inter-token latency per generated token after the first; the
	// others once per finished request (queue: arrival to first scheduled;
	// prefill: first scheduled to first token; decode: first to last token;
	// e2e: arrival to last token); iteration tokens once per engine step
	// (prompt and generated tokens scheduled in it).
	VLLMInterTokenLatency       = "vllm:inter_token_latency_seconds"
	VLLMRequestQueueTime        = "vllm:request_queue_time_seconds"
	VLLMRequestPrefillTime      = "vllm:request_prefill_time_seconds"
	VLLMRequestDecodeTime       = "vllm:request_decode_time_seconds"
	VLLME2ERequestLatency       = "vllm:e2e_request_latency_seconds"
	VLLMRequestPromptTokens     = "vllm:request_prompt_tokens"
	VLLMRequestGenerationTokens = "vllm:request_generation_tokens"
	VLLMIterationTokens         = "vllm:iteration_tokens_total"
)

// Series names of warden's own metrics. Labels: [LabelModel] and, where the
// series is per replica, [LabelReplica]. Never a session id.
const (
	WardenRequests          = "warden_requests_total"           // counter {model,replica,reason}
	WardenInFlight          = "warden_in_flight"                // gauge {model,replica}
	WardenSessions          = "warden_sessions"                 // gauge {model,replica}: conversations homed
	WardenActiveSessions    = "warden_active_sessions"          // gauge {model,replica}: homed and seen within the active window
	WardenLaterTurns        = "warden_later_turns_total"        // counter {model}: requests with turn > 0
	WardenLaterTurnsHome    = "warden_later_turns_home_total"   // counter {model}: those served by the replica of the session's first turn (placement.Stay)
	WardenSessionsCompleted = "warden_sessions_completed_total" // counter {model}: closed-loop clients only
	WardenTTFB              = "warden_ttfb_seconds"             // histogram base name {model}: client-side TTFB
	WardenOutputTokens      = "warden_output_tokens_total"      // counter {model}

	// The KV-aware routing options (issue 14).
	WardenKVHeadroomTokens  = "warden_kv_headroom_tokens"       // gauge {model,replica}: KV capacity minus resident footprint; absent without vllm:cache_config_info
	WardenAdmissionWaiting  = "warden_admission_waiting"        // gauge {model}: new conversations waiting for KV headroom (admission: kv)
	WardenAdmissionTimeouts = "warden_admission_timeouts_total" // counter {model}: of those, refused after admission_timeout
)

// Label names.
const (
	LabelName                 = "__name__"
	LabelModelName            = "model_name"      // vLLM's model label
	LabelEngine               = "engine"          // vLLM's data-parallel rank
	LabelFinishedReason       = "finished_reason" // "stop" | "length"
	LabelBlockSize            = "block_size"
	LabelNumGPUBlocks         = "num_gpu_blocks"
	LabelGPUMemoryUtilization = "gpu_memory_utilization"
	LabelEnablePrefixCaching  = "enable_prefix_caching"
	LabelModel                = "model"   // warden's model label
	LabelReplica              = "replica" // warden's replica index, decimal
	LabelReason               = "reason"  // a placement reason, or "retried"
	LabelLE                   = "le"
)

// Values of [LabelFinishedReason].
const (
	FinishedStop   = "stop"
	FinishedLength = "length"
)

// Suffixes of the series that make up a classic histogram.
const (
	BucketSuffix = "_bucket"
	SumSuffix    = "_sum"
	CountSuffix  = "_count"
)

// VLLMTTFTBuckets returns the upper bounds (seconds, +Inf excluded) of
// vLLM's vllm:time_to_first_token_seconds histogram, as defined in
// vllm/v1/metrics/loggers.py (PrometheusStatLogger). The slice is a fresh
// copy each call.
func VLLMTTFTBuckets() []float64 {
	return []float64{
		0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
		640.0, 2560.0,
	}
}

// WardenTTFBBuckets returns the upper bounds (seconds, +Inf excluded) of
// warden_ttfb_seconds' classic buckets: 21 exponential buckets, 5 ms
// doubling up to 5242.88 s, so that no quantile under an hour lands in the
// +Inf bucket. They are coarse (a quantile interpolated inside a doubling
// bucket can be off by tens of percent); the KPIs read the native
// histogram ([WardenTTFBNative]) when the server has it, these buckets
// only on a Prometheus without native histograms. The slice is a fresh
// copy each call.
func WardenTTFBBuckets() []float64 {
	b := make([]float64, 21)
	v := 0.005
	for i := range b {
		b[i] = v
		v *= 2
	}
	return b
}

// WardenTTFBNative returns the native histogram parameters of
// warden_ttfb_seconds, for live mode's client_golang HistogramOpts and the
// simulator's metrics.Histogram.WithNative alike: bucket factor 1.01, which is
// schema 7 (128 buckets per doubling, each bound 2^(1/128) = 1.0054 times
// the previous), so a quantile is within about 0.5% of the sample it
// lands on; at most 2048 populated buckets (16 doublings at schema 7;
// beyond, the resolution halves: schema 6, 1.1%).
func WardenTTFBNative() NativeOpts {
	return NativeOpts{BucketFactor: 1.01, MaxBuckets: 2048}
}

// VLLMITLBuckets returns the upper bounds (seconds) of
// vllm:inter_token_latency_seconds (vllm/v1/metrics/loggers.py).
func VLLMITLBuckets() []float64 {
	return []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
}

// VLLMRequestLatencyBuckets returns the upper bounds (seconds) of vLLM's
// per-request latency histograms (e2e, queue, prefill, decode).
func VLLMRequestLatencyBuckets() []float64 {
	return []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
		30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
}

// VLLMTokenBuckets returns vLLM's 1-2-5 buckets up to maxLen (at least
// 1,000,000 when maxLen is smaller), for vllm:request_prompt_tokens and
// vllm:request_generation_tokens.
func VLLMTokenBuckets(maxLen int) []float64 {
	maxLen = max(maxLen, 1_000_000)
	var out []float64
	// The bounds are compared by division so that a huge maxLen cannot
	// overflow m*e or e*10.
	for e := 1; ; e *= 10 {
		for _, m := range []int{1, 2, 5} {
			if e > maxLen/m {
				return out
			}
			out = append(out, float64(m*e))
		}
		if e > maxLen/10 {
			return out
		}
	}
}

// VLLMIterationTokenBuckets returns the upper bounds of
// vllm:iteration_tokens_total (tokens per engine step).
func VLLMIterationTokenBuckets() []float64 {
	return []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
}

// NativeOpts are the parameters of a Prometheus native histogram, named as
// client_golang's HistogramOpts names them, so that the simulator's
// histogram and live mode's /metrics histogram are configured from one
// value (see [WardenTTFBNative]).
type NativeOpts struct {
	// BucketFactor is NativeHistogramBucketFactor: the largest ratio
	// allowed between the bounds of a bucket. The schema is the coarsest
	// whose ratio 2^(2^-schema) is at most this ([NativeOpts.Schema]).
	BucketFactor float64
	// MaxBuckets is NativeHistogramMaxBucketNumber: when more buckets are
	// populated, the resolution halves (schema - 1, two buckets merged into
	// one), as client_golang does without NativeHistogramMinResetDuration
	// and NativeHistogramMaxZeroThreshold. 0 means no limit.
	MaxBuckets int
}

// Schema returns the native histogram schema that client_golang picks for
// o.BucketFactor (its pickSchema): -floor(log2(log2(factor))), clamped to
// [-4, 8]. It panics for a factor <= 1, as client_golang does.
func (o NativeOpts) Schema() int32 {
	if !(o.BucketFactor > 1) {
		panic(fmt.Sprintf("metrics: native histogram bucket factor %v, want > 1", o.BucketFactor))
	}
	f := math.Floor(math.Log2(math.Log2(o.BucketFactor)))
	switch {
	case f <= -8:
		return 8
	case f >= 4:
		return -4
	default:
		return -int32(f)
	}
}
