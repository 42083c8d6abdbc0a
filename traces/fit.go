package traces

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// Fitting a Workload to real traffic: what `warden trace stats` (any
// trace: a proxy's journal, an imported Bailian or Mooncake trace) and
// `warden workload --journal` write, so that a user can turn their own
// traffic or a public trace into a preset.
//
// A trace gives, per session in file order, each request's prompt and
// answer sizes, its pause (think_ms: the client's time before sending it;
// an importer's arrival gap, an upper bound) and for subagents their
// parent. The fit reads off it:
//
//   - turns: requests per top-level session, a lognormal (log-moments);
//   - additions: prompt(k) - prompt(k-1) - answer(k-1), each with its
//     pause; a pause of FitOptions.UserPause or more is taken for a
//     person's message, a shorter one for a tool's result (a trace does
//     not say which), each class a lognormal of its sizes and pauses;
//   - compactions: a prompt under half the context before it (of at least
//     4k tokens); the context before is where the agent compacts, the
//     prompt after (less the system prompt) the summary, an upper bound;
//   - the system prompt: the blocks a session's first prompt shares with
//     its kind's first session (the median over sessions); sessions
//     whose first block differs are other agent kinds, fitted apart when
//     there are several of 5 % of the sessions or more;
//   - subagents: sessions with a parent, grouped by the parent's request
//     they follow (how many at once), their turns, task and own system
//     prompt. Subagents that carry their parent's session id cannot be
//     told from the parent's turns.

// DefaultUserPause splits pauses into a tool's run and a person's reply:
// TraceLab (arXiv 2606.30560) puts 90 % of tool runs under 14 s and the
// median reply of a person at 79-95 s.
const DefaultUserPause = 30 * time.Second

// FitOptions tune a Fitter.
type FitOptions struct {
	UserPause time.Duration // 0: DefaultUserPause
}

// Fit is a workload fitted to a trace and the figures it rests on.
type Fit struct {
	Workload Workload `json:"workload"`
	// Sessions and Requests counted (subagents' included); Kinds the
	// agent kinds found (1 when the sessions share one system prompt, or
	// none does).
	Sessions    int      `json:"sessions"`
	Subagents   int      `json:"subagents"`
	Requests    int      `json:"requests"`
	Kinds       int      `json:"kinds"`
	Compactions int      `json:"compactions"`
	Notes       []string `json:"notes,omitempty"`
}

// sample accumulates a positive quantity for a lognormal fit.
type sample struct {
	n                   int
	sum, sumLog, sumLg2 float64
	max                 float64
}

func (s *sample) add(x float64) {
	s.n++
	s.sum += x
	l := math.Log(max(x, 1e-3))
	s.sumLog += l
	s.sumLg2 += l * l
	s.max = max(s.max, x)
}

func (s *sample) mean() float64 {
	if s.n == 0 {
		return 0
	}
	return s.sum / float64(s.n)
}

// sigma is the standard deviation of the logs.
func (s *sample) sigma() float64 {
	if s.n < 2 {
		return 0
	}
	m := s.sumLog / float64(s.n)
	v := s.sumLg2/float64(s.n) - m*m
	return math.Min(4, math.Sqrt(math.Max(v, 0)))
}

// dist fits a Dist: a constant when the values barely spread, else a
// lognormal of their mean and log-sigma, bounded by the largest seen.
func fitDist[U distUnit](s *sample, round float64) Dist[U] {
	r := func(v float64) float64 { return math.Round(v/round) * round }
	mean := r(s.mean())
	if sg := s.sigma(); sg >= 0.05 && mean > 0 {
		return Dist[U]{Mean: mean, Sigma: math.Round(sg*100) / 100, Max: math.Max(r(s.max), mean)}
	}
	return Dist[U]{Mean: mean}
}

// shapeAcc accumulates one agent kind (or its subagents).
type shapeAcc struct {
	key        uint64 // the first block of its first session's first prompt
	sessions   int
	turns      sample
	first      []int // first prompts
	tool, user struct{ tokens, pause sample }
	out        sample
	outs       map[int]int // answers by size, for "they all run to max_tokens"
	firstIDs   []uint64    // the first session's first prompt
	lcps       []int       // blocks each later session's first prompt shares with it
	preCtx     sample      // the context before each compaction
	summary    sample
	maxCtx     int
	laterTurns int // requests after which a subagent could be spawned
	spawns     sample
	sub        *shapeAcc
}

func newShapeAcc(key uint64) *shapeAcc { return &shapeAcc{key: key, outs: map[int]int{}} }

// fitSession is what the Fitter keeps per session id.
type fitSession struct {
	acc        *shapeAcc
	parent     *fitSession
	turns      int
	lastPrompt int
	lastOut    int
	spawnAt    int // the parent's request count when its current spawn began, -1: none
	spawnN     int
}

// Fitter fits a Workload to requests given in file order.
type Fitter struct {
	bs       int
	o        FitOptions
	sessions map[string]*fitSession
	list     []*fitSession // in order of first request: sums add up in one order
	kinds    map[uint64]*shapeAcc
	order    []*shapeAcc
	requests int
	nsub     int
}

// NewFitter returns a Fitter for a trace of blocks of blockSize tokens.
func NewFitter(blockSize int, o FitOptions) *Fitter {
	if o.UserPause <= 0 {
		o.UserPause = DefaultUserPause
	}
	return &Fitter{bs: blockSize, o: o, sessions: map[string]*fitSession{}, kinds: map[uint64]*shapeAcc{}}
}

// Add counts one request; r's slices are not kept.
func (f *Fitter) Add(r *Request) {
	f.requests++
	s := f.sessions[r.Session]
	if s == nil {
		s = f.newSession(r)
		f.sessions[r.Session] = s
		f.list = append(f.list, s)
	}
	a := s.acc
	ctx := s.lastPrompt + s.lastOut
	if s.turns == 0 {
		a.first = append(a.first, r.PromptTokens)
	} else {
		if s.parent == nil {
			a.laterTurns++
			if s.spawnAt >= 0 { // the spawn before this request is over
				a.spawns.add(float64(s.spawnN))
				s.spawnAt = -1
			}
		}
		switch add := r.PromptTokens - ctx; {
		case ctx >= 4096 && 2*r.PromptTokens < ctx:
			a.preCtx.add(float64(ctx))
			a.summary.add(float64(r.PromptTokens)) // the system prompt is taken off in fit
		default:
			cls := &a.tool
			if time.Duration(max(r.ThinkMs, 0))*time.Millisecond >= f.o.UserPause {
				cls = &a.user
			}
			cls.tokens.add(float64(min(max(add, 0), MaxTokens)))
			// A pause of a day or more is a session left and resumed.
			cls.pause.add(math.Min(float64(max(r.ThinkMs, 0))/1000, 24*3600))
		}
	}
	a.out.add(float64(r.OutputTokens))
	a.outs[r.OutputTokens]++
	a.maxCtx = max(a.maxCtx, r.PromptTokens+r.OutputTokens)
	s.turns++
	s.lastPrompt, s.lastOut = r.PromptTokens, r.OutputTokens
}

// newSession places a session's first request: with its parent's kind
// (subagents), or the kind of its first block.
func (f *Fitter) newSession(r *Request) *fitSession {
	s := &fitSession{spawnAt: -1}
	if p := f.sessions[r.Parent]; r.Parent != "" && p != nil {
		f.nsub++
		s.parent = p
		if p.acc.sub == nil {
			p.acc.sub = newShapeAcc(0)
		}
		s.acc = p.acc.sub
		if p.spawnAt != p.turns {
			if p.spawnAt >= 0 {
				p.acc.spawns.add(float64(p.spawnN))
			}
			p.spawnAt, p.spawnN = p.turns, 0
		}
		p.spawnN++
	} else {
		var key uint64
		if len(r.HashIDs) > 0 {
			key = r.HashIDs[0]
		}
		a := f.kinds[key]
		if a == nil {
			a = newShapeAcc(key)
			f.kinds[key] = a
			f.order = append(f.order, a)
		}
		s.acc = a
	}
	a := s.acc
	a.sessions++
	full := r.PromptTokens / f.bs
	if a.firstIDs == nil {
		a.firstIDs = append([]uint64(nil), r.HashIDs[:min(full, len(r.HashIDs))]...)
	} else {
		k := 0
		for k < len(a.firstIDs) && k < full && a.firstIDs[k] == r.HashIDs[k] {
			k++
		}
		a.lcps = append(a.lcps, k)
	}
	return s
}

// Fit fits the workload to the requests added.
func (f *Fitter) Fit() Fit {
	out := Fit{Sessions: len(f.sessions) - f.nsub, Subagents: f.nsub, Requests: f.requests}
	for _, s := range f.list {
		if s.parent == nil {
			s.acc.turns.add(float64(s.turns))
			if s.spawnAt >= 0 {
				s.acc.spawns.add(float64(s.spawnN))
			}
		} else {
			s.acc.turns.add(float64(s.turns))
		}
	}
	if out.Requests == 0 {
		out.Workload = DefaultWorkload()
		out.Notes = append(out.Notes, "no request: the default workload")
		return out
	}
	// Kinds: 5 % of the top-level sessions and 3 at least each; the rest
	// join the largest.
	kinds := slices.Clone(f.order)
	slices.SortStableFunc(kinds, func(a, b *shapeAcc) int { return cmp.Compare(b.sessions, a.sessions) })
	var big []*shapeAcc
	for _, k := range kinds {
		if k.sessions >= 3 && 20*k.sessions >= out.Sessions {
			big = append(big, k)
		}
	}
	if len(big) == 0 {
		big = kinds[:1]
	}
	for _, k := range kinds {
		if !slices.Contains(big, k) {
			big[0].merge(k)
		}
	}
	out.Kinds = len(big)
	for _, k := range big {
		out.Compactions += k.preCtx.n
	}
	if len(big) == 1 {
		out.Workload = big[0].fit(f.bs, &out.Notes)
		return out
	}
	var total int
	for _, k := range big {
		total += k.sessions
	}
	w := DefaultWorkload()
	for i, k := range big {
		var notes []string
		shape := k.fit(f.bs, &notes)
		for _, n := range notes {
			out.Notes = append(out.Notes, fmt.Sprintf("kind%d: %s", i+1, n))
		}
		w.Agents = append(w.Agents, Agent{Name: fmt.Sprintf("kind%d", i+1), Weight: math.Round(1000*float64(k.sessions)/float64(total)) / 1000, Shape: shape})
	}
	out.Notes = append(out.Notes, fmt.Sprintf("%d agent kinds: sessions whose first prompts begin apart", len(big)))
	if err := w.Validate(); err != nil {
		out.Notes = append(out.Notes, fmt.Sprintf("the kinds do not make a valid workload (%v): one kind of all sessions instead", err))
		for _, k := range big[1:] {
			big[0].merge(k)
		}
		w = big[0].fit(f.bs, &out.Notes)
	}
	out.Workload = w
	return out
}

// merge adds b's sessions to a (a kind too small to stand apart).
func (a *shapeAcc) merge(b *shapeAcc) {
	a.sessions += b.sessions
	a.turns.merge(b.turns)
	a.first = append(a.first, b.first...)
	a.tool.tokens.merge(b.tool.tokens)
	a.tool.pause.merge(b.tool.pause)
	a.user.tokens.merge(b.user.tokens)
	a.user.pause.merge(b.user.pause)
	a.out.merge(b.out)
	for k, v := range b.outs {
		a.outs[k] += v
	}
	a.preCtx.merge(b.preCtx)
	a.summary.merge(b.summary)
	a.maxCtx = max(a.maxCtx, b.maxCtx)
	a.laterTurns += b.laterTurns
	a.spawns.merge(b.spawns)
	// b's sessions share no prefix with a's first: they count as sharing
	// nothing (a system prompt of none, if they are many).
	for range b.sessions {
		a.lcps = append(a.lcps, 0)
	}
	if b.sub != nil {
		if a.sub == nil {
			a.sub = newShapeAcc(0)
		}
		a.sub.merge(b.sub)
	}
}

func (s *sample) merge(b sample) {
	s.n += b.n
	s.sum += b.sum
	s.sumLog += b.sumLog
	s.sumLg2 += b.sumLg2
	s.max = max(s.max, b.max)
}

func median(v []int) int {
	if len(v) == 0 {
		return 0
	}
	c := slices.Clone(v)
	slices.Sort(c)
	return c[len(c)/2]
}

// fit turns one kind's counts into its workload.
func (a *shapeAcc) fit(bs int, notes *[]string) Workload {
	w := DefaultWorkload()
	w.SubagentProbability = 0
	if len(a.lcps) > 0 {
		w.SystemPromptTokens = median(a.lcps) * bs
	} else {
		w.SystemPromptTokens = 0
		*notes = append(*notes, "one session only: no shared system prompt can be seen; assumed none")
	}
	w.FirstMessageTokens = max(1, median(a.first)-w.SystemPromptTokens)
	w.FirstMessageSpread = 0
	if len(a.first) > 1 {
		lo, hi := slices.Min(a.first), slices.Max(a.first)
		if m := float64(w.SystemPromptTokens + w.FirstMessageTokens); hi > lo && m > 0 {
			w.FirstMessageSpread = math.Min(0.95, math.Round(100*float64(hi-lo)/2/float64(w.FirstMessageTokens))/100)
		}
	}
	// Turns.
	td := fitDist[tokenUnit](&a.turns, 1)
	w.Turns = max(1, int(td.Mean))
	if td.Sigma > 0 {
		w.TurnsSigma, w.TurnsMax = td.Sigma, max(w.Turns, int(td.Max))
	}
	// Answers: all at one size (max_tokens) or a lognormal.
	top, topN := 0, 0
	for k, v := range a.outs {
		if v > topN || (v == topN && k > top) {
			top, topN = k, v
		}
	}
	if topN*10 >= a.out.n*9 {
		w.OutputTokens, w.MaxOutputTokens = OutputMax, max(1, top)
	} else {
		w.OutputTokens = OutputLognormal
		w.OutputTokensMean = math.Round(a.out.mean()*10) / 10
		w.OutputTokensSigma = math.Round(a.out.sigma()*100) / 100
		w.MaxOutputTokens = max(1, int(a.out.max))
	}
	// Additions and pauses.
	cls := []struct {
		kind string
		t    *struct{ tokens, pause sample }
	}{{AdditionTool, &a.tool}, {AdditionUser, &a.user}}
	n := a.tool.tokens.n + a.user.tokens.n
	switch {
	case n == 0:
	case a.user.tokens.n == 0 && a.tool.tokens.sigma() < 0.05 && a.tool.pause.sigma() < 0.05:
		// One constant addition after one constant pause: the old keys.
		w.NewTokensPerTurn = int(math.Round(a.tool.tokens.mean()))
		w.ThinkTime = (time.Duration(a.tool.pause.mean() * float64(time.Second))).Round(time.Millisecond)
	default:
		for _, c := range cls {
			if c.t.tokens.n == 0 {
				continue
			}
			add := Addition{Kind: c.kind, Weight: math.Round(1000*float64(c.t.tokens.n)/float64(n)) / 1000,
				Tokens: fitDist[tokenUnit](&c.t.tokens, 1), Think: fitDist[timeUnit](&c.t.pause, 0.001)}
			add.Weight = math.Max(add.Weight, 0.001)
			w.Additions = append(w.Additions, add)
		}
	}
	// Compaction.
	if a.preCtx.n > 0 {
		limit := (a.maxCtx + 1023) / 1024 * 1024
		w.ContextLimit = limit
		w.CompactAt = math.Min(1, math.Round(100*a.preCtx.mean()/float64(limit))/100)
		sum := a.summary
		sum.sum -= float64(w.SystemPromptTokens * sum.n)
		sum.max -= float64(w.SystemPromptTokens)
		w.SummaryTokens = fitDist[tokenUnit](&sum, 1)
		w.SummaryTokens.Mean = math.Max(1, w.SummaryTokens.Mean)
		if err := w.Validate(); err != nil {
			*notes = append(*notes, fmt.Sprintf("%d compactions seen but they do not fit a context limit (%v): left out", a.preCtx.n, err))
			w.ContextLimit, w.CompactAt, w.SummaryTokens = 0, 0, TokenDist{}
		}
	}
	// Subagents.
	if s := a.sub; s != nil && a.spawns.n > 0 && a.laterTurns > 0 {
		w.SubagentProbability = math.Min(1, math.Round(10000*float64(a.spawns.n)/float64(a.laterTurns))/10000)
		if pd := fitDist[tokenUnit](&a.spawns, 1); pd.Sigma > 0 || pd.Mean > 1 {
			pd.Min = 1
			w.SubagentParallel = pd
		}
		std := fitDist[tokenUnit](&s.turns, 1)
		w.SubagentTurns = max(1, int(std.Mean))
		w.SubagentTurnsSigma = std.Sigma
		sys := w.SystemPromptTokens
		if len(s.lcps) > 0 && median(s.lcps)*bs != w.SystemPromptTokens {
			w.SubagentSystemPromptTokens = median(s.lcps) * bs
			sys = w.SubagentSystemPromptTokens
		}
		w.SubagentTaskTokens = max(1, median(s.first)-sys)
		w.SubagentSession = SubagentOwn
	}
	if err := w.Validate(); err != nil {
		*notes = append(*notes, fmt.Sprintf("fitted shape invalid (%v): subagents left out", err))
		w.SubagentProbability, w.SubagentParallel, w.SubagentTurnsSigma, w.SubagentSystemPromptTokens, w.SubagentSession = 0, TokenDist{}, 0, 0, ""
	}
	return w
}
