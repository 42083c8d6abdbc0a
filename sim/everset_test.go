package sim

import (
	"context"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/traces"
)

// TestEverSetAgainstMaps checks the table against the sets it replaced (a
// map per replica and one for the farm), through growth and forgetting
// (whose backward shifts must leave every probe run whole), with one word
// of replica bits and with several (whose rows are reused), and with room
// reserved up front.
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
			switch rng.IntN(6) {
			case 0, 1:
				e.add(h, rep)
				here[rep][h], anywhere[h] = true, true
				continue
			case 2:
				e.forget(h)
				for _, m := range here {
					delete(m, h)
				}
				delete(anywhere, h)
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
// probe runs to wrap around its end, with keys that share their
// fingerprint (the index compares the full hash, the block's own).
func TestBlockIndexAgainstMap(t *testing.T) {
	for _, n := range []int{2, 5, 64, 1000} {
		blocks := make([]kvBlock, n)
		x := newBlockIndex(blocks)
		ref := map[uint64]int32{}
		var free []int32 // blocks holding no key
		for b := range n {
			free = append(free, int32(b))
		}
		rng := rand.New(rand.NewPCG(uint64(n), 9))
		keys := make([]uint64, 3*n)
		for i := range keys {
			keys[i] = rng.Uint64() >> rng.IntN(64) // some share high bits, some low
			if i%4 == 3 {
				// Another key of the key before's fingerprint (and home):
				// its mix differs in the low bits alone.
				keys[i] = unmix(mix(keys[i-1]) ^ uint64(1+rng.IntN(1<<20)))
				if mix(keys[i])&fpMask != mix(keys[i-1])&fpMask || keys[i] == keys[i-1] {
					t.Fatalf("unmix: %#x and %#x do not share a fingerprint", keys[i], keys[i-1])
				}
			}
		}
		for step := range 40000 {
			h := keys[rng.IntN(len(keys))]
			switch op := rng.IntN(3); {
			case op == 0 && len(free) > 0:
				// A block takes the key (a block holding it before gives
				// it up, as a hash moves to its duplicate in evict).
				k := rng.IntN(len(free))
				b := free[k]
				free = append(free[:k], free[k+1:]...)
				if old, ok := ref[h]; ok {
					free = append(free, old)
				}
				blocks[b].hash = h
				x.put(h, b)
				ref[h] = b
			case op == 1:
				x.del(h)
				if b, ok := ref[h]; ok {
					free = append(free, b)
				}
				delete(ref, h)
			}
			want, ok := ref[h]
			if !ok {
				want = noBlock
			}
			if got := x.get(h); got != want {
				t.Fatalf("%d blocks, step %d: get(%#x) = %d, want %d", n, step, h, got, want)
			}
			if x.n != len(ref) {
				t.Fatalf("%d blocks, step %d: %d entries, want %d", n, step, x.n, len(ref))
			}
		}
		for h, b := range ref {
			if got := x.get(h); got != b {
				t.Fatalf("%d blocks: get(%#x) = %d at the end, want %d", n, h, got, b)
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

// unmix inverts mix (its multiplier is odd, so invertible mod 2^64).
func unmix(m uint64) uint64 {
	const g = 0x9e3779b97f4a7c15
	inv := uint64(g)
	for range 6 { // Newton's iteration doubles the correct low bits
		inv *= 2 - g*inv
	}
	return m * inv
}

// put sets hash's block, which holds hash.
func (x *blockIndex) put(hash uint64, b int32) {
	if i := x.find(hash); x.slots[i] != 0 {
		x.setBlockAt(i, b)
	} else {
		x.putAt(i, hash, b)
	}
}

// del removes hash.
func (x *blockIndex) del(hash uint64) {
	if i := x.find(hash); x.slots[i] != 0 {
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

// TestEverSetForgetsExactly runs every synthetic equivalence workload (a
// level going down retires sessions, subagents, preemption) and one of 66
// replicas (more than one word of replica bits) with the hashes of the
// sessions that are over forgotten, and with every hash kept, and compares
// everything they output: forgetting must not change a miss class.
func TestEverSetForgetsExactly(t *testing.T) {
	cases := []equivCase{{"a4000x66-steps", func(t testing.TB) Experiment {
		spec := mustDefaultFarm(t).Spec
		spec.Replicas = 66
		f, err := Resolve(spec)
		if err != nil {
			t.Fatal(err)
		}
		return Experiment{Farm: f, Sessions: []int{40, 12, 70}, Duration: 40 * time.Second, Seed: 5, Strategies: []string{"hash", "affinity"}}
	}}}
	for _, c := range equivCases() {
		if c.e(t).Trace == nil {
			cases = append(cases, c)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := c.e(t)
			forgetting := runEquiv(t, e)
			keepEveryHash = true
			keeping := runEquiv(t, e)
			keepEveryHash = false
			if forgetting != keeping {
				a, b := strings.Split(forgetting, "\n"), strings.Split(keeping, "\n")
				for i := range min(len(a), len(b)) {
					if a[i] != b[i] {
						t.Fatalf("line %d differs:\nforgetting: %.300s\nkeeping:    %.300s", i+1, a[i], b[i])
					}
				}
				t.Fatalf("outputs differ in length: %d and %d lines", len(a), len(b))
			}
		})
	}
}

// TestEverSetBoundedByLoad checks that a long run of synthetic sessions
// holds in its record of hashes ever cached no more than the blocks of the
// sessions its clients hold at the end (and the shared system prompt's),
// however many sessions came and went before, where keeping every hash
// holds several times that.
func TestEverSetBoundedByLoad(t *testing.T) {
	final := func(t *testing.T) (*run, int) {
		e, err := Experiment{Farm: mustDefaultFarm(t), Strategies: []string{"affinity"}, Sessions: []int{16, 8}, Duration: 6 * time.Minute, Seed: 2}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		e.lean = true
		_, r, err := runStrategy(context.Background(), e, "affinity", nil)
		if err != nil {
			t.Fatal(err)
		}
		return r, int(r.rt.sessionsCompleted)
	}
	r, completed := final(t)
	cl := r.drv.(*closedLoop)
	held := map[uint64]bool{}
	for _, c := range cl.clients {
		for ti := range c.sess.Turns {
			req := &c.sess.Turns[ti]
			for k := 0; ; k++ {
				h, ok := requestBlockHash(req, req.PromptTokens, k, r.cfg.blockSize)
				if !ok {
					break
				}
				held[h] = true
			}
		}
	}
	ever := r.reps[0].pool.ever
	if completed < 4*len(cl.clients) {
		t.Fatalf("%d sessions completed by %d clients: too few for the test to mean anything", completed, len(cl.clients))
	}
	if ever.n > len(held) {
		t.Errorf("%d hashes recorded after %d sessions completed; the %d clients' sessions hold %d blocks", ever.n, completed, len(cl.clients), len(held))
	}
	keepEveryHash = true
	kept, _ := final(t)
	keepEveryHash = false
	n := kept.reps[0].pool.ever.n
	t.Logf("%d sessions completed: %d hashes recorded (%d slots), %d held by the clients' sessions; keeping every hash: %d", completed, ever.n, len(ever.slots), len(held), n)
	if n < 2*len(held) {
		t.Errorf("keeping every hash recorded %d, not far above the %d of the sessions held: the test cannot tell", n, len(held))
	}
}

// TestSyntheticSessionsOwnTheirBlocks checks what forgetting a session's
// hashes (run.sessionOver) rests on: the synthetic sessions, subagents
// included, share their system prompt's full blocks (Session.SharedTokens)
// and no other, whatever the shape: agent kinds of their own system
// prompts, compaction, subagents with a system prompt of theirs, or
// carrying their parent's session id.
func TestSyntheticSessionsOwnTheirBlocks(t *testing.T) {
	bench := traces.DefaultWorkload()
	bench.SubagentProbability = 0.4
	bench.Turns = 4
	shaped := traces.DefaultWorkload()
	shaped.Turns, shaped.NewTokensPerTurn = 30, 900
	shaped.ContextLimit, shaped.SummaryTokens = 24000, traces.TokenDist{Mean: 2000}
	shaped.SubagentProbability, shaped.SubagentTurns = 0.1, 3
	shaped.SubagentSystemPromptTokens, shaped.SubagentSession = 1000, traces.SubagentParent
	other := shaped
	other.SystemPromptTokens, other.SubagentSession = 5000, ""
	mixed := traces.DefaultWorkload()
	mixed.Agents = []traces.Agent{{Name: "a", Weight: 1, Shape: shaped}, {Name: "b", Weight: 1, Shape: other}}
	for _, w := range []traces.Workload{bench, mixed} {
		for _, bs := range []int{16, 64} {
			g := traces.NewGenerator(w, bs, 9)
			owner := map[uint64]string{}
			system := map[uint64]bool{}
			for range 120 {
				s, _ := g.NextSession()
				shared := s.SharedTokens / bs
				for ti := range s.Turns {
					req := &s.Turns[ti]
					for k := 0; ; k++ {
						h, ok := requestBlockHash(req, req.PromptTokens, k, bs)
						if !ok {
							break
						}
						if k < shared {
							system[h] = true
							continue
						}
						if o, ok := owner[h]; ok && o != s.ID {
							t.Fatalf("block size %d: block %d of session %s, turn %d, is also session %s's", bs, k, s.ID, ti, o)
						}
						owner[h] = s.ID
					}
				}
			}
			for h := range system {
				if o, ok := owner[h]; ok {
					t.Fatalf("block size %d: a system prompt block is also session %s's own", bs, o)
				}
			}
			if len(w.Agents) > 0 && len(system) < 2*1000/bs {
				t.Fatalf("block size %d: %d system prompt blocks for kinds of 3,500 and 5,000 tokens and subagents of 1,000", bs, len(system))
			}
		}
	}
}
