package placement

import (
	"math"
	"time"
)

// LeastLoaded is the load balancer of vLLM's data-parallel front end as
// warden runs it on scraped counts: every request is placed afresh on the
// replica with the lowest 4*waiting + running. It knows nothing of prefix
// caches; it is the baseline the affinity policy is measured against
// behind the proxy (routing.balancer: warden), and what Affinity does when
// it is switched off.
//
// It follows vLLM's scan (vllm/v1/engine/core_client.py,
// DPLBAsyncMPClient.get_core_engine_for_request, up to 0.26): scan the
// engines from a start index, keep the first with the strictly lowest
// score (ties go to the first scanned), add to the chosen engine's local
// waiting count so that a burst between two updates spreads out, and
// advance the start by one after every pick (PR #47420). Here the local
// increment is +1 (one balancer), and a change of Snapshot.Generation (a
// new scrape) drops the local increments, as a coordinator publication
// does in vLLM. Where it differs from vLLM: it runs on counts warden
// scrapes, which vLLM 0.26's API servers never get for a dense model
// (the simulator's own model of vLLM's front end, with every release's
// scoring, is sim/frontend.go); unhealthy replicas are skipped (vLLM
// routes to every engine it has). A valid pin is honoured without a local
// increment, as vLLM does for X-data-parallel-rank.
//
// The zero value is ready to use. LeastLoaded is not safe for concurrent
// use.
type LeastLoaded struct {
	start int    // next scan starts here (vLLM's eng_start_index)
	gen   uint64 // Snapshot.Generation the local increments belong to
	extra []int  // local increments of waiting, aligned with Snapshot.Replicas
}

var _ Policy = (*LeastLoaded)(nil)

// leastLoadedStrategy is least-loaded in the registry.
var leastLoadedStrategy = Strategy{
	Name:    StrategyLeastLoaded,
	Words:   "every turn goes to the replica with the fewest requests in flight, wherever the conversation is cached",
	Reasons: []Reason{ReasonLeastLoaded, ReasonPinned},
	Proxy:   true,
	// vLLM's own balancer: what a farm runs with no router in front.
	HeadToHead: []string{StrategyLeastLoaded},
	New:        plain(func() Policy { return &LeastLoaded{} }),
}

// Pick implements Policy.
func (l *LeastLoaded) Pick(r *Request, s *Snapshot, _ time.Time) (Decision, error) {
	reps := s.Replicas
	if usable(reps, r.Pinned) {
		return Decision{Replica: r.Pinned, Reason: ReasonPinned}, nil
	}
	if s.Generation != l.gen || len(l.extra) != len(reps) {
		l.gen = s.Generation
		l.extra = l.extra[:0]
		for range reps {
			l.extra = append(l.extra, 0)
		}
	}
	n := len(reps)
	best, bestScore := -1, math.MaxInt
	l.start %= max(n, 1) // the farm may have shrunk
	for k, i := 0, l.start; k < n; k, i = k+1, i+1 {
		if i == n {
			i = 0
		}
		if !reps[i].Healthy {
			continue
		}
		score := 4*(reps[i].Waiting+l.extra[i]) + reps[i].Running
		if score < bestScore {
			best, bestScore = i, score
		}
	}
	if best < 0 {
		return Decision{}, noHealthy(s)
	}
	l.extra[best]++
	l.start = (l.start + 1) % n
	return Decision{Replica: best, Reason: ReasonLeastLoaded}, nil
}

// Scores appends to dst the score LeastLoaded gives each replica now,
// 4*(waiting + local increment) + running, aligned with s.Replicas; an
// unhealthy replica scores -1. It is for reports and does not change state.
func (l *LeastLoaded) Scores(s *Snapshot, dst []int) []int {
	for i, rep := range s.Replicas {
		if !rep.Healthy {
			dst = append(dst, -1)
			continue
		}
		w := rep.Waiting
		if s.Generation == l.gen && i < len(l.extra) {
			w += l.extra[i]
		}
		dst = append(dst, 4*w+rep.Running)
	}
	return dst
}
