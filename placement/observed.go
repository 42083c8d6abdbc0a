package placement

import (
	"fmt"
	"math"
)

// Observed hits and "re-home when cold".
//
// Affinity keeps a conversation on its home because the home holds its
// prefix, but a home under memory pressure evicts it between two turns
// (vLLM frees a finished request's blocks into an LRU queue and evicts
// them when an allocation pops them: vllm/v1/core/block_pool.py
// get_new_blocks, _maybe_evict_cached_block). Staying then buys nothing,
// and moving costs nothing. vLLM says what each request found: the
// response's usage.prompt_tokens_details.cached_tokens (OpenAI API, with
// --enable-prompt-tokens-details), cache_read_input_tokens (Anthropic API),
// the request's num_cached_tokens at its first scheduling. The simulator
// gives the same figure from its own block pool.
//
// Table.ObserveHits records, per conversation, what its home served from
// its cache against what was asked (ReplicaCounters.AskedTokens and
// CachedTokens sum them per home), and what the conversation had there
// after its last turn served there: that turn's prompt + answer. What a
// conversation finds of its own is judged above the shared prefix: the
// tokens a conversation's first turn on a replica finds cached (a common
// system prompt, cached on every busy replica), learnt as a moving
// average (weight 1/8) over those first turns (Table.SharedHit). A turn
// served by its home whose cached tokens beyond the shared prefix were
// below ColdFraction of what it had there beyond it (the smaller of what
// it had and its prompt), when that is at least ColdMinTokens, marks the
// conversation cold at home; a turn that found more clears the mark.
// Without the shared prefix, a history evicted behind a system prompt of
// a third of the prompt (the built-in workload's) would read as a third
// cached and never as cold. With Config.Rehome RehomeCold, the next turn of a
// cold conversation is placed as a new conversation would be (the load
// score, or the KV headroom with BalanceKV) on a healthy replica other
// than its home, reason rehome, and the replica it lands on becomes its
// home; the replica it left counts one in ReplicaCounters.Rehomed. With
// no other healthy replica it stays (sticky). The home is left out even
// when it scores best: the cold turn was just recomputed there, but the
// home evicted the conversation within one think time and will again,
// and on a farm of equally loaded replicas the tie would go to the
// lowest ID and the rule would never move anyone. A valid pin and a failed home come first,
// as for any later turn; a subagent is not sent to its parent's home by a
// re-home. Turns served elsewhere (a spill) do not judge the home.
//
// Why the next turn and not the cold one: the proxy learns what a turn
// found only from its answer, and by then the turn has been computed on
// the home again. The cold turn says that this home evicts this
// conversation within its think time: it will again, while a replica with
// room keeps it. The default, RehomeOff, keeps every conversation home
// (the seed's rule): a move recomputes the whole prefix once more, which is
// what hurt when migration was aggressive (verl#6533), so it is an opt-in
// to be measured first (warden sim and warden tune, variant
// affinity+rehome).

// ColdFraction and ColdMinTokens define a turn that found its home cold:
// its cached tokens beyond the shared prefix were below ColdFraction of
// what the conversation had there beyond it (the smaller of its previous
// prompt + answer there and this prompt), and that was at least
// ColdMinTokens. vLLM evicts a finished request's blocks tail first, so a
// history under pressure erodes from its end: a fifth left is (nearly)
// none. A prefix under 256 tokens costs a few milliseconds of prefill
// anywhere: not worth a move.
const (
	ColdFraction  = 0.2
	ColdMinTokens = 256
)

// Rehome selects whether a conversation found cold at home moves
// (routing.rehome).
type Rehome uint8

const (
	RehomeOff  Rehome = iota // a conversation always stays home (the seed's rule)
	RehomeCold               // a conversation cold at home is placed afresh on its next turn
)

// ParseRehome reads "off" (or "") and "cold".
func ParseRehome(s string) (Rehome, error) {
	switch s {
	case "", "off":
		return RehomeOff, nil
	case "cold":
		return RehomeCold, nil
	}
	return 0, fmt.Errorf("placement: rehome %q: want off or cold", s)
}

func (r Rehome) String() string {
	if r == RehomeCold {
		return "cold"
	}
	return "off"
}

// MarshalText implements encoding.TextMarshaler.
func (r Rehome) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *Rehome) UnmarshalText(text []byte) error {
	v, err := ParseRehome(string(text))
	if err == nil {
		*r = v
	}
	return err
}

// hitEntry is one conversation's observed hits (Table.hits, aligned with
// Table.entries).
type hitEntry struct {
	had    int32 // prompt + answer tokens after its last turn served on hadOn
	hadOn  int32 // the replica had refers to; -1: none
	cold   bool  // its last turn at home found (nearly) none of what it had there
	asked  int64 // prompt tokens of its turns served by its home
	served int64 // of those, served from the home's prefix cache
}

// ObserveHits records the answer to a request of session served by
// replica: prompt tokens asked, cached of them served from the replica's
// prefix cache (negative: unknown, the replica does not report it) and
// answer tokens (negative: unknown). It changes no footprint and does not
// count as a request. It reports whether the table knows the session.
// See "Observed hits" above for what it decides.
func (t *Table) ObserveHits(session string, replica, prompt, cached, answer int) bool {
	i, ok := t.index[fnv1a64(session)]
	if !ok {
		return false
	}
	e := &t.entries[i]
	if replica != int(e.home) || prompt <= 0 {
		return true // a spill, or nothing to judge by
	}
	h := t.hitOf(i)
	if cached >= 0 {
		cached = min(cached, prompt)
		h.asked += int64(prompt)
		h.served += int64(cached)
		c := &t.counts[e.home]
		c.AskedTokens += int64(prompt)
		c.CachedTokens += int64(cached)
		shared := int(t.sharedHit)
		if h.hadOn == e.home {
			expect := min(int(h.had), prompt) - shared
			own := cached - shared
			h.cold = expect >= ColdMinTokens && float64(own) < ColdFraction*float64(expect)
		} else if t.sharedHit == 0 {
			t.sharedHit = float64(cached) // a first turn here: what any conversation finds
		} else {
			t.sharedHit += (float64(cached) - t.sharedHit) / 8
		}
	}
	h.had = int32(min(prompt+max(answer, 0), math.MaxInt32))
	h.hadOn = e.home
	return true
}

// SharedHit is the table's estimate of the shared prefix: the cached
// tokens a conversation's first turn on a replica finds (see "Observed
// hits"), 0 before any.
func (t *Table) SharedHit() int { return int(t.sharedHit) }

// Hits returns what session's homes served from their prefix cache
// (cached) against what its turns there asked (asked), and whether it is
// cold at its home now; ok is false when the table does not know it.
func (t *Table) Hits(session string) (asked, cached int64, cold, ok bool) {
	i, ok := t.index[fnv1a64(session)]
	if !ok {
		return 0, 0, false, false
	}
	if int(i) >= len(t.hits) {
		return 0, 0, false, true
	}
	h := &t.hits[i]
	return h.asked, h.served, h.cold && h.hadOn == t.entries[i].home, true
}

// coldAt reports whether entry i was found cold at its home.
func (t *Table) coldAt(i int32) bool {
	if int(i) >= len(t.hits) {
		return false
	}
	h := &t.hits[i]
	return h.cold && h.hadOn == t.entries[i].home
}

// hitOf returns entry i's observed hits, growing Table.hits to the entries.
func (t *Table) hitOf(i int32) *hitEntry {
	for len(t.hits) < len(t.entries) {
		t.hits = append(t.hits, hitEntry{hadOn: -1})
	}
	return &t.hits[i]
}

// rehome moves the cold conversation of entry i (a later turn, home h
// usable) to where a new conversation would go, h left out. It returns the
// decision, or ok false when no other replica is healthy (the caller
// serves the turn at home, sticky).
func (a *Affinity) rehome(r *Request, s *Snapshot, i int32, h int) (d Decision, ok bool) {
	t := a.table
	hit := t.hitOf(i)
	hit.cold = false
	// Leave home out as a new conversation's placement sees the replicas:
	// shown unhealthy for this one decision (restored before returning).
	// With the held prefix (prefix.go), where the prompt is held comes
	// first.
	target := -1
	if a.cfg.Prefix == PrefixHeld {
		target = a.prefixHolder(r, s, h, a.cfg.Spill.Resolve(s.MaxNumSeqs))
	}
	s.Replicas[h].Healthy = false
	if target < 0 && a.kvNew() {
		target, _ = a.placeNew(r, s) // an admitted conversation never waits
	}
	if target < 0 {
		target = a.best(s, -1)
	}
	s.Replicas[h].Healthy = true
	if target < 0 || target == h {
		return Decision{}, false
	}
	t.counter(h).Rehomed++
	t.setHome(i, target)
	hit.hadOn = -1 // the new home has nothing of it yet
	d = Decision{Replica: target, Reason: ReasonRehome}
	if a.kvOn() {
		a.estimate(r, s, nilIndex, &d)
	}
	return d, true
}
