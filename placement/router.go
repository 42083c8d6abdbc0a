package placement

import "time"

// Router drives one Policy for one model: the code that the simulator and
// the proxy both run around each decision, written once. It is pure like
// the rest of the package (now is an argument) and not safe for concurrent
// use: the proxy calls it under its model's mutex, the simulator from its
// one goroutine.
//
// The caller describes the replicas: it fills the Snapshot's load (the
// scraped gauges, its own in-flight and prefill-queue counts, capacities
// and prefill rates) and keeps its clients and its concurrency (the
// simulator's event loop, the proxy's waiting goroutines). The Router
// describes the conversations: it keeps the session table (the policy's
// own, or an observer table for a policy without one), fills the
// Snapshot's conversation figures from it, asks the policy, and tells the
// table each request's start and end, its footprint and the cache hits
// its answer reported. A policy that needs any of that says so through
// the small interfaces below, never by its concrete type:
//
//   - SessionKeeper: it keeps a session table (Affinity);
//   - TableAdopter: it can take over a table, so that a reload keeps the
//     homes of the conversations it inherits;
//   - Admitter: it may make a new conversation wait (Decision.Wait), and
//     says whether a request must join the back of the wait queue;
//   - Traiter: which optional inputs it reads (Traits);
//   - HeldReader: it reads Prompt.Held, how much of the prompt each replica
//     holds now, which the Router fills from the caller's HeldIndex (the
//     proxy's KV-event ledger, the simulator's block pools);
//   - Tracker: it follows each request it placed to its first token and
//     its end;
//   - Scraper: it reads vLLM's gauges at an interval of its own, at which
//     the caller refreshes them (ScrapeInterval).
//
// One request's life, in the order both callers make the calls:
//
//	Advance(now)                   bring the table to now (the proxy, every pick; the simulator, every scrape)
//	Fill(&snap)                    the conversations' figures into the snapshot
//	MustQueue(req, waiting, now)   a new conversation behind others waiting: queue it without asking
//	Pick(req, &snap, now)          the decision; Wait: hold it (WaitQueue) and ask again later
//	Sent(session, now)             it left for its replica (with TurnEnds)
//	FirstToken(req, replica, now)  its first token (a Tracker policy)
//	Finished(req, replica, now)    it left its replica, finished or not (a Tracker policy)
//	Ended(session, tokens, now)    it ended, with the conversation's prompt + answer tokens
//	Served(session, replica, ...)  what its answer says the replica served from cache
//	Forget(session)                the conversation is over (its room is free at once)
type Router struct {
	policy   Policy
	table    *Table // the policy's table, or the observer table; nil: none
	observer bool   // table is the router's own (homes for the stayed KPI), not the policy's
	traits   Traits
	admit    Admitter // nil: the policy never makes a conversation wait
	tracker  Tracker  // nil: the policy follows no request after placing it
	reads    bool     // the policy reads Prompt.Held (HeldReader)
	held     HeldIndex
	heldBuf  []int
	// TurnEnds says that the caller reports when each request is sent and
	// when it ends (Sent, Ended): a conversation then holds KV headroom
	// while a request of it is out and for its return timeout after
	// (placement's "Held conversations"). The proxy always does; the
	// simulator's session replay does, its closed and open loops do not
	// (the table then holds every active conversation, and Ended only
	// records footprints, for a policy that reads them).
	TurnEnds bool
}

// Traits are the optional inputs a policy reads; a policy without the
// Traiter interface reads none of them.
type Traits uint8

const (
	// TraitSticky: a later turn of a conversation the table knows goes
	// where the conversation went before (hash, affinity), so the proxy's
	// warm-up of a replica back from ejection admits it as it would any
	// known conversation (only new ones are throttled).
	TraitSticky Traits = 1 << iota
	// TraitKV: the policy reads Replica.KVCapacityTokens,
	// PrefillTokensPerSec and PrefillQueueTokens, Request.SharedPrefixTokens
	// and the conversations' footprints (the caller reports Ended with
	// tokens).
	TraitKV
	// TraitAdmission: the policy may answer Decision.Wait.
	TraitAdmission
)

// Has reports whether every trait of u is in t.
func (t Traits) Has(u Traits) bool { return t&u == u }

// Traiter is a policy that reads optional inputs (Traits).
type Traiter interface {
	Traits() Traits
}

// SessionKeeper is a policy that keeps a session table: the Router fills
// the snapshot's conversation figures from it and tells it each turn's
// start and end. SessionTable returns nil when the policy, as configured,
// keeps none (affinity switched off).
type SessionKeeper interface {
	SessionTable() *Table
}

// TableAdopter is a SessionKeeper that can continue on another table: the
// same policy over t, keeping the homes t holds (a reload of the proxy).
type TableAdopter interface {
	AdoptTable(t *Table) Policy
}

// HeldIndex tells how many leading blocks of a prompt each replica holds
// in its KV cache now: vLLM's KV events in the proxy (a ledger of the
// blocks each replica stored minus those it removed), the block pools in
// the simulator. Held appends to dst, for every replica in Snapshot
// order, the number of leading blocks of blocks (block ids of blockTokens
// tokens each, Prompt's) it holds, counting from block 0 to the first it
// lacks, and returns dst; ok is false when it cannot tell (no events yet,
// a ledger that lost batches): the policy then sees Held nil.
type HeldIndex interface {
	Held(blocks []uint64, blockTokens int, dst []int) (held []int, ok bool)
}

// Admitter is a policy that may hold new conversations (TraitAdmission).
// MustQueue reports whether r must join the back of a wait queue holding
// waiting requests without asking Pick (a new conversation never
// overtakes the ones already waiting); it changes nothing but lazy
// expiry.
type Admitter interface {
	MustQueue(r *Request, waiting int, now time.Time) bool
}

// NewRouter returns the router of policy p. A policy that keeps no table
// of its own gets observer (nil: none), in which the router records each
// conversation's first home only (the proxy's stayed KPI and status).
func NewRouter(p Policy, observer *Table) *Router {
	r := &Router{policy: p}
	if t, ok := p.(Traiter); ok {
		r.traits = t.Traits()
	}
	if a, ok := p.(Admitter); ok && r.traits.Has(TraitAdmission) {
		r.admit = a
	}
	r.tracker, _ = p.(Tracker)
	if h, ok := p.(HeldReader); ok {
		r.reads = h.ReadsHeld()
	}
	if k, ok := p.(SessionKeeper); ok {
		r.table = k.SessionTable()
	}
	if r.table == nil && observer != nil {
		r.table, r.observer = observer, true
	}
	return r
}

// WithTable returns a router of the same policy over t, which a reload
// hands over with the homes of the conversations it keeps: a policy that
// keeps a table continues on t (TableAdopter), any other records its
// homes there as an observer. The returned router keeps r's TurnEnds.
func (r *Router) WithTable(t *Table) *Router {
	p := r.policy
	if a, ok := p.(TableAdopter); ok && !r.observer && r.table != nil {
		p = a.AdoptTable(t)
		n := NewRouter(p, nil)
		n.TurnEnds, n.held = r.TurnEnds, r.held
		return n
	}
	n := NewRouter(p, t)
	n.TurnEnds, n.held = r.TurnEnds, r.held
	return n
}

// SetHeld gives the router the source of Prompt.Held (nil: none).
func (r *Router) SetHeld(h HeldIndex) { r.held = h }

// ReadsHeld reports whether the policy reads Prompt.Held: only then need
// the caller give a request its Prompt's blocks and the router a
// HeldIndex.
func (r *Router) ReadsHeld() bool { return r.reads }

// ScrapeInterval is the interval at which the policy reads vLLM's gauges
// (Scraper), 0 when it reads them as the caller scrapes them.
func (r *Router) ScrapeInterval() time.Duration {
	if s, ok := r.policy.(Scraper); ok {
		return s.ScrapeInterval()
	}
	return 0
}

// Policy returns the policy the router drives.
func (r *Router) Policy() Policy { return r.policy }

// Table returns the session table: the policy's, or the observer table
// (Observer), or nil.
func (r *Router) Table() *Table { return r.table }

// Observer reports whether Table is the router's own record of first
// homes rather than the policy's table.
func (r *Router) Observer() bool { return r.observer }

// KeepsHomes reports whether the policy keeps a session table of its own
// (affinity on): only then is a conversation's home a decision worth
// sharing with other proxies.
func (r *Router) KeepsHomes() bool { return r.table != nil && !r.observer }

// Traits returns what the policy reads beyond the basics.
func (r *Router) Traits() Traits { return r.traits }

// Advance brings the table to now without a request (Table.Advance).
func (r *Router) Advance(now time.Time) {
	if r.table != nil {
		r.table.Advance(now)
	}
}

// Fill writes the conversations' figures into s (Table.Fill): the active
// conversations homed on each replica and their footprints.
func (r *Router) Fill(s *Snapshot) {
	if r.table != nil {
		r.table.Fill(s)
	}
}

// Lookup returns session's home and first home, if the table knows it
// (Table.Lookup); false without a table or a session.
func (r *Router) Lookup(session string, now time.Time) (home, first int, ok bool) {
	if r.table == nil || session == "" {
		return -1, -1, false
	}
	return r.table.Lookup(session, now)
}

// MustQueue reports whether req must join the back of a wait queue that
// holds waiting requests without asking the policy (Admitter); false for
// a policy that never makes a conversation wait.
func (r *Router) MustQueue(req *Request, waiting int, now time.Time) bool {
	return r.admit != nil && r.admit.MustQueue(req, waiting, now)
}

// Pick asks the policy for req's replica over s, which the caller has
// described (and Fill completed). For a policy that reads it, req's
// Prompt.Held is filled from the HeldIndex for the policy's Pick and
// cleared after it (the router reuses its buffer: a policy that keeps it
// copies it). A policy with no table
// of its own has the conversation's first home recorded in the observer
// table, and every later pick refreshes its last seen. A Wait decision
// records nothing.
func (r *Router) Pick(req *Request, s *Snapshot, now time.Time) (Decision, error) {
	if r.reads {
		req.Prompt.Held = nil
		if r.held != nil && len(req.Prompt.Blocks) > 0 {
			if h, ok := r.held.Held(req.Prompt.Blocks, req.Prompt.BlockTokens, r.heldBuf[:0]); ok {
				req.Prompt.Held, r.heldBuf = h, h
			}
		}
	}
	d, err := r.policy.Pick(req, s, now)
	if r.reads {
		req.Prompt.Held = nil
	}
	if err != nil || d.Wait {
		return d, err
	}
	if r.observer && req.Session != "" {
		t := r.table
		home := d.Replica
		if h, ok := t.peek(fnv1a64(req.Session), t.clock(now)); ok {
			home = h // keep the first turn's replica
		}
		t.Assign(req.Session, home, now)
	}
	return d, nil
}

// Sent records that a request of session left for its replica at now
// (Table.Start), when the caller reports turn ends: the conversation is
// held until it ends and for its return timeout after.
func (r *Router) Sent(session string, now time.Time) {
	if r.TurnEnds && r.table != nil && session != "" {
		r.table.Start(session, now)
	}
}

// FirstToken tells a policy that follows its requests (Tracker) that the
// request it placed on replica, req as it was placed (its ID and Prompt),
// produced its first token at now.
func (r *Router) FirstToken(req *Request, replica int, now time.Time) {
	if r.tracker != nil {
		r.tracker.FirstToken(req, replica, now)
	}
}

// Finished tells a policy that follows its requests (Tracker) that req,
// placed on replica, left it at now: finished, failed or cut.
func (r *Router) Finished(req *Request, replica int, now time.Time) {
	if r.tracker != nil {
		r.tracker.Finished(req, replica, now)
	}
}

// Tracks reports whether the policy follows its requests (Tracker): only
// then need the caller report FirstToken and Finished.
func (r *Router) Tracks() bool { return r.tracker != nil }

// Ended records that a request of session ended at now, with the
// conversation's footprint, its prompt + answer tokens (0: none known).
// With TurnEnds it ends the request's hold (Table.Finish); without, the
// footprint is recorded (Table.Observe) for a policy that reads it
// (TraitKV). An observer table records homes, not footprints.
func (r *Router) Ended(session string, tokens int, now time.Time) {
	if r.table == nil || session == "" {
		return
	}
	if r.observer {
		tokens = 0
	}
	switch {
	case r.TurnEnds:
		r.table.Finish(session, tokens, now)
	case tokens > 0 && r.traits.Has(TraitKV):
		r.table.Observe(session, tokens)
	}
}

// Served records what replica served of a request of session from its
// prefix cache, as its answer reports: prompt tokens asked, cached of them
// (negative: the replica does not report it) and answer tokens (negative:
// unknown) (Table.ObserveHits: the cold-at-home rule and the observed hit
// counters). An observer table is not told.
func (r *Router) Served(session string, replica, prompt, cached, answer int) {
	if r.table == nil || r.observer || session == "" {
		return
	}
	r.table.ObserveHits(session, replica, prompt, cached, answer)
}

// Forget drops session from the table at once (its room counts free for
// admission and the KV balance now) and reports whether the table knew it.
func (r *Router) Forget(session string) bool {
	if r.table == nil || session == "" {
		return false
	}
	return r.table.Remove(session)
}
