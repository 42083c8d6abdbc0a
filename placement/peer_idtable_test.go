package placement

import (
	"math/rand/v2"
	"testing"
)

// TestIDTableMatchesMap runs random puts, overwrites and deletions on an
// idTable and a Go map side by side, over random ids and over ids that
// share their home entries in pairs and runs (deletion must move the
// entries after a hole back, and only those).
func TestIDTableMatchesMap(t *testing.T) {
	const inversePhi = 0xf1de83e19937733d // 2^64/phi's inverse: home(k*inversePhi) is k's top bits
	for _, tc := range []struct {
		name string
		id   func(r *rand.Rand) uint64
	}{
		{"random", func(r *rand.Rand) uint64 { return r.Uint64() % 5000 * 0x9e3779b97f4a7c15 }},
		{"clustered", func(r *rand.Rand) uint64 { return (r.Uint64() % 3000 << 50) * inversePhi }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var tab idTable
			ref := map[uint64]int32{}
			for step := range 50000 {
				id := tc.id(rng)
				if rng.IntN(3) < 2 {
					v := rng.Int32N(1 << 30)
					tab.put(id, v)
					ref[id] = v
				} else {
					tab.del(id)
					delete(ref, id)
				}
				want, in := ref[id]
				if !in {
					want = -1
				}
				if got, ok := tab.get(id); ok != in || got != want {
					t.Fatalf("step %d: id %x = %d %v, want %d %v", step, id, got, ok, want, in)
				}
				if step%500 != 0 {
					continue
				}
				if tab.len() != len(ref) {
					t.Fatalf("step %d: %d ids, want %d", step, tab.len(), len(ref))
				}
				for id, want := range ref {
					if got, ok := tab.get(id); !ok || got != want {
						t.Fatalf("step %d: id %x = %d %v, want %d", step, id, got, ok, want)
					}
				}
			}
		})
	}
}
