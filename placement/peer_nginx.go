package placement

import (
	"encoding/binary"
	"hash/crc32"
	"slices"
	"strings"
	"time"
)

// NginxHash is nginx's `hash $http_x_session_id consistent;` in an
// upstream block (src/http/modules/ngx_http_upstream_hash_module.c,
// ngx_http_upstream_init_chash and ngx_http_upstream_get_chash_peer, as
// in nginx 1.2x): a ketama ring compatible with Cache::Memcached::Fast.
//
//   - Each server (weight 1) gets 160 points: base = crc32(host "\0"
//     port); point k = crc32 of base continued with the previous point's 4
//     bytes (little endian; 0 for the first). Points are sorted, equal
//     hashes kept once.
//   - A request's key is crc32 of the header's value ("" when it is
//     missing: every request without the header lands on one server); it
//     goes to the first point at or after it, wrapping; a server that is
//     down passes the request to the next point's server (up to 20 tries;
//     then nginx falls back to round robin, here the first healthy).
//
// Servers are PeerAddress(i) (10.0.H.L:8000). Not modelled: max_fails
// and fail_timeout (a failed replica is Replica.Healthy false), weights.
type NginxHash struct {
	ring hashRing
	n    int
}

var _ Policy = (*NginxHash)(nil)

// nginxPoints returns the 160 ring points of server addr ("host:port").
func nginxPoints(addr string, dst []uint32) []uint32 {
	host, port := addr, ""
	if k := strings.LastIndexByte(addr, ':'); k >= 0 && isDigits(addr[k+1:]) {
		host, port = addr[:k], addr[k+1:]
	}
	base := crc32.ChecksumIEEE([]byte(host + "\x00" + port))
	var prev [4]byte
	for range 160 {
		h := crc32.Update(base, crc32.IEEETable, prev[:])
		dst = append(dst, h)
		binary.LittleEndian.PutUint32(prev[:], h)
	}
	return dst
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// nginxHashStrategy is nginx-hash in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var nginxHashStrategy = Strategy{
	Name:    PeerNginxHash,
	Words:   "nginx's consistent hash of the x-session-id header, whatever the load (every request without one on the same replica)",
	Reasons: []Reason{ReasonHash, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return &NginxHash{}, nil },
}

// Pick implements Policy.
func (h *NginxHash) Pick(r *Request, s *Snapshot, _ time.Time) (Decision, error) {
	if d, ok := pinned(r, s); ok {
		return d, nil
	}
	reps := s.Replicas
	if !anyHealthy(reps) {
		return Decision{}, noHealthy(s)
	}
	if h.n != len(reps) {
		h.ring = h.ring[:0]
		var pts []uint32
		for i := range reps {
			pts = nginxPoints(PeerAddress(i), pts[:0])
			for _, p := range pts {
				h.ring = append(h.ring, ringPoint{h: uint64(p), rep: int32(i)})
			}
		}
		h.ring.sort(false)
		h.ring = slices.CompactFunc(h.ring, func(a, b ringPoint) bool { return a.h == b.h })
		h.n = len(reps)
	}
	key := uint64(crc32.ChecksumIEEE([]byte(r.Session)))
	k, _ := slices.BinarySearchFunc(h.ring, key, func(p ringPoint, key uint64) int {
		switch {
		case p.h < key:
			return -1
		case p.h > key:
			return 1
		}
		return 0
	})
	for try := 0; try < 20; try++ {
		i := int(h.ring[(k+try)%len(h.ring)].rep)
		if reps[i].Healthy {
			return Decision{Replica: i, Reason: ReasonHash}, nil
		}
	}
	for i := range reps {
		if reps[i].Healthy {
			return Decision{Replica: i, Reason: ReasonHash}, nil
		}
	}
	return Decision{}, noHealthy(s)
}
