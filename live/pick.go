package live

import (
	"fmt"
	"time"

	"github.com/lm-warden/warden/placement"
)

// fill refreshes m.snap for a pick at now. Called with m.mu held.
//
// Scraped fields come from the latest scrape when it is fresh (see
// ScrapeResult.fresh). When it is stale or failed, the replica is described
// by the proxy's own counts instead: Running = min(InFlight, max_num_seqs),
// Waiting = the rest, KVUsage = the mean of the replicas with fresh data
// (0 when none has): neither idle nor saturated, so the policy neither
// floods nor shuns it.
//
// sticky says the pick is for a conversation the table already homes:
// warm-up throttles new conversations only, so a warming replica is healthy
// for a known one (see admit).
func (m *model) fill(now time.Time, sticky bool) {
	maxSeqs, _ := m.maxNumSeqs()
	s := &m.snap
	s.MaxNumSeqs = maxSeqs
	var gen uint64
	var kvSum float64
	var kvN int
	stale := make([]bool, len(m.replicas))
	for i, rep := range m.replicas {
		r := rep.server.last.Load()
		gen += r.Seq
		inFlight := int(rep.inFlight.Load())
		pr := placement.Replica{ID: i, Key: rep.nameHash, InFlight: inFlight, Healthy: r.Healthy && m.admit(rep, now, sticky)}
		pr.PrefillTokensPerSec, _ = m.prefillRate(rep)
		pr.PrefillQueueTokens = int(max(rep.prefillQueue.Load(), 0))
		if st, ok := rep.stats(r); ok && st.NumGPUBlocks > 0 && st.BlockSize > 0 {
			// vllm:cache_config_info: the cache's size, whatever the freshness.
			pr.KVCapacityTokens = st.NumGPUBlocks * st.BlockSize
		}
		if st, ok := rep.stats(r); ok && r.fresh(now, m.interval) {
			pr.Running, pr.Waiting, pr.KVUsage = int(st.Running), int(st.Waiting), st.KVUsage
			kvSum += st.KVUsage
			kvN++
		} else {
			stale[i] = true
			pr.Running = min(inFlight, maxSeqs)
			pr.Waiting = inFlight - pr.Running
		}
		s.Replicas[i] = pr
	}
	for i := range s.Replicas {
		if stale[i] && kvN > 0 {
			s.Replicas[i].KVUsage = kvSum / float64(kvN)
		}
	}
	s.Generation = gen
	m.router.Advance(now)
	m.router.Fill(s) // the active conversations, which is what placement balances
	m.adm.wake()     // conversations may have left the active window
	m.addRemote(s)
}

// admit applies ejection and warm-up to one pick. A warming replica takes
// every pick of a known conversation (sticky: its sessions come home, their
// prefix is cached there) and a growing share of the others, so that only
// new conversations are throttled. Called with m.mu held.
func (m *model) admit(rep *replica, now time.Time, sticky bool) bool {
	if now.Before(rep.ejectedUntil) {
		return false
	}
	if sticky || !now.Before(rep.warmUntil) {
		return true
	}
	elapsed := now.Sub(rep.ejectedUntil)
	share := warmStart + (1-warmStart)*float64(elapsed)/float64(warmup)
	n := rep.warmPicks
	rep.warmPicks++
	// Admit when the running share crosses an integer: deterministic, no rand.
	return int(float64(n+1)*share) > int(float64(n)*share)
}

// picked is the outcome of model.pick.
type picked struct {
	placement.Decision
	m    *model // the model that picked: m, or its successor after a reload
	rep  *replica
	home int // the session's home before the pick; -1: a new session
	// later: a later turn of a known session; stayed: served by the
	// session's first replica (placement.Stay, the "stayed %" rule).
	later, stayed bool
}

// pick asks the policy for a replica and counts the request in flight
// there. exclude (an index in m, -1 for none) is shown to the policy as
// unhealthy: the replica a failed first attempt went to. A model that a
// reload replaced has its successor pick (picked.m says which).
func (m *model) pick(r *placement.Request, exclude int, now time.Time) (picked, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.current(); l != m {
		if exclude >= 0 {
			exclude = l.index(m.replicas[exclude])
		}
		m = l
	}
	home, first, known := m.router.Lookup(r.Session, now)
	// Least-loaded places every turn afresh: nothing is sticky there.
	m.fill(now, known && m.router.Traits().Has(placement.TraitSticky))
	if exclude >= 0 {
		m.snap.Replicas[exclude].Healthy = false
		r.Failed = append(r.Failed[:0], exclude) // the session keeps its home
	}
	d, err := m.router.Pick(r, &m.snap, now) // an observer table records the first home
	if err != nil {
		return picked{}, err
	}
	if d.Wait {
		return picked{}, errMustWait
	}
	if d.Replica < 0 || d.Replica >= len(m.replicas) {
		return picked{}, fmt.Errorf("placement picked replica %d of %d", d.Replica, len(m.replicas))
	}
	if exclude < 0 {
		// The request is sent now: its conversation is held until it ends
		// (model.observe) and for its return timeout after (placement's
		// "Held conversations"). A retry (exclude >= 0) is the same request.
		m.router.Sent(r.Session, now)
	}
	// A known session's request is a later turn (the proxy sees no turn
	// numbers: a session that returns after the TTL starts over, for the
	// count as for placement); a retry (exclude >= 0) was counted by its
	// first attempt.
	later, stayed := placement.Stay(known && exclude < 0, first, d.Replica)
	if later {
		m.laterTurns.Add(1)
	}
	if stayed {
		m.laterHome.Add(1)
	}
	if later && d.Reason == placement.ReasonSpill && home >= 0 && home < len(m.snap.Replicas) && d.Replica != home {
		m.adm.spills.add(SpillReason{Time: now.UTC(), From: home, To: d.Replica,
			Reason: spillText(d, m.snap.Replicas[home], m.spillThreshold())})
	}
	rep := m.replicas[d.Replica]
	rep.inFlight.Add(1)
	if d.Uncached > 0 {
		rep.prefillQueue.Add(int64(d.Uncached)) // given back by the attempt (prefill.go)
	}
	if !known {
		home = -1
	}
	return picked{Decision: d, m: m, rep: rep, home: home, later: later, stayed: stayed}, nil
}

// pickCountTokens places a request that is no conversation turn (count_tokens) on
// the healthy replica with the fewest requests in flight (ties to the
// lowest ID; exclude, -1 for none, is skipped) and counts it in flight
// there. The session table is neither read nor written (no session is
// created or refreshed) and no policy decision is counted. It is not sent
// to the session's home on purpose: counting tokens only tokenizes, so a
// home's prefix cache gains it nothing, and a busy home need not take it.
func (m *model) pickCountTokens(exclude int, now time.Time) (picked, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.current(); l != m {
		if exclude >= 0 {
			exclude = l.index(m.replicas[exclude])
		}
		m = l
	}
	m.fill(now, false)
	best := -1
	for i, r := range m.snap.Replicas {
		if r.Healthy && i != exclude && (best < 0 || r.InFlight < m.snap.Replicas[best].InFlight) {
			best = i
		}
	}
	if best < 0 {
		return picked{}, fmt.Errorf("%w of %d", placement.ErrNoHealthyReplica, len(m.replicas))
	}
	rep := m.replicas[best]
	rep.inFlight.Add(1)
	return picked{Decision: placement.Decision{Replica: best, Reason: placement.ReasonLeastLoaded}, m: m, rep: rep, home: -1}, nil
}
