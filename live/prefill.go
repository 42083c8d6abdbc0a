package live

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lm-warden/warden/metrics/names"
)

// The priced spill (spill_threshold: priced) compares a later turn's
// expected time to first token at its home with the one elsewhere
// (placement's kv.go): each replica's queue of prompt tokens still to
// prefill ahead of a new arrival, divided by its prefill rate. Both come
// from here:
//
//   - The queue is the proxy's own count, like its in-flight count: each
//     request adds the uncached tokens placement expects its replica to
//     compute (Decision.Uncached) when it is picked, and gives them back at
//     its first output token (the first byte of a response that is not a
//     stream), or when its attempt ends without one.
//   - The rate is the model's prefill_tokens_per_s, or with
//     prefill_tokens_per_s: metrics, each replica's measured rate
//     (prefillMeter): the prompt tokens it computed over the time its
//     requests spent in prefill.

// prefillMeter measures one replica's prefill rate from its vLLM metrics:
// the prompt tokens it computed, vllm:prompt_tokens_total minus
// vllm:prefix_cache_hits_total (the cached ones are looked up, not
// computed), over the seconds its requests spent in prefill, the sum of
// vllm:request_prefill_time_seconds (vLLM observes, per finished request,
// the time from its first scheduling to its first token, preemptions
// included: vllm/v1/metrics/stats.py, IterationStats.
// update_from_finished_request, FinishedRequestStats.prefill_time). That is the rate a
// request's prefill is served at on that replica, including the steps it
// shares with other requests' decodes and prefills: what a spilled turn
// would meet there.
//
// The rate covers the last hour (historyPoints samples historyInterval
// apart, the span of the proxy's history), so it follows a change of load
// or of the served model within the hour. An hour without a finished
// request keeps the last rate measured (an idle replica is still as fast);
// before any, the rate is unknown (0) and placement cannot price the
// replica. A counter that goes down (a restarted vLLM) starts the
// measurement over.
type prefillMeter struct {
	mu   sync.Mutex
	ring [historyPoints]prefillSample // samples at least historyInterval apart, oldest at start
	n    int                          // samples in ring
	next int                          // where the next sample goes
	cur  prefillSample                // the latest observation
	seen bool                         // cur is set
	rate atomic.Uint64                // math.Float64bits of the rate; 0: unknown
}

// prefillSample is one observation of the counters.
type prefillSample struct {
	at                              time.Time
	prompt, hits, seconds, requests float64
}

// observe records one successful scrape of the replica at at.
func (p *prefillMeter) observe(e EngineStats, at time.Time) {
	if !e.HasPrefill {
		return
	}
	s := prefillSample{at: at, prompt: e.PromptTokens, hits: e.PrefixHits, seconds: e.PrefillSeconds, requests: e.PrefillRequests}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen && (s.prompt < p.cur.prompt || s.hits < p.cur.hits || s.seconds < p.cur.seconds || s.requests < p.cur.requests) {
		p.n, p.next = 0, 0 // counters reset: measure afresh (the last rate stands meanwhile)
	}
	p.cur, p.seen = s, true
	if p.n == 0 || at.Sub(p.ring[(p.next+len(p.ring)-1)%len(p.ring)].at) >= historyInterval {
		p.ring[p.next] = s
		p.next = (p.next + 1) % len(p.ring)
		p.n = min(p.n+1, len(p.ring))
	}
	old := p.ring[(p.next+len(p.ring)-p.n)%len(p.ring)]
	computed := (s.prompt - old.prompt) - (s.hits - old.hits)
	secs, reqs := s.seconds-old.seconds, s.requests-old.requests
	if reqs >= 1 && secs > 0 && computed > 0 {
		if r := computed / secs; !math.IsInf(r, 0) && !math.IsNaN(r) {
			p.rate.Store(math.Float64bits(r))
		}
	}
}

// tokensPerSec is the measured rate, 0 when unknown.
func (p *prefillMeter) tokensPerSec() float64 { return math.Float64frombits(p.rate.Load()) }

// prefillRate is replica rep's prefill rate for placement, and where it
// comes from ("config", "metrics"; "" with the rate 0: unknown).
func (m *model) prefillRate(rep *replica) (float64, string) {
	switch r := m.cfg.PrefillTokensPerS; {
	case r.PerS > 0:
		return r.PerS, "config"
	case r.Metrics:
		if v := rep.meter.tokensPerSec(); v > 0 {
			return v, "metrics"
		}
	}
	return 0, ""
}

// prefilled gives back the attempt's share of its replica's prefill queue,
// once: at its first output token, or when it ends without one.
func (a *attempt) prefilled() {
	if a != nil && a.uncached > 0 && a.queued.CompareAndSwap(true, false) {
		a.rep.prefillQueue.Add(-a.uncached)
	}
}

// prefillWarning names, for a priced spill, the replicas without a prefill
// rate yet (prefill_tokens_per_s: metrics, and no finished request
// measured, or a server that does not expose the histogram): a later turn
// homed there, or leaving for there, is not priced; the spill threshold
// (auto) decides. "" when every replica has one.
func (m *model) prefillWarning() string {
	if !m.cfg.SpillThreshold.Priced {
		return ""
	}
	var none []string
	for i, rep := range m.replicas {
		if r, _ := m.prefillRate(rep); r <= 0 {
			none = append(none, strconv.Itoa(i))
		}
	}
	if len(none) == 0 {
		return ""
	}
	return fmt.Sprintf("replicas %s have no prefill rate yet (prefill_tokens_per_s: metrics needs %s and the prompt and prefix-cache counters, with a finished request): their turns are not priced and spill at the auto threshold; set models[].prefill_tokens_per_s to a number if the servers do not expose it",
		strings.Join(none, ", "), names.VLLMRequestPrefillTime)
}
