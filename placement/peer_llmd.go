package placement

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"time"

	"github.com/cespare/xxhash/v2"
)

// LLMD is llm-d's endpoint picker (EPP) in its default profile, read in
// llm-d/llm-d-router at main ebab687 (2026-08-22; v0.10.0 = 71f4f09 has the
// same profile; nothing later changes it here):
//
//   - Profile (pkg/epp/config/loader/defaults.go, config/charts/routerlib/
//     templates/_config.yaml): queue-scorer weight 2, kv-cache-utilization-
//     scorer 2, prefix-cache-scorer 3, no filter, max-score-picker of one
//     endpoint. Each score is clamped to [0, 1] (scheduling/
//     scheduler_profile.go enforceScoreRange) and the weighted scores are
//     summed, not normalised.
//   - queue (scorer/queuedepth/queue.go): 1 when every endpoint has the same
//     vllm:num_requests_waiting, else (max - w) / (max - min).
//   - kv (scorer/kvcacheutilization): 1 - vllm:kv_cache_usage_perc.
//   - prefix (scorer/prefix/plugin.go, matchLengthWeight 0): matched blocks /
//     total blocks, from the approximate prefix producer
//     (requestcontrol/dataproducer/approximateprefix/plugin.go):
//     the prompt as pseudo-tokens of 4 bytes (tokenizer/estimate.go
//     packBytes), blocks of max(64, vLLM block_size) pseudo-tokens
//     (GetBlockSize, autotune), at most 131072 / block size of them
//     (resolveMaxBlocks), the last partial block hashed too
//     (prefixhash/hashing.go): h0 = xxhash64(model), h_i = xxhash64(LE64(
//     xxhash64(block)) || LE64(h_{i-1})). Match walks the hashes while some
//     pod holds one and counts, for every pod holding it, one block (no
//     per-pod run: a pod may count blocks after a gap).
//   - State (approximateprefix/indexer.go): hash -> pods, one LRU of hashes
//     per pod whose capacity is the pod's num_gpu_blocks at its first add
//     (vllm:cache_config_info, else 31250); PreRequest adds every hash of
//     the prompt to the chosen pod, in order (each Add refreshes recency);
//     a lookup refreshes nothing; no signal from the engine ever removes a
//     hash. Router blocks are 64 tokens where vLLM's are 16, so the LRU
//     remembers about 4x what the GPU holds.
//   - Picker (picker/maxscore/picker.go): shuffle, then stable sort by
//     score: uniform among the endpoints tied at the top (the shuffle is
//     seeded from the clock there; from Config's seed here).
//   - Staleness: the gauges are scraped every 50 ms (pkg/epp/server/
//     options.go); ScrapeInterval says so to the caller, and a burst
//     inside one scrape sees the same load. The router counts nothing in
//     flight of its own in this profile.
//
// Not modelled: flow control (off by default), the PreRequest being
// asynchronous (here the next pick sees the index updated), the text of
// tools and roles (the prompt's text is the rule of doc.go), the
// inactive-pod cleanup every 2 minutes (replicas do not leave).
// The block hashes are xxhash64 over the blocks' descriptions (vtext.go),
// not over the peer's bytes: they decide placement only.
type LLMD struct {
	cfg LLMDConfig
	rng *rand.Rand

	index llmdIndex

	text    vtext
	hashes  []uint64
	matched []int
	scores  []float64
}

// LLMDConfig are the EPP's parameters; the zero value is the default
// profile (approximate prefix).
type LLMDConfig struct {
	Seed uint64
	// QueueWeight, KVWeight, PrefixWeight: 2, 2, 3 when all are 0.
	QueueWeight, KVWeight, PrefixWeight float64
	// VLLMBlockSize is vLLM's block_size as cache_config_info reports it
	// (autotune): 16 when 0.
	VLLMBlockSize int
	// MinBlockTokens is the floor of the router's block size, 64 (issue
	// #1158); the peer's tests lower it (disableMinBlockSizeClamp).
	MinBlockTokens int
	// MaxPrefixTokens caps the tokens hashed: 131072 when 0.
	MaxPrefixTokens int
	// LRUCapacity is a pod's LRU capacity when its num_gpu_blocks is
	// unknown (Replica.KVCapacityTokens 0): 31250 when 0.
	LRUCapacity int
	// Precise reads the prefix from Prompt.Held (llm-d-precise) instead
	// of the router's own index.
	Precise bool
}

// llmdScrape is the EPP's metrics refresh interval
// (pkg/epp/server/options.go: refresh-metrics-interval 50ms).
const llmdScrape = 50 * time.Millisecond

var (
	_ Policy     = (*LLMD)(nil)
	_ Scraper    = (*LLMD)(nil)
	_ HeldReader = (*LLMD)(nil)
)

// llmdStrategy is llm-d in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var llmdStrategy = Strategy{
	Name:    PeerLLMD,
	Words:   "llm-d's endpoint picker in its default profile: the highest sum of queue 2, free KV cache 2 and prefix 3, the prefix matched in the router's own index of the prompts it sent, vLLM's gauges read every 50 ms",
	Reasons: []Reason{ReasonScore, ReasonPrefix, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return NewLLMD(LLMDConfig{Seed: cfg.Seed}), nil },
}

// llmdPreciseStrategy is llm-d-precise in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var llmdPreciseStrategy = Strategy{
	Name:    PeerLLMDPrecise,
	Words:   "llm-d's precise prefix profile: prefix 2 (the longest run of the prompt's blocks each replica holds, from vLLM's KV events), free KV cache 1 and queue 1",
	Reasons: []Reason{ReasonScore, ReasonPrefix, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return NewLLMDPrecise(cfg.Seed), nil },
}

// NewLLMD returns llm-d's EPP with cfg (zero fields take the defaults).
func NewLLMD(cfg LLMDConfig) *LLMD {
	if cfg.QueueWeight == 0 && cfg.KVWeight == 0 && cfg.PrefixWeight == 0 {
		cfg.QueueWeight, cfg.KVWeight, cfg.PrefixWeight = 2, 2, 3
	}
	orDefault(&cfg.VLLMBlockSize, 16)
	orDefault(&cfg.MinBlockTokens, 64)
	orDefault(&cfg.MaxPrefixTokens, 131072)
	orDefault(&cfg.LRUCapacity, 31250)
	return &LLMD{cfg: cfg, rng: newRand(cfg.Seed), index: llmdIndex{pods: make(map[uint64][]int32)}}
}

// NewLLMDPrecise is llm-d's precise prefix profile
// (deploy/config/epp-precise-prefix-cache-config.yaml @ebab687): the
// prefix-cache-scorer reads the precise-prefix-cache-producer, whose index
// vLLM's KV events feed (llm-d-kv-cache 7be76e1: blocks of the engine's
// tokens, full blocks only, the longest run from block 0 per pod), with
// weights prefix 2, kv-cache-utilization 1, queue 1, and the max-score
// picker. The events are Prompt.Held here, in the Prompt's blocks;
// matched and total blocks are counted in the producer's 64-token blocks
// (tokenProcessorConfig.blockSize 64), full blocks only.
func NewLLMDPrecise(seed uint64) *LLMD {
	return NewLLMD(LLMDConfig{Seed: seed, QueueWeight: 1, KVWeight: 1, PrefixWeight: 2, Precise: true})
}

// ScrapeInterval implements Scraper: 50 ms.
func (*LLMD) ScrapeInterval() time.Duration { return llmdScrape }

// ReadsHeld implements HeldReader: the precise profile reads Prompt.Held.
func (l *LLMD) ReadsHeld() bool { return l.cfg.Precise }

// blockTokens is the router's block size in pseudo-tokens
// (approximateprefix GetBlockSize with autotune on).
func (l *LLMD) blockTokens() int { return max(l.cfg.MinBlockTokens, l.cfg.VLLMBlockSize) }

// Pick implements Policy.
func (l *LLMD) Pick(r *Request, s *Snapshot, _ time.Time) (Decision, error) {
	if d, ok := pinned(r, s); ok {
		return d, nil
	}
	reps := s.Replicas
	n := len(reps)
	l.matched = grow(l.matched[:0], n)
	clear(l.matched)
	total := 0
	if l.cfg.Precise {
		total = l.preciseMatch(r)
	} else {
		total = l.approxMatch(r, reps)
	}
	minQ, maxQ := math.MaxInt, math.MinInt
	for i := range reps {
		if reps[i].Healthy {
			minQ, maxQ = min(minQ, reps[i].Waiting), max(maxQ, reps[i].Waiting)
		}
	}
	best, bestScore, ties := -1, math.Inf(-1), 0
	l.scores = grow(l.scores[:0], n)
	clear(l.scores)
	for i := range reps {
		if !reps[i].Healthy {
			continue
		}
		sc := l.cfg.QueueWeight*clamp01(llmdQueueScore(reps[i].Waiting, minQ, maxQ)) +
			l.cfg.KVWeight*clamp01(1-reps[i].KVUsage) +
			l.cfg.PrefixWeight*clamp01(llmdPrefixScore(l.matched[i], total))
		l.scores[i] = sc
		switch {
		case sc > bestScore:
			best, bestScore, ties = i, sc, 1
		case sc == bestScore:
			// Uniform among the tied: the picker's shuffle, then a
			// stable sort.
			ties++
			if l.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 {
		return Decision{}, noHealthy(s)
	}
	if !l.cfg.Precise {
		l.preRequest(best, reps[best])
	}
	reason := ReasonScore
	if l.matched[best] > 0 {
		reason = ReasonPrefix
	}
	return Decision{Replica: best, Reason: reason}, nil
}

// llmdQueueScore is queue-scorer's score of an endpoint with w requests
// waiting, min and max over the endpoints.
func llmdQueueScore(w, minQ, maxQ int) float64 {
	if maxQ == minQ {
		return 1
	}
	return float64(maxQ-w) / float64(maxQ-minQ)
}

// llmdPrefixScore is prefix-cache-scorer's match ratio (0 with no block).
func llmdPrefixScore(matched, total int) float64 {
	if total == 0 {
		return 0
	}
	return float64(matched) / float64(total)
}

// clamp01 is the scheduler profile's enforceScoreRange.
func clamp01(x float64) float64 { return min(max(x, 0), 1) }

// approxMatch hashes the prompt into l.hashes and counts in l.matched the
// blocks each pod holds (Produce / matchLongestPrefix); it returns the
// number of blocks.
func (l *LLMD) approxMatch(r *Request, reps []Replica) int {
	l.hashes = l.blockHashes(r)
	for _, h := range l.hashes {
		pods := l.index.pods[h]
		if len(pods) == 0 {
			break
		}
		for _, p := range pods {
			if int(p) < len(reps) {
				l.matched[p]++
			}
		}
	}
	return len(l.hashes)
}

// blockHashes is the prompt's chain of router block hashes
// (computeBlockHashes), capped at MaxPrefixTokens / block size.
func (l *LLMD) blockHashes(r *Request) []uint64 {
	bs := l.blockTokens()
	l.text = appendPromptText(l.text[:0], &r.Prompt, r.Prompt.tokens(r.PromptTokens))
	maxBlocks := l.cfg.MaxPrefixTokens / bs
	prev := xxhash.Sum64String(r.Model)
	var buf [16]byte
	hashes := l.hashes[:0]
	chunkHashes(l.text, bs*TextBytesPerToken, func(block uint64) bool {
		if len(hashes) >= maxBlocks {
			return false
		}
		binary.LittleEndian.PutUint64(buf[:8], block)
		binary.LittleEndian.PutUint64(buf[8:], prev)
		prev = xxhash.Sum64(buf[:])
		hashes = append(hashes, prev)
		return true
	})
	return hashes
}

// preciseMatch counts what each pod holds from Prompt.Held, in the
// producer's 64-token blocks, full blocks only; it returns the prompt's
// full blocks.
func (l *LLMD) preciseMatch(r *Request) int {
	bs := l.blockTokens()
	p := &r.Prompt
	for i, h := range p.Held {
		if i < len(l.matched) {
			l.matched[i] = h * p.BlockTokens / bs
		}
	}
	return r.PromptTokens / bs
}

// preRequest adds the prompt's hashes to pod i (PreRequest), with an
// LRU of the pod's num_gpu_blocks (cache_config_info), else LRUCapacity.
func (l *LLMD) preRequest(i int, rep Replica) {
	capacity := l.cfg.LRUCapacity
	if rep.KVCapacityTokens > 0 {
		capacity = rep.KVCapacityTokens / l.cfg.VLLMBlockSize
	}
	l.index.add(l.hashes, int32(i), capacity)
}

// llmdIndex is the approximate producer's indexer (indexer.go): block
// hash -> pods, and one LRU per pod, sized at the pod's first add.
type llmdIndex struct {
	pods map[uint64][]int32 // ascending pod indices
	lrus []*lruSet
}

// add puts hashes on pod: its LRU first, each hash added or refreshed in
// order, an evicted hash leaving the pod's entry; then the index.
func (x *llmdIndex) add(hashes []uint64, pod int32, capacity int) {
	x.lrus = grow(x.lrus, int(pod)+1)
	lru := x.lrus[pod]
	if lru == nil {
		lru = newLRUSet(capacity)
		x.lrus[pod] = lru
	}
	for _, h := range hashes {
		if ev, ok := lru.add(h); ok {
			x.pods[ev] = removePod(x.pods[ev], pod)
			if len(x.pods[ev]) == 0 {
				delete(x.pods, ev)
			}
		}
	}
	for _, h := range hashes {
		x.pods[h] = addPod(x.pods[h], pod)
	}
}

// size is the number of hashes pod holds.
func (x *llmdIndex) size(pod int) int {
	if pod < len(x.lrus) && x.lrus[pod] != nil {
		return x.lrus[pod].len()
	}
	return 0
}

// addPod inserts p into the ascending set ps.
func addPod(ps []int32, p int32) []int32 {
	for k, x := range ps {
		if x == p {
			return ps
		}
		if x > p {
			ps = append(ps, 0)
			copy(ps[k+1:], ps[k:])
			ps[k] = p
			return ps
		}
	}
	return append(ps, p)
}

// removePod deletes p from the set ps.
func removePod(ps []int32, p int32) []int32 {
	for k, x := range ps {
		if x == p {
			return append(ps[:k], ps[k+1:]...)
		}
	}
	return ps
}

// Scores appends the total score LLMD gave each replica at its last Pick
// (aligned with the snapshot; an unhealthy replica 0). For tests and reports.
func (l *LLMD) Scores(dst []float64) []float64 { return append(dst, l.scores...) }
