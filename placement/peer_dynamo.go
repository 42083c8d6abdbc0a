package placement

import (
	"math/rand/v2"
	"time"
)

// Dynamo is NVIDIA Dynamo's KV router (`--router-mode kv`), read in
// ai-dynamo/dynamo lib/kv-router at 07a6c9c (the v1.4-era selector the
// notes cite; the newest stored file, selector/default.rs, keeps the same
// cost and tie-break):
//
//   - Config defaults (scheduling/config.rs): overlap_score_credit 1,
//     credit decay 0, prefill_load_scale 1, decode_active_request_weight 0,
//     router_temperature 0, use_kv_events true, router_ttl_secs 120 for the
//     approximate mode.
//   - Cost of worker w (selector/default.rs worker_logit, sequences'
//     WorkerLoadProjection): raw_prefill_blocks = (active_prefill_tokens_w
//   - isl) / block_size; credit = the device-tier overlap in blocks (the
//     radix tree fed by vLLM's KV events); decode = active_blocks_w + the
//     request's blocks that w's active requests do not already hold;
//     cost = prefill_load_scale x max(raw_prefill_blocks - credit, 0) +
//     decode.
//   - Pick at temperature 0 (pick_default_worker): the lowest cost, exact
//     ties replaced by reservoir sampling (the k-th tie wins when a draw in
//     [0, k) is 0), over the candidates in ascending worker id.
//   - State: per worker its active sequences (sequences/): a request's
//     blocks refcounted and its uncached prompt tokens counted as prefill
//     from routing until its first token; its blocks until it ends. Load is
//     the router's own, instant.
//   - Overlap: with KV events (the default) from Prompt.Held; without them
//     (Held nil) the approximate mode (approx.rs): the blocks the router
//     sent to w, each expiring 120 s after it was last routed
//     (PruneManager: a re-insert resets the TTL).
//
// Block hashes are XXH3-64 seed 1337 over the block's tokens there; here
// the Prompt's block ids, which are equal exactly when the blocks are (the
// hash decides placement only). Not modelled: temperature > 0 (softmax
// sampling), the queueing of requests at the router (off by default),
// replica sync between routers, host and disk tiers, disaggregated
// prefill/decode pools.
type Dynamo struct {
	cfg       DynamoConfig
	rng       *rand.Rand
	workers   []dynWorker
	active    map[uint64]dynActive // request ID -> its bookkeeping
	dynBlocks                      // the active blocks of all workers (peer_dynamo_blocks.go)
}

// DynamoConfig is the router's configuration; zero fields take Dynamo's
// defaults.
type DynamoConfig struct {
	Seed uint64
	// Rand, when set, is the tie-break source instead of one seeded with
	// Seed (the golden test gives a wyrand source, as fastrand's).
	Rand *rand.Rand
	// OverlapCredit and PrefillScale: 1 when 0.
	OverlapCredit, PrefillScale float64
	// TTL of a routed block in the approximate mode: 120 s when 0.
	TTL time.Duration
}

type dynWorker struct {
	prefillTokens int     // active prefill tokens
	blocks        []int32 // the distinct blocks w's active requests hold: their slots in dynBlocks
	approx        map[uint64]int64
	expiries      []dynExpiry // FIFO of approximate inserts, by time
}

type dynExpiry struct {
	id uint64
	at int64
}

type dynActive struct {
	worker  int
	prefill int
	slots   []int32 // the request's blocks, as routed
}

var (
	_ Policy     = (*Dynamo)(nil)
	_ Tracker    = (*Dynamo)(nil)
	_ HeldReader = (*Dynamo)(nil)
)

// dynamoStrategy is dynamo in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var dynamoStrategy = Strategy{
	Name:    PeerDynamo,
	Words:   "NVIDIA Dynamo's KV router: the lowest cost of the prompt's blocks a replica must compute (what it holds, from KV events, credited) plus the blocks of the requests it has in flight, ties at random",
	Reasons: []Reason{ReasonScore, ReasonPrefix, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return NewDynamo(DynamoConfig{Seed: cfg.Seed}), nil },
}

// NewDynamo returns Dynamo's KV router with cfg.
func NewDynamo(cfg DynamoConfig) *Dynamo {
	orDefault(&cfg.OverlapCredit, 1)
	orDefault(&cfg.PrefillScale, 1)
	orDefault(&cfg.TTL, 120*time.Second)
	d := &Dynamo{cfg: cfg, rng: cfg.Rand, active: make(map[uint64]dynActive), dynBlocks: newDynBlocks()}
	if d.rng == nil {
		d.rng = newRand(cfg.Seed)
	}
	return d
}

// ReadsHeld implements HeldReader: the overlap comes from KV events.
func (*Dynamo) ReadsHeld() bool { return true }

func (d *Dynamo) worker(i int) *dynWorker {
	for len(d.workers) <= i {
		d.workers = append(d.workers, dynWorker{approx: make(map[uint64]int64)})
	}
	return &d.workers[i]
}

// Pick implements Policy.
func (d *Dynamo) Pick(r *Request, s *Snapshot, now time.Time) (Decision, error) {
	if dec, ok := pinned(r, s); ok {
		d.route(r, dec.Replica, 0, now)
		return dec, nil
	}
	best, overlap := d.choose(r, s, now)
	if best < 0 {
		return Decision{}, noHealthy(s)
	}
	d.route(r, best, overlap, now)
	reason := ReasonScore
	if overlap > 0 {
		reason = ReasonPrefix
	}
	return Decision{Replica: best, Reason: reason}, nil
}

// choose is the selection without its bookkeeping (ScheduleMode::
// QueryOnly): the worker of least cost and its overlap; -1 when none is
// healthy.
func (d *Dynamo) choose(r *Request, s *Snapshot, now time.Time) (best, bestOverlap int) {
	p := &r.Prompt
	bs := max(p.BlockTokens, 1)
	isl := r.PromptTokens
	reqBlocks := len(p.Blocks)
	at := now.UnixNano()
	depth := d.activeDepths(p.Blocks, d.prevOf(r), len(s.Replicas))
	best, bestCost, ties := -1, 0.0, 0
	bestOverlap = 0
	for i := range s.Replicas {
		if !s.Replicas[i].Healthy {
			continue
		}
		w := d.worker(i)
		overlap := d.overlap(p, i, w, at)
		cost := d.cost(w.prefillTokens+isl, bs, overlap, len(w.blocks)+reqBlocks-int(depth[i]))
		switch {
		case best < 0 || cost < bestCost:
			best, bestCost, ties, bestOverlap = i, cost, 1, overlap
		case cost == bestCost:
			ties++
			if boundedDraw(d.rng, uint64(ties)) == 0 {
				best, bestOverlap = i, overlap
			}
		}
	}
	return best, bestOverlap
}

// cost is worker_logit: prefill_load_scale x max(raw prefill blocks -
// credit x overlap, 0) + decode blocks, with prefillTokens the worker's
// active prefill tokens plus the request's.
func (d *Dynamo) cost(prefillTokens, blockSize, overlap, decodeBlocks int) float64 {
	raw := float64(prefillTokens) / float64(blockSize)
	return d.cfg.PrefillScale*max(raw-d.cfg.OverlapCredit*float64(overlap), 0) + float64(decodeBlocks)
}

// overlap is the device-tier prefix depth of p on worker i, in blocks:
// Prompt.Held from KV events, else the approximate index.
func (d *Dynamo) overlap(p *Prompt, i int, w *dynWorker, at int64) int {
	if p.Held != nil {
		if i < len(p.Held) {
			return p.Held[i]
		}
		return 0
	}
	n := 0
	for _, id := range p.Blocks {
		if exp, ok := w.approx[id]; !ok || exp <= at {
			break
		}
		n++
	}
	return n
}

// route adds request r, sent to worker i with overlap blocks cached, to
// the worker's active sequences (and, without events, routes its blocks
// into the approximate index with a fresh TTL).
func (d *Dynamo) route(r *Request, i, overlap int, now time.Time) {
	w := d.worker(i)
	p := &r.Prompt
	prefill := max(r.PromptTokens-overlap*max(p.BlockTokens, 1), 0)
	w.prefillTokens += prefill
	d.active[r.ID] = dynActive{worker: i, prefill: prefill, slots: d.holdAll(r, i)}
	if p.Held == nil {
		at := now.UnixNano()
		exp := at + d.cfg.TTL.Nanoseconds()
		for _, id := range p.Blocks {
			w.approx[id] = exp
			w.expiries = append(w.expiries, dynExpiry{id: id, at: exp})
		}
		d.prune(w, at)
	}
}

// prune drops the approximate blocks whose TTL has passed
// (PruneManager.pop_expired): the FIFO is in expiry order, as the TTL is
// one constant; an entry refreshed since is skipped.
func (d *Dynamo) prune(w *dynWorker, at int64) int {
	k, n := 0, 0
	for ; k < len(w.expiries) && w.expiries[k].at <= at; k++ {
		e := w.expiries[k]
		if w.approx[e.id] == e.at {
			delete(w.approx, e.id)
			n++
		}
	}
	if k > 0 {
		w.expiries = append(w.expiries[:0], w.expiries[k:]...)
	}
	return n
}

// FirstToken implements Tracker: the request's prefill tokens leave its
// worker's load (mark_prefill_completed).
func (d *Dynamo) FirstToken(r *Request, _ int, _ time.Time) {
	a, ok := d.active[r.ID]
	if !ok || a.prefill == 0 {
		return
	}
	d.worker(a.worker).prefillTokens -= a.prefill
	a.prefill = 0
	d.active[r.ID] = a
}

// Finished implements Tracker: the request's blocks are freed (free).
func (d *Dynamo) Finished(r *Request, _ int, _ time.Time) {
	a, ok := d.active[r.ID]
	if !ok {
		return
	}
	delete(d.active, r.ID)
	d.worker(a.worker).prefillTokens -= a.prefill
	d.releaseAll(r, a.worker, a.slots)
}
