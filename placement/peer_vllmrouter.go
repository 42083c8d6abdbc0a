package placement

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// VLLMRouterHash is vllm-project/router's consistent_hash policy on the
// session headers, read at src/policies/consistent_hash.rs @080589a and
// src/policies/hash_key.rs @335c57e:
//
//   - The key (extract_hash_key): the first non-empty header of
//     x-session-id, x-user-id, x-tenant-id, x-correlation-id, x-request-id,
//     x-trace-id, as "header:NAME:VALUE"; then body fields; else the
//     request text. Request.Session is the x-session-id here; a request
//     without one hashes its prompt ("request_hash:" + the hash of its
//     text description, hash_key.rs's fallback for a text over 100 bytes).
//   - The hash (fbi_hash): mcrouter's furc_hash of the key into 2^23 - 1
//     buckets (MurmurHash64A bits, seed 4193360111), that bucket's 4 bytes
//     MurmurHash64A'd again into the 64-bit ring.
//   - The ring: 160 virtual nodes per worker at fbi_hash("URL:i"); a key
//     goes to the first point at or after its hash, wrapping; a target
//     that is unhealthy sends the request to the first healthy worker.
//
// Workers are addressed http://10.0.H.L:8000 (PeerAddress) in the
// simulator; the ring does not change while the replicas do not.
type VLLMRouterHash struct {
	ring hashRing
	n    int
}

var _ Policy = (*VLLMRouterHash)(nil)

// vllmRouterHashStrategy is vllm-router-hash in the registry (a peer's router: warden sim,
// plan and tune run it; the proxy does not serve it).
var vllmRouterHashStrategy = Strategy{
	Name:    PeerVLLMRouterHash,
	Words:   "vllm-project/router's consistent hash of the session header, whatever the load",
	Reasons: []Reason{ReasonHash, ReasonPinned},
	Peer:    true,
	New:     func(cfg Config) (Policy, error) { return &VLLMRouterHash{}, nil },
}

// PeerAddress is the host:port the peers' hash rings give replica i, as a
// deployment's pod addresses would be: 10.0.H.L:8000 with H.L = i + 1.
func PeerAddress(i int) string {
	return "10.0." + strconv.Itoa((i+1)/256) + "." + strconv.Itoa((i+1)%256) + ":8000"
}

// Pick implements Policy.
func (v *VLLMRouterHash) Pick(r *Request, s *Snapshot, _ time.Time) (Decision, error) {
	if d, ok := pinned(r, s); ok {
		return d, nil
	}
	reps := s.Replicas
	first := -1
	for i := range reps {
		if reps[i].Healthy {
			first = i
			break
		}
	}
	if first < 0 {
		return Decision{}, noHealthy(s)
	}
	if v.n != len(reps) {
		v.ring = v.ring[:0]
		for i := range reps {
			url := "http://" + PeerAddress(i)
			for k := range 160 {
				v.ring = append(v.ring, ringPoint{h: fbiHash(url + ":" + strconv.Itoa(k)), rep: int32(i)})
			}
		}
		v.ring.sort(true)
		v.n = len(reps)
	}
	var key string
	if r.Session != "" {
		key = "header:x-session-id:" + r.Session
	} else {
		key = fmt.Sprintf("request_hash:%016x", fbiHash(promptKey(r)))
	}
	i := int(v.ring.lookup(fbiHash(key)))
	if !reps[i].Healthy {
		i = first
	}
	return Decision{Replica: i, Reason: ReasonHash}, nil
}

// promptKey is a stand-in for a request's text in hash keys: its model,
// length and block ids (equal prompts, equal keys).
func promptKey(r *Request) string {
	b := make([]byte, 0, 16+8*len(r.Prompt.Blocks))
	b = append(b, r.Model...)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.PromptTokens))
	for _, id := range r.Prompt.Blocks {
		b = binary.LittleEndian.AppendUint64(b, id)
	}
	return string(b)
}

// ringPoint is one point of a hash ring.
type ringPoint struct {
	h   uint64
	rep int32
}

// hashRing is a sorted ring of points.
type hashRing []ringPoint

// sort orders the ring by hash. With lastWins, of points with equal
// hashes the one inserted last stays (a BTreeMap insert replaces), else
// all stay in insertion order.
func (r *hashRing) sort(lastWins bool) {
	slices.SortStableFunc(*r, func(a, b ringPoint) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return 0
	})
	if !lastWins {
		return
	}
	out := (*r)[:0]
	for _, p := range *r {
		if n := len(out); n > 0 && out[n-1].h == p.h {
			out[n-1] = p
			continue
		}
		out = append(out, p)
	}
	*r = out
}

// lookup returns the replica of the first point at or after h, wrapping
// to the first point; the ring must not be empty.
func (r hashRing) lookup(h uint64) int32 {
	k, _ := slices.BinarySearchFunc(r, h, func(p ringPoint, h uint64) int {
		switch {
		case p.h < h:
			return -1
		case p.h > h:
			return 1
		}
		return 0
	})
	if k == len(r) {
		k = 0
	}
	return r[k].rep
}

// The hashes of mcrouter's lib/fbi/hash.c as vllm-project/router's
// consistent_hash.rs writes them.
const (
	murmurM    = 0xc6a4a7935bd1e995
	murmurR    = 47
	furcSeed   = 4193360111
	furcShift  = 23
	furcTries  = 32
	furcModMax = 1<<23 - 1
)

// murmur64A is MurmurHash64A of key with seed.
func murmur64A(key []byte, seed uint64) uint64 {
	h := seed ^ uint64(len(key))*murmurM
	for len(key) >= 8 {
		k := binary.LittleEndian.Uint64(key)
		k *= murmurM
		k ^= k >> murmurR
		k *= murmurM
		h ^= k
		h *= murmurM
		key = key[8:]
	}
	if len(key) > 0 {
		for i := len(key) - 1; i >= 0; i-- {
			h ^= uint64(key[i]) << (8 * uint(i))
		}
		h *= murmurM
	}
	h ^= h >> murmurR
	h *= murmurM
	h ^= h >> murmurR
	return h
}

// murmurRehash64A is MurmurHash64A of the 8 bytes of k with furc's seed.
func murmurRehash64A(k uint64) uint64 {
	m := uint64(murmurM)
	h := uint64(furcSeed) ^ 8*m // wrapping, as Rust's wrapping_mul
	k *= murmurM
	k ^= k >> murmurR
	k *= murmurM
	h ^= k
	h *= murmurM
	h ^= h >> murmurR
	h *= murmurM
	h ^= h >> murmurR
	return h
}

// furcHash is mcrouter's furc_hash of key into [0, m).
func furcHash(key []byte, m uint32) uint32 {
	if m <= 1 {
		return 0
	}
	var cache []uint64
	bit := func(idx uint32) bool {
		ord := int(idx >> 6)
		for n := len(cache); n <= ord; n++ {
			if n == 0 {
				cache = append(cache, murmur64A(key, furcSeed))
			} else {
				cache = append(cache, murmurRehash64A(cache[n-1]))
			}
		}
		return cache[ord]>>(idx&0x3f)&1 != 0
	}
	d := uint32(0)
	for m > 1<<d {
		d++
	}
	a := d
	for range furcTries {
		for !bit(a) {
			if d == 0 {
				return 0
			}
			d--
			a = d
		}
		a += furcShift
		num := uint32(1)
		for k := uint32(0); k+1 < d; k++ {
			num <<= 1
			if bit(a) {
				num |= 1
			}
			a += furcShift
		}
		if num < m {
			return num
		}
	}
	return 0
}

// fbiHash is consistent_hash.rs fbi_hash.
func fbiHash(key string) uint64 {
	f := furcHash([]byte(key), furcModMax)
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], f)
	return murmur64A(b[:], furcSeed)
}
