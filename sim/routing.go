package sim

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/lm-warden/warden/placement"
)

// Routing variants: a strategy spec (placement.ParseSpec: the registry's
// grammar) may carry options after "+", e.g. "affinity+kv+priced+admit":
//
//	kv        routing.balance: kv          (new conversations by KV headroom)
//	priced    routing.spill_threshold: priced
//	admit     routing.admission: kv        (new conversations wait for headroom,
//	          up to the farm's routing.admission_timeout)
//	admit=D   the same with admission_timeout D (> 0), e.g. admit=30s
//	rehome    routing.rehome: cold         (a conversation whose home served
//	          (nearly) none of its prefix from cache moves on its next turn)
//
// Plain "affinity" takes the farm's routing block. A variant's display
// name, in tables and JSON, lists the options in effect
// (placement.EffectiveSpec): "affinity (kv, priced, admit)", "affinity
// (kv, admit 30s)" (a timeout named in the variant is shown); with none it
// is the strategy's name.

// variant is one strategy with its options resolved against the farm.
type variant struct {
	strategy string // a registered strategy
	name     string // display name
	cfg      placement.Config
	timeout  time.Duration // admission timeout; 0: none
}

// newVariant resolves strategy s (placement.ValidSpec) on farm f with the spill
// threshold spill (the experiment's, which may override the farm's).
func newVariant(f *Farm, s string, spill placement.SpillThreshold) (variant, error) {
	o, err := placement.ParseSpec(s)
	if err != nil {
		return variant{}, fmt.Errorf("sim: %w", err)
	}
	base := o.Strategy
	rs := f.Spec.Routing
	v := variant{strategy: base, name: base, cfg: placement.Config{
		Spill:        spill,
		SessionTTL:   time.Duration(rs.SessionTTL),
		ActiveWindow: time.Duration(rs.ActiveWindow),
		MaxSessions:  rs.MaxSessions,
		Balance:      f.Balance,
		Admission:    f.Admission,
	}, timeout: time.Duration(rs.AdmissionTimeout)}
	o.Apply(&v.cfg)
	if o.AdmissionTimeout > 0 {
		v.timeout = o.AdmissionTimeout
	}
	// The options in effect, from the variant or the farm's block. A
	// timeout named in the variant (admit=D) is shown.
	v.name = placement.EffectiveSpec(base, v.cfg, o.AdmissionTimeout).Label()
	return v, nil
}

// prefillTokensPerSec is the step-time model's rate of computing a cold
// prompt of 8192 tokens in chunks of the scheduler's token budget: what
// the priced spill divides uncached tokens by.
func prefillTokensPerSec(c *engineConfig) float64 {
	const prompt = 8192
	budget := max(c.maxNumBatchedTokens, 1)
	secs := 0.0
	for start := 0; start < prompt; start += budget {
		n := min(budget, prompt-start)
		secs += c.steps.seconds([]chunk{{start: start, n: n}})
	}
	if secs <= 0 {
		return 0
	}
	return prompt / secs
}

// kvRouter is the router's side of the KV-aware options: what it feeds to
// placement and the admission FIFO.
type kvRouter struct {
	queue   []int // per replica: Decision.Uncached of requests before their first token
	waiting placement.WaitQueue[*seq]
	timeout time.Duration
	expired []*seq
	// admitQueued: an evAdmit is queued at the current instant.
	admitQueued bool
}

// initKV prepares the run for a KV-aware variant.
func (r *run) initKV(v variant) {
	if !r.router.Traits().Has(placement.TraitKV) {
		return
	}
	r.kv = &kvRouter{queue: make([]int, len(r.reps)), timeout: v.timeout}
	rate := prefillTokensPerSec(&r.cfg)
	for i := range r.snap.Replicas {
		r.snap.Replicas[i].PrefillTokensPerSec = rate
	}
}

// Held implements placement.HeldIndex from the block pools: for each
// replica, the leading blocks of the prompt its prefix cache holds now,
// walking the chain to the first block it lacks, as vLLM's
// find_longest_cache_hit does (before the cap that leaves one token to
// compute). The KV events tell the proxy the same: a block is held from
// the step that cached it to the allocation that evicts it. With at most
// 64 replicas the pools keep one index of which replicas hold each hash
// (heldIndex), and the walk asks it once per block for all of them;
// beyond, each pool is walked.
func (r *run) Held(blocks []uint64, blockTokens int, dst []int) ([]int, bool) {
	if blockTokens != r.cfg.blockSize {
		return dst, false // ids of another block size: not the pools' keys
	}
	if r.heldIdx != nil {
		return r.heldIdx.leading(blocks, len(r.reps), dst), true
	}
	for _, rep := range r.reps {
		dst = append(dst, heldWalk(rep.pool, blocks))
	}
	return dst, true
}

// heldWalk is how many leading blocks of blocks pool p caches.
func heldWalk(p *blockPool, blocks []uint64) int {
	n := 0
	for _, h := range blocks {
		if p.lookup(h) < 0 {
			break
		}
		n++
	}
	return n
}

// heldIndex records, for every hash cached on some replica of a run of at
// most 64 replicas, which replicas cache it now (a bit each): an
// open-addressing table as the record of hashes ever cached (everSet, one
// word of bits), whose one probe a lookup is; a Go map's deletions, one
// per block evicted, leave tombstones that lengthen every later probe.
type heldIndex struct {
	on *everSet
}

func newHeldIndex() *heldIndex { return &heldIndex{on: newEverSet(1)} }

func (x *heldIndex) add(hash uint64, replica int) { x.on.add(hash, replica) }

func (x *heldIndex) remove(hash uint64, replica int) {
	i := x.on.slot(hash)
	if m := x.on.slots[i].val &^ (1 << replica); m != 0 {
		x.on.slots[i].val = m
	} else if x.on.slots[i].val != 0 {
		x.on.forget(hash)
	}
}

// leading appends, for each of n replicas, how many leading blocks of
// blocks it holds: one lookup per block for all replicas, until none is
// left holding the chain.
func (x *heldIndex) leading(blocks []uint64, n int, dst []int) []int {
	n0 := len(dst)
	for range n {
		dst = append(dst, len(blocks))
	}
	alive := uint64(1)<<n - 1
	if n == 64 {
		alive = ^uint64(0)
	}
	for j, h := range blocks {
		m := x.on.slots[x.on.slot(h)].val & alive
		for gone := alive &^ m; gone != 0; gone &= gone - 1 {
			dst[n0+bits.TrailingZeros64(gone)] = j
		}
		if alive = m; alive == 0 {
			break
		}
	}
	return dst
}

// routed records the prefill estimate of s, placed with d.
func (k *kvRouter) routed(r *run, s *seq, d placement.Decision) {
	s.uncached = d.Uncached
	k.queue[d.Replica] += int(d.Uncached)
	r.snap.Replicas[d.Replica].PrefillQueueTokens = k.queue[d.Replica]
}

// prefilled takes s out of its replica's prefill queue (its first token,
// or it left without one).
func (k *kvRouter) prefilled(r *run, s *seq) {
	if s.uncached == 0 || s.replica < 0 {
		return
	}
	k.queue[s.replica] -= int(s.uncached)
	r.snap.Replicas[s.replica].PrefillQueueTokens = k.queue[s.replica]
	s.uncached = 0
}

// wake makes admission look at the waiting requests again at the current
// instant, after the events of this instant (a replica may be inside its
// step's end): admission enqueues on replicas.
func (k *kvRouter) wake(r *run) {
	if k.waiting.Len() > 0 && !k.admitQueued {
		k.admitQueued = true
		r.ev.push(r.now, evAdmit, 0)
	}
}

// admit places waiting requests, oldest first, until one must still wait;
// then it refuses those waiting longer than the timeout.
func (k *kvRouter) admit(r *run) {
	for k.waiting.Len() > 0 {
		s, _, _ := k.waiting.Front()
		if s.aborted {
			k.waiting.Pop()
			r.seqFree = append(r.seqFree, s)
			continue
		}
		d, err := r.pick(s)
		if err != nil {
			r.err = fmt.Errorf("placement: %w", err)
			return
		}
		if d.Wait {
			break
		}
		k.waiting.Pop()
		r.place(s, d, r.homeOf(s))
	}
	k.expired = k.waiting.Expired(time.UnixMicro(r.now), k.timeout, k.expired[:0])
	for _, s := range k.expired {
		if s.aborted {
			r.seqFree = append(r.seqFree, s)
			continue
		}
		if int(s.attempt) < r.clientRetries {
			// Refused (429/529 with Retry-After); its client sends it again.
			r.rt.admissionRefused++
			r.rt.admissionRetries++
			r.retry(s)
			continue
		}
		// Refused after its wait (429/529 in the proxy): the wait counts
		// in its TTFB, as a client would see it, in the exact quantiles
		// and the KPIs' histogram alike; once: a wait already counted
		// censored at an earlier step's end is not counted again (as
		// onFirstToken does).
		if !s.censored {
			s.ttfbUs = r.now - s.clientSentUs
			s.stepSessions = r.stepSessions
			r.rec.observeRefusedTTFB(float64(s.ttfbUs) / usPerSec)
			r.rt.ttfbs = append(r.rt.ttfbs, float64(s.ttfbUs)/usPerSec)
		}
		r.rt.rejected++
		r.rt.admissionRefused++
		r.rt.unfinished++
		s.rejected = true
		r.logRequest(s, false)
		r.drv.done(r, s, false)
		r.seqFree = append(r.seqFree, s)
	}
	if len(k.expired) > 0 {
		r.checkIdle()
	}
}

// retry records the refused attempt s and sends it again as its client's
// SDK does (sdkMaxRetries): the refusal reaches the client, which sleeps
// the proxy's Retry-After and sends the same call again. The turn's TTFB,
// as the client sees it, keeps running from its first attempt
// (clientSentUs); the retry waits its own admission timeout at the router
// (from its arrival), at the back of the queue as the proxy's would.
func (r *run) retry(s *seq) {
	r.logRequest(s, false) // the refused attempt, with no replica and no TTFB
	s.logged = false
	s.attempt++
	s.id = r.nextID // a new request, in send order
	r.nextID++
	r.dispatchAfter(s, r.downlinkUs+micros(placement.AdmissionRetryAfter))
}

// each calls f for every request waiting for admission.
func (k *kvRouter) each(f func(*seq)) {
	for n := k.waiting.Len(); n > 0; n-- {
		s := k.waiting.Pop()
		f(s)
		k.waiting.Push(s, time.UnixMicro(s.sentUs))
	}
}

// submit routes s through the placement policy and enqueues it on the
// chosen replica. home is the session's home (the replica of its first
// turn), updated for a first turn; it may be nil. It reports false when
// the request can never fit in a replica's KV cache: it is then rejected
// (passed to the driver's done as unfinished) without being routed.
func (r *run) submit(s *seq, home *int) bool {
	if !r.cfg.fits(s.prompt, s.output) {
		r.rt.rejected++
		r.rt.unfinished++
		s.rejected = true
		r.logRequest(s, false)
		r.drv.done(r, s, false)
		r.seqFree = append(r.seqFree, s)
		r.checkIdle()
		return false
	}
	if r.kv != nil && r.router.MustQueue(r.request(s), r.kv.waiting.Len(), time.UnixMicro(r.now)) {
		r.kv.waiting.Push(s, time.UnixMicro(s.sentUs)) // behind the new conversations already waiting
		r.rt.admissionWaits++
		return true
	}
	d, err := r.pick(s)
	if err != nil {
		r.err = fmt.Errorf("placement: %w", err)
		return false
	}
	if d.Wait {
		r.kv.waiting.Push(s, time.UnixMicro(s.sentUs))
		r.rt.admissionWaits++
		return true
	}
	r.place(s, d, home)
	return true
}

// observeHits tells the router what the replica of s, which finished,
// served of its prompt from its prefix cache at its first admission (what
// vLLM's answer reports as its cached tokens), as the proxy does from each
// answer's usage (live's model.observeHits).
func (r *run) observeHits(s *seq) {
	if s.replica >= 0 {
		r.router.Served(s.req.Session, s.replica, s.prompt, s.cachedTokens, s.generated)
	}
}

// request fills r.preq for s: its prompt as the trace's block ids (the
// pools' keys, placement.Prompt) and its request number.
func (r *run) request(s *seq) *placement.Request {
	r.preq = placement.Request{
		Session:      s.req.Session,
		Parent:       s.req.Parent,
		Model:        r.model,
		PromptTokens: s.prompt,
		Pinned:       placement.NoPin,
		ID:           uint64(s.id),
		Prompt:       placement.Prompt{BlockTokens: r.cfg.blockSize, Blocks: s.req.HashIDs},
	}
	if r.kv != nil || r.router.ReadsHeld() {
		r.preq.SharedPrefixTokens = min(r.shared, s.prompt)
	}
	return &r.preq
}

// pick asks the router for s's replica.
func (r *run) pick(s *seq) (placement.Decision, error) {
	req := r.request(s)
	r.router.Fill(&r.snap)
	if r.front != nil {
		r.connect(s)
		return r.front.pick(s.apiServer, req)
	}
	return r.router.Pick(req, &r.snap, time.UnixMicro(r.now))
}

// homeOf returns the home slot of s's client in a closed loop, else nil.
func (r *run) homeOf(s *seq) *int {
	if c, ok := r.drv.(*closedLoop); ok && s.client >= 0 && int(s.client) < len(c.clients) {
		return &c.clients[s.client].home
	}
	return nil
}

// place enqueues s on the replica of decision d.
func (r *run) place(s *seq, d placement.Decision, home *int) {
	rp := d.Replica
	s.reason = uint8(d.Reason)
	r.rt.requests[rp][d.Reason]++
	r.rt.inFlight[rp]++
	r.snap.Replicas[rp].InFlight = r.rt.inFlight[rp]
	if home != nil {
		if s.turn == 0 {
			*home = rp
		}
		if c, ok := r.drv.(*closedLoop); ok && s.client >= 0 && int(s.client) < len(c.clients) {
			c.clients[s.client].last = int32(rp)
		}
		r.rt.stay.Add(s.turn > 0, *home, rp)
	}
	// Sent now: held until it ends (onDone) and for its return timeout
	// after, as the proxy's pick starts it in the table (TurnEnds).
	r.router.Sent(s.req.Session, time.UnixMicro(r.now))
	if r.kv != nil {
		r.kv.routed(r, s, d)
	}
	if r.front == nil && r.apiUs != nil {
		s.replica = rp // in flight there from now, as the router counts it
		r.tokenise(rp, s)
		return
	}
	rep := r.reps[rp]
	rep.add(s)
	r.kick(rep)
}
