package sim

// This file is one vLLM engine (one data-parallel rank): the V1 scheduler
// (vllm/v1/core/sched/scheduler.py, Scheduler.schedule and
// update_from_output) over the KV cache manager
// (vllm/v1/core/kv_cache_manager.py: get_computed_blocks, allocate_slots,
// free) and the block pool of blockpool.go.

// engineConfig is what every replica of a farm shares.
type engineConfig struct {
	blockSize           int
	maxNumSeqs          int
	maxNumBatchedTokens int
	numGPUBlocks        int
	steps               stepModel

	// reserveFullISL is vLLM's scheduler_reserve_full_isl
	// (vllm/config/scheduler.py; PR #37307): the waiting loop of
	// Scheduler.schedule passes full_sequence_must_fit to
	// KVCacheManager.allocate_slots, which admits a request only if its whole
	// current sequence (request.num_tokens) fits in the free blocks, its
	// evictable prefix hits counted as needed; otherwise the loop stops,
	// preempting nothing.
	reserveFullISL bool
	// watermarkBlocks is int(watermark x num_gpu_blocks) (KVCacheManager
	// __init__): free blocks a waiting or preempted request must leave
	// when some request is already running (allocate_slots,
	// has_scheduled_reqs = bool(self.running)).
	watermarkBlocks int
	// countEveryLookup: prefix-cache stats as vLLM counted them before PR
	// #48860 (KVCacheManager.get_computed_blocks recorded queries and hits
	// on every lookup, so a head-of-queue request blocked by allocation was
	// counted again at every step). Without it they are counted once, at
	// admission.
	countEveryLookup bool
}

// newEngineConfig returns the engine configuration of f's replicas.
func newEngineConfig(f *Farm) engineConfig {
	v := f.Spec.VLLM
	return engineConfig{
		blockSize:           v.BlockSize,
		maxNumSeqs:          v.MaxNumSeqs,
		maxNumBatchedTokens: v.MaxNumBatchedTokens,
		numGPUBlocks:        f.NumGPUBlocks,
		steps:               newStepModel(f.Deployment, float64(f.Sizing.WeightsBytes)*float64(f.Spec.TensorParallelSize), f.Spec.StepTime).scaled(f.Spec.SpeedScale),
		reserveFullISL:      v.ReserveFullISL == "true",
		watermarkBlocks:     int(v.Watermark * float64(f.NumGPUBlocks)),
		countEveryLookup:    !f.Behaviour.StatsAtAdmission,
	}
}

// fits reports whether a request of prompt + output tokens can ever be held
// by one replica's KV cache (all blocks but the null block).
func (c *engineConfig) fits(prompt, output int) bool {
	return (prompt+output+c.blockSize-1)/c.blockSize <= c.numGPUBlocks-1
}

// MissTokens classifies the prompt tokens of first lookups that were not
// served from the prefix cache. Every such token is in exactly one class.
type MissTokens struct {
	Cold      int64 `json:"cold"`      // its block was never computed on any replica
	Evicted   int64 `json:"evicted"`   // its block was cached on this replica before and is gone
	Elsewhere int64 `json:"elsewhere"` // its block was computed only on other replicas
	Partial   int64 `json:"partial"`   // a trailing partial block, or the block the hit cap forces
}

// Total is the sum of the classes.
func (m MissTokens) Total() int64 { return m.Cold + m.Evicted + m.Elsewhere + m.Partial }

func (m MissTokens) sub(o MissTokens) MissTokens {
	return MissTokens{m.Cold - o.Cold, m.Evicted - o.Evicted, m.Elsewhere - o.Elsewhere, m.Partial - o.Partial}
}

// engineStats are one replica's cumulative counters: the source of its
// vllm:* series and of the direct counts the tests compare PromQL with.
type engineStats struct {
	// Lookups as vLLM exports them (vllm:prefix_cache_queries_total /
	// _hits_total): each request's first admission, and with
	// countEveryLookup every failed lookup before it too. A preempted
	// request's re-lookup is counted apart, as vLLM does
	// (preempted_queries).
	queries, hits                   int64
	preemptedQueries, preemptedHits int64
	// admitQueries and admitHits count each request once, at its first
	// admission: the true hit rate, whatever the version counts.
	admitQueries, admitHits int64
	// prefillComputed counts the prompt tokens scheduled for computation
	// by prefill chunks, over all admissions, preempted ones included;
	// prefillAbandoned the tokens of an admission left uncomputed because
	// the request was preempted or cut before its prefill ended. With no
	// prefill in progress: queries + preemptedQueries == hits +
	// preemptedHits + prefillComputed + prefillAbandoned.
	prefillComputed  int64
	prefillAbandoned int64

	promptTokens     int64 // vllm:prompt_tokens_total (at the first token)
	generationTokens int64 // vllm:generation_tokens_total
	preemptions      int64 // vllm:num_preemptions_total
	finishedStop     int64 // vllm:request_success_total{finished_reason="stop"}
	finishedLength   int64 // ... {finished_reason="length"}
	miss             MissTokens
	steps            int64
}

// replica is one vLLM engine.
type replica struct {
	id      int
	cfg     *engineConfig
	pool    *blockPool
	waiting seqQueue
	running []*seq
	stats   engineStats

	busy         bool    // a step is in flight
	abortPending bool    // running requests were aborted during the step in flight
	batch        []*seq  // the requests scheduled in the step in flight
	chunks       []chunk // their work, aligned with batch
	stepTokens   int     // the tokens of chunks
	fresh        []*seq  // the requests of batch scheduled for the first time
	hitBuf       []int32
	// firstToken, when set, is told of every request's first token;
	// nextToken of every later one, before s.lastTokenUs moves to now.
	// Without nextToken, nextTokens is told of the later tokens in runs of
	// consecutive tokens of the batch whose latency is the same (n tokens,
	// itlUs after their previous one): all of a batch's decodes, mostly.
	firstToken func(*seq)
	nextToken  func(s *seq, now int64)
	nextTokens func(rep int, itlUs int64, n int)
	freeBuf    [][]int32 // recycled block tables
}

// newReplica returns replica id, recording the hashes it caches in ever
// (shared by the replicas of a run; nil: not recorded, misses read cold).
func newReplica(id int, cfg *engineConfig, ever *everSet) *replica {
	r := &replica{
		id:   id,
		cfg:  cfg,
		pool: newBlockPool(cfg.numGPUBlocks),
	}
	r.pool.ever, r.pool.everID = ever, id
	return r
}

// hasWork reports whether the engine would run a step now.
func (r *replica) hasWork() bool { return r.waiting.len() > 0 || len(r.running) > 0 }

// add enqueues a new request at the tail of the waiting queue.
func (r *replica) add(s *seq) {
	s.replica = r.id
	r.waiting.pushBack(s)
}

// startStep runs the scheduler of an idle replica and returns the duration
// of the step it started; false when the replica is busy or scheduled
// nothing.
func (r *replica) startStep() (us int64, ok bool) {
	if r.busy || !r.hasWork() {
		return 0, false
	}
	if r.schedule() == 0 {
		return 0, false
	}
	r.busy = true
	return r.cfg.steps.micros(r.chunks), true
}

// schedule picks the next step's batch: running requests first (decodes
// and unfinished chunked prefills, preempting the newest running request
// when blocks run out), then, if nothing was preempted, waiting requests in
// FCFS order while the token budget, max_num_seqs and the free blocks allow.
// It returns the number of requests scheduled.
func (r *replica) schedule() int {
	bs := r.cfg.blockSize
	budget := r.cfg.maxNumBatchedTokens
	r.batch, r.chunks = r.batch[:0], r.chunks[:0]
	clear(r.fresh)
	r.fresh = r.fresh[:0]
	preempted := false

	for i := 0; i < len(r.running) && budget > 0; {
		s := r.running[i]
		n := min(s.numTokens-s.computed, budget)
		if n <= 0 {
			i++
			continue
		}
		if n == 1 && s.computed < len(s.blocks)*bs && !stepByStep {
			// A decode whose token fits the blocks it holds: allocate_slots
			// takes no block and cannot fail (allocateSlots with no hits
			// and no new block), only caching a block the token completes.
			// (computed+1)/bs > cachedBlocks, without a division.
			if s.computed+1 >= (s.cachedBlocks+1)*bs && (s.hashEnd == 0 || s.cachedBlocks < s.hashEnd-1) {
				r.cacheKnown(s, (s.computed+1)/bs)
			}
			r.batch = append(r.batch, s)
			r.chunks = append(r.chunks, chunk{start: s.computed, n: 1})
			budget--
			i++
			continue
		}
		scheduled := false
		for {
			if r.allocateSlots(s, n, nil) {
				scheduled = true
				break
			}
			victim := r.running[len(r.running)-1]
			r.running[len(r.running)-1] = nil
			r.running = r.running[:len(r.running)-1]
			r.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
		}
		if !scheduled {
			break
		}
		r.batch = append(r.batch, s)
		r.chunks = append(r.chunks, chunk{start: s.computed, n: n})
		budget -= n
		i++
	}

	if !preempted {
		for r.waiting.len() > 0 && budget > 0 {
			if len(r.running) >= r.cfg.maxNumSeqs {
				break
			}
			s := r.waiting.front()
			hits := r.longestHit(s)
			hitTokens := len(hits) * bs
			n := min(s.numTokens-hitTokens, budget)
			// allocate_slots: the watermark applies to waiting and preempted
			// requests once something is running.
			watermark := 0
			if len(r.running) > 0 {
				watermark = r.cfg.watermarkBlocks
			}
			ev := r.evictableFor(s, hits)
			if r.cfg.reserveFullISL && !r.fullSequenceFits(s, hits, ev, watermark) {
				r.recordFailedLookup(s, len(hits))
				r.noteBlocked(s, hits, ev)
				break
			}
			newBlocks, ok := r.slotsNeededEv(s, n, hits, ev, watermark)
			if !ok {
				r.recordFailedLookup(s, len(hits))
				r.noteBlocked(s, hits, ev)
				break
			}
			s.memoReplica = -1 // admitted: the blocks are its own now
			if s.scheduledUs < 0 {
				// Only here: a running request was in an earlier step.
				r.fresh = append(r.fresh, s)
			}
			var miss MissTokens
			if !s.admitted {
				miss = r.classifyMisses(s, len(hits)) // before allocation caches new blocks
			}
			r.commitSlots(s, n, hits, newBlocks)
			r.waiting.popFront()
			r.running = append(r.running, s)
			r.recordAdmission(s, len(hits), miss)
			s.computed = hitTokens
			r.batch = append(r.batch, s)
			r.chunks = append(r.chunks, chunk{start: s.computed, n: n})
			budget -= n
		}
	}

	for i, s := range r.batch {
		c := r.chunks[i]
		if c.start < s.admitTokens {
			r.stats.prefillComputed += int64(c.n)
		}
		s.computed += c.n
	}
	r.stepTokens = r.cfg.maxNumBatchedTokens - budget
	return len(r.batch)
}

// longestHit walks the request's block hashes until the first miss, capped
// so that at least one token is computed (max_cache_hit_length =
// num_tokens - 1), and returns the cached blocks found (in r.hitBuf, or in
// s.memo for a request looked up before).
//
// A waiting request that the scheduler could not admit is looked up again
// at every step, as vLLM does; with long prompts those walks dominate the
// run. noteBlocked keeps the blocks found; while no cached block has been
// evicted since (blockPool.evictions), they are still exactly what lookup
// returns for those hashes (duplicates join the end of a hash's chain), so
// the walk resumes after them: the same answer, without re-reading them.
func (r *replica) longestHit(s *seq) []int32 {
	bs := r.cfg.blockSize
	maxBlocks := (s.numTokens - 1) / bs
	hits := r.hitBuf[:0]
	if s.memoReplica == r.id && s.memoEvictions == r.pool.evictions && len(s.memo) <= maxBlocks && !noLookupMemo {
		hits = s.memo
	} else {
		s.memoReplica = -1
	}
	for k := len(hits); k < maxBlocks; k++ {
		h, ok := s.blockHash(k, bs)
		if !ok {
			break
		}
		b := r.pool.lookup(h)
		if b == noBlock {
			break
		}
		hits = append(hits, b)
	}
	if s.memoReplica == r.id {
		s.memo = hits
	} else {
		r.hitBuf = hits
	}
	return hits
}

// noLookupMemo switches the memo of longestHit off (tests compare).
var noLookupMemo = false

// noteBlocked remembers the hits of a request the waiting loop could not
// admit (see longestHit), and ev, how many of them were evictable.
func (r *replica) noteBlocked(s *seq, hits []int32, ev int) {
	if s.memoReplica != r.id {
		s.memo = append(s.memo[:0], hits...)
	}
	s.memoReplica, s.memoEvictions = r.id, r.pool.evictions
	s.memoEvictable, s.memoEvN, s.memoFlips = ev, len(hits), r.pool.refFlips
}

// evictableFor is evictable(hits) for the request at the head of the
// waiting queue. A request blocked there counts its hits at every step;
// while its memo holds (longestHit) and no block of the pool went between
// held and free since (blockPool.refFlips), the count of the hits it
// counted before is unchanged, and only the hits found since are counted.
func (r *replica) evictableFor(s *seq, hits []int32) int {
	if noLookupMemo || stepByStep || s.memoReplica != r.id || s.memoFlips != r.pool.refFlips || s.memoEvN > len(hits) {
		return r.evictable(hits)
	}
	return s.memoEvictable + r.evictable(hits[s.memoEvN:])
}

// allocateSlots gives s room for n more tokens after its computed ones and
// its new cache hits, or reports false and changes nothing when the free
// queue is too short (vLLM KVCacheManager.allocate_slots).
func (r *replica) allocateSlots(s *seq, n int, hits []int32) bool {
	newBlocks, ok := r.slotsNeeded(s, n, hits)
	if ok {
		r.commitSlots(s, n, hits, newBlocks)
	}
	return ok
}

// slotsNeeded returns how many blocks s needs from the free queue for n
// more tokens after its computed ones and its new cache hits, and whether
// the free queue has them. Hit blocks that sit in the free queue count
// against the free blocks, since touching them takes them out of it.
func (r *replica) slotsNeeded(s *seq, n int, hits []int32) (newBlocks int, ok bool) {
	return r.slotsNeededWithin(s, n, hits, 0)
}

// slotsNeededWithin is slotsNeeded leaving reserve blocks free (the
// watermark).
func (r *replica) slotsNeededWithin(s *seq, n int, hits []int32, reserve int) (newBlocks int, ok bool) {
	return r.slotsNeededEv(s, n, hits, r.evictable(hits), reserve)
}

// slotsNeededEv is slotsNeededWithin with ev = evictable(hits).
func (r *replica) slotsNeededEv(s *seq, n int, hits []int32, ev, reserve int) (newBlocks int, ok bool) {
	bs := r.cfg.blockSize
	need := (s.computed + len(hits)*bs + n + bs - 1) / bs
	newBlocks = max(need-len(hits)-len(s.blocks), 0)
	return newBlocks, newBlocks+ev+reserve <= r.pool.numFree
}

// evictable counts the hit blocks that sit in the free queue: touching them
// takes them out of it, so they count as needed.
func (r *replica) evictable(hits []int32) int {
	n := 0
	for _, b := range hits {
		if r.pool.blocks[b].ref == 0 {
			n++
		}
	}
	return n
}

// fullSequenceFits is allocate_slots' admission gate with
// full_sequence_must_fit (vllm/v1/core/kv_cache_manager.py): the blocks
// for the request's whole current sequence, min(num_tokens, max_model_len),
// beyond its hits and the blocks it holds, plus its evictable hits and
// the watermark, must be free. ev is evictable(hits).
func (r *replica) fullSequenceFits(s *seq, hits []int32, ev, watermark int) bool {
	bs := r.cfg.blockSize
	need := (s.numTokens + bs - 1) / bs
	toAllocate := max(need-len(hits)-len(s.blocks), 0) + ev
	return toAllocate+watermark <= r.pool.numFree
}

// recordFailedLookup counts a lookup whose allocation failed, as vLLM did
// before PR #48860 (get_computed_blocks recorded the stats of every call);
// since then nothing is counted until the request is admitted.
func (r *replica) recordFailedLookup(s *seq, hitBlocks int) {
	if !r.cfg.countEveryLookup {
		return
	}
	if s.admitted {
		return // a preempted request's re-lookups never reach the exported counters
	}
	hitTokens := int64(hitBlocks * r.cfg.blockSize)
	r.stats.queries += int64(s.numTokens)
	r.stats.hits += hitTokens
}

// commitSlots takes the hits and newBlocks blocks that slotsNeeded counted
// for s, then caches its full blocks of known tokens.
func (r *replica) commitSlots(s *seq, n int, hits []int32, newBlocks int) {
	bs := r.cfg.blockSize
	computed := s.computed + len(hits)*bs
	if s.blocks == nil {
		s.blocks = r.takeTable()
	}
	r.pool.touch(hits)
	s.blocks = append(s.blocks, hits...)
	if len(hits) > 0 {
		s.cachedBlocks = len(hits)
	}
	s.blocks = r.pool.allocate(newBlocks, s.blocks)

	// Cache every full block of known tokens (vLLM caches at schedule time:
	// num_tokens_to_cache = min(computed + new, num_tokens)).
	r.cacheKnown(s, min(computed+n, s.numTokens)/bs)
}

// cacheKnown caches s's blocks from its first uncached one up to full, or
// to the first whose hash is unknown.
func (r *replica) cacheKnown(s *seq, full int) {
	bs := r.cfg.blockSize
	for k := s.cachedBlocks; k < full; k++ {
		h, ok := s.blockHash(k, bs)
		if !ok {
			s.hashEnd = k + 1 // and every later block: a decode past it skips the call
			break
		}
		r.pool.cacheBlock(s.blocks[k], h)
		if w := r.pool.watch; w != nil {
			parent, hasParent := uint64(0), false
			if k > 0 {
				parent, hasParent = s.blockHash(k-1, bs)
			}
			w.Stored(h, parent, hasParent)
		}
		s.cachedBlocks = k + 1
	}
}

// stepByStep turns off the fast paths of pure decode work (the decode
// shortcut of schedule, the batched inter-token observations of
// finishStep), which must give exactly the output of the step-by-step
// model (TestFastPathEquivalence).
var stepByStep = false

// recordAdmission counts a lookup of hitBlocks blocks for s and, on its
// first admission, adds the classification of its missed prompt tokens.
func (r *replica) recordAdmission(s *seq, hitBlocks int, miss MissTokens) {
	hitTokens := int64(hitBlocks * r.cfg.blockSize)
	queried := int64(s.numTokens)
	s.admitTokens = s.numTokens
	if s.admitted {
		r.stats.preemptedQueries += queried
		r.stats.preemptedHits += hitTokens
		return
	}
	s.admitted = true
	s.cachedTokens = int(hitTokens)
	r.stats.queries += queried
	r.stats.hits += hitTokens
	r.stats.admitQueries += queried
	r.stats.admitHits += hitTokens
	r.stats.miss.Cold += miss.Cold
	r.stats.miss.Evicted += miss.Evicted
	r.stats.miss.Elsewhere += miss.Elsewhere
	r.stats.miss.Partial += miss.Partial
}

// classifyMisses classifies the prompt tokens of s that a lookup of
// hitBlocks blocks leaves to compute: past the hit-cap boundary they are
// partial; a full block before it is evicted if its hash was ever cached
// on this replica, elsewhere if it was computed only on other replicas,
// and cold otherwise (or when it has no hash).
func (r *replica) classifyMisses(s *seq, hitBlocks int) MissTokens {
	bs := r.cfg.blockSize
	var m MissTokens
	maxBlocks := (s.numTokens - 1) / bs
	m.Partial = int64(s.numTokens - maxBlocks*bs)
	for k := hitBlocks; k < maxBlocks; k++ {
		h, ok := s.blockHash(k, bs)
		if !ok || r.pool.ever == nil {
			m.Cold += int64(bs)
			continue
		}
		switch here, anywhere := r.pool.ever.seen(h, r.id); {
		case here:
			m.Evicted += int64(bs)
		case anywhere:
			m.Elsewhere += int64(bs)
		default:
			m.Cold += int64(bs)
		}
	}
	return m
}

// preempt frees a running request's blocks and sends it back to the head of
// the waiting queue, to be recomputed from scratch (preemption by
// recompute).
func (r *replica) preempt(s *seq) {
	r.abandon(s)
	r.releaseBlocks(s)
	s.computed = 0
	s.preemptions++
	r.stats.preemptions++
	r.waiting.pushFront(s)
}

// abandon counts the prefill tokens of a running request that will not be
// computed in its current admission.
func (r *replica) abandon(s *seq) {
	if s.computed < s.admitTokens {
		r.stats.prefillAbandoned += int64(s.admitTokens - s.computed)
	}
}

// releaseBlocks frees s's block table (in reverse order) and recycles it.
func (r *replica) releaseBlocks(s *seq) {
	if s.blocks == nil {
		return
	}
	r.pool.free(s.blocks)
	r.freeBuf = append(r.freeBuf, s.blocks[:0])
	s.blocks = nil
	s.cachedBlocks = 0
}

func (r *replica) takeTable() []int32 {
	if n := len(r.freeBuf); n > 0 {
		t := r.freeBuf[n-1]
		r.freeBuf = r.freeBuf[:n-1]
		return t
	}
	return make([]int32, 0, 64)
}

// finishStep applies the outputs of the step in flight at time now: every
// scheduled request whose computed tokens reached its known tokens samples
// one token; requests that reach their output length finish and free their
// blocks. Each finished (or aborted) request is passed to done, in batch
// order.
func (r *replica) finishStep(now int64, done func(s *seq, finished bool)) {
	r.busy = false
	r.stats.steps++
	anyGone := false
	// A run of runN later tokens whose previous token came at runLast.
	runN, runLast := 0, int64(0)
	flush := func() {
		if runN > 0 {
			r.nextTokens(r.id, now-runLast, runN)
			runN = 0
		}
	}
	for _, s := range r.batch {
		if s.aborted {
			anyGone = true
			continue
		}
		if s.computed < s.numTokens {
			continue // a chunk of a longer prefill: no token yet
		}
		s.generated++
		s.numTokens++
		r.stats.generationTokens++
		if s.firstTokenUs < 0 {
			s.firstTokenUs = now
			r.stats.promptTokens += int64(s.prompt)
			if r.firstToken != nil {
				r.firstToken(s)
			}
		} else if r.nextToken != nil {
			r.nextToken(s, now)
		} else if r.nextTokens != nil {
			if runN > 0 && (s.lastTokenUs != runLast || stepByStep) {
				flush()
			}
			runN, runLast = runN+1, s.lastTokenUs
		}
		s.lastTokenUs = now
		if s.generated >= s.output {
			anyGone = true
		}
	}
	flush()
	if !anyGone && !r.abortPending {
		return
	}
	r.abortPending = false
	kept := r.running[:0]
	for _, s := range r.running {
		switch {
		case s.aborted:
			r.releaseBlocks(s)
			done(s, false)
		case s.generated >= s.output:
			r.releaseBlocks(s)
			if s.lengthCapped {
				r.stats.finishedLength++
			} else {
				r.stats.finishedStop++
			}
			done(s, true)
		default:
			kept = append(kept, s)
		}
	}
	clear(r.running[len(kept):])
	r.running = kept
}

// abortAll cuts every request of the replica (the end of a measured step):
// waiting ones at once, running ones at once when no step is in flight, and
// otherwise when the step in flight ends. Each is passed to done.
func (r *replica) abortAll(done func(s *seq, finished bool)) {
	for r.waiting.len() > 0 {
		s := r.waiting.popFront()
		s.aborted = true
		r.releaseBlocks(s)
		done(s, false)
	}
	if r.busy {
		for _, s := range r.running {
			s.aborted = true
			r.abandon(s)
		}
		r.abortPending = len(r.running) > 0
		return
	}
	for _, s := range r.running {
		s.aborted = true
		r.abandon(s)
		r.releaseBlocks(s)
		done(s, false)
	}
	clear(r.running)
	r.running = r.running[:0]
}

// abort cuts one request (a client went away), as abortAll does for all:
// a waiting one at once, a running one at once when no step is in flight,
// and otherwise when the step in flight ends. It is passed to done then.
// A request that already left the replica is ignored.
func (r *replica) abort(s *seq, done func(s *seq, finished bool)) {
	if s.aborted || s.replica != r.id {
		return
	}
	for i := range r.waiting.len() {
		if r.waiting.at(i) == s {
			r.waiting.filter(func(q *seq) bool { return q != s })
			s.aborted = true
			r.releaseBlocks(s)
			done(s, false)
			return
		}
	}
	for i, q := range r.running {
		if q != s {
			continue
		}
		s.aborted = true
		r.abandon(s)
		if r.busy {
			r.abortPending = true
			return
		}
		r.releaseBlocks(s)
		last := len(r.running) - 1
		copy(r.running[i:], r.running[i+1:]) // keep the order: the newest is preempted first
		r.running[last] = nil
		r.running = r.running[:last]
		done(s, false)
		return
	}
}
