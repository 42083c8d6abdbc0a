package placement

import (
	"math"
	"time"
)

// Affinity is the product's policy: it keeps each conversation on the
// replica that already holds its prefix cache. In order:
//
//  1. Pinned: a valid pin (Request.Pinned in range and healthy) wins,
//     reason pinned, counted as ClientPinned. It does not move an existing
//     home (the pin is one request's choice, not the conversation's); a
//     session the table does not know yet, or whose home is gone, is homed
//     on the pinned replica, since that is where its prefix is now cached.
//     An invalid pin is ignored.
//  2. Sticky: a later turn goes home, reason sticky, unless home's InFlight
//     is above the spill threshold (strictly greater): then the request
//     spills to the least-loaded other healthy replica (lowest InFlight,
//     then lowest score, then lowest ID), reason spill, and home does not
//     change. With no other healthy replica it stays home (sticky).
//     A request whose home is in Request.Failed (it failed there a moment
//     ago: the proxy's retry) spills the same way, and home does not change.
//     With Config.Rehome cold, a later turn of a conversation found cold
//     at home (observed.go) is first placed as a new one, reason rehome.
//  3. New: a session the table does not know, or whose home is unhealthy
//     or no longer exists (it is re-homed), goes to the healthy replica
//     with the lowest score (ties to the lowest ID), reason new, and that
//     replica becomes its home. A subagent (Request.Parent set) goes
//     instead to its parent's home, reason parent, unless that home is
//     unusable or above the spill threshold.
//
// The score of replica i for a new conversation, lower is better, sums
// three terms, each normalised to 0..1 and weighted equally:
//
//	InFlight[i]/max(InFlight) + KVUsage[i] + Sessions[i]/max(Sessions)
//
// where the maxima run over the healthy replicas (a term that is zero on
// all of them adds nothing), KVUsage is clamped to 0..1 (NaN counts as 0)
// and Sessions is the policy's own table count of active conversations
// homed on the replica (ReplicaCounters.Active: seen within
// Config.ActiveWindow, retired at now; always current, unlike the
// snapshot's field). In-flight is the load now, KV fill how much cache a
// newcomer would evict, and active sessions held the load still to come
// from conversations at home. A conversation that has gone quiet keeps its
// home for the TTL but no longer counts here: finished conversations do not
// pile up and push newcomers away from a replica that has room.
//
// An empty Request.Session cannot be remembered: it is placed as new each
// time and not stored. With Config.Disabled the policy is LeastLoaded
// (the same code, composed) and keeps no table.
//
// Affinity is not safe for concurrent use; the proxy serialises Pick.
type Affinity struct {
	cfg   Config
	table *Table
	ll    LeastLoaded // the whole policy when cfg.Disabled
}

var (
	_ Policy        = (*Affinity)(nil)
	_ SessionKeeper = (*Affinity)(nil)
	_ TableAdopter  = (*Affinity)(nil)
	_ Admitter      = (*Affinity)(nil)
	_ Traiter       = (*Affinity)(nil)
)

// affinityStrategy is affinity in the registry, with its options.
var affinityStrategy = Strategy{
	Name:    StrategyAffinity,
	Words:   "each conversation stays on the replica that already holds it in its prefix cache (new ones go to the least-loaded)",
	Reasons: []Reason{ReasonNew, ReasonSticky, ReasonSpill, ReasonPinned, ReasonParent, ReasonRehome},
	Proxy:   true,
	Spills:  true,
	// Warden's best routings: plain; priced (turns and new conversations
	// by expected TTFT); following the KV caches' contents; by KV
	// headroom with the priced spill and admission.
	HeadToHead: []string{StrategyAffinity, StrategyAffinity + "+priced", StrategyAffinity + "+prefix", StrategyAffinity + "+kv+priced+admit"},
	Options: []Option{
		{Name: "kv", Words: "the least-loaded replica is judged by its KV cache fill too",
			set: func(s *Spec, _ time.Duration) { s.KV = true }},
		{Name: "priced", // the spill threshold's words say it
			set: func(s *Spec, _ time.Duration) { s.Priced = true }},
		{Name: "admit", Arg: "TIMEOUT",
			ArgWords: "an admission timeout > 0 such as admit=30s (plain admit takes the farm's routing.admission_timeout)",
			Words:    "a turn that no replica can take at once waits at the proxy rather than queueing in vLLM",
			set:      func(s *Spec, d time.Duration) { s.Admit, s.AdmissionTimeout = true, d }},
		{Name: "rehome", Words: "a conversation its replica has evicted moves to another replica on its next turn",
			set: func(s *Spec, _ time.Duration) { s.Rehome = true }},
		{Name: "prefix", Words: "what each replica's KV cache holds decides too: a conversation its replica has evicted moves before its turn is sent, and one without a session id, or a subagent, starts where its prefix already is",
			set: func(s *Spec, _ time.Duration) { s.Prefix = true }},
	},
	New: func(cfg Config) (Policy, error) {
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return NewAffinity(cfg), nil
	},
}

// NewAffinity returns an affinity policy with an empty session table. Zero
// fields of cfg take their defaults; negative ones are treated as zero
// (New validates them instead).
func NewAffinity(cfg Config) *Affinity {
	return &Affinity{cfg: cfg, table: NewTableWindow(cfg.SessionTTL, cfg.MaxSessions, cfg.ActiveWindow)}
}

// NewAffinityTable returns an affinity policy over an existing session
// table t (nil: a new one, as NewAffinity makes), so that a changed policy
// keeps the homes of the conversations it inherits. The table keeps its
// own TTL, cap and active window: call t.Reconfigure to apply cfg's.
func NewAffinityTable(cfg Config, t *Table) *Affinity {
	if t == nil {
		return NewAffinity(cfg)
	}
	return &Affinity{cfg: cfg, table: t}
}

// Config returns the configuration the policy was made with.
func (a *Affinity) Config() Config { return a.cfg }

// Table returns the policy's session table, for its counters and Fill.
// It stays empty while affinity is disabled.
func (a *Affinity) Table() *Table { return a.table }

// SessionTable implements SessionKeeper: the table, nil while affinity is
// disabled (it then keeps none).
func (a *Affinity) SessionTable() *Table {
	if a.cfg.Disabled {
		return nil
	}
	return a.table
}

// AdoptTable implements TableAdopter: the same configuration over t
// (NewAffinityTable).
func (a *Affinity) AdoptTable(t *Table) Policy { return NewAffinityTable(a.cfg, t) }

// Traits implements Traiter: sticky, and the KV inputs and admission as
// the options turn them on; none while disabled (it is LeastLoaded then).
func (a *Affinity) Traits() Traits {
	if a.cfg.Disabled {
		return 0
	}
	t := TraitSticky
	if a.kvOn() {
		t |= TraitKV
	}
	if a.cfg.Admission == AdmissionKV {
		t |= TraitAdmission
	}
	return t
}

// Pick implements Policy.
func (a *Affinity) Pick(r *Request, s *Snapshot, now time.Time) (Decision, error) {
	if a.cfg.Disabled {
		return a.ll.Pick(r, s, now)
	}
	reps := s.Replicas
	if !anyHealthy(reps) {
		return Decision{}, noHealthy(s)
	}
	t := a.table
	at := t.clock(now)
	t.expire(at)
	threshold := a.cfg.Spill.Resolve(s.MaxNumSeqs)

	remember := r.Session != ""
	key := fnv1a64(r.Session)
	i, home, failedHome := nilIndex, -1, -1
	if remember {
		i = t.find(key, at)
		if i != nilIndex && len(r.Failed) == 0 {
			t.noteGap(i, at) // a retry of a failed request is no new turn
		}
		if i != nilIndex {
			switch h := int(t.entries[i].home); {
			case usable(reps, h):
				home = h
			case r.failed(h):
				failedHome = h
			}
		}
	}

	// 1. Pinned.
	if p := r.Pinned; usable(reps, p) {
		t.counter(p).ClientPinned++
		a.keep(i, key, home, p, at, remember)
		return Decision{Replica: p, Reason: ReasonPinned}, nil
	}

	// 2. Sticky, or spill while home is overloaded or failed this request
	// a moment ago (then home is kept: its prefix cache is still there).
	if failedHome >= 0 {
		t.touch(i, at)
		o := a.best(s, failedHome)
		if o < 0 {
			return Decision{}, noHealthy(s)
		}
		t.counter(o).SpilledIn++
		return Decision{Replica: o, Reason: ReasonSpill}, nil
	}
	if home >= 0 {
		t.touch(i, at)
		if a.cfg.Prefix == PrefixHeld && a.homeLost(r, i, home) {
			if d, ok := a.rehome(r, s, i, home); ok {
				a.grow(i, r.PromptTokens)
				return d, nil
			}
		}
		if a.cfg.Rehome == RehomeCold && t.coldAt(i) {
			if d, ok := a.rehome(r, s, i, home); ok {
				a.grow(i, r.PromptTokens)
				return d, nil
			}
		}
		if a.cfg.Spill.Priced() {
			if d, ok := a.priced(r, s, i, home); ok {
				a.grow(i, r.PromptTokens)
				return d, nil
			}
		}
		d := Decision{Replica: home, Reason: ReasonSticky}
		if reps[home].InFlight > threshold {
			if o := a.best(s, home); o >= 0 {
				t.counter(o).SpilledIn++
				d = Decision{Replica: o, Reason: ReasonSpill}
			}
		}
		if d.Reason == ReasonSticky {
			t.counter(home).Sticky++
		}
		if a.kvOn() {
			a.estimate(r, s, i, &d)
			a.grow(i, r.PromptTokens)
		}
		return d, nil
	}

	// 3. New (or re-homed): where its prefix is held for a conversation
	// the table cannot follow (prefix.go), the parent's home for a
	// subagent, else the lowest score.
	target, reason := -1, ReasonNew
	if a.cfg.Prefix == PrefixHeld && (!remember || r.Parent != "" || i != nilIndex) {
		if p := a.prefixHolder(r, s, -1, threshold); p >= 0 {
			target, reason = p, ReasonPrefix
		}
	}
	if target < 0 && r.Parent != "" {
		if ph, ok := t.peek(fnv1a64(r.Parent), at); ok && usable(reps, ph) && reps[ph].InFlight <= threshold {
			target, reason = ph, ReasonParent
		}
	}
	if target < 0 && a.kvNew() {
		tgt, wait := a.placeNew(r, s)
		if wait && remember && i == nilIndex && r.Parent == "" {
			return Decision{Replica: -1, Reason: ReasonNew, Wait: true}, nil
		}
		target = tgt
	}
	if target < 0 && a.cfg.Spill.Priced() && a.cfg.Balance != BalanceKV {
		target = a.pricedNew(r, s)
	}
	if target < 0 {
		target = a.best(s, -1)
	}
	if c := t.counter(target); reason == ReasonParent {
		c.Parent++
	} else {
		c.New++
	}
	d := Decision{Replica: target, Reason: reason}
	if a.kvOn() {
		a.estimate(r, s, nilIndex, &d)
	}
	if j := a.keep(i, key, -1, target, at, remember); j != nilIndex {
		a.grow(j, r.PromptTokens)
	}
	return d, nil
}

// grow raises entry i's footprint to a prompt of tokens: a conversation
// occupies at least its latest prompt until its answer is observed.
func (a *Affinity) grow(i int32, tokens int) {
	if tokens > a.table.fp(i) {
		a.table.setFootprint(i, tokens)
	}
}

// keep records a request placed on replica to for the session whose entry
// is i (nilIndex if none) and whose usable home is home (-1 if none): the
// entry is touched, and the session is homed on to unless it has a home.
// It returns the session's entry (nilIndex when it is not remembered).
func (a *Affinity) keep(i int32, key uint64, home, to int, at int64, remember bool) int32 {
	switch {
	case !remember:
		return nilIndex
	case i == nilIndex:
		a.table.noteStart(at)
		return a.table.insert(key, to, at)
	default:
		if home < 0 {
			a.table.setHome(i, to)
		}
		a.table.touch(i, at)
		return i
	}
}

// best returns the healthy replica other than exclude (-1 for none) with
// the lowest score, ties to the lowest ID; when exclude >= 0 (a spill) the
// lowest InFlight comes first and the score breaks ties. It returns -1
// when there is no candidate. It computes the same scores as Scores, in
// one pass after the maxima, without storing them.
func (a *Affinity) best(s *Snapshot, exclude int) int {
	reps := s.Replicas
	invIF, invSess := a.norms(reps)
	held := a.table.counts
	best, bestIF, bestScore := -1, 0, 0.0
	for i := range reps {
		if !reps[i].Healthy || i == exclude {
			continue
		}
		h := 0
		if i < len(held) {
			h = held[i].Active
		}
		score := newScore(&reps[i], h, invIF, invSess)
		switch {
		case best < 0:
		case exclude >= 0 && reps[i].InFlight != bestIF:
			if reps[i].InFlight > bestIF {
				continue
			}
		case score >= bestScore:
			continue
		}
		best, bestIF, bestScore = i, reps[i].InFlight, score
	}
	return best
}

// Scores appends to dst the new-conversation score of each replica (see
// Affinity), aligned with s.Replicas; an unhealthy replica scores +Inf.
// It does not change state.
func (a *Affinity) Scores(s *Snapshot, dst []float64) []float64 {
	reps := s.Replicas
	invIF, invSess := a.norms(reps)
	for i := range reps {
		if !reps[i].Healthy {
			dst = append(dst, math.Inf(1))
			continue
		}
		dst = append(dst, newScore(&reps[i], a.table.activeOn(i), invIF, invSess))
	}
	return dst
}

// norms returns the reciprocals of the largest InFlight and the largest
// number of sessions held among the healthy replicas; a term that is zero
// everywhere gets 0, so it adds nothing to any score.
func (a *Affinity) norms(reps []Replica) (invIF, invSess float64) {
	maxIF, maxSess := 0, 0
	for i := range reps {
		if reps[i].Healthy {
			maxIF = max(maxIF, reps[i].InFlight)
			maxSess = max(maxSess, a.table.activeOn(i))
		}
	}
	if maxIF > 0 {
		invIF = 1 / float64(maxIF)
	}
	if maxSess > 0 {
		invSess = 1 / float64(maxSess)
	}
	return invIF, invSess
}

// newScore is the score of one replica holding held sessions.
func newScore(r *Replica, held int, invIF, invSess float64) float64 {
	kv := r.KVUsage
	if !(kv >= 0) { // negative or NaN
		kv = 0
	}
	return min(kv, 1) + float64(max(r.InFlight, 0))*invIF + float64(held)*invSess
}

func anyHealthy(reps []Replica) bool {
	for i := range reps {
		if reps[i].Healthy {
			return true
		}
	}
	return false
}
