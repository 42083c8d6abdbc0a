package traces

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
)

// SessionSource hands out sessions one at a time, in the order a closed-loop
// driver should start them. The second result is false when it is exhausted.
type SessionSource interface {
	NextSession() (Session, bool)
}

var (
	_ SessionSource = (*Generator)(nil)
	_ SessionSource = (*SliceSource)(nil)
)

// Generator produces synthetic agent sessions of a Workload, without end and
// deterministically: the same workload, block size and seed give the same
// sessions, in the same order, on every machine.
//
// Session k (0-based, counting top-level sessions) is named fmt "s%06d" and
// draws its sizes from its own PCG stream seeded with (seed, k), so its
// content does not depend on any other session. Its subagent sessions (if
// Workload.SubagentProbability > 0) follow it, named "<parent>.sub<n>".
//
// Prompts are made of content segments: the system prompt (one segment,
// shared by every session of every seed: it is the same text), the first
// user message, then each answer and each new user text. Segment ids other
// than the system prompt's hash (seed, k, subagent n, segment index), so they
// never collide across sessions or seeds. Block ids chain as in vLLM (see
// blockChain): identical prefixes give identical ids, and a block straddling
// two segments is unique to its session.
//
// Requests carry no arrival time (ArrivalMs 0: a closed-loop driver decides
// when to send), CachedTokens and Replica -1, ThinkMs 0 for a session's first
// turn and Workload.ThinkTime afterwards.
type Generator struct {
	w         Workload
	blockSize int
	seed      uint64
	next      uint64    // index of the next top-level session
	queue     []Session // subagents waiting to be handed out
	chain     blockChain
	sysSeg    uint64
}

// NewGenerator returns a generator of w's sessions hashed in blocks of
// blockSize tokens. It panics if w is invalid or blockSize < 1: validate
// user input with Workload.Validate first.
func NewGenerator(w Workload, blockSize int, seed uint64) *Generator {
	if err := w.Validate(); err != nil {
		panic("traces.NewGenerator: invalid workload: " + err.Error())
	}
	if blockSize < 1 {
		panic(fmt.Sprintf("traces.NewGenerator: block size %d < 1", blockSize))
	}
	return &Generator{
		w:         w,
		blockSize: blockSize,
		seed:      seed,
		chain:     blockChain{size: blockSize},
		sysSeg:    hashWords(0x73797374656d, uint64(w.SystemPromptTokens)), // "system"
	}
}

// Workload returns the generator's workload.
func (g *Generator) Workload() Workload { return g.w }

// BlockSize returns the block size of the generated hash ids.
func (g *Generator) BlockSize() int { return g.blockSize }

// NextSession returns the next session; it never runs out.
func (g *Generator) NextSession() (Session, bool) {
	if len(g.queue) > 0 {
		s := g.queue[0]
		g.queue = g.queue[1:]
		return s, true
	}
	k := g.next
	g.next++
	id := fmt.Sprintf("s%06d", k)
	rng := rand.New(rand.NewPCG(g.seed, hashWords(k, 0)))
	first := g.firstMessage(rng)
	s := g.session(id, "", -1, k, 0, first, g.w.Turns, rng)
	return s, true
}

func (g *Generator) firstMessage(rng *rand.Rand) int {
	f := float64(g.w.FirstMessageTokens)
	if sp := g.w.FirstMessageSpread; sp > 0 {
		f *= 1 + sp*(2*rng.Float64()-1)
	}
	return max(1, int(math.Round(f)))
}

func (g *Generator) outputTokens(rng *rand.Rand) int {
	if g.w.OutputTokens != OutputLognormal {
		// "max": the answer runs to max_tokens. The draw is still made, so
		// that the sessions' other figures are the same in both models.
		_ = rng.NormFloat64()
		return g.w.MaxOutputTokens
	}
	mean, sigma := g.w.outputMean(), g.w.OutputTokensSigma
	// Lognormal: E[exp(mu + sigma Z)] = exp(mu + sigma^2/2) = mean.
	mu := math.Log(mean) - sigma*sigma/2
	o := int(math.Round(math.Exp(mu + sigma*rng.NormFloat64())))
	return min(max(o, 1), g.w.MaxOutputTokens)
}

// session builds one session. k and sub name its segments; first is the
// size of its first (or task) message; for a top-level session (sub == 0)
// it also decides which subagents to spawn and queues them.
func (g *Generator) session(id, parent string, parentTurn int, k, sub uint64, first, turns int, rng *rand.Rand) Session {
	w := g.w
	B := g.blockSize
	// Draw the sizes first so that one backing array holds every id.
	// Spawn decisions use a stream of their own, so that a session's sizes
	// do not depend on the subagent probability.
	outs := make([]int, turns)
	spawn := make([]bool, turns)
	var coin *rand.Rand
	if sub == 0 && w.SubagentProbability > 0 {
		coin = rand.New(rand.NewPCG(g.seed, hashWords(k, 0x7370617764))) // "spawn"
	}
	for t := range outs {
		outs[t] = g.outputTokens(rng)
		if coin != nil && t < turns-1 {
			spawn[t] = coin.Float64() < w.SubagentProbability
		}
	}
	total, prompt := 0, w.SystemPromptTokens+first
	for t := range turns {
		if t > 0 {
			prompt += w.NewTokensPerTurn
		}
		total += ceilDiv(prompt, B) + (prompt+outs[t])/B - prompt/B
		prompt += outs[t]
	}
	ids := make([]uint64, 0, total)

	seg := func(i uint64) uint64 { return hashWords(g.seed, k, sub, i) }
	c := &g.chain
	c.full, c.pending, c.fill = c.full[:0], c.pending[:0], 0
	s := Session{ID: id, Parent: parent, ParentTurn: parentTurn, Turns: make([]Request, turns)}
	var nsub uint64
	for t := range turns {
		if t == 0 {
			if w.SystemPromptTokens > 0 {
				c.appendSegment(g.sysSeg, w.SystemPromptTokens)
			}
			c.appendSegment(seg(1), first)
		} else if w.NewTokensPerTurn > 0 {
			c.appendSegment(seg(uint64(2*t+1)), w.NewTokensPerTurn)
		}
		P := c.tokens()
		start := len(ids)
		ids = c.appendIDs(ids)
		hash := ids[start:len(ids):len(ids)]
		fullBefore := len(c.full)
		c.appendSegment(seg(uint64(2*t+2)), outs[t])
		start = len(ids)
		ids = append(ids, c.full[fullBefore:]...)
		var outIDs []uint64
		if len(ids) > start {
			outIDs = ids[start:len(ids):len(ids)]
		}
		think := int64(0)
		if t > 0 {
			think = w.ThinkTime.Milliseconds()
		}
		s.Turns[t] = Request{
			Session:       id,
			Parent:        parent,
			Turn:          t,
			Model:         w.Model,
			PromptTokens:  P,
			OutputTokens:  outs[t],
			CachedTokens:  -1,
			Replica:       -1,
			ThinkMs:       think,
			HashIDs:       hash,
			OutputHashIDs: outIDs,
		}
		if spawn[t] {
			nsub++
			srng := rand.New(rand.NewPCG(g.seed, hashWords(k, nsub)))
			// subagent works on a chain of its own and restores ours.
			g.queue = append(g.queue, g.subagent(id, t, k, nsub, srng))
		}
	}
	return s
}

// subagent builds subagent n of top-level session k, spawned after turn t.
func (g *Generator) subagent(parent string, t int, k, n uint64, rng *rand.Rand) Session {
	saved := g.chain
	g.chain = blockChain{size: g.blockSize}
	id := fmt.Sprintf("%s.sub%d", parent, n)
	s := g.session(id, parent, t, k, n, g.w.SubagentTaskTokens, g.w.SubagentTurns, rng)
	g.chain = saved
	return s
}

// SliceSource is a SessionSource over sessions held in memory (for example
// LoadSessions' result): it hands them out in order, then reports false.
type SliceSource struct {
	sessions []Session
	next     int
}

// NewSliceSource returns a source over sessions (not copied).
func NewSliceSource(sessions []Session) *SliceSource { return &SliceSource{sessions: sessions} }

// NextSession returns the next session, or false when all were handed out.
func (s *SliceSource) NextSession() (Session, bool) {
	if s.next >= len(s.sessions) {
		return Session{}, false
	}
	s.next++
	return s.sessions[s.next-1], true
}

// LoadSessions reads a whole trace file and groups its requests by session:
// sessions in order of first appearance, each session's requests in file
// order. Parent and ParentTurn (-1) come from the session's first request.
// It holds the whole trace in memory; use a Reader to stream.
func LoadSessions(path string) ([]Session, Header, error) {
	r, err := Open(path, ReaderOptions{})
	if err != nil {
		return nil, Header{}, err
	}
	defer r.Close()
	index := map[string]int{}
	var sessions []Session
	for {
		req, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return sessions, r.Header(), nil
			}
			return nil, Header{}, err
		}
		i, ok := index[req.Session]
		if !ok {
			i = len(sessions)
			index[req.Session] = i
			sessions = append(sessions, Session{ID: req.Session, Parent: req.Parent, ParentTurn: -1})
		}
		sessions[i].Turns = append(sessions[i].Turns, req.Clone())
	}
}
