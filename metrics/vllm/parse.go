package vllm

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/lm-warden/warden/metrics/names"
)

// Engine is the figures of one vLLM engine (one data-parallel rank) read
// from a /metrics page.
type Engine struct {
	Engine           int     // the engine label (DP rank); 0 when absent
	Running          float64 // vllm:num_requests_running
	Waiting          float64 // vllm:num_requests_waiting
	KVUsage          float64 // vllm:kv_cache_usage_perc, 0..1
	PrefixQueries    float64 // vllm:prefix_cache_queries_total (tokens)
	PrefixHits       float64 // vllm:prefix_cache_hits_total (tokens)
	PromptTokens     float64 // vllm:prompt_tokens_total
	GenerationTokens float64 // vllm:generation_tokens_total
	Requests         float64 // vllm:request_success_total, every finished reason
	Preemptions      float64 // vllm:num_preemptions_total
	BlockSize        int     // from vllm:cache_config_info, 0 if absent
	NumGPUBlocks     int     // from vllm:cache_config_info, 0 if absent
	MaxNumSeqs       int     // a max_num_seqs label of any vllm:*_config_info, 0 if absent
	// vllm:request_prefill_time_seconds: the sum and count of the
	// histogram, and whether the server exposes it.
	PrefillSeconds  float64
	PrefillRequests float64
	HasPrefill      bool
}

// MaxPageBytes is the cap on a page the proxy's scraper reads (a
// caller states its own to Parse): a vLLM page is tens of kilobytes per
// engine, and 65,536 engines of two gauges fit in it.
const MaxPageBytes = 8 << 20

// MaxServerNumSeqs caps a max_num_seqs read from a server's
// *_config_info labels: 16 times vLLM's largest default (1024), far above
// any batch a GPU runs, so that a wrong or hostile page cannot make the
// auto spill threshold (a quarter of it) unreachable. A configured
// models[].max_num_seqs above it is refused (issue 46 item 8: 2^62 was
// taken).
const MaxServerNumSeqs = 16384

// Parse reads vLLM's text exposition, at most maxBytes of it, and returns
// the figures of each engine, sorted by engine. Series other than the
// ones Engine holds (including the *_created gauges) are ignored; a series
// with several label sets per engine (e.g. per model_name) is summed.
func Parse(r io.Reader, maxBytes int64) ([]Engine, error) {
	p := expfmt.NewTextParser(pmodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(r, maxBytes))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	var out []Engine
	// at indexes out by engine label: a page may carry up to 65,537 of
	// them, and a search of out for each sample made a scrape quadratic
	// (21 s of CPU for such a page, issue 35).
	at := map[int]int{}
	get := func(engine int) *Engine {
		if i, ok := at[engine]; ok {
			return &out[i]
		}
		at[engine] = len(out)
		out = append(out, Engine{Engine: engine})
		return &out[len(out)-1]
	}
	add := func(name string, field func(*Engine) *float64) {
		f := fams[name]
		if f == nil {
			return
		}
		for _, m := range f.GetMetric() {
			e, ok := engineOf(m)
			if !ok {
				continue
			}
			*field(get(e)) += sampleValue(m)
		}
	}
	add(names.VLLMNumRequestsRunning, func(s *Engine) *float64 { return &s.Running })
	add(names.VLLMNumRequestsWaiting, func(s *Engine) *float64 { return &s.Waiting })
	add(names.VLLMKVCacheUsagePerc, func(s *Engine) *float64 { return &s.KVUsage })
	add(names.VLLMPrefixCacheQueries, func(s *Engine) *float64 { return &s.PrefixQueries })
	add(names.VLLMPrefixCacheHits, func(s *Engine) *float64 { return &s.PrefixHits })
	add(names.VLLMPromptTokens, func(s *Engine) *float64 { return &s.PromptTokens })
	add(names.VLLMGenerationTokens, func(s *Engine) *float64 { return &s.GenerationTokens })
	add(names.VLLMRequestSuccess, func(s *Engine) *float64 { return &s.Requests })
	add(names.VLLMNumPreemptions, func(s *Engine) *float64 { return &s.Preemptions })
	if f := fams[names.VLLMRequestPrefillTime]; f != nil {
		for _, m := range f.GetMetric() {
			e, ok := engineOf(m)
			if !ok || m.Histogram == nil {
				continue
			}
			s := get(e)
			s.PrefillSeconds += m.GetHistogram().GetSampleSum()
			s.PrefillRequests += float64(m.GetHistogram().GetSampleCount())
			s.HasPrefill = true
		}
	}
	info := make([]string, 0, 4)
	for name := range fams {
		if strings.HasPrefix(name, "vllm:") && strings.HasSuffix(name, "_config_info") {
			info = append(info, name)
		}
	}
	slices.Sort(info) // map order must not decide which label wins
	for _, name := range info {
		for _, m := range fams[name].GetMetric() {
			e, ok := engineOf(m)
			if !ok {
				continue
			}
			s := get(e)
			for _, lp := range m.GetLabel() {
				v, err := strconv.ParseFloat(lp.GetValue(), 64)
				if err != nil || v < 0 || v > 1<<30 {
					continue
				}
				switch lp.GetName() {
				case names.LabelBlockSize:
					s.BlockSize = int(v)
				case names.LabelNumGPUBlocks:
					s.NumGPUBlocks = int(v)
				case "max_num_seqs":
					// A server is not trusted with the spill threshold:
					// 2^30 made it 268,435,456 (issue 35).
					s.MaxNumSeqs = min(int(v), MaxServerNumSeqs)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Engine) int { return a.Engine - b.Engine })
	return out, nil
}

// engineOf returns the engine label of a sample (0 when absent); false for
// a label that is not a small non-negative integer.
func engineOf(m *dto.Metric) (int, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == names.LabelEngine {
			e, err := strconv.Atoi(lp.GetValue())
			if err != nil || e < 0 || e > 1<<16 {
				return 0, false
			}
			return e, true
		}
	}
	return 0, true
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}
