package placement

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"time"
)

// AIBrix is the AIBrix gateway's prefix-cache routing algorithm, read in
// vllm-project/aibrix at e3e10f9: pkg/plugins/gateway/algorithms/
// prefix_cache.go (routeOriginal, getTargetPodFromMatchedPods,
// getTargetPodListOnLoadImbalance), least_request.go, util.go, and
// pkg/utils/prefixcacheindexer/hash.go with pkg/utils/lrustore:
//
//   - Tokens: the "character" tokenizer's bytes; blocks of 4 bytes (full
//     blocks only), each hash xxhash64(seed 0) of the parent hash and the
//     block's bytes.
//   - Index: one LRU store of 200000 blocks for the gateway (Put refreshes
//     a block, Get does not), each block with the pods it was routed to;
//     a block idle 20 minutes is dropped (checked every second).
//   - Load: the gateway's realtime running requests per pod
//     (Replica.InFlight).
//   - Route: if max - min running > 8, only the pods at the minimum stay
//     candidates. The blocks are matched in order against the candidates,
//     each block keeping only the candidates that hold it; a pod's match
//     is the percentage of blocks it held when it dropped out or the walk
//     ended. Among matched pods (shuffled, then stably sorted by match
//     desc and running asc) the first whose running count is at most the
//     mean + 1 x the sample standard deviation over all ready pods wins;
//     else, as with no match, a pod with the fewest running requests
//     (uniform among ties). The prompt's blocks are then put for the pod.
//
// The index is kept here per Prompt block: the 4-byte blocks inside one
// Prompt block of derived text are present, absent and refreshed
// together, so one entry stands for them and weighs their number against
// the 200000 (one block a token at 4 bytes a token). Where AIBrix evicts
// the first 4-byte blocks of such a group, this model evicts the group:
// either way no later match passes its start. The hash decides placement
// only. Not modelled: the KV-event sync mode (off by default), the
// tiktoken tokenizer option, the remote tokenizer pool.
type AIBrix struct {
	cfg   AIBrixConfig
	rng   *rand.Rand
	store aibStore
	ready []bool
	pct   []int
	order []int
	alive []uint64 // match's candidates still in the walk, a bit a pod
	found []int32  // the store entries of the prompt's leading groups, as match found them
}

// AIBrixConfig are the algorithm's parameters; zero fields take AIBrix's
// defaults.
type AIBrixConfig struct {
	Seed uint64
	// Blocks is the LRU store's capacity in 4-byte blocks: 200000.
	Blocks int
	// IdleTTL drops a block not put for this long: 20 min.
	IdleTTL time.Duration
	// ImbalanceAbs is the running-request spread that narrows the
	// candidates to the least loaded: 8.
	ImbalanceAbs int
	// StdDevFactor: 1.
	StdDevFactor float64
}

var _ Policy = (*AIBrix)(nil)

// aibrixStrategy is aibrix in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var aibrixStrategy = Strategy{
	Name:    PeerAIBrix,
	Words:   "AIBrix's prefix-cache router: the replica that was sent the longest run of the prompt's 4-byte blocks, unless it is busier than the mean plus one standard deviation; else the least busy",
	Reasons: []Reason{ReasonPrefix, ReasonLeastLoaded, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return NewAIBrix(AIBrixConfig{Seed: cfg.Seed}), nil },
}

// NewAIBrix returns AIBrix's prefix-cache router with cfg.
func NewAIBrix(cfg AIBrixConfig) *AIBrix {
	orDefault(&cfg.Blocks, 200000)
	orDefault(&cfg.IdleTTL, 20*time.Minute)
	orDefault(&cfg.ImbalanceAbs, 8)
	orDefault(&cfg.StdDevFactor, 1)
	return &AIBrix{cfg: cfg, rng: newRand(cfg.Seed), store: aibStore{head: -1, tail: -1}}
}

// Pick implements Policy.
func (a *AIBrix) Pick(r *Request, s *Snapshot, now time.Time) (Decision, error) {
	if d, ok := pinned(r, s); ok {
		return d, nil
	}
	reps := s.Replicas
	n := len(reps)
	a.store.expire(now.UnixNano() - a.cfg.IdleTTL.Nanoseconds())
	a.ready = grow(a.ready[:0], n)
	a.pct = grow(a.pct[:0], n)
	lo, hi := math.MaxInt, math.MinInt
	for i := range reps {
		a.ready[i] = reps[i].Healthy
		a.pct[i] = -1
		if reps[i].Healthy {
			lo, hi = min(lo, reps[i].InFlight), max(hi, reps[i].InFlight)
		}
	}
	if lo == math.MaxInt {
		return Decision{}, noHealthy(s)
	}
	if hi-lo > a.cfg.ImbalanceAbs {
		for i := range reps {
			a.ready[i] = a.ready[i] && reps[i].InFlight == lo
		}
	}
	matched := a.match(r)
	best := -1
	reason := ReasonLeastLoaded
	if matched {
		best = a.fromMatched(reps)
		if best >= 0 {
			reason = ReasonPrefix
		}
	}
	if best < 0 {
		best = a.leastRequest(reps)
	}
	a.put(r, best, now.UnixNano(), a.found)
	return Decision{Replica: best, Reason: reason}, nil
}

// aibKey is the store key of a group: its Prompt block id salted with
// the model (the chain of hashes from the model's seed).
func aibKey(id, salt uint64) uint64 { return mix64(id ^ salt) }

// match walks the blocks (seqSearchPrefix / matchPods) over the ready
// pods and records in a.pct each matched pod's percentage; it reports
// whether any matched. A pod keeps the percentage of the last block it
// held, so it is written once, when the pod drops out of the walk or the
// walk ends. a.found gets the entries the walk met, for put.
func (a *AIBrix) match(r *Request) bool {
	a.found = a.found[:0]
	p := &r.Prompt
	total := p.tokens(r.PromptTokens)
	if total == 0 {
		return false
	}
	a.alive = grow(a.alive[:0], (len(a.ready)+63)/64)
	clear(a.alive)
	for i, ok := range a.ready {
		if ok {
			a.alive[i/64] |= 1 << (i % 64)
		}
	}
	salt := fnv1a64(r.Model)
	cum, last := 0, -1 // last: the percentage of the last block held
	for j, id := range p.Blocks {
		cum += p.blockLen(j, total)
		k, ok := a.store.idx.get(aibKey(id, salt))
		if !ok {
			break
		}
		a.found = append(a.found, k)
		e := &a.store.ents[k]
		hit := false
		for w, m := range a.alive {
			held := m & e.pods.word(w)
			a.dropOut(w, m&^held, last)
			a.alive[w] = held
			hit = hit || held != 0
		}
		if !hit {
			break
		}
		last = cum * 100 / total
	}
	for w, m := range a.alive {
		a.dropOut(w, m, last)
	}
	for i := range a.ready {
		a.ready[i] = a.alive[i/64]&(1<<(i%64)) != 0
	}
	return last >= 0
}

// dropOut gives the pods of word w of mask the percentage pct of the
// last block they held (none when pct < 0: they held no block).
func (a *AIBrix) dropOut(w int, mask uint64, pct int) {
	if pct < 0 {
		return
	}
	for ; mask != 0; mask &= mask - 1 {
		a.pct[w*64+bits.TrailingZeros64(mask)] = pct
	}
}

// fromMatched is getTargetPodFromMatchedPods.
func (a *AIBrix) fromMatched(reps []Replica) int {
	var sum, sq float64
	k := 0
	for i := range reps {
		if reps[i].Healthy {
			sum += float64(reps[i].InFlight)
			k++
		}
	}
	mean := sum / float64(k)
	for i := range reps {
		if reps[i].Healthy {
			d := float64(reps[i].InFlight) - mean
			sq += d * d
		}
	}
	std := 0.0
	if k > 1 {
		std = math.Sqrt(sq / float64(k-1))
	}
	a.order = a.order[:0]
	for i, p := range a.pct {
		if p >= 0 {
			a.order = append(a.order, i)
		}
	}
	a.rng.Shuffle(len(a.order), func(i, j int) { a.order[i], a.order[j] = a.order[j], a.order[i] })
	sortStable(a.order, func(x, y int) bool {
		if a.pct[x] != a.pct[y] {
			return a.pct[x] > a.pct[y]
		}
		return reps[x].InFlight < reps[y].InFlight
	})
	for _, i := range a.order {
		if float64(reps[i].InFlight) <= mean+a.cfg.StdDevFactor*std {
			return i
		}
	}
	return -1
}

// leastRequest is selectTargetPodWithLeastRequestCount: uniform among the
// ready pods with the fewest running requests.
func (a *AIBrix) leastRequest(reps []Replica) int {
	best, ties := -1, 0
	for i := range reps {
		if !reps[i].Healthy {
			continue
		}
		switch {
		case best < 0 || reps[i].InFlight < reps[best].InFlight:
			best, ties = i, 1
		case reps[i].InFlight == reps[best].InFlight:
			ties++
			if a.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// put is AddPrefix: each block put for pod i at now. found are the
// entries of the leading blocks, as match met them: the store has not
// changed since, so they are put without a lookup.
func (a *AIBrix) put(r *Request, i int, at int64, found []int32) {
	p := &r.Prompt
	tokens := p.tokens(r.PromptTokens)
	salt := fnv1a64(r.Model)
	prev := 0
	for j, id := range p.Blocks {
		cum := prev + p.blockLen(j, tokens)
		if j < len(found) {
			a.store.refresh(found[j], int32(i), at)
		} else {
			a.store.put(aibKey(id, salt), int32(i), int32(cum-prev), at, a.cfg.Blocks)
		}
		prev = cum
	}
}

// sortStable is an insertion sort by less: stable, and the candidate
// lists are short.
func sortStable(xs []int, less func(a, b int) bool) {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && less(xs[j], xs[j-1]); j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
}

// aibStore is the LRU store: entries in recency order of their last put,
// each weighing its 4-byte blocks, dropped from the tail past capacity
// or idle past the TTL.
type aibStore struct {
	idx        idTable // key -> entry (peer_idtable.go: one cache miss a lookup, no tombstones)
	ents       []aibEntry
	head, tail int32
	free       []int32
	weight     int
}

type aibEntry struct {
	key        uint64
	pods       podSet // the pods the block was routed to
	at         int64
	w          int32
	prev, next int32
}

// podSet is a set of pod indices, a bit each: the first 64 in lo.
type podSet struct {
	lo uint64
	hi []uint64
}

// word returns the bits of pods 64w to 64w+63.
func (s *podSet) word(w int) uint64 {
	switch {
	case w == 0:
		return s.lo
	case w-1 < len(s.hi):
		return s.hi[w-1]
	}
	return 0
}

func (s *podSet) add(p int32) {
	w, b := int(p)/64, uint(p)%64
	if w == 0 {
		s.lo |= 1 << b
		return
	}
	s.hi = grow(s.hi, w)
	s.hi[w-1] |= 1 << b
}

// reset empties the set.
func (s *podSet) reset() {
	s.lo = 0
	clear(s.hi)
}

func (s *aibStore) unlink(i int32) {
	e := &s.ents[i]
	if e.prev >= 0 {
		s.ents[e.prev].next = e.next
	} else {
		s.head = e.next
	}
	if e.next >= 0 {
		s.ents[e.next].prev = e.prev
	} else {
		s.tail = e.prev
	}
}

func (s *aibStore) pushFront(i int32) {
	s.ents[i].prev, s.ents[i].next = -1, s.head
	if s.head >= 0 {
		s.ents[s.head].prev = i
	}
	s.head = i
	if s.tail < 0 {
		s.tail = i
	}
}

func (s *aibStore) drop(i int32) {
	s.unlink(i)
	s.idx.del(s.ents[i].key)
	s.weight -= int(s.ents[i].w)
	s.ents[i].pods.reset()
	s.free = append(s.free, i)
}

// put adds pod to key's entry (weight w), makes it the most recent, and
// trims the store to capacity.
func (s *aibStore) put(key uint64, pod, w int32, at int64, capacity int) {
	if i, ok := s.idx.get(key); ok {
		s.refresh(i, pod, at)
		return
	}
	var i int32
	if n := len(s.free); n > 0 {
		i = s.free[n-1]
		s.free = s.free[:n-1]
		s.ents[i].key, s.ents[i].at, s.ents[i].w = key, at, w
	} else {
		i = int32(len(s.ents))
		s.ents = append(s.ents, aibEntry{key: key, at: at, w: w})
	}
	s.ents[i].pods.add(pod)
	s.idx.put(key, i)
	s.weight += int(w)
	s.pushFront(i)
	for s.weight > capacity && s.tail >= 0 && s.tail != i {
		s.drop(s.tail)
	}
}

// refresh adds pod to entry i and makes it the most recent.
func (s *aibStore) refresh(i, pod int32, at int64) {
	s.ents[i].pods.add(pod)
	s.ents[i].at = at
	if s.head != i {
		s.unlink(i)
		s.pushFront(i)
	}
}

// expire drops the entries last put before cutoff (the tail is the
// oldest).
func (s *aibStore) expire(cutoff int64) {
	for s.tail >= 0 && s.ents[s.tail].at < cutoff {
		s.drop(s.tail)
	}
}
