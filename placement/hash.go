package placement

import (
	"fmt"
	"time"
)

// Hash places a session by hashing its id onto the healthy replicas, with
// no regard for load: the first rule of the original farm. It uses
// rendezvous (highest-random-weight) hashing: every replica gets a weight
// mixed from the session's hash and the replica's identity (Replica.Key,
// else its ID), and the healthy replica with the highest weight wins. A replica that turns unhealthy
// therefore moves only its own sessions, each to its second choice, and
// they come back when it recovers. The hash is FNV-1a (64 bit, no seed), so
// a session lands on the same replica in every process and every release;
// testdata/scenarios/hash-stability.txt fixes the mapping.
//
// A valid pin (Request.Pinned in range and healthy) is honoured, as vLLM
// honours X-data-parallel-rank. Hash keeps no state; it is safe for
// concurrent use.
type Hash struct{}

var (
	_ Policy  = (*Hash)(nil)
	_ Traiter = (*Hash)(nil)
)

// hashStrategy is hash in the registry.
var hashStrategy = Strategy{
	Name:    StrategyHash,
	Words:   "each conversation goes to the replica its session id hashes to, whatever the load",
	Reasons: []Reason{ReasonHash, ReasonPinned},
	Proxy:   true,
	New:     plain(func() Policy { return &Hash{} }),
}

// Traits implements Traiter: a session goes where it went before.
func (*Hash) Traits() Traits { return TraitSticky }

// Pick implements Policy.
func (*Hash) Pick(r *Request, s *Snapshot, _ time.Time) (Decision, error) {
	if usable(s.Replicas, r.Pinned) {
		return Decision{Replica: r.Pinned, Reason: ReasonPinned}, nil
	}
	i := rendezvous(fnv1a64(r.Session), s.Replicas)
	if i < 0 {
		return Decision{}, noHealthy(s)
	}
	return Decision{Replica: i, Reason: ReasonHash}, nil
}

// Rendezvous is the healthy replica of s that rendezvous hashing gives
// session (as Hash picks, without a pin), or -1 when none is healthy.
// With Replica.Key set, processes that list the same replicas in another
// order agree.
func Rendezvous(session string, s *Snapshot) int { return rendezvous(fnv1a64(session), s.Replicas) }

// NameKey is the Replica.Key of a replica named name (live: its URL, and
// "#rank" in the data-parallel layout): its 64-bit FNV-1a hash, never 0.
func NameKey(name string) uint64 { return max(fnv1a64(name), 1) }

// rendezvous returns the healthy replica with the highest weight for key,
// ties (improbable) to the lowest identity, or -1 when none is healthy.
// A replica's identity is its Key, else ID+1: with keys, the choice does
// not depend on the order in which a process lists the replicas.
func rendezvous(key uint64, reps []Replica) int {
	best, bestW, bestID := -1, uint64(0), uint64(0)
	for i := range reps {
		if !reps[i].Healthy {
			continue
		}
		id := reps[i].Key
		if id == 0 {
			id = uint64(reps[i].ID) + 1
		}
		w := mix64(key ^ mix64(id))
		if best < 0 || w > bestW || (w == bestW && id < bestID) {
			best, bestW, bestID = i, w, id
		}
	}
	return best
}

// fnv1a64 is the 64-bit FNV-1a hash of s (no seed, no allocation).
func fnv1a64(s string) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= prime64
	}
	return h
}

// mix64 is the SplitMix64 finaliser: a bijection that spreads every input
// bit over the whole word, so weights of one key on different replicas are
// independent.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// usable reports whether replica i exists and is healthy.
func usable(reps []Replica, i int) bool {
	return i >= 0 && i < len(reps) && reps[i].Healthy
}

// noHealthy is the error for a snapshot with nothing to pick.
func noHealthy(s *Snapshot) error {
	return fmt.Errorf("placement: none of %d replicas can take the request: %w", len(s.Replicas), ErrNoHealthyReplica)
}
