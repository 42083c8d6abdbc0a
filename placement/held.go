package placement

import (
	"math"
	"time"
)

// Held conversations. A conversation occupies KV blocks of its home while
// a request of it runs; once its answer is done vLLM frees those blocks
// (vllm/v1/core/block_pool.py BlockPool.free_blocks appends every block
// whose ref_cnt drops to 0 to the free queue, a cached one keeping its
// hash) and they stay there as the prefix cache, evicted only when an
// allocation pops them (get_new_blocks, _maybe_evict_cached_block).
// Admission protects those cached prefixes of conversations that are
// coming back, so a conversation between its turns must still count; one
// that has finished must not, or the farm idles with newcomers waiting
// (the proxy sees no end of a conversation, only that it stops sending).
//
// The table tells them apart by the conversation's own rhythm. Table.Start
// and Table.Finish mark a request sent and ended; a conversation is held
// while a request of it is in flight and, after its last one ended, for
// its return timeout: the gap it is expected back within. The gaps
// observed between the end of one of its requests and the start of its
// next (the think time: a tool call, a user reading) are smoothed as TCP
// smooths round-trip samples into its retransmission timeout (RFC 6298
// section 2: SRTT and RTTVAR with gains 1/8 and 1/4, the first sample R
// giving SRTT = R and RTTVAR = R/2; timeout SRTT + 4 RTTVAR), rounded up
// to MinHold as RFC 6298 (2.4) rounds its timeout up to one second, and
// capped by the active window. A conversation with no gap of its own yet
// (after its first turn) takes the same estimate over every
// conversation's gaps; before the table has seen any gap, the active
// window (the rule before turn ends were known). A conversation that
// returns after it was released is held again from its request, and its
// long gap raises its timeout.
//
// Why not vLLM's own figures: vllm:kv_cache_usage_perc is BlockPool.
// get_usage, 1 - free/total blocks, and the free queue holds the cached
// blocks of finished requests, so a conversation in its think time
// already reads as free KV, and so does a replica none of whose
// conversations is running at that instant. "vLLM reports free KV and
// nothing waiting" or "nothing in flight" therefore cannot mean "room for
// a newcomer": it would admit newcomers over exactly the idle prefixes
// admission protects (the thrash of the 7 x RTX 5090 farm, issue 14).
//
// Held is kept incrementally: a request (Pick's touch) holds its
// conversation, Finish schedules its release in a min-heap by time, and
// every call that takes now releases the conversations whose timeout has
// passed (at most one heap item per Finish, popped once: O(log n) each).

// MinHold is the shortest return timeout of a held conversation (see
// above): RFC 6298 (2.4) rounds a retransmission timeout below one second
// up to one second, so that scheduling and delivery jitter of a fast
// round trip does not count as a loss; here it keeps a conversation whose
// client answers within milliseconds from being released between two of
// its turns.
const MinHold = time.Second

// release is one scheduled end of a hold: entry i (whose key it was) is
// released after at unless it was touched or started since.
type release struct {
	at  int64
	key uint64
	i   int32
}

// gapStats is an RFC 6298 estimator of think-time gaps, in seconds.
type gapStats struct {
	srtt, rttvar float32
}

// add folds in one gap of r seconds, the first when first (RFC 6298
// section 2.2 and 2.3).
func (g *gapStats) add(r float64, first bool) {
	if first {
		g.srtt, g.rttvar = float32(r), float32(r/2)
		return
	}
	srtt := float64(g.srtt)
	g.rttvar = float32(0.75*float64(g.rttvar) + 0.25*math.Abs(srtt-r))
	g.srtt = float32(0.875*srtt + 0.125*r)
}

// timeout is SRTT + 4 RTTVAR in nanoseconds.
func (g *gapStats) timeout() float64 {
	return (float64(g.srtt) + 4*float64(g.rttvar)) * float64(time.Second)
}

// Observe records the footprint of session's conversation, its last
// prompt + answer tokens (from the response's usage in live; exact in the
// simulator), as the conversation's share of its home's KV cache. It does
// not count as a request. It reports whether the table knows the session.
func (t *Table) Observe(session string, tokens int) bool {
	i, ok := t.index[fnv1a64(session)]
	if !ok {
		return false
	}
	t.observe(i, tokens)
	return true
}

// observe records entry i's footprint and folds it into the typical one.
func (t *Table) observe(i int32, tokens int) {
	t.setFootprint(i, tokens)
	if tokens > 0 {
		if t.typical == 0 {
			t.typical = float64(tokens)
		} else {
			t.typical += (float64(tokens) - t.typical) / 32
		}
	}
}

// Start records that a request of session was sent at now (the proxy:
// once per client request, after its first pick placed it; a retry on
// another replica is the same request). The conversation is held (see
// "Held conversations") until the request ends (Finish); when it was
// between turns, the gap since its last request ended is one sample of
// its think time. It reports whether the table knows the session.
func (t *Table) Start(session string, now time.Time) bool {
	at := t.clock(now)
	t.expire(at)
	i := t.find(fnv1a64(session), at)
	if i == nilIndex {
		return false
	}
	k := t.kvOf(i)
	if k.inFlight == 0 && k.ended {
		r := float64(max(at-k.endAt, 0)) / float64(time.Second)
		k.gaps.add(r, !k.gapped)
		t.gaps.add(r, !t.gapped)
		k.gapped, t.gapped = true, true
	}
	if k.inFlight < math.MaxInt32 {
		k.inFlight++
	}
	k.until = 0
	t.hold(i)
	return true
}

// Finish records that a request of session ended at now, with the
// conversation's footprint (its prompt + answer tokens, as Observe; 0 or
// less: none known, the footprint is kept). When no other request of it is
// in flight, it stays held for its return timeout (see "Held
// conversations") and is released after, unless it sends again. It
// reports whether the table knows the session.
func (t *Table) Finish(session string, tokens int, now time.Time) bool {
	at := t.clock(now)
	t.expire(at)
	key := fnv1a64(session)
	i := t.find(key, at)
	if i == nilIndex {
		return false
	}
	if tokens > 0 {
		t.observe(i, tokens)
	}
	k := t.kvOf(i)
	if k.inFlight > 0 {
		k.inFlight--
	}
	if k.inFlight > 0 {
		return true
	}
	k.ended, k.endAt = true, at
	k.until = at + t.holdFor(k)
	t.pushRelease(release{at: k.until, key: key, i: i})
	t.hold(i) // a request just ended: held from now (already, unless it was never started)
	return true
}

// holdFor is the return timeout of the conversation with KV figures k,
// in nanoseconds (see "Held conversations").
func (t *Table) holdFor(k *kvEntry) int64 {
	g := &k.gaps
	if !k.gapped {
		if !t.gapped {
			return t.window
		}
		g = &t.gaps
	}
	h := max(g.timeout(), float64(MinHold))
	if h >= float64(t.window) {
		return t.window
	}
	return max(int64(h), 1)
}

// ReturnTimeout is how long session stays held after its requests have
// ended (see "Held conversations"): its own estimate, else the estimate
// over every conversation, else the active window; false when the table
// does not know the session. It changes nothing.
func (t *Table) ReturnTimeout(session string) (time.Duration, bool) {
	i, ok := t.index[fnv1a64(session)]
	if !ok {
		return 0, false
	}
	var k kvEntry
	if int(i) < len(t.kv) {
		k = t.kv[i]
	}
	return time.Duration(t.holdFor(&k)), true
}

// hold counts entry i, if active, in its home's Held.
func (t *Table) hold(i int32) {
	e := &t.entries[i]
	if !e.active || e.held {
		return
	}
	e.held = true
	c := &t.counts[e.home]
	c.Held++
	c.HeldFootprint += t.fp(i)
}

// unhold takes entry i out of its home's Held.
func (t *Table) unhold(i int32) {
	e := &t.entries[i]
	if !e.held {
		return
	}
	e.held = false
	c := &t.counts[e.home]
	c.Held--
	c.HeldFootprint -= t.fp(i)
}

// holding reports whether entry i, when active at at, is held: no end
// recorded since its last request, a request in flight, or within its
// return timeout.
func (t *Table) holding(i int32, at int64) bool {
	if int(i) >= len(t.kv) {
		return true
	}
	k := &t.kv[i]
	return !k.ended || k.inFlight > 0 || k.until == 0 || at <= k.until
}

// pushRelease adds r to the release heap.
func (t *Table) pushRelease(r release) {
	h := append(t.releases, r)
	j := len(h) - 1
	for j > 0 {
		p := (j - 1) / 2
		if h[p].at <= h[j].at {
			break
		}
		h[p], h[j] = h[j], h[p]
		j = p
	}
	t.releases = h
}

// popRelease removes the earliest release from the heap.
func (t *Table) popRelease() release {
	h := t.releases
	r := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for j := 0; ; {
		l, m := 2*j+1, j
		if l < n && h[l].at < h[m].at {
			m = l
		}
		if l+1 < n && h[l+1].at < h[m].at {
			m = l + 1
		}
		if m == j {
			break
		}
		h[j], h[m] = h[m], h[j]
		j = m
	}
	t.releases = h
	return r
}

// releaseDue releases every held conversation whose return timeout ended
// before at. A heap item is stale when its entry was removed (its key is
// gone or another's), touched or started since (until changed).
func (t *Table) releaseDue(at int64) {
	for len(t.releases) > 0 && t.releases[0].at < at {
		r := t.popRelease()
		if j, ok := t.index[r.key]; !ok || j != r.i || int(r.i) >= len(t.kv) {
			continue
		}
		if k := &t.kv[r.i]; k.inFlight == 0 && k.until == r.at {
			t.unhold(r.i)
		}
	}
}

// TypicalFootprint is the expected footprint of a new conversation, and
// of an active one over its life: a moving average (weight 1/32) of the
// footprints observed, one per response; 0 before the first.
func (t *Table) TypicalFootprint() int { return int(t.typical) }

// setFootprint changes entry i's footprint, keeping its home's count.
func (t *Table) setFootprint(i int32, tokens int) {
	e := &t.entries[i]
	n := int32(min(max(tokens, 0), math.MaxInt32))
	k := t.kvOf(i)
	if e.active {
		t.counts[e.home].Footprint += int(n) - int(k.footprint)
	}
	if e.held {
		t.counts[e.home].HeldFootprint += int(n) - int(k.footprint)
	}
	k.footprint = n
}

// kvEntry is one conversation's KV figures (Table.kv).
type kvEntry struct {
	footprint int32 // last prompt + answer tokens (see ReplicaCounters.Footprint)
	leftTok   int32 // tokens of the conversation when it last left a home
	left      int16 // the home it last left (a priced move), -1 none
	ended     bool  // a request of it has ended (Finish): endAt is set
	gapped    bool  // gaps holds at least one sample of its own
	inFlight  int32 // its requests started (Start) and not finished
	gaps      gapStats
	endAt     int64 // when its last request ended, ns since Table.base
	until     int64 // held until then after endAt (0: no release scheduled)
}

// fp is entry i's footprint (0 when none was recorded).
func (t *Table) fp(i int32) int {
	if int(i) < len(t.kv) {
		return int(t.kv[i].footprint)
	}
	return 0
}

// kvOf returns entry i's KV figures, growing Table.kv to the entries.
func (t *Table) kvOf(i int32) *kvEntry {
	for len(t.kv) < len(t.entries) {
		t.kv = append(t.kv, kvEntry{left: -1})
	}
	return &t.kv[i]
}
