package placement

import (
	"math"
	"math/rand/v2"
	"time"
)

// RayPrefix is Ray Serve LLM's PrefixCacheAffinityRouter, read in
// ray-project/ray at python/ray/llm/_internal/serve/routing_policies/
// prefix_aware/prefix_aware_router.py @06c16f2 and prefix_tree.py @e852f9b,
// with the request router's queue-length cache (ray/serve/_private/
// request_router/request_router.py):
//
//   - State (initialize_state defaults): imbalanced_threshold inf (since
//     PR #59390), match_rate_threshold 0.1, eviction off. The prefix tree
//     holds every replica as a tenant (add_tenants inserts "" for each)
//     and the text of every request routed, inserted for its replica
//     after routing (on_request_routed).
//   - Text: the messages' contents concatenated.
//   - _prefix_match_best_replicas: with the load balanced (max - min queue
//     length <= threshold; never over at inf), match the text: the walk
//     enters a child only while one of the candidate replicas is a tenant
//     of it, a partial edge match stops it; if matched / len(text) < 0.1,
//     the tenants with the fewest characters in the tree; else the
//     candidate tenants of the node the walk stopped on. An imbalanced
//     load, or an empty prompt, falls back to power of two choices.
//   - Among the chosen replicas the request goes to the one with the
//     shortest queue (the first on ties), as the router reads queue
//     lengths: from its cache, an entry younger than 10 s
//     (RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S), else a probe of the
//     replica (its exact count, Replica.InFlight here); sending a request
//     sets the entry to the count the replica reports back with it. A
//     request's end is not seen until the next send or probe: the cache
//     runs high for up to 10 s.
//
// Not modelled: max_ongoing_requests (1e9 in Ray Serve LLM, never full),
// locality and multiplexing preferences, several routers sharing one
// tree actor, the tree's timestamps (used only by eviction, off).
type RayPrefix struct {
	cfg   RayPrefixConfig
	rng   *rand.Rand
	tree  *charTree
	cache []rayQueueLen
	text  vtext
	cand  []int
}

// RayPrefixConfig is the router's state; zero fields take Ray's defaults.
type RayPrefixConfig struct {
	Seed uint64
	// ImbalancedThreshold: +Inf when 0.
	ImbalancedThreshold float64
	// MatchRateThreshold: 0.1 when 0.
	MatchRateThreshold float64
	// QueueLenTTL is the queue-length cache's staleness timeout: 10 s
	// when 0.
	QueueLenTTL time.Duration
}

type rayQueueLen struct {
	n  int
	at time.Time
	ok bool
}

var _ Policy = (*RayPrefix)(nil)

// rayPrefixStrategy is ray-prefix in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var rayPrefixStrategy = Strategy{
	Name:    PeerRayPrefix,
	Words:   "Ray Serve's prefix-cache affinity router: the replicas whose tree of sent prompts matches over 10 % of the prompt's characters (else those holding the least), then the shortest queue as read up to 10 s ago",
	Reasons: []Reason{ReasonPrefix, ReasonLeastLoaded, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return NewRayPrefix(RayPrefixConfig{Seed: cfg.Seed}), nil },
}

// NewRayPrefix returns the prefix-aware router with cfg.
func NewRayPrefix(cfg RayPrefixConfig) *RayPrefix {
	orDefault(&cfg.ImbalancedThreshold, math.Inf(1))
	orDefault(&cfg.MatchRateThreshold, 0.1)
	orDefault(&cfg.QueueLenTTL, 10*time.Second)
	return &RayPrefix{cfg: cfg, rng: newRand(cfg.Seed), tree: newCharTree()}
}

// queueLen is the router's view of replica i's queue at now: the cached
// entry while it is fresh, else a probe.
func (p *RayPrefix) queueLen(i int, rep *Replica, now time.Time) int {
	p.cache = grow(p.cache, i+1)
	c := &p.cache[i]
	if !c.ok || now.Sub(c.at) >= p.cfg.QueueLenTTL {
		*c = rayQueueLen{n: max(rep.InFlight, 0), at: now, ok: true}
	}
	return c.n
}

// Pick implements Policy.
func (p *RayPrefix) Pick(r *Request, s *Snapshot, now time.Time) (Decision, error) {
	if d, ok := pinned(r, s); ok {
		return d, nil
	}
	reps := s.Replicas
	if !anyHealthy(reps) {
		return Decision{}, noHealthy(s)
	}
	p.text = appendPromptText(p.text[:0], &r.Prompt, r.Prompt.tokens(r.PromptTokens))
	p.cand = p.cand[:0]
	reason := ReasonLeastLoaded
	if len(p.text) > 0 && !p.imbalanced(reps, now) {
		reason = p.prefixCandidates(reps)
	}
	if len(p.cand) == 0 {
		p.powerOfTwo(reps)
		reason = ReasonLeastLoaded
	}
	best, bestQ := -1, 0
	for _, i := range p.cand {
		if q := p.queueLen(i, &reps[i], now); best < 0 || q < bestQ {
			best, bestQ = i, q
		}
	}
	// on_send_request, then the replica's own count back with it.
	p.cache[best] = rayQueueLen{n: max(reps[best].InFlight, 0) + 1, at: now, ok: true}
	p.tree.insert(p.text, int32(best)) // on_request_routed
	return Decision{Replica: best, Reason: reason}, nil
}

// imbalanced compares the spread of queue lengths with the threshold
// (never over at the default +Inf, and then nothing is probed).
func (p *RayPrefix) imbalanced(reps []Replica, now time.Time) bool {
	if math.IsInf(p.cfg.ImbalancedThreshold, 1) {
		return false
	}
	lo, hi := math.MaxInt, 0
	for i := range reps {
		if reps[i].Healthy {
			q := p.queueLen(i, &reps[i], now)
			lo, hi = min(lo, q), max(hi, q)
		}
	}
	return float64(hi-lo) > p.cfg.ImbalancedThreshold
}

// prefixCandidates fills p.cand with the matched or the smallest tenants.
func (p *RayPrefix) prefixCandidates(reps []Replica) Reason {
	avail := func(rep int32) bool { return int(rep) < len(reps) && reps[rep].Healthy }
	matched, node := p.tree.matchAvail(p.text, avail)
	if float64(matched)/float64(p.text.size()) < p.cfg.MatchRateThreshold {
		smallest := math.MaxInt
		for i := range reps {
			if reps[i].Healthy {
				smallest = min(smallest, p.tree.tenantSize(i))
			}
		}
		for i := range reps {
			if reps[i].Healthy && p.tree.tenantSize(i) == smallest {
				p.cand = append(p.cand, i)
			}
		}
		return ReasonLeastLoaded
	}
	if node == ctRoot {
		// Every replica is a tenant of the root (add_tenants).
		for i := range reps {
			if reps[i].Healthy {
				p.cand = append(p.cand, i)
			}
		}
		return ReasonPrefix
	}
	for i := range reps {
		if reps[i].Healthy && p.tree.nodes[node].tenantAt(int32(i)) >= 0 {
			p.cand = append(p.cand, i)
		}
	}
	return ReasonPrefix
}

// powerOfTwo fills p.cand with two healthy replicas drawn at random
// (PowerOfTwoChoicesRequestRouter), or the one there is.
func (p *RayPrefix) powerOfTwo(reps []Replica) {
	var healthy []int
	for i := range reps {
		if reps[i].Healthy {
			healthy = append(healthy, i)
		}
	}
	if len(healthy) <= 2 {
		p.cand = append(p.cand, healthy...)
		return
	}
	a := p.rng.IntN(len(healthy))
	b := p.rng.IntN(len(healthy) - 1)
	if b >= a {
		b++
	}
	p.cand = append(p.cand, healthy[min(a, b)], healthy[max(a, b)])
}

// matchAvail is prefix_tree.py prefix_match: the walk enters a child only
// while one of the available tenants is on it; it returns the characters
// matched and the node it stopped on.
func (t *charTree) matchAvail(text vtext, avail func(int32) bool) (matched int, node int32) {
	c := cursor{t: text}
	cur := int32(ctRoot)
	for !c.done() {
		ch := t.child(cur, c.first())
		if ch < 0 {
			break
		}
		ok := false
		for _, x := range t.nodes[ch].tenants {
			if avail(x.rep) {
				ok = true
				break
			}
		}
		if !ok {
			break
		}
		nt := t.nodes[ch].text
		s := c.shared(nt)
		matched += s
		cur = ch
		if s < nt.size() {
			break
		}
		c.advance(s)
	}
	return matched, cur
}
