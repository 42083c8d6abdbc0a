package sim

import (
	"math/rand/v2"
	"testing"
)

// TestEverSetAgainstMaps checks the table against the sets it replaced (a
// map per replica and one for the farm), through growth, with one word of
// replica bits and with several.
func TestEverSetAgainstMaps(t *testing.T) {
	for _, replicas := range []int{1, 4, 64, 65, 130} {
		e := newEverSet(replicas)
		here := make([]map[uint64]bool, replicas)
		for i := range here {
			here[i] = map[uint64]bool{}
		}
		anywhere := map[uint64]bool{}
		rng := rand.New(rand.NewPCG(uint64(replicas), 7))
		hash := func() uint64 {
			if rng.IntN(2) == 0 {
				return uint64(rng.IntN(20000)) // small, dense ids collide in the table's low bits
			}
			return rng.Uint64N(40000) << 40
		}
		for range 50000 {
			h, rep := hash(), rng.IntN(replicas)
			if rng.IntN(3) == 0 {
				e.add(h, rep)
				here[rep][h], anywhere[h] = true, true
				continue
			}
			gotHere, gotAny := e.seen(h, rep)
			if gotHere != here[rep][h] || gotAny != anywhere[h] {
				t.Fatalf("%d replicas: seen(%#x, %d) = %v, %v; want %v, %v", replicas, h, rep, gotHere, gotAny, here[rep][h], anywhere[h])
			}
		}
		if e.n != len(anywhere) {
			t.Errorf("%d replicas: %d hashes in the table, want %d", replicas, e.n, len(anywhere))
		}
	}
}

// TestBlockIndexAgainstMap checks the pool's index against a Go map under
// random insertions, overwrites and deletions, in a table small enough for
// probe runs to wrap around its end.
func TestBlockIndexAgainstMap(t *testing.T) {
	for _, blocks := range []int{2, 5, 64, 1000} {
		x := newBlockIndex(blocks)
		ref := map[uint64]int32{}
		rng := rand.New(rand.NewPCG(uint64(blocks), 9))
		keys := make([]uint64, 3*blocks)
		for i := range keys {
			keys[i] = rng.Uint64() >> rng.IntN(64) // some share high bits, some low
		}
		for step := range 40000 {
			h := keys[rng.IntN(len(keys))]
			switch op := rng.IntN(3); {
			case op == 0 && len(ref) < blocks:
				b := int32(rng.IntN(blocks))
				x.put(h, b)
				ref[h] = b
			case op == 1:
				x.del(h)
				delete(ref, h)
			}
			want, ok := ref[h]
			if !ok {
				want = noBlock
			}
			if got := x.get(h); got != want {
				t.Fatalf("%d blocks, step %d: get(%#x) = %d, want %d", blocks, step, h, got, want)
			}
			if x.n != len(ref) {
				t.Fatalf("%d blocks, step %d: %d entries, want %d", blocks, step, x.n, len(ref))
			}
		}
		for h, b := range ref {
			if got := x.get(h); got != b {
				t.Fatalf("%d blocks: get(%#x) = %d at the end, want %d", blocks, h, got, b)
			}
		}
	}
}
