package sim

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/lm-warden/warden/traces"
)

// TestEverSetAgainstMaps checks the table against the sets it replaced (a
// map per replica and one for the farm), through growth, with one word of
// replica bits and with several, and with room reserved up front.
func TestEverSetAgainstMaps(t *testing.T) {
	// reserve: room reserved after at operations.
	for _, c := range []struct{ replicas, reserve, at int }{{1, 0, 0}, {4, 0, 0}, {64, 0, 0}, {65, 0, 0}, {130, 0, 0}, {4, 40000, 0}, {4, 40000, 9000}} {
		replicas := c.replicas
		e := newEverSet(replicas)
		reserved := 0
		reserve := func() {
			e.reserve(c.reserve)
			if len(e.slots) < 2*c.reserve {
				t.Fatalf("%d slots reserved for %d hashes", len(e.slots), c.reserve)
			}
			reserved = len(e.slots)
		}
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
		for i := range 50000 {
			if i == c.at {
				reserve()
			}
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
		if c.reserve > 0 && len(e.slots) != reserved {
			t.Errorf("%d hashes grew a table reserved for %d: %d slots, then %d", e.n, c.reserve, reserved, len(e.slots))
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

// TestHashCount checks the estimate of a trace's distinct block hashes
// that sizes the record of hashes ever cached, against an exact count:
// random ids, small dense ids, prefixes shared by many requests, output
// hash ids, and none.
func TestHashCount(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	trace := func(requests, prefixes, prefixLen, tail int, ids func(int) uint64, output bool) *Trace {
		tr := &Trace{}
		next := 0
		for range requests {
			r := &traces.Request{}
			p := rng.IntN(max(prefixes, 1))
			for k := range prefixLen {
				r.HashIDs = append(r.HashIDs, ids(1<<30+p*prefixLen+k))
			}
			for range tail {
				r.HashIDs = append(r.HashIDs, ids(next))
				next++
			}
			if output {
				r.OutputHashIDs = append(r.OutputHashIDs, ids(next))
				next++
			}
			tr.Requests = append(tr.Requests, r)
		}
		return tr
	}
	random := func(i int) uint64 { return rand.New(rand.NewPCG(uint64(i), 5)).Uint64() }
	dense := func(i int) uint64 { return uint64(i) }
	for _, c := range []struct {
		name string
		tr   *Trace
	}{
		{"shared prefixes, random ids", trace(5000, 8, 128, 16, random, false)},
		{"shared prefixes, dense ids", trace(5000, 8, 128, 16, dense, true)},
		{"no sharing", trace(2000, 0, 0, 50, random, true)},
		{"all shared", trace(3000, 1, 300, 0, dense, false)},
		{"one request", trace(1, 0, 0, 1, dense, false)},
		{"no ids", &Trace{Requests: []*traces.Request{{}}}},
		{"empty", &Trace{}},
	} {
		exact := map[uint64]bool{}
		for _, r := range c.tr.Requests {
			for _, h := range append(append([]uint64(nil), r.HashIDs...), r.OutputHashIDs...) {
				exact[h] = true
			}
		}
		got, want := c.tr.hashCount(), len(exact)
		if math.Abs(float64(got-want)) > 0.02*float64(want)+1 {
			t.Errorf("%s: estimate %d, exact %d", c.name, got, want)
		}
	}
}

// put sets hash's block.
func (x *blockIndex) put(hash uint64, b int32) { x.putAt(x.find(hash), hash, b) }

// del removes hash.
func (x *blockIndex) del(hash uint64) {
	if i := x.find(hash); x.slots[i].block != 0 {
		x.delAt(i)
	}
}

// reserve makes room for n hashes in all without growing again.
func (e *everSet) reserve(n int) {
	if 2*n <= len(e.slots) {
		return
	}
	e.moveTo(make([]everSlot, 1<<bits.Len(uint(2*n-1))))
}
