package placement

import (
	"math/rand/v2"
	"time"
)

// LiteLLM is the LiteLLM proxy's router with routing_strategy least-busy,
// read in BerriAI/litellm at litellm/router_strategy/least_busy.py
// @00e06b8 (LeastBusyLoggingHandler) and its tests
// tests/local_testing/test_least_busy_routing.py @2b4986b:
//
//   - Each deployment's requests in flight, counted by the proxy itself: +1
//     just before a call (log_pre_api_call), -1 on its success or failure
//     (Replica.InFlight, the router's own count).
//   - The counts live in a dict in the order the deployments were first
//     called; healthy deployments never called are appended with 0; the
//     first with the strictly lowest count wins (_get_available_
//     deployments); if that one is not healthy, a healthy deployment at
//     random.
//
// LiteLLM's default is simple-shuffle (a weighted random pick); its
// optional session and prompt-prefix affinity are not modelled.
type LiteLLM struct {
	rng   *rand.Rand
	order []int  // replicas in the order they were first called
	known []bool // replica is in order
}

var _ Policy = (*LiteLLM)(nil)

// liteLLMStrategy is litellm in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var liteLLMStrategy = Strategy{
	Name:    PeerLiteLLM,
	Words:   "LiteLLM's least-busy router: the replica with the fewest requests in flight, wherever the conversation is cached",
	Reasons: []Reason{ReasonLeastLoaded, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return NewLiteLLM(cfg.Seed), nil },
}

// NewLiteLLM returns the least-busy router; seed draws the random pick
// that an unhealthy least-busy deployment falls to.
func NewLiteLLM(seed uint64) *LiteLLM { return &LiteLLM{rng: newRand(seed)} }

// Pick implements Policy.
func (l *LiteLLM) Pick(r *Request, s *Snapshot, _ time.Time) (Decision, error) {
	if d, ok := pinned(r, s); ok {
		l.called(d.Replica)
		return d, nil
	}
	reps := s.Replicas
	if !anyHealthy(reps) {
		return Decision{}, noHealthy(s)
	}
	l.known = grow(l.known, len(reps))
	best, bestN := -1, 0
	consider := func(i int) {
		if n := max(reps[i].InFlight, 0); best < 0 || n < bestN {
			best, bestN = i, n
		}
	}
	for _, i := range l.order {
		if i < len(reps) {
			consider(i)
		}
	}
	for i := range reps {
		if reps[i].Healthy && !l.known[i] {
			consider(i)
		}
	}
	if !reps[best].Healthy {
		var healthy []int
		for i := range reps {
			if reps[i].Healthy {
				healthy = append(healthy, i)
			}
		}
		best = healthy[l.rng.IntN(len(healthy))]
	}
	l.called(best)
	return Decision{Replica: best, Reason: ReasonLeastLoaded}, nil
}

// called records replica i's first call (the dict's insertion order).
func (l *LiteLLM) called(i int) {
	l.known = grow(l.known, i+1)
	if !l.known[i] {
		l.known[i] = true
		l.order = append(l.order, i)
	}
}
