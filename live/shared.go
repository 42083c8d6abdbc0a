package live

import (
	"context"
	"github.com/lm-warden/warden/live/sessionstore"
	"time"

	"github.com/lm-warden/warden/placement"
)

// Several proxies, one placement: how a model uses the session store.
//
//   - A conversation this proxy already homes (its table is the local
//     cache of homes) is placed as without a store; its touch reaches the
//     store at the next sync, so a hot session costs no round trip.
//   - A conversation it does not know is placed as new, and the choice is
//     claimed in the store (one round trip): the first proxy to claim wins,
//     and a later turn that reaches another proxy (or this one after a
//     restart) finds its home there.
//   - With the store down, a conversation it does not know goes to the
//     rendezvous-hash choice of its id over the healthy replicas, weighed
//     by each replica's name (its URL, plus "#rank" for a data-parallel
//     rank), not by its place in the list: every proxy with the same
//     replicas computes it alike, in whatever order its configuration
//     lists them; its home is recorded in the store when it returns
//     (unless one was recorded meanwhile). While the store is up, a proxy
//     that sees another one list other replicas for a model says so (a
//     warning in the log and in /api/status, see sessionstore.Redis).
//   - The other proxies' in-flight counts and the conversations held by
//     all are added to the Snapshot before each pick (at most one sync,
//     sessionstore's interval, old), so a spill threshold counts every proxy's
//     requests.

// shared reports whether picks of r go through the store: an affinity
// model with a store, a request with a session and no pin.
func (m *model) shared(r *placement.Request) bool {
	return m.store != nil && r.Session != "" && r.Pinned == placement.NoPin &&
		m.cfg.EffectiveStrategy() == placement.StrategyAffinity
}

// place is the first pick of a request (admit's): pick, with the session
// store consulted where the model has one.
func (m *model) place(ctx context.Context, r *placement.Request, now time.Time) (picked, error) {
	if !m.shared(r) {
		return m.pick(r, -1, now)
	}
	st := m.store
	m.mu.Lock()
	_, known := m.table.Home(r.Session, now)
	m.mu.Unlock()
	var p picked
	var err error
	switch {
	case known:
		p, err = m.pick(r, -1, now)
	case st.Down():
		p, err = m.pickSettled(r, now, m.rendezvous(r.Session))
	default:
		p, err = m.claim(ctx, r, now)
	}
	if err != nil {
		return p, err
	}
	home := p.home
	if home < 0 || p.Reason == placement.ReasonRehome {
		home = p.Replica // a new or re-homed conversation: its home is where it went
	}
	st.Touch(m.cfg.Name, r.Session, p.m.replicas[home].name, now)
	return p, nil
}

// claim places a conversation this proxy does not know as new and claims
// that home in the store; when another proxy (or an earlier life of this
// one) recorded a home, the request is placed again as a later turn of it.
func (m *model) claim(ctx context.Context, r *placement.Request, now time.Time) (picked, error) {
	p, err := m.pick(r, -1, now)
	if err != nil {
		return p, err
	}
	home, existed, err := m.store.Claim(ctx, m.cfg.Name, r.Session, p.rep.name, m.sessionTTL())
	if err != nil {
		// The store failed: settle on the rendezvous choice, which the
		// other proxies make too while the store is unreachable for them.
		m.unpick(r, p)
		return m.pickSettled(r, now, m.rendezvous(r.Session))
	}
	m = p.m // a reload may have replaced m meanwhile
	idx := m.replicaNamed(home)
	if idx < 0 || (!existed && idx == p.Replica) {
		return p, nil // ours; or a replica this proxy's config lacks (configs differ): keep ours
	}
	m.unpick(r, p)
	m.mu.Lock()
	m.table.Assign(r.Session, idx, now)
	m.mu.Unlock()
	return m.pick(r, -1, now) // a later turn of a known conversation now
}

// pickSettled picks for a conversation this proxy does not know whose home
// is settled by settle (from the model that picks and its Snapshot, under
// the model's lock) rather than by the load score; settle returning -1
// leaves it to the score.
func (m *model) pickSettled(r *placement.Request, now time.Time, settle func(*model, *placement.Snapshot) int) (picked, error) {
	m.mu.Lock()
	if _, known := m.table.Home(r.Session, now); !known {
		m.fill(now, false)
		if h := settle(m, &m.snap); h >= 0 {
			m.table.Assign(r.Session, h, now)
			m.mu.Unlock()
			p, err := m.pick(r, -1, now)
			if err == nil {
				p = m.forgetTurn(p, h) // a new conversation, not a later turn
			}
			return p, err
		}
	}
	m.mu.Unlock()
	return m.pick(r, -1, now)
}

// forgetTurn takes back the later-turn count pick made for a conversation
// that was new after all (its home set just before the pick).
func (m *model) forgetTurn(p picked, home int) picked {
	if p.Replica == home {
		p.Reason = placement.ReasonHash // placed by the rendezvous hash, not sticky
	}
	if !p.later {
		return p
	}
	p.m.laterTurns.Add(-1)
	if p.stayed {
		p.m.laterHome.Add(-1)
	}
	p.home, p.later, p.stayed = -1, false, false
	return p
}

// unpick undoes the in-flight count of a pick that is placed again, and
// forgets the session in the table (it is recorded again by the next
// pick).
func (m *model) unpick(r *placement.Request, p picked) {
	p.rep.inFlight.Add(-1)
	if p.Uncached > 0 {
		p.rep.prefillQueue.Add(-int64(p.Uncached))
	}
	m.mu.Lock()
	m.table.Remove(r.Session)
	m.mu.Unlock()
}

// rendezvous settles a new conversation's home by rendezvous
// (highest-random-weight) hashing: placement.Rendezvous, over each
// replica's Key, a hash of its name, never its index, so proxies whose
// configurations list the same replicas in another order agree (issue 35:
// with the list's positions, two such proxies split 40 of 40 new sessions).
func (m *model) rendezvous(session string) func(*model, *placement.Snapshot) int {
	return func(_ *model, s *placement.Snapshot) int { return placement.Rendezvous(session, s) }
}

// replicaNamed returns the index of the replica named name, or -1.
func (m *model) replicaNamed(name string) int {
	for i, r := range m.replicas {
		if r.name == name {
			return i
		}
	}
	return -1
}

// sessionTTL is the model's idle TTL of a session.
func (m *model) sessionTTL() time.Duration {
	if d := m.cfg.SessionTTL.D(); d > 0 {
		return d
	}
	return placement.DefaultSessionTTL
}

// activeWindow is the model's active window as the table applies it: the
// configured one, or the one it has learned so far.
func (m *model) activeWindow() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.table.ActiveWindow()
}

// addRemote adds the other proxies' in-flight requests and the
// conversations held by every proxy to the Snapshot. Called by fill with
// m.mu held.
func (m *model) addRemote(s *placement.Snapshot) {
	if m.store == nil {
		return
	}
	for i, rep := range m.replicas {
		inFlight, held, ok := m.store.Remote(m.cfg.Name, rep.name)
		if !ok {
			continue
		}
		pr := &s.Replicas[i]
		pr.InFlight += inFlight
		pr.Sessions = max(pr.Sessions, held)
	}
}

// storeLoads is what this proxy publishes to the store: every replica's
// in-flight count; and how far it trusts another proxy's: up to its own
// limits.max_in_flight, which no proxy with the same configuration passes
// on one replica.
func (s *Server) storeLoads() []sessionstore.Load {
	rt := s.state.Load()
	var out []sessionstore.Load
	for _, name := range rt.names {
		m := rt.models[name]
		ttl, window := m.sessionTTL(), m.activeWindow()
		for _, rep := range m.replicas {
			out = append(out, sessionstore.Load{Model: name, Replica: rep.name, InFlight: int(rep.inFlight.Load()),
				TTL: ttl, Window: window, Cap: rt.cfg.Limits.MaxInFlight})
		}
	}
	return out
}
