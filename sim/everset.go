package sim

import (
	"math/bits"

	"github.com/lm-warden/warden/traces"
)

// everSet is the record of a run's replicas of the block hashes they ever
// cached: one probe answers both questions of the miss classification
// (replica.classifyMisses: cached on this replica before? computed on
// any?), where a Go map per replica and one for the farm took two lookups,
// and two more insertions per block cached. It is an open-addressing table
// with linear probing and backward-shift deletion whose slot holds the
// hash and, up to 64 replicas, their bits: the set holds far more blocks
// than the caches, so each lookup is a cache miss, and one slot is one
// miss.
//
// Bounded by the load, not by time: the classification only ever asks
// about the blocks of a request being admitted, so a hash that no request
// still to come can hold need not be kept. The synthetic sessions' blocks
// are their own past the shared system prompt (traces.Generator: segment
// ids never collide across sessions), so when a session is over its own
// hashes are forgotten (run.sessionOver) and the set holds the sessions in
// progress, whatever the simulated time; the classification, hence every
// output, is the same as with every hash kept (TestEverSetForgetsExactly).
// A trace's sessions may share any block with any other, so a trace's
// run keeps every hash: the set is then bounded by the trace's distinct
// hashes (Trace.hashCount sizes it up front).
type everSet struct {
	slots []everSlot
	n     int      // slots in use
	shift uint     // 64 - log2(len(slots))
	words int      // words of bits per hash: one bit per replica
	rows  []uint64 // words > 1: the bits of hash row i at [i*words, (i+1)*words)
	free  []uint64 // words > 1: rows of forgotten hashes, to reuse
}

// keepEveryHash (tests) turns off the forgetting of sessions' hashes: the
// record then holds every hash ever cached, as it did before forgetting.
var keepEveryHash = false

// everSlot is one hash: val is its replicas' bits (words == 1) or its row
// + 1; 0 marks an empty slot (a hash is only added with a bit).
type everSlot struct {
	hash, val uint64
}

func newEverSet(replicas int) *everSet {
	const initial = 1 << 12
	return &everSet{slots: make([]everSlot, initial), shift: 64 - 12, words: (max(replicas, 1) + 63) / 64}
}

// home is the slot where hash's probe run starts.
func (e *everSet) home(hash uint64) int { return int((hash * 0x9e3779b97f4a7c15) >> e.shift) }

// slot returns the index of hash's slot, or of the empty slot where it
// would go.
func (e *everSet) slot(hash uint64) int {
	mask := len(e.slots) - 1
	i := e.home(hash)
	for {
		sl := &e.slots[i]
		if sl.val == 0 || sl.hash == hash {
			return i
		}
		i = (i + 1) & mask
	}
}

// moveTo moves the hashes to slots, an empty table of a power of two
// slots, when it is larger than the one they are in.
func (e *everSet) moveTo(slots []everSlot) {
	if len(slots) <= len(e.slots) {
		return
	}
	old := e.slots
	e.slots, e.shift = slots, uint(64-bits.Len(uint(len(slots)-1)))
	for _, sl := range old {
		if sl.val != 0 {
			e.slots[e.slot(sl.hash)] = sl
		}
	}
}

// add records that replica rep cached hash.
func (e *everSet) add(hash uint64, rep int) {
	i := e.slot(hash)
	sl := &e.slots[i]
	if e.words == 1 {
		if sl.val == 0 {
			sl.hash = hash
			e.n++
		}
		sl.val |= 1 << rep
	} else {
		if sl.val == 0 {
			sl.hash = hash
			if k := len(e.free); k > 0 {
				sl.val = e.free[k-1]
				e.free = e.free[:k-1]
			} else {
				sl.val = uint64(len(e.rows)/e.words) + 1
				e.rows = append(e.rows, make([]uint64, e.words)...)
			}
			e.n++
		}
		e.rows[int(sl.val-1)*e.words+rep/64] |= 1 << (rep % 64)
	}
	if 2*e.n > len(e.slots) {
		e.grow()
	}
}

// grow doubles the table.
func (e *everSet) grow() { e.moveTo(make([]everSlot, 2*len(e.slots))) }

// seen reports whether replica rep ever cached hash, and whether any
// replica did.
func (e *everSet) seen(hash uint64, rep int) (here, anywhere bool) {
	sl := e.slots[e.slot(hash)]
	switch {
	case sl.val == 0:
		return false, false
	case e.words == 1:
		return sl.val&(1<<rep) != 0, true
	}
	return e.rows[int(sl.val-1)*e.words+rep/64]&(1<<(rep%64)) != 0, true
}

// forget removes hash, if recorded: the entries after it in its probe run
// that would no longer be found move back into the hole (backward-shift
// deletion, as blockIndex.delAt), so the table needs no tombstones.
func (e *everSet) forget(hash uint64) {
	i := e.slot(hash)
	if e.slots[i].val == 0 {
		return
	}
	if e.words > 1 {
		row := e.slots[i].val
		clear(e.rows[int(row-1)*e.words : int(row)*e.words])
		e.free = append(e.free, row)
	}
	e.n--
	mask := len(e.slots) - 1
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		sl := e.slots[j]
		if sl.val == 0 {
			break
		}
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if h := e.home(sl.hash); (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			e.slots[i] = sl
			i = j
		}
	}
	e.slots[i] = everSlot{}
}

// sessionOver is told by the closed loop that session s is over: no request
// of it is in flight and none will be sent. In a run of synthetic sessions
// (forgetOwn) the hashes of its blocks past its system prompt's
// (s.SharedTokens, which every session of its agent kind shares) are its
// own: no later lookup can ask about them, and the record of hashes ever
// cached forgets them. Elsewhere (a trace's sessions) it does nothing.
func (r *run) sessionOver(s *traces.Session) {
	if !r.forgetOwn || len(r.reps) == 0 || r.reps[0].pool.ever == nil {
		return
	}
	ever, bs := r.reps[0].pool.ever, r.cfg.blockSize
	// The session's own blocks start after its system prompt, the prefix
	// it shares with every session of its agent kind.
	from := s.SharedTokens / bs
	// A turn's blocks begin with the previous turn's (the conversation so
	// far): those were forgotten with it. Only the hashes that a request
	// can have cached are walked (seq.blockHash: full blocks).
	var prev *traces.Request
	for t := range s.Turns {
		req := &s.Turns[t]
		for k := from; ; k++ {
			h, ok := requestBlockHash(req, req.PromptTokens, k, bs)
			if !ok {
				break
			}
			if prev != nil {
				if ph, ok := requestBlockHash(prev, prev.PromptTokens, k, bs); ok && ph == h {
					continue
				}
			}
			ever.forget(h)
		}
		prev = req
	}
}
