package fakevllm

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"
)

// Counters are an engine's token counters, as its /metrics shows them.
type Counters struct {
	Prompt  float64 // vllm:prompt_tokens_total
	Queries float64 // vllm:prefix_cache_queries_total
	Hits    float64 // vllm:prefix_cache_hits_total
	Gen     float64 // vllm:generation_tokens_total
}

// lookup walks the engine's prefix cache with the prompt's chained 64-byte
// blocks, as vLLM does with its block hashes, counts queries and hits (in
// tokens, 4 bytes each) and caches every full block; it returns the hit
// tokens. Called with s.mu held.
func (s *Server) lookup(engine int, text []byte) int {
	var prev uint64
	hitBlocks, missed := 0, false
	for lo := 0; lo+64 <= len(text); lo += 64 {
		h := sha256.New()
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], prev)
		h.Write(b[:])
		h.Write(text[lo : lo+64])
		prev = binary.LittleEndian.Uint64(h.Sum(nil))
		if !missed && s.cache[engine][prev] {
			hitBlocks++
		} else {
			missed = true
		}
		s.cache[engine][prev] = true
	}
	s.counters[engine].Queries += float64(max(1, len(text)/4))
	s.counters[engine].Hits += float64(hitBlocks * 16)
	return hitBlocks * 16
}

// PerEngine returns each engine's counters.
func (s *Server) PerEngine() []Counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Counters(nil), s.counters...)
}

// Counters returns the counters of every engine summed.
func (s *Server) Counters() Counters {
	var sum Counters
	for _, c := range s.PerEngine() {
		sum.Prompt += c.Prompt
		sum.Queries += c.Queries
		sum.Hits += c.Hits
		sum.Gen += c.Gen
	}
	return sum
}

// Restart empties the prefix caches and sets the token counters back to
// zero, as a restarted vLLM does.
func (s *Server) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for e := range s.engines {
		s.cache[e] = map[uint64]bool{}
		s.counters[e] = Counters{}
	}
}

// metrics renders a vLLM-style exposition: colons in names, an engine
// label per rank, *_created gauges to be ignored.
func (s *Server) metrics() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	labels := func(e int) string { return fmt.Sprintf("engine=\"%d\",model_name=%q", e, s.Model) }
	series := func(name, typ string, v func(e int) float64) {
		fmt.Fprintf(&b, "# HELP %s fake\n# TYPE %s %s\n", name, name, typ)
		for e := range s.engines {
			fmt.Fprintf(&b, "%s{%s} %g\n", name, labels(e), v(e))
		}
	}
	series("vllm:num_requests_running", "gauge", func(e int) float64 { return float64(s.running[e] + s.extra[e]) })
	series("vllm:num_requests_waiting", "gauge", func(int) float64 { return 0 })
	series("vllm:kv_cache_usage_perc", "gauge", func(e int) float64 { return float64(len(s.cache[e])) / 10000 })
	series("vllm:prefix_cache_queries_total", "counter", func(e int) float64 { return s.counters[e].Queries })
	series("vllm:prefix_cache_hits_total", "counter", func(e int) float64 { return s.counters[e].Hits })
	series("vllm:prefix_cache_hits_created", "gauge", func(int) float64 { return 1.7e9 })
	series("vllm:prompt_tokens_total", "counter", func(e int) float64 { return s.counters[e].Prompt })
	series("vllm:generation_tokens_total", "counter", func(e int) float64 { return s.counters[e].Gen })
	series("vllm:num_preemptions_total", "counter", func(int) float64 { return 0 })
	fmt.Fprintf(&b, "# HELP vllm:request_success_total fake\n# TYPE vllm:request_success_total counter\n")
	for e := range s.engines {
		fmt.Fprintf(&b, "vllm:request_success_total{%s,finished_reason=\"length\"} %g\n", labels(e), s.done[e])
	}
	if s.PrefillRate > 0 {
		fmt.Fprintf(&b, "# HELP vllm:request_prefill_time_seconds fake\n# TYPE vllm:request_prefill_time_seconds histogram\n")
		for e := range s.engines {
			fmt.Fprintf(&b, "vllm:request_prefill_time_seconds_bucket{%s,le=\"+Inf\"} %g\n", labels(e), s.pfCount[e])
			fmt.Fprintf(&b, "vllm:request_prefill_time_seconds_sum{%s} %g\n", labels(e), s.pfSum[e])
			fmt.Fprintf(&b, "vllm:request_prefill_time_seconds_count{%s} %g\n", labels(e), s.pfCount[e])
		}
	}
	fmt.Fprintf(&b, "# HELP vllm:cache_config_info fake\n# TYPE vllm:cache_config_info gauge\n")
	for e := range s.engines {
		extra := ""
		if s.MaxNumSeqs > 0 {
			extra = fmt.Sprintf(",max_num_seqs=\"%d\"", s.MaxNumSeqs)
		}
		blocks := s.GPUBlocks
		if blocks == 0 {
			blocks = 2400
		}
		if blocks > 0 {
			extra = fmt.Sprintf(",num_gpu_blocks=\"%d\"", blocks) + extra
		}
		fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",engine=\"%d\"%s} 1\n", e, extra)
	}
	return b.String()
}
