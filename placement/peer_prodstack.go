package placement

import (
	"bytes"
	"crypto/md5"
	"slices"
	"strconv"
	"time"
)

// ProductionStack is vLLM production-stack's router with
// --routing-logic session, read in vllm-project/production-stack at
// a6c01db (src/vllm_router/routers/routing_logic.py SessionRouter,
// src/vllm_router/stats/request_stats.py):
//
//   - A request whose session header (--session-key) is set goes to the
//     endpoint of a uhashring HashRing: 160 virtual nodes "URL-w" per
//     endpoint, each at int(md5(key).hexdigest(), 16) (128 bits), the key
//     to the first point after its md5 (bisect), wrapping. The ring holds
//     the endpoints service discovery lists (healthy ones here) and
//     changes as they do (_update_hash_ring).
//   - A request without one goes by QPS (_qps_routing): the first endpoint
//     that has never had a request, else the lowest QPS, the first on
//     ties; QPS is the router's own count of requests sent to the endpoint
//     in the last 60 s over 60 (RequestStatsMonitor, sliding window
//     --request-stats-window 60).
//
// Request.Session is the session header here. Endpoint URLs are
// "http://" + PeerAddress(i) unless Config.URLs names them. Not modelled:
// the request-stats engine scrapes (not read by this logic), the other
// routing logics (roundrobin is the Helm default; prefixaware and kvaware
// are separate).
type ProductionStack struct {
	cfg   ProductionStackConfig
	urls  []string
	ring  []psPoint // sorted by md5
	nodes []bool    // which replicas the ring holds
	sent  [][]int64 // per replica: send times in the window, oldest first
	seen  []bool    // per replica: had a request (request_stats has it)
}

// ProductionStackConfig is the router's configuration.
type ProductionStackConfig struct {
	// Window is the request-stats sliding window: 60 s when 0.
	Window time.Duration
	// URLs names the endpoints (by replica index); nil: PeerAddress.
	URLs []string
}

type psPoint struct {
	h   [md5.Size]byte
	rep int32
}

var _ Policy = (*ProductionStack)(nil)

// productionStackStrategy is production-stack in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var productionStackStrategy = Strategy{
	Name:    PeerProductionStack,
	Words:   "vLLM production-stack's session router: a hash ring on the session header, whatever the load; without one, the replica with the fewest requests over the last minute",
	Reasons: []Reason{ReasonHash, ReasonLeastLoaded, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return NewProductionStack(ProductionStackConfig{}), nil },
}

// NewProductionStack returns the session router with cfg.
func NewProductionStack(cfg ProductionStackConfig) *ProductionStack {
	orDefault(&cfg.Window, 60*time.Second)
	return &ProductionStack{cfg: cfg}
}

func (p *ProductionStack) url(i int) string {
	if i < len(p.cfg.URLs) {
		return p.cfg.URLs[i]
	}
	return "http://" + PeerAddress(i)
}

// Pick implements Policy.
func (p *ProductionStack) Pick(r *Request, s *Snapshot, now time.Time) (Decision, error) {
	if d, ok := pinned(r, s); ok {
		p.record(d.Replica, now)
		return d, nil
	}
	reps := s.Replicas
	if !anyHealthy(reps) {
		return Decision{}, noHealthy(s)
	}
	p.updateRing(reps)
	var i int
	reason := ReasonHash
	if r.Session != "" {
		i = p.lookup(r.Session)
	} else {
		i, reason = p.lowestQPS(reps, now), ReasonLeastLoaded
	}
	p.record(i, now)
	return Decision{Replica: i, Reason: reason}, nil
}

// updateRing adds the healthy replicas missing from the ring and removes
// the others.
func (p *ProductionStack) updateRing(reps []Replica) {
	p.nodes = grow(p.nodes, len(reps))
	changed := false
	for i := range p.nodes {
		want := i < len(reps) && reps[i].Healthy
		if p.nodes[i] != want {
			p.nodes[i], changed = want, true
		}
	}
	if !changed {
		return
	}
	p.ring = p.ring[:0]
	for i, on := range p.nodes {
		if !on {
			continue
		}
		u := p.url(i)
		for w := range 160 {
			p.ring = append(p.ring, psPoint{h: md5.Sum([]byte(u + "-" + strconv.Itoa(w))), rep: int32(i)})
		}
	}
	slices.SortFunc(p.ring, func(a, b psPoint) int { return bytes.Compare(a.h[:], b.h[:]) })
}

// lookup is HashRing.get_node: the first point after md5(key), wrapping.
func (p *ProductionStack) lookup(key string) int {
	h := md5.Sum([]byte(key))
	k, _ := slices.BinarySearchFunc(p.ring, h, func(q psPoint, h [md5.Size]byte) int {
		if bytes.Compare(q.h[:], h[:]) <= 0 {
			return -1 // bisect_right: points equal to h come before
		}
		return 1
	})
	if k == len(p.ring) {
		k = 0
	}
	return int(p.ring[k].rep)
}

// lowestQPS is _qps_routing over the healthy replicas in order.
func (p *ProductionStack) lowestQPS(reps []Replica, now time.Time) int {
	p.grow(len(reps))
	at := now.UnixNano()
	best, bestN := -1, 0
	for i := range reps {
		if !reps[i].Healthy {
			continue
		}
		if !p.seen[i] {
			return i // no request yet: not in request_stats
		}
		n := len(p.trim(i, at))
		if best < 0 || n < bestN {
			best, bestN = i, n
		}
	}
	return best
}

// QPS returns replica i's requests per second over the window at now.
func (p *ProductionStack) QPS(i int, now time.Time) float64 {
	p.grow(i + 1)
	return float64(len(p.trim(i, now.UnixNano()))) / p.cfg.Window.Seconds()
}

// trim drops replica i's sends older than the window (timestamps[0] <
// now - window) and returns the rest.
func (p *ProductionStack) trim(i int, at int64) []int64 {
	ts := p.sent[i]
	cut := at - p.cfg.Window.Nanoseconds()
	k := 0
	for k < len(ts) && ts[k] < cut {
		k++
	}
	if k > 0 {
		ts = append(ts[:0], ts[k:]...)
		p.sent[i] = ts
	}
	return ts
}

// record is on_new_request: one more request sent to replica i at now.
func (p *ProductionStack) record(i int, now time.Time) {
	p.grow(i + 1)
	p.seen[i] = true
	p.sent[i] = append(p.sent[i], now.UnixNano())
	p.trim(i, now.UnixNano())
}

func (p *ProductionStack) grow(n int) {
	p.sent = grow(p.sent, n)
	p.seen = grow(p.seen, n)
}
