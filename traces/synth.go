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

// FamilySource is a SessionSource that can also hand out a top-level
// session with its subagents attached (Session.Subagents), for a driver
// that runs them side by side with their parent. Use one of the two
// methods on a source, not both.
type FamilySource interface {
	SessionSource
	NextFamily() (Session, bool)
}

var _ FamilySource = (*Generator)(nil)

// Generator produces synthetic agent sessions of a Workload, without end and
// deterministically: the same workload, block size and seed give the same
// sessions, in the same order, on every machine.
//
// Session k (0-based, counting top-level sessions) is named fmt "s%06d" and
// draws its sizes from PCG streams of its own seeded with (seed, k), so its
// content does not depend on any other session: the first message and the
// answers from one stream, the spawn decisions from a second, and the
// shapes of issue 48 (agent kind, turns, additions, pauses, summaries,
// subagents at once) from a third, so that a workload without them draws
// exactly what it always did. Its subagents are named "<parent>.sub<n>":
// NextFamily attaches them to their parent (Session.Subagents, each with
// the request index it follows as ParentTurn); NextSession hands them out
// after it.
//
// Prompts are made of content segments: the system prompt (one segment,
// shared by every session of every seed of its agent kind: it is the same
// text), the first user message, then each answer and each new addition.
// Segment ids other than the system prompts' hash (seed, k, subagent n,
// segment index), so they never collide across sessions or seeds. Block
// ids chain as in vLLM (see blockChain): identical prefixes give identical
// ids, and a block straddling two segments is unique to its session. A
// compaction's summary is the compaction request's answer; the request
// after it starts a new chain of the system prompt and that summary.
//
// Requests carry no arrival time (ArrivalMs 0: a closed-loop driver decides
// when to send), CachedTokens and Replica -1, ThinkMs 0 for a session's first
// request and for a parent's request after its subagents (the wait is
// theirs), else the pause drawn for the turn (Workload.ThinkTime without
// additions).
type Generator struct {
	w         Workload
	blockSize int
	seed      uint64
	next      uint64    // index of the next top-level session
	queue     []Session // subagents waiting to be handed out (NextSession)
	chain     blockChain
	kinds     []kind    // one per agent kind (w itself without agents)
	kindCum   []float64 // cumulative weights of kinds
	noHash    bool      // sizes only: no block ids (Summarize)
	shaped    bool      // w uses the keys of issue 48: sessions need their shape stream
}

// kind is one agent kind of a generator: its workload and its system
// prompts' segment ids.
type kind struct {
	w      Workload
	sysSeg uint64 // the system prompt
	subSeg uint64 // the subagents' own system prompt (SubagentSystemPromptTokens > 0)
	addCum []float64
}

// Stream tags of a session's PCG streams (see Generator).
const (
	spawnTag = 0x7370617764     // "spawn"
	shapeTag = 0x7368617065     // "shape"
	sysTag   = 0x73797374656d   // "system"
	subTag   = 0x7375626167656e // "subagen"
)

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
	g := &Generator{w: w, blockSize: blockSize, seed: seed, chain: blockChain{size: blockSize}, shaped: w.Shaped()}
	if len(w.Agents) == 0 {
		g.kinds = []kind{newKind(w, hashWords(sysTag, uint64(w.SystemPromptTokens)), "")}
	}
	var cum float64
	for _, a := range w.Agents {
		name := hashString(a.Name)
		g.kinds = append(g.kinds, newKind(a.Shape, hashWords(sysTag, uint64(a.Shape.SystemPromptTokens), name), a.Name))
		cum += a.Weight
		g.kindCum = append(g.kindCum, cum)
	}
	return g
}

func newKind(w Workload, sysSeg uint64, name string) kind {
	k := kind{w: w, sysSeg: sysSeg, subSeg: hashWords(subTag, uint64(w.SubagentSystemPromptTokens), hashString(name))}
	var cum float64
	for _, a := range w.Additions {
		cum += a.Weight
		k.addCum = append(k.addCum, cum)
	}
	return k
}

// hashString hashes a name into a segment word.
func hashString(s string) uint64 {
	h := newHasher(0x6e616d65) // "name"
	for len(s) > 0 {
		var w uint64
		n := min(len(s), 8)
		for i := range n {
			w |= uint64(s[i]) << (8 * i)
		}
		h.add(w)
		s = s[n:]
	}
	return h.sum()
}

// pick returns the index an inverse-CDF draw u in [0, 1) selects from
// cumulative weights cum.
func pick(cum []float64, u float64) int {
	x := u * cum[len(cum)-1]
	for i, c := range cum {
		if x < c {
			return i
		}
	}
	return len(cum) - 1
}

// Workload returns the generator's workload.
func (g *Generator) Workload() Workload { return g.w }

// BlockSize returns the block size of the generated hash ids.
func (g *Generator) BlockSize() int { return g.blockSize }

// NextSession returns the next session, the subagents of a top-level
// session after it; it never runs out.
func (g *Generator) NextSession() (Session, bool) {
	if len(g.queue) > 0 {
		s := g.queue[0]
		g.queue = g.queue[1:]
		return s, true
	}
	s, _ := g.NextFamily()
	g.queue = append(g.queue, s.Subagents...)
	s.Subagents = nil
	return s, true
}

// NextFamily returns the next top-level session with its subagents in
// Subagents; it never runs out.
func (g *Generator) NextFamily() (Session, bool) {
	k := g.next
	g.next++
	id := fmt.Sprintf("s%06d", k)
	rng := rand.New(rand.NewPCG(g.seed, hashWords(k, 0)))
	var ks *rand.Rand // only a shaped workload draws from it
	if g.shaped {
		ks = rand.New(rand.NewPCG(g.seed, hashWords(k, shapeTag)))
	}
	ki := 0
	if len(g.kindCum) > 0 {
		ki = pick(g.kindCum, ks.Float64())
	}
	kd := &g.kinds[ki]
	w := kd.w
	turns := w.Turns
	if w.TurnsSigma > 0 {
		turns = drawTurns(w.Turns, w.TurnsSigma, w.TurnsMax, ks)
	}
	first := firstMessage(w, rng)
	return g.session(sessionSpec{id: id, parentTurn: -1, k: k, kind: kd, first: first, turns: turns}, rng, ks), true
}

// drawTurns draws a number of turns from a lognormal of this mean and
// sigma, at least 1 and at most hi (0: no bound).
func drawTurns(mean int, sigma float64, hi int, rng *rand.Rand) int {
	d := TokenDist{Mean: float64(mean), Sigma: sigma, Min: 1, Max: float64(hi)}
	return d.drawInt(rng, 1)
}

func firstMessage(w Workload, rng *rand.Rand) int {
	f := float64(w.FirstMessageTokens)
	if sp := w.FirstMessageSpread; sp > 0 {
		f *= 1 + sp*(2*rng.Float64()-1)
	}
	return max(1, int(math.Round(f)))
}

func outputTokens(w Workload, rng *rand.Rand) int {
	if w.OutputTokens != OutputLognormal {
		// "max": the answer runs to max_tokens. The draw is still made, so
		// that the sessions' other figures are the same in both models.
		_ = rng.NormFloat64()
		return w.MaxOutputTokens
	}
	mean, sigma := w.outputMean(), w.OutputTokensSigma
	// Lognormal: E[exp(mu + sigma Z)] = exp(mu + sigma^2/2) = mean.
	mu := math.Log(mean) - sigma*sigma/2
	o := int(math.Round(math.Exp(mu + sigma*rng.NormFloat64())))
	return min(max(o, 1), w.MaxOutputTokens)
}

// sessionSpec is what names and sizes one session before its draws.
type sessionSpec struct {
	id         string
	parent     string // "" for a top-level session
	parentTurn int    // the parent's request it follows, -1 for a top-level session
	k, sub     uint64 // top-level index and subagent number (0: top level)
	kind       *kind
	first      int // its first (or task) message
	turns      int
}

// step is one request of a session, planned before its blocks are hashed.
type step struct {
	add     int  // tokens appended before the request: the first message, a turn's addition, a compaction's instructions
	reset   bool // the chain restarts with the system prompt and summary tokens of summary first
	summary int
	prompt  int
	out     int
	thinkMs int64
}

// session builds one session: it plans every request (sizes, pauses,
// compactions, and the subagents it spawns, built on the way), then hashes
// the blocks of all of them into one backing array.
func (g *Generator) session(sp sessionSpec, rng, ks *rand.Rand) Session {
	kd := sp.kind
	w := kd.w
	top := sp.sub == 0
	sys, sysSeg := w.SystemPromptTokens, kd.sysSeg
	if !top && w.SubagentSystemPromptTokens > 0 {
		sys, sysSeg = w.SubagentSystemPromptTokens, kd.subSeg
	}
	// Answers first, from the session's first stream, and the spawn
	// decisions from a stream of their own, so that a session's sizes do
	// not depend on the subagent probability.
	outs := make([]int, sp.turns)
	spawn := make([]bool, sp.turns)
	var coin *rand.Rand
	if top && w.SubagentProbability > 0 {
		coin = rand.New(rand.NewPCG(g.seed, hashWords(sp.k, spawnTag)))
	}
	for t := range outs {
		outs[t] = outputTokens(w, rng)
		if coin != nil && t < sp.turns-1 {
			spawn[t] = coin.Float64() < w.SubagentProbability
		}
	}

	// Plan every request: what it appends, its prompt, answer and pause.
	limit := 0
	if w.ContextLimit > 0 {
		limit = int(w.compactAt() * float64(w.ContextLimit))
	}
	steps := make([]step, 0, sp.turns)
	var subs []Session
	results := -1 // the subagents' answers the next turn adds, -1: none
	ctx := 0      // the context after the last request: prompt + answer
	for t := range sp.turns {
		var st step
		switch {
		case t == 0:
			st = step{add: sp.first}
			ctx = sys
		case results >= 0:
			// The parent's turn after its subagents: their answers are the
			// tool's result, sent as soon as the last one is in.
			st, results = step{add: results}, -1
			if len(w.Additions) > 0 {
				w.drawAddition(kd, ks) // keeps the stream aligned
			}
		default:
			st = step{add: w.NewTokensPerTurn, thinkMs: w.ThinkTime.Milliseconds()}
			if len(w.Additions) > 0 {
				st.add, st.thinkMs = w.drawAddition(kd, ks)
			}
		}
		if t > 0 && limit > 0 && ctx+st.add > limit {
			// The agent compacts before it sends the turn: its history and
			// the instructions, answered by the summary; the turn then
			// starts a new context of the system prompt and the summary.
			sum := w.SummaryTokens.drawInt(ks, 1)
			steps = append(steps, step{add: w.CompactPromptTokens, prompt: ctx + w.CompactPromptTokens, out: sum, thinkMs: st.thinkMs})
			ctx = sys + sum
			st.reset, st.summary, st.thinkMs = true, sum, 0
			if room := limit - ctx; st.add > room {
				st.add = max(room, 0) // what the agent truncates to fit
			}
		}
		st.prompt = ctx + st.add
		st.out = outs[t]
		if w.ContextLimit > 0 {
			// An answer ends where the model's context window does.
			st.out = max(1, min(st.out, w.ContextLimit-st.prompt))
		}
		steps = append(steps, st)
		ctx = st.prompt + st.out
		if spawn[t] {
			n := 1
			if !w.SubagentParallel.IsZero() {
				n = w.SubagentParallel.drawInt(ks, 1)
			}
			results = 0
			for range n {
				sub := g.subagent(sp, uint64(len(subs))+1, len(steps)-1)
				results += sub.Turns[len(sub.Turns)-1].OutputTokens
				subs = append(subs, sub)
			}
		}
	}

	s := Session{ID: sp.id, Parent: sp.parent, ParentTurn: sp.parentTurn, Turns: make([]Request, len(steps)), Subagents: subs, SharedTokens: sys}
	reqSession, reqParent := sp.id, sp.parent
	switch {
	case top:
	case w.SubagentSession == SubagentParent:
		reqSession, reqParent = sp.parent, ""
	case w.SubagentSession == SubagentNone:
		reqParent = ""
	}
	turn := func(j int) int {
		if !top && w.SubagentSession == SubagentParent {
			return sp.parentTurn + 1 // a later turn of the parent's conversation
		}
		return j
	}
	if g.noHash {
		for j, st := range steps {
			s.Turns[j] = Request{Session: reqSession, Parent: reqParent, Turn: turn(j), Model: g.w.Model, PromptTokens: st.prompt,
				OutputTokens: st.out, CachedTokens: -1, Replica: -1, ThinkMs: st.thinkMs}
		}
		return s
	}

	// Hash: one backing array holds every id of the session.
	B := g.blockSize
	total := 0
	for _, st := range steps {
		total += ceilDiv(st.prompt, B) + (st.prompt+st.out)/B - st.prompt/B
	}
	ids := make([]uint64, 0, total)
	seg := func(i uint64) uint64 { return hashWords(g.seed, sp.k, sp.sub, i) }
	c := &g.chain
	c.full, c.pending, c.fill = c.full[:0], c.pending[:0], 0
	for j, st := range steps {
		if j == 0 || st.reset {
			c.full, c.pending, c.fill = c.full[:0], c.pending[:0], 0
			if sys > 0 {
				c.appendSegment(sysSeg, sys)
			}
			if st.reset {
				// The summary is the answer of the compaction before.
				c.appendSegment(seg(uint64(2*j)), st.summary)
			}
		}
		if st.add > 0 {
			c.appendSegment(seg(uint64(2*j+1)), st.add)
		}
		P := c.tokens()
		start := len(ids)
		ids = c.appendIDs(ids)
		hash := ids[start:len(ids):len(ids)]
		fullBefore := len(c.full)
		c.appendSegment(seg(uint64(2*j+2)), st.out)
		start = len(ids)
		ids = append(ids, c.full[fullBefore:]...)
		var outIDs []uint64
		if len(ids) > start {
			outIDs = ids[start:len(ids):len(ids)]
		}
		s.Turns[j] = Request{
			Session:       reqSession,
			Parent:        reqParent,
			Turn:          turn(j),
			Model:         g.w.Model,
			PromptTokens:  P,
			OutputTokens:  st.out,
			CachedTokens:  -1,
			Replica:       -1,
			ThinkMs:       st.thinkMs,
			HashIDs:       hash,
			OutputHashIDs: outIDs,
		}
	}
	return s
}

// drawAddition draws one later turn's addition and the pause before it.
func (w Workload) drawAddition(kd *kind, ks *rand.Rand) (int, int64) {
	a := &w.Additions[pick(kd.addCum, ks.Float64())]
	add := a.Tokens.drawInt(ks, 0)
	return add, a.Think.drawDuration(ks).Milliseconds()
}

// subagent builds subagent n of the top-level session parent, spawned
// after the parent's request after: its own first stream (seeded with
// (seed, k, n)) and shape stream, the kind's subagent shape.
func (g *Generator) subagent(parent sessionSpec, n uint64, after int) Session {
	w := parent.kind.w
	rng := rand.New(rand.NewPCG(g.seed, hashWords(parent.k, n)))
	var ks *rand.Rand
	if g.shaped {
		ks = rand.New(rand.NewPCG(g.seed, hashWords(parent.k, n, shapeTag)))
	}
	turns := w.SubagentTurns
	if w.SubagentTurnsSigma > 0 {
		turns = drawTurns(w.SubagentTurns, w.SubagentTurnsSigma, 0, ks)
	}
	saved := g.chain
	g.chain = blockChain{size: g.blockSize}
	s := g.session(sessionSpec{id: fmt.Sprintf("%s.sub%d", parent.id, n), parent: parent.id, parentTurn: after,
		k: parent.k, sub: n, kind: parent.kind, first: w.SubagentTaskTokens, turns: turns}, rng, ks)
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
