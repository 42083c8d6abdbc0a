package placement

import (
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"
	"time"
)

// The routers people run instead of warden (notes/peer-routers.md), each
// a Policy in its own file peer_*.go, modelled on what that router keeps
// and reads, with the file and commit it was read at cited at the top.
// What a peer needs beyond Pick it asks for through the small interfaces
// below; a caller (the router seam in sim and live) looks for them with a
// type assertion and does nothing for a policy that has none.

// Tracker is a policy that follows the requests it placed, as a gateway
// sees them pass: the caller reports each one's first token and its end
// (finished, failed or cut), with the Request it was placed with (its ID
// and Prompt) and the replica it went to.
type Tracker interface {
	FirstToken(r *Request, replica int, now time.Time)
	Finished(r *Request, replica int, now time.Time)
}

// Scraper is a policy that reads vLLM's gauges (Replica.Running, Waiting,
// KVUsage) at an interval of its own: the caller refreshes those fields
// of the Snapshot at that interval (the simulator) or scrapes at it (the
// proxy), so the policy sees them as old as its own scrape makes them.
type Scraper interface {
	ScrapeInterval() time.Duration
}

// HeldReader is a policy that reads Prompt.Held (how much of the prompt
// each replica holds now, from KV events or the block pools); the caller
// fills it only for policies that say so.
type HeldReader interface {
	ReadsHeld() bool
}

// newRand is the policies' seeded source: PCG, as math/rand/v2 offers.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// boundedDraw is a number in [0, n) from r by Lemire's multiply-shift with
// rejection, as Rust's fastrand draws usize(0..n) (Rng::gen_mod_u64),
// reading one r.Uint64() per try. With a wyrand source it reproduces the
// draws of a seeded fastrand::Rng (Dynamo's tie-break test).
func boundedDraw(r *rand.Rand, n uint64) uint64 {
	hi, lo := bits.Mul64(r.Uint64(), n)
	if lo < n {
		t := -n % n
		for lo < t {
			hi, lo = bits.Mul64(r.Uint64(), n)
		}
	}
	return hi
}

// pinned returns the decision for a valid pin: every strategy honours
// one, as vLLM honours X-data-parallel-rank.
func pinned(r *Request, s *Snapshot) (Decision, bool) {
	if usable(s.Replicas, r.Pinned) {
		return Decision{Replica: r.Pinned, Reason: ReasonPinned}, true
	}
	return Decision{}, false
}

// grow returns xs with at least n elements, the new ones zero.
func grow[T any](xs []T, n int) []T {
	for len(xs) < n {
		var z T
		xs = append(xs, z)
	}
	return xs
}

// sortedKeys returns m's keys in order: state kept in maps is visited in
// a fixed order, never the map's.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// The peers' strategy names, as issue 47 names them.
const (
	PeerLLMD            = "llm-d"
	PeerLLMDPrecise     = "llm-d-precise"
	PeerDynamo          = "dynamo"
	PeerSGLang          = "sglang"
	PeerVLLMRouter      = "vllm-router"
	PeerVLLMRouterHash  = "vllm-router-hash"
	PeerProductionStack = "production-stack"
	PeerRayPrefix       = "ray-prefix"
	PeerAIBrix          = "aibrix"
	PeerLiteLLM         = "litellm"
	PeerNginxHash       = "nginx-hash"
)

// PeerNames lists the peers' strategy names (Strategy.Peer), in the
// registry's order, which is notes/peer-routers.md's.
func PeerNames() []string { return names(func(s *Strategy) bool { return s.Peer }) }

// NewPeer returns the policy of peer name in its default configuration,
// its random draws (tie-breaks) seeded with seed; ok is false for a name
// that is not a peer's. It is the registry's factory (Strategy.New).
func NewPeer(name string, seed uint64) (p Policy, ok bool) {
	s, found := LookupStrategy(name)
	if !found || !s.Peer {
		return nil, false
	}
	p, err := s.New(Config{Seed: seed})
	return p, err == nil
}

// orDefault sets *p to v when it is the zero value: the peers' configs
// take their router's default for a field left out.
func orDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}
