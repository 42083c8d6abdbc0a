package emulator

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lm-warden/warden/metrics/names"
	"github.com/lm-warden/warden/sim"
)

// vLLM's /metrics, as a collector over the engines of one server. Every
// series has labels model_name and engine (the rank), except
// vllm:cache_config_info (engine and the cache settings). Counters end in
// _total. The histograms are sim.EngineHistogramDescs, observed by the
// engine's model as the simulator observes them, in model time: with
// --speed 10 a TTFT of 2 s of model time is recorded as 2 s although it
// took 0.2 s of wall time.
type collector struct {
	e       *Emulator
	engines []*engine

	running, waiting, kv, queries, hits, prompt, gen, preempt, success, cacheCfg *prometheus.Desc
	hists                                                                        []*prometheus.Desc // aligned with engine.hists
}

func newCollector(e *Emulator, engines []*engine) *collector {
	l := []string{names.LabelModelName, names.LabelEngine}
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(append([]string(nil), l...), extra...), nil)
	}
	return &collector{
		e:       e,
		engines: engines,
		running: d(names.VLLMNumRequestsRunning, "Number of requests in model execution batches."),
		waiting: d(names.VLLMNumRequestsWaiting, "Number of requests waiting to be processed."),
		kv:      d(names.VLLMKVCacheUsagePerc, "KV-cache usage. 1 means 100 percent usage."),
		queries: d(names.VLLMPrefixCacheQueries, "Prefix cache queries, in terms of number of queried tokens."),
		hits:    d(names.VLLMPrefixCacheHits, "Prefix cache hits, in terms of number of cached tokens."),
		prompt:  d(names.VLLMPromptTokens, "Number of prefill tokens processed."),
		gen:     d(names.VLLMGenerationTokens, "Number of generation tokens processed."),
		preempt: d(names.VLLMNumPreemptions, "Cumulative number of preemption from the engine."),
		success: d(names.VLLMRequestSuccess, "Count of successfully processed requests.", names.LabelFinishedReason),
		cacheCfg: prometheus.NewDesc(names.VLLMCacheConfigInfo, "Information of the LLMEngine CacheConfig",
			[]string{names.LabelBlockSize, names.LabelEnablePrefixCaching, names.LabelEngine,
				names.LabelGPUMemoryUtilization, names.LabelNumGPUBlocks}, nil),
		hists: func() []*prometheus.Desc {
			var out []*prometheus.Desc
			for _, h := range sim.EngineHistogramDescs(e.farm.Spec.VLLM.MaxModelLen) {
				out = append(out, d(h.Name, h.Help))
			}
			return out
		}(),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kv, c.queries, c.hits, c.prompt, c.gen,
		c.preempt, c.success, c.cacheCfg} {
		ch <- d
	}
	for _, d := range c.hists {
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
		hists := make([]histogramSnapshot, len(eng.hists))
		for i, h := range eng.hists {
			hists[i] = h.snapshot()
		}
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
		counter(c.success, st.FinishedStop, names.FinishedStop)
		counter(c.success, st.FinishedLength, names.FinishedLength)
		counter(c.success, st.Aborted, "abort")
		ch <- prometheus.MustNewConstMetric(c.cacheCfg, prometheus.GaugeValue, 1,
			strconv.Itoa(st.BlockSize), "True", rank,
			strconv.FormatFloat(v.GPUMemoryUtilization, 'g', -1, 64), strconv.Itoa(st.NumGPUBlocks))
		for i, h := range hists {
			ch <- prometheus.MustNewConstHistogram(c.hists[i], h.n, h.sum, h.buckets, m, r)
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
