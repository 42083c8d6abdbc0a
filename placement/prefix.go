package placement

import "fmt"

// The held prefix: affinity with Config.Prefix PrefixHeld reads
// Prompt.Held, how many leading blocks of this prompt each replica holds
// in its KV cache now. The proxy knows it from vLLM's KV events (a ledger
// of the blocks each replica stored minus those it removed), the
// simulator from its block pools: one signal, two sources, as the
// metrics are. It decides two things the observed hits (observed.go)
// learn only one turn late:
//
//   - A later turn whose home has lost the conversation moves before it is
//     sent, reason rehome: home holds, beyond the shared prefix, less than
//     ColdFraction of what the conversation had there (its last prompt +
//     answer served there, as Table.ObserveHits recorded it, or its
//     footprint), that being at least ColdMinTokens. It goes to the replica
//     that holds the most of its prompt when that one holds a
//     conversation's worth of it (below), else where a new conversation
//     would go, home left out (the cold-at-home rule's reasons, observed.go).
//   - A conversation the table cannot follow, one without a session id
//     (each of its turns is new to the table) or a subagent's first turn,
//     goes where its prefix already is, reason prefix: the healthy replica
//     holding the most of its prompt, when that replica is within the
//     spill threshold and holds, beyond the floor, at least ColdMinTokens
//     and ColdFraction of the prompt beyond the floor. The floor is what
//     any replica may hold of any prompt: the larger of the shared prefix
//     (Request.SharedPrefixTokens, Table.SharedHit) and what the next best
//     replica holds (a system prompt cached on every busy replica is no
//     reason to go anywhere: production-stack's prefix router sent every
//     request to one endpoint for that, #957). Ties go to the fewest in
//     flight, then the lowest ID. Otherwise the usual rules place it.
//
// Without Prompt.Held (no KV events yet, a ledger that lost batches, a
// caller without a source) the option changes nothing.

// PrefixUse selects whether affinity reads the held prefix
// (routing.prefix).
type PrefixUse uint8

const (
	PrefixOff  PrefixUse = iota // decisions ignore what each replica holds of the prompt
	PrefixHeld                  // move a conversation its home lost, place one without a session where its prefix is
)

// ParsePrefixUse reads "off" (or "") and "held".
func ParsePrefixUse(s string) (PrefixUse, error) {
	switch s {
	case "", "off":
		return PrefixOff, nil
	case "held":
		return PrefixHeld, nil
	}
	return 0, fmt.Errorf("placement: prefix %q: want off or held", s)
}

func (p PrefixUse) String() string {
	if p == PrefixHeld {
		return "held"
	}
	return "off"
}

// MarshalText implements encoding.TextMarshaler.
func (p PrefixUse) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (p *PrefixUse) UnmarshalText(text []byte) error {
	v, err := ParsePrefixUse(string(text))
	if err == nil {
		*p = v
	}
	return err
}

// ReadsHeld implements HeldReader: with Config.Prefix held.
func (a *Affinity) ReadsHeld() bool { return !a.cfg.Disabled && a.cfg.Prefix == PrefixHeld }

// heldTokens is how many tokens of r's prompt replica i holds, -1 when
// unknown.
func heldTokens(r *Request, i int) int {
	p := &r.Prompt
	if p.Held == nil || p.BlockTokens <= 0 || i < 0 || i >= len(p.Held) {
		return -1
	}
	return min(p.Held[i]*p.BlockTokens, r.PromptTokens)
}

// sharedFloor is the shared prefix as the table and the caller know it.
func (a *Affinity) sharedFloor(r *Request) int {
	return max(r.SharedPrefixTokens, a.table.SharedHit(), 0)
}

// prefixHolder returns the replica, other than exclude, where r's prompt
// is held as a conversation's own (see above), or -1.
func (a *Affinity) prefixHolder(r *Request, s *Snapshot, exclude, threshold int) int {
	if r.Prompt.Held == nil {
		return -1
	}
	reps := s.Replicas
	best, second, bestTok := -1, 0, -1
	for i := range reps {
		if !reps[i].Healthy || i == exclude {
			continue
		}
		tok := heldTokens(r, i)
		switch {
		case tok < 0:
		case best < 0 || tok > bestTok || (tok == bestTok && reps[i].InFlight < reps[best].InFlight):
			if best >= 0 {
				second = max(second, bestTok)
			}
			best, bestTok = i, tok
		default:
			second = max(second, tok)
		}
	}
	if best < 0 || reps[best].InFlight > threshold {
		return -1
	}
	floor := max(a.sharedFloor(r), second)
	own := bestTok - floor
	if own < ColdMinTokens || float64(own) < ColdFraction*float64(r.PromptTokens-floor) {
		return -1
	}
	return best
}

// homeLost reports whether home h of the conversation in entry i holds,
// beyond the shared prefix, less than ColdFraction of what the
// conversation had there (see above); false when that is unknown.
func (a *Affinity) homeLost(r *Request, i int32, h int) bool {
	held := heldTokens(r, h)
	if held < 0 {
		return false
	}
	t := a.table
	had := 0
	if int(i) < len(t.hits) && t.hits[i].hadOn == int32(h) {
		had = int(t.hits[i].had)
	} else {
		had = t.fp(i)
	}
	floor := a.sharedFloor(r)
	expect := min(had, r.PromptTokens) - floor
	return expect >= ColdMinTokens && float64(held-floor) < ColdFraction*float64(expect)
}
