package emulator

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lm-warden/warden/metrics"
)

// vLLM's /metrics, as a collector over the engines of one server. Every
// series has labels model_name and engine (the rank), except
// vllm:cache_config_info (engine and the cache settings). Counters end in
// _total. Histograms are in model time: with --speed 10 a TTFT of 2 s of
// model time is recorded as 2 s although it took 0.2 s of wall time.
const (
	vllmE2E = "vllm:e2e_request_latency_seconds"
	vllmITL = "vllm:inter_token_latency_seconds"
)

type collector struct {
	e       *Emulator
	engines []*engine

	running, waiting, kv, queries, hits, prompt, gen, preempt, success, cacheCfg *prometheus.Desc
	ttft, itl, e2e                                                               *prometheus.Desc
}

func newCollector(e *Emulator, engines []*engine) *collector {
	l := []string{metrics.LabelModelName, metrics.LabelEngine}
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(append([]string(nil), l...), extra...), nil)
	}
	return &collector{
		e:       e,
		engines: engines,
		running: d(metrics.VLLMNumRequestsRunning, "Number of requests in model execution batches."),
		waiting: d(metrics.VLLMNumRequestsWaiting, "Number of requests waiting to be processed."),
		kv:      d(metrics.VLLMKVCacheUsagePerc, "KV-cache usage. 1 means 100 percent usage."),
		queries: d(metrics.VLLMPrefixCacheQueries, "Prefix cache queries, in terms of number of queried tokens."),
		hits:    d(metrics.VLLMPrefixCacheHits, "Prefix cache hits, in terms of number of cached tokens."),
		prompt:  d(metrics.VLLMPromptTokens, "Number of prefill tokens processed."),
		gen:     d(metrics.VLLMGenerationTokens, "Number of generation tokens processed."),
		preempt: d(metrics.VLLMNumPreemptions, "Cumulative number of preemption from the engine."),
		success: d(metrics.VLLMRequestSuccess, "Count of successfully processed requests.", metrics.LabelFinishedReason),
		cacheCfg: prometheus.NewDesc(metrics.VLLMCacheConfigInfo, "Information of the LLMEngine CacheConfig",
			[]string{metrics.LabelBlockSize, metrics.LabelEnablePrefixCaching, metrics.LabelEngine,
				metrics.LabelGPUMemoryUtilization, metrics.LabelNumGPUBlocks}, nil),
		ttft: d(metrics.VLLMTimeToFirstToken, "Histogram of time to first token in seconds."),
		itl:  d(vllmITL, "Histogram of inter-token latency in seconds."),
		e2e:  d(vllmE2E, "Histogram of e2e request latency in seconds."),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kv, c.queries, c.hits, c.prompt, c.gen,
		c.preempt, c.success, c.cacheCfg, c.ttft, c.itl, c.e2e} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one consistent reading of each
// engine, taken under its lock.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	v := c.e.farm.Spec.VLLM
	for _, eng := range c.engines {
		rank := strconv.Itoa(eng.index)
		eng.mu.Lock()
		st := eng.eng.Stats()
		ttft, itl, e2e := eng.ttft.snapshot(), eng.itl.snapshot(), eng.e2e.snapshot()
		eng.mu.Unlock()

		m, r := c.e.model, rank
		gauge := func(d *prometheus.Desc, x float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, x, append([]string{m, r}, extra...)...)
		}
		counter := func(d *prometheus.Desc, x int64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(x), append([]string{m, r}, extra...)...)
		}
		gauge(c.running, float64(st.Running))
		gauge(c.waiting, float64(st.Waiting))
		gauge(c.kv, st.KVUsage)
		counter(c.queries, st.PrefixQueries)
		counter(c.hits, st.PrefixHits)
		counter(c.prompt, st.PromptTokens)
		counter(c.gen, st.GenerationTokens)
		counter(c.preempt, st.Preemptions)
		counter(c.success, st.FinishedStop, metrics.FinishedStop)
		counter(c.success, st.FinishedLength, metrics.FinishedLength)
		counter(c.success, st.Aborted, "abort")
		ch <- prometheus.MustNewConstMetric(c.cacheCfg, prometheus.GaugeValue, 1,
			strconv.Itoa(st.BlockSize), "True", rank,
			strconv.FormatFloat(v.GPUMemoryUtilization, 'g', -1, 64), strconv.Itoa(st.NumGPUBlocks))
		for _, h := range []struct {
			d *prometheus.Desc
			s histogramSnapshot
		}{{c.ttft, ttft}, {c.itl, itl}, {c.e2e, e2e}} {
			ch <- prometheus.MustNewConstHistogram(h.d, h.s.n, h.s.sum, h.s.buckets, m, r)
		}
	}
}

type histogramSnapshot struct {
	n       uint64
	sum     float64
	buckets map[float64]uint64
}

// snapshot copies the histogram; its owner holds the lock.
func (h *histogram) snapshot() histogramSnapshot {
	return histogramSnapshot{n: h.n, sum: h.sum, buckets: h.cumulative()}
}
