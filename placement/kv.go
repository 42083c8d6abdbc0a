package placement

import (
	"math"
	"time"
)

// The KV-aware options of Affinity, all opt-in (the zero Config is the
// seed's rules):
//
//   - Config.Balance BalanceKV: a new conversation goes to the healthy
//     replica with the most KV headroom, capacity minus resident
//     footprint (below), ties to the lowest InFlight, then the lowest ID.
//     Without any KVCapacityTokens it falls back to the load score.
//
//   - Config.Spill SpillPriced(): a later turn leaves home only when its
//     expected time to first token there exceeds the one on the best other
//     replica by the hysteresis margin, max(PricedMarginSec,
//     PricedMarginFrac x elsewhere). The expected TTFT of replica o is
//
//     (PrefillQueueTokens[o] + uncached(o)) / PrefillTokensPerSec[o]
//
//     where uncached(o) is the prompt minus what o is expected to hold of
//     it: the conversation's footprint at home; at the home it last left,
//     what it had there; on any replica holding a conversation, the
//     request's SharedPrefixTokens; each scaled by capacity/resident when
//     the replica's resident footprint exceeds its capacity (what LRU
//     eviction leaves). The best other replica is the lowest expected TTFT,
//     ties to the one holding more of the prefix, then the lowest ID. A
//     conversation that leaves is re-homed there (reason spill): its whole
//     prefix is on the new replica once computed, and going back would
//     recompute the turns served there; the margin and the stale copy it
//     left behind keep it from flapping. A replica without a prefill rate
//     cannot be priced: then the spill threshold (auto) decides.
//
//     A new conversation is priced too, unless the KV balance places it:
//     among the replicas whose expected TTFT for its whole prompt is
//     within the same margin of the lowest, the load score picks. The
//     shared prefix is not discounted there: it would draw every new
//     conversation to the replicas that already hold one (SGLang's
//     cache-aware router's pile-up), and a shared prefix is computed once
//     per replica however the conversations spread. A conversation
//     places its first turn once, so a replica whose prefill queue would
//     hold it back by more than the margin is no candidate however few
//     conversations it holds: where most conversations are one or two
//     long prompts (Mooncake's conversation_trace on 7 x RTX 5090), the
//     count alone piled long cold prefills behind each other, TTFB p95
//     39.8 s where NVIDIA Dynamo's router, which prices every request by
//     its prefill blocks, had 25.6 s.
//
//   - Config.Admission AdmissionKV: a new conversation (not a subagent:
//     sessions already admitted never wait) whose expected footprint,
//     max(prompt, Table.TypicalFootprint), fits on no healthy replica
//     gets Decision{Replica: -1, Wait: true}; the table is unchanged. A
//     replica fits when capacity - resident >= expected - (the shared
//     prefix if it holds a conversation). It never waits when no replica
//     holds a held conversation (nothing could end) or no replica has
//     a capacity. The caller keeps the waiting requests in a WaitQueue.
//
// The resident footprint of replica i, as admission and the KV balance
// count it, is max(HeldFootprint[i], Held[i] x TypicalFootprint) minus the
// shared prefix counted more than once, (Held[i]-1) x SharedPrefixTokens:
// conversations grow towards the typical size, and a common system prompt
// is cached once. Held conversations (held.go) are the active ones with a
// request in flight or expected back within their return timeout; with a
// caller that never reports ends (Table.Finish) they are the active ones.
// The priced spill's estimate of what a replica still caches counts every
// active conversation instead (Footprint, Active): a released one's blocks
// stay cached until an allocation evicts them.

// Hysteresis of the priced spill: a conversation leaves home only when
// home's expected TTFT exceeds the best other one's by more than the
// larger of these.
const (
	PricedMarginSec  = 0.5
	PricedMarginFrac = 0.25
)

// kvNew reports whether new conversations use the KV-aware placement.
func (a *Affinity) kvNew() bool {
	return a.cfg.Balance == BalanceKV || a.cfg.Admission == AdmissionKV
}

// resident is replica i's footprint as the priced spill counts what it
// caches: every active conversation (Footprint, Active; see above).
func (a *Affinity) resident(i, shared int) int {
	t := a.table
	if i >= len(t.counts) {
		return 0
	}
	c := &t.counts[i]
	fp := max(c.Footprint, c.Active*int(t.typical))
	if c.Active > 1 && shared > 0 {
		fp -= (c.Active - 1) * shared
	}
	return max(fp, 0)
}

// placeNew places a new conversation by KV headroom, or says wait. It
// returns -1 (and wait false) when no replica has a KV capacity: then the
// load score decides.
func (a *Affinity) placeNew(r *Request, s *Snapshot) (target int, wait bool) {
	reps := s.Replicas
	shared := max(r.SharedPrefixTokens, 0)
	typical := int(a.table.typical)
	expected := max(r.PromptTokens, typical)
	counts := a.table.counts
	best, bestRoom, fits, known, busy := -1, 0, false, false, false
	for i := range reps {
		rp := &reps[i]
		if !rp.Healthy || rp.KVCapacityTokens <= 0 {
			continue
		}
		known = true
		held, fp := 0, 0
		if i < len(counts) {
			held, fp = counts[i].Held, counts[i].HeldFootprint
		}
		res := max(fp, held*typical)
		if held > 1 {
			res -= (held - 1) * shared
		}
		room := rp.KVCapacityTokens - max(res, 0)
		need := expected
		if held > 0 {
			busy = true
			need -= min(shared, expected)
		}
		if room >= need {
			fits = true
		}
		switch {
		case best < 0:
		case room != bestRoom:
			if room < bestRoom {
				continue
			}
		case rp.InFlight >= reps[best].InFlight:
			continue
		}
		best, bestRoom = i, room
	}
	if !known {
		return -1, false
	}
	if a.cfg.Admission == AdmissionKV && !fits && busy {
		return -1, true
	}
	if a.cfg.Balance != BalanceKV {
		return -1, false
	}
	return best, false
}

// pricedNew places a new conversation by price (see above): the lowest
// load score among the replicas whose expected TTFT is within the margin
// of the lowest, ties to the lowest ID; -1 when no healthy replica has a
// prefill rate.
func (a *Affinity) pricedNew(r *Request, s *Snapshot) int {
	reps := s.Replicas
	u := max(r.PromptTokens, 1)
	expect := func(o int) float64 { return ttft(&reps[o], u) }
	lowest := math.Inf(1)
	for o := range reps {
		if reps[o].Healthy {
			lowest = min(lowest, expect(o))
		}
	}
	if math.IsInf(lowest, 1) {
		return -1
	}
	limit := lowest + max(PricedMarginSec, PricedMarginFrac*lowest)
	invIF, invSess := a.norms(reps)
	best, bestScore := -1, 0.0
	for o := range reps {
		if !reps[o].Healthy || expect(o) > limit {
			continue
		}
		if sc := newScore(&reps[o], a.table.activeOn(o), invIF, invSess); best < 0 || sc < bestScore {
			best, bestScore = o, sc
		}
	}
	return best
}

// cached is how many tokens of the prompt of the conversation in entry i
// (nilIndex: none) replica o is expected to hold (see above).
func (a *Affinity) cached(r *Request, s *Snapshot, i int32, o int) int {
	t := a.table
	c := 0
	switch {
	case i == nilIndex:
	case int(t.entries[i].home) == o:
		c = t.fp(i)
	case int(i) < len(t.kv) && int(t.kv[i].left) == o:
		c = int(t.kv[i].leftTok)
	}
	shared := max(r.SharedPrefixTokens, 0)
	if shared > c && a.table.HomedOn(o) > 0 {
		c = shared
	}
	rp := &s.Replicas[o]
	if res := a.resident(o, shared); rp.KVCapacityTokens > 0 && res > rp.KVCapacityTokens {
		c = int(float64(c) * float64(rp.KVCapacityTokens) / float64(res))
	}
	return min(c, max(r.PromptTokens-1, 0))
}

// ttft is the expected time to first token on replica o of a prompt with
// u tokens to compute: +Inf without a prefill rate.
func ttft(rp *Replica, u int) float64 {
	if !(rp.PrefillTokensPerSec > 0) {
		return math.Inf(1)
	}
	return float64(max(rp.PrefillQueueTokens, 0)+u) / rp.PrefillTokensPerSec
}

// priced decides a later turn of the conversation in entry i, homed on h,
// by price (see above). ok is false when home has no prefill rate. The
// loop over the other replicas is cached and ttft inlined: it runs for
// every replica on every later turn.
func (a *Affinity) priced(r *Request, s *Snapshot, i int32, h int) (d Decision, ok bool) {
	reps := s.Replicas
	if !(reps[h].PrefillTokensPerSec > 0) {
		return Decision{}, false
	}
	t := a.table
	k := t.kvOf(i)
	prompt := r.PromptTokens
	uh := max(prompt-a.cached(r, s, i, h), 1)
	th := ttft(&reps[h], uh)
	shared := max(r.SharedPrefixTokens, 0)
	typical := int(t.typical)
	left, leftTok := int(k.left), int(k.leftTok)
	counts := t.counts
	best, bestT, bestU := -1, math.Inf(1), 0
	for o := range reps {
		rp := &reps[o]
		if o == h || !rp.Healthy || !(rp.PrefillTokensPerSec > 0) {
			continue
		}
		c := 0
		if o == left {
			c = leftTok
		}
		if o < len(counts) {
			cn := &counts[o]
			if shared > c && cn.Sessions > 0 {
				c = shared
			}
			if c > 0 && rp.KVCapacityTokens > 0 {
				res := max(cn.Footprint, cn.Active*typical)
				if cn.Active > 1 {
					res -= (cn.Active - 1) * shared
				}
				if res > rp.KVCapacityTokens {
					c = int(int64(c) * int64(rp.KVCapacityTokens) / int64(res))
				}
			}
		}
		u := max(prompt-min(c, max(prompt-1, 0)), 1)
		to := float64(max(rp.PrefillQueueTokens, 0)+u) / rp.PrefillTokensPerSec
		if best >= 0 && (to > bestT || (to == bestT && u >= bestU)) {
			continue
		}
		best, bestT, bestU = o, to, u
	}
	d = Decision{Replica: h, Reason: ReasonSticky, Uncached: int32(min(uh, math.MaxInt32)), HomeTTFT: float32(th)}
	if best < 0 {
		t.counter(h).Sticky++
		return d, true
	}
	d.ElsewhereTTFT = float32(bestT)
	if th <= bestT+max(PricedMarginSec, PricedMarginFrac*bestT) {
		t.counter(h).Sticky++
		return d, true
	}
	if h <= math.MaxInt16 {
		k.left, k.leftTok = int16(h), k.footprint
	} else {
		k.left = -1
	}
	t.setHome(i, best)
	t.counter(best).SpilledIn++
	d.Replica, d.Reason, d.Uncached = best, ReasonSpill, int32(min(bestU, math.MaxInt32))
	return d, true
}

// estimate sets d.Uncached for a decision the KV options did not price.
func (a *Affinity) estimate(r *Request, s *Snapshot, i int32, d *Decision) {
	d.Uncached = int32(min(max(r.PromptTokens-a.cached(r, s, i, d.Replica), 1), math.MaxInt32))
}

// kvOn reports whether any KV-aware option is on.
func (a *Affinity) kvOn() bool { return a.kvNew() || a.cfg.Spill.Priced() }

// MustQueue reports whether r must join the back of a wait queue that
// holds waiting requests without asking Pick: with Config.Admission kv, a
// new conversation (a session the table does not know, not a subagent)
// never overtakes the ones already waiting. It changes nothing but lazy
// expiry.
func (a *Affinity) MustQueue(r *Request, waiting int, now time.Time) bool {
	if waiting <= 0 || a.cfg.Admission != AdmissionKV || a.cfg.Disabled || r.Session == "" || r.Parent != "" {
		return false
	}
	_, known := a.table.Home(r.Session, now)
	return !known
}

// WaitQueue is the FIFO of new conversations held for admission
// (Decision.Wait). It is pure, like the rest of the package: the caller
// keeps it next to its policy, pushes a request that got Wait, and, when
// a conversation ends or goes idle (or at each stats refresh), asks the
// policy again for the front one, pops it when placed and tries the next;
// it stops at the first that must still wait (sessions behind it do not
// overtake it). Expired pops the ones that waited longer than the
// admission timeout, for the caller to refuse (429 or 529 with
// Retry-After); a caller that times each waiter itself (the proxy: one
// goroutine and timer per waiting request) takes a leaver out with
// Remove instead. Router.MustQueue says whether a request must join the
// back without asking. The simulator queues its requests here, the proxy
// its waiters' wake-up channels. Not safe for concurrent use.
type WaitQueue[T any] struct {
	items []waiter[T]
	head  int
}

type waiter[T any] struct {
	v     T
	since time.Time
}

// Push appends v, waiting since now.
func (q *WaitQueue[T]) Push(v T, now time.Time) {
	if q.head > 0 && q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	q.items = append(q.items, waiter[T]{v, now})
}

// Len is the number of waiting items.
func (q *WaitQueue[T]) Len() int { return len(q.items) - q.head }

// Front returns the oldest waiting item and since when it waits.
func (q *WaitQueue[T]) Front() (v T, since time.Time, ok bool) {
	if q.Len() == 0 {
		return v, since, false
	}
	w := q.items[q.head]
	return w.v, w.since, true
}

// Pop removes and returns the oldest waiting item; it panics when empty.
func (q *WaitQueue[T]) Pop() T {
	w := q.items[q.head]
	var zero waiter[T]
	q.items[q.head] = zero
	q.head++
	if q.head > 32 && q.head*2 > len(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return w.v
}

// Index returns the position (0: the front) of the first waiting item
// for which match is true, or -1.
func (q *WaitQueue[T]) Index(match func(T) bool) int {
	for i := q.head; i < len(q.items); i++ {
		if match(q.items[i].v) {
			return i - q.head
		}
	}
	return -1
}

// Remove takes out the first waiting item for which match is true (one
// that leaves before its turn: its client went away, its own timer
// fired) and returns its position before removal, or -1 when none
// matched.
func (q *WaitQueue[T]) Remove(match func(T) bool) int {
	k := q.Index(match)
	if k < 0 {
		return -1
	}
	i := q.head + k
	copy(q.items[i:], q.items[i+1:])
	var zero waiter[T]
	q.items[len(q.items)-1] = zero
	q.items = q.items[:len(q.items)-1]
	return k
}

// Expired pops, oldest first, every item that has waited longer than
// timeout at now and appends it to dst. A timeout of zero or less never
// expires anything.
func (q *WaitQueue[T]) Expired(now time.Time, timeout time.Duration, dst []T) []T {
	if timeout <= 0 {
		return dst
	}
	for q.Len() > 0 && now.Sub(q.items[q.head].since) > timeout {
		dst = append(dst, q.Pop())
	}
	return dst
}
