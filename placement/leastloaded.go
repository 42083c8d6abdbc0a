package placement

import (
	"math"
	"time"
)

// LeastLoaded is vLLM's own data-parallel balancer: every request is placed
// afresh on the replica with the lowest 4*waiting + running. It knows
// nothing of prefix caches; it is the baseline the affinity policy is
// measured against, and what Affinity does when it is switched off.
//
// What vLLM does (vllm/v1/engine/core_client.py,
// DPLBAsyncMPClient.get_core_engine_for_request): unless the request names
// a data-parallel rank, it scans the engines from eng_start_index, scores
// each waiting*4 + running from lb_engines (the counts the DP coordinator
// publishes about every 100 ms), keeps the first engine with the strictly
// lowest score (so ties go to the first scanned), then adds client_count to
// the chosen engine's local waiting count, so that a burst between two
// stats updates spreads out; the next update replaces lb_engines and with
// it every local increment. Older releases fix eng_start_index at
// client_index*engines/client_count; current main also advances it by one
// after every pick, so equal scores do not always favour the same engine.
//
// What LeastLoaded does: the same score, scan and tie rule, starting from
// an index that advances by one after every balanced pick (the rotating
// start); the local increment is +1 (one API server, client_count 1); a
// change of Snapshot.Generation (a new scrape) drops the local increments,
// as a stats update does in vLLM. Where it differs: unhealthy replicas are
// skipped (vLLM routes to every engine it has); the newest vLLM main also
// blends its own in-flight count and a KV-pressure penalty into the score,
// which this type does not, because the product's baseline is the
// 4*waiting + running balancer that farms run today. A valid pin is
// honoured without a local increment, as vLLM does for
// X-data-parallel-rank.
//
// The zero value is ready to use. LeastLoaded is not safe for concurrent
// use.
type LeastLoaded struct {
	start int    // next scan starts here (vLLM's eng_start_index)
	gen   uint64 // Snapshot.Generation the local increments belong to
	extra []int  // local increments of waiting, aligned with Snapshot.Replicas

	// fixed: the start index never advances (vLLM 0.26's API servers);
	// increment is what a pick adds to the chosen engine's local waiting
	// count (client_count); 0 means 1.
	fixed     bool
	increment int
}

// NewDPLBClient returns the balancer of one of vLLM's API servers as
// vllm/v1/engine/core_client.py DPLBAsyncMPClient runs it in 0.26 with
// api_server_count servers in front of engines data-parallel engines:
// server clientIndex scans from its fixed eng_start_index =
// engines*clientIndex/clientCount, and each pick adds client_count to the
// chosen engine's local waiting count (get_core_engine_for_request), so
// that the servers, which do not see each other's picks, spread a burst
// as one would; the coordinator's next stats update (a new
// Snapshot.Generation) replaces the local counts. Feed it the counts the
// coordinator publishes (vllm/v1/engine/coordinator.py), not the scraped
// ones: they change when an engine step ends and reach the servers within
// the stats update interval (100 ms).
func NewDPLBClient(clientIndex, clientCount, engines int) *LeastLoaded {
	clientCount = max(clientCount, 1)
	return &LeastLoaded{
		start:     engines * clientIndex / clientCount,
		fixed:     true,
		increment: clientCount,
	}
}

var _ Policy = (*LeastLoaded)(nil)

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
	l.extra[best] += max(l.increment, 1)
	if !l.fixed {
		l.start = (l.start + 1) % n
	}
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
