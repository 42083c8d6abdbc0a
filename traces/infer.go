package traces

import "fmt"

// SessionInferrer assigns sessions to the requests of a trace that has none
// (Mooncake, Azure), from their prefix chains. Requests must come in arrival
// order. The rule:
//
//  1. A request's stable prefix is the blocks that a continuation of the
//     conversation would repeat: its full blocks, except that an importer
//     whose source ids are coarser than the block size passes fewer (a
//     Mooncake request's last 512-token id covers a partial block whose id
//     changes when the conversation grows). Its tip is the last block of
//     the stable prefix.
//  2. A request R continues conversation C when the tip of C's latest
//     request occurs in R's stable prefix (ids chain, so R then repeats
//     C's whole stable prefix) and R's prompt is longer than that request's.
//     When several conversations qualify, the one with the longest stable
//     prefix wins. Otherwise R starts a new conversation.
//  3. A conversation can be continued at most once per request: continuing
//     it moves its tip to R's.
//  4. A request's tip is registered only if no earlier request had that
//     block in its stable prefix, i.e. the request brought content of its
//     own. A request made only of shared content (a bare system prompt, a
//     retry of an earlier prompt) is never continued, so that a widely
//     shared prefix does not chain unrelated conversations. Because a tip
//     is registered at most once, no two open conversations share a tip
//     and there are no ties.
//
// Turn counts from 0 within the conversation; ThinkMs is the time since the
// conversation's previous request arrived (an upper bound of the think
// time: it includes the previous request's service time).
//
// Memory: one id per distinct stable block seen, and one entry per open
// conversation.
type SessionInferrer struct {
	prefix string
	seen   map[uint64]struct{}
	open   map[uint64]*inferred
	n      int
}

type inferred struct {
	id     string
	turn   int
	lastMs int64
	prompt int
}

// NewSessionInferrer returns an inferrer naming sessions prefix + a 7-digit
// number, in order of first appearance.
func NewSessionInferrer(prefix string) *SessionInferrer {
	return &SessionInferrer{prefix: prefix, seen: map[uint64]struct{}{}, open: map[uint64]*inferred{}}
}

// Sessions returns the number of sessions assigned so far.
func (s *SessionInferrer) Sessions() int { return s.n }

// Assign sets r.Session, r.Turn and r.ThinkMs. stable is the number of
// leading blocks of r.HashIDs that a continuation would repeat (see the
// rule above); it is clamped to [0, len(r.HashIDs)].
func (s *SessionInferrer) Assign(r *Request, stable int) {
	stable = min(max(stable, 0), len(r.HashIDs))
	ids := r.HashIDs[:stable]
	var c *inferred
	for j := len(ids) - 1; j >= 0; j-- {
		if o := s.open[ids[j]]; o != nil && o.prompt < r.PromptTokens {
			c = o
			delete(s.open, ids[j])
			break
		}
	}
	if c == nil {
		c = &inferred{id: fmt.Sprintf("%s%07d", s.prefix, s.n), turn: -1, lastMs: r.ArrivalMs}
		s.n++
	}
	c.turn++
	r.Session, r.Turn, r.ThinkMs = c.id, c.turn, r.ArrivalMs-c.lastMs
	c.lastMs, c.prompt = r.ArrivalMs, r.PromptTokens
	if len(ids) > 0 {
		tip := ids[len(ids)-1]
		if _, dup := s.seen[tip]; !dup {
			s.open[tip] = c
		}
	}
	for _, id := range ids {
		s.seen[id] = struct{}{}
	}
}
