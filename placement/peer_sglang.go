package placement

import (
	"time"
)

// SGLang is the SGLang gateway's cache_aware policy, now Shepherd Model
// Gateway (lightseekorg/smg), read at HEAD 73da68c (2026-08-07, tag v1.9.0):
// model_gateway/src/policies/cache_aware.rs and crates/kv_index/src/
// string_tree.rs (the tree: charTree in radixtree.go).
//
//   - Defaults (model_gateway/src/main.rs): cache_threshold 0.3,
//     balance_abs_threshold 64, balance_rel_threshold 1.5,
//     eviction_interval 120 s, max_tree_size 2^26 characters per tenant;
//     the two KV-usage triggers default to 1.0, which never fires.
//   - Load is the gateway's own in-flight count per worker (+1 before the
//     request is sent, -1 when its response body is dropped):
//     Replica.InFlight. The minimum is by (load, processed, index), where
//     processed counts the requests the policy sent each worker (#1714).
//   - select_worker: over the healthy workers, if max - min > 64 and max
//     > 1.5 x min (is_imbalanced), the least loaded, with the text inserted
//     for it; else match the request text in the model's tree: a match
//     rate (matched characters / text characters) above 0.3 picks the
//     matched node's tenant, if it is healthy (else the first healthy
//     worker, and nothing is inserted); a lower rate picks the least
//     loaded. The text is inserted for the pick.
//   - Every 120 s the tree trims each tenant to 2^26 characters, least
//     recently used leaves first.
//
// The text is the chat messages' text joined by ' ' there; here the
// prompt's derived text (doc.go), characters as bytes. Not modelled: the
// gRPC token tree and the event-driven overlap (HTTP workers use the
// string tree), mesh synchronisation between gateways, circuit breakers
// (Replica.Healthy only), the 1-in-8 timestamp refresh being racy.
type SGLang struct {
	cfg       SGLangConfig
	trees     map[string]*charTree // per model
	processed []int
	text      vtext
	nextEvict time.Time
}

// SGLangConfig are cache_aware's parameters; zero fields take the
// gateway's defaults.
type SGLangConfig struct {
	CacheThreshold   float64       // 0.3
	BalanceAbs       int           // 64
	BalanceRel       float64       // 1.5
	EvictionInterval time.Duration // 120 s
	MaxTreeChars     int           // 1 << 26
}

var _ Policy = (*SGLang)(nil)

// sglangStrategy is sglang in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var sglangStrategy = Strategy{
	Name:    PeerSGLang,
	Words:   "the SGLang gateway's cache-aware policy: the replica whose tree of sent prompts matches over 30 % of the prompt's characters, the least busy when none does or when the load is out of balance",
	Reasons: []Reason{ReasonPrefix, ReasonLeastLoaded, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return NewSGLang(SGLangConfig{}), nil },
}

// vllmRouterStrategy is vllm-router in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var vllmRouterStrategy = Strategy{
	Name:    PeerVLLMRouter,
	Words:   "vllm-project/router's default, cache-aware: SGLang's policy with its constants",
	Reasons: []Reason{ReasonPrefix, ReasonLeastLoaded, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return NewVLLMRouter(), nil },
}

// NewSGLang returns SMG's cache_aware policy with cfg.
func NewSGLang(cfg SGLangConfig) *SGLang {
	orDefault(&cfg.CacheThreshold, 0.3)
	orDefault(&cfg.BalanceAbs, 64)
	orDefault(&cfg.BalanceRel, 1.5)
	orDefault(&cfg.EvictionInterval, 120*time.Second)
	orDefault(&cfg.MaxTreeChars, 1<<26)
	return &SGLang{cfg: cfg, trees: make(map[string]*charTree)}
}

// NewVLLMRouter is vllm-project/router's default policy, cache_aware: a
// fork of SGLang's router with the same constants (0.3 / 64 / 1.5 /
// 120 s / 2^26), read at the notes' snapshot (peer-routers.md section 4).
// Where the fork and SMG 73da68c differ (SMG's (load, processed, index)
// tie-break of #1714 came later), this model follows SMG.
func NewVLLMRouter() *SGLang { return NewSGLang(SGLangConfig{}) }

// imbalanced is is_imbalanced's count spread (abs AND rel).
func (g *SGLang) imbalanced(minLoad, maxLoad int) bool {
	return maxLoad-minLoad > g.cfg.BalanceAbs && float64(maxLoad) > float64(minLoad)*g.cfg.BalanceRel
}

// Pick implements Policy.
func (g *SGLang) Pick(r *Request, s *Snapshot, now time.Time) (Decision, error) {
	if d, ok := pinned(r, s); ok {
		return d, nil
	}
	g.maybeEvict(now)
	reps := s.Replicas
	g.processed = grow(g.processed, len(reps))
	minLoad, maxLoad, minIdx, firstHealthy := 0, 0, -1, -1
	for i := range reps {
		if !reps[i].Healthy {
			continue
		}
		load := max(reps[i].InFlight, 0)
		if firstHealthy < 0 {
			firstHealthy, minLoad, maxLoad = i, load, load
		}
		minLoad, maxLoad = min(minLoad, load), max(maxLoad, load)
		if minIdx < 0 || load < max(reps[minIdx].InFlight, 0) ||
			(load == max(reps[minIdx].InFlight, 0) && g.processed[i] < g.processed[minIdx]) {
			minIdx = i
		}
	}
	if minIdx < 0 {
		return Decision{}, noHealthy(s)
	}
	tree := g.trees[r.Model]
	if tree == nil {
		tree = newCharTree()
		g.trees[r.Model] = tree
	}
	g.text = appendPromptText(g.text[:0], &r.Prompt, r.Prompt.tokens(r.PromptTokens))
	if g.imbalanced(minLoad, maxLoad) {
		tree.match(g.text) // match_and_insert: the match's side effects, then the insert
		tree.insert(g.text, int32(minIdx))
		g.processed[minIdx]++
		return Decision{Replica: minIdx, Reason: ReasonLeastLoaded}, nil
	}
	m := tree.match(g.text)
	rate := 0.0
	if m.total > 0 {
		rate = float64(m.matched) / float64(m.total)
	}
	pick, reason := minIdx, ReasonLeastLoaded
	if rate > g.cfg.CacheThreshold {
		if m.tenant < 0 || int(m.tenant) >= len(reps) || !reps[m.tenant].Healthy {
			// The matched tenant is gone: the first healthy worker,
			// nothing inserted, nothing counted.
			return Decision{Replica: firstHealthy, Reason: ReasonLeastLoaded}, nil
		}
		pick, reason = int(m.tenant), ReasonPrefix
	}
	tree.insert(g.text, int32(pick))
	g.processed[pick]++
	return Decision{Replica: pick, Reason: reason}, nil
}

// maybeEvict runs the periodic eviction task: every EvictionInterval from
// the first request (the gateway starts it at construction).
func (g *SGLang) maybeEvict(now time.Time) {
	if g.nextEvict.IsZero() {
		g.nextEvict = now.Add(g.cfg.EvictionInterval)
		return
	}
	if now.Before(g.nextEvict) {
		return
	}
	// Ticks missed while no request came would find the trees unchanged:
	// one eviction stands for them.
	for _, model := range sortedKeys(g.trees) {
		g.trees[model].evict(g.cfg.MaxTreeChars)
	}
	for !now.Before(g.nextEvict) {
		g.nextEvict = g.nextEvict.Add(g.cfg.EvictionInterval)
	}
}
