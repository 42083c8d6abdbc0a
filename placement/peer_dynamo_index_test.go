package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// dynRefcounts is the sequences' state as Dynamo keeps it (sequences/:
// per worker, each block id with the number of its active requests that
// hold it), kept the plain way, from the decisions of the Dynamo under
// test: what its one index for all workers must answer.
type dynRefcounts []map[uint64]int

func (c dynRefcounts) add(w int, blocks []uint64, n int) {
	for _, id := range blocks {
		if c[w][id] += n; c[w][id] == 0 {
			delete(c[w], id)
		}
	}
}

// depth is how many leading blocks of blocks worker w's active requests
// hold.
func (c dynRefcounts) depth(w int, blocks []uint64) int {
	n := 0
	for _, id := range blocks {
		if c[w][id] == 0 {
			break
		}
		n++
	}
	return n
}

// check compares d's index with c: the depth of r's prompt and the number
// of distinct blocks in each worker, and with all each block's refcount
// and position.
func (c dynRefcounts) check(d *Dynamo, r *Request, all bool) error {
	depth := d.activeDepths(r.Prompt.Blocks, d.prevOf(r), len(c))
	for w := range c {
		if got, want := int(depth[w]), c.depth(w, r.Prompt.Blocks); got != want {
			return fmt.Errorf("worker %d: active depth %d, want %d", w, got, want)
		}
		wk := d.worker(w)
		if len(wk.blocks) != len(c[w]) {
			return fmt.Errorf("worker %d: %d distinct active blocks, want %d", w, len(wk.blocks), len(c[w]))
		}
		if !all {
			continue
		}
		for pos, k := range wk.blocks {
			sl := &d.slots[k]
			h := d.find(k, int32(w))
			switch {
			case !sl.used || !d.holdsSlot(sl.id, k):
				return fmt.Errorf("worker %d: slot %d of its blocks is not block %x's", w, k, sl.id)
			case h == nil || int(h.refs) != c[w][sl.id] || int(h.pos) != pos:
				return fmt.Errorf("worker %d: block %x hold %+v, want %d refs at %d", w, sl.id, h, c[w][sl.id], pos)
			}
		}
	}
	return nil
}

// TestDynamo_IndexMatchesRefcounts drives Dynamo with conversations whose
// turns extend, share a system prompt, fork and overlap, and checks its
// index of active blocks against the plain refcounts at every step: the
// decisions read only the depths and the distinct counts it gives.
func TestDynamo_IndexMatchesRefcounts(t *testing.T) {
	// Up to 64 workers the walk intersects bits; beyond, it reads holds.
	for _, tc := range []struct{ workers, seed int }{{6, 0}, {6, 1}, {64, 2}, {70, 3}} {
		workers, seed := tc.workers, uint64(tc.seed)
		t.Run(fmt.Sprintf("%d workers seed %d", workers, seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			d := NewDynamo(DynamoConfig{Seed: seed})
			d.sweepMin = 64
			s := farm(workers, 64)
			ref := make(dynRefcounts, workers)
			for w := range ref {
				ref[w] = make(map[uint64]int)
			}
			system := seqIDs(1<<40, 1<<40+40)
			type conv struct {
				name   string
				blocks []uint64
			}
			var convs []*conv
			var active []Request     // in flight
			sent := map[uint64]int{} // request -> worker
			now, id, swept := t0, uint64(0), false
			for step := range 2000 {
				now = now.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
				switch x := rng.IntN(10); {
				case x < 4 || len(active) == 0: // a turn
					var c *conv
					if len(convs) < 8 {
						c = &conv{name: fmt.Sprint("c", step), blocks: append([]uint64(nil), system[:rng.IntN(len(system)+1)]...)}
						convs = append(convs, c)
					} else {
						k := rng.IntN(len(convs))
						if c = convs[k]; len(c.blocks) > 600 { // its last turn
							convs = append(convs[:k], convs[k+1:]...)
						}
					}
					if rng.IntN(8) == 0 && len(c.blocks) > 0 { // a fork: the prompt is edited
						c.blocks = c.blocks[:rng.IntN(len(c.blocks))]
					}
					for range 1 + rng.IntN(100) {
						id++
						c.blocks = append(c.blocks, id)
					}
					if rng.IntN(4) == 0 && len(c.blocks) > 1 { // a repeated block
						c.blocks = append(c.blocks, c.blocks[rng.IntN(len(c.blocks))])
					}
					r := Request{ID: id, Session: c.name, Pinned: NoPin, PromptTokens: 16 * len(c.blocks),
						Prompt: Prompt{BlockTokens: 16, Blocks: append([]uint64(nil), c.blocks...), Held: make([]int, workers)}}
					if rng.IntN(5) == 0 {
						r.Pinned = rng.IntN(workers)
					}
					for w := range r.Prompt.Held {
						r.Prompt.Held[w] = rng.IntN(len(c.blocks) + 1)
					}
					if err := ref.check(d, &r, step%16 == 0); err != nil {
						t.Fatalf("step %d, before request %d: %v", step, r.ID, err)
					}
					w := mustPick(t, d, r, s, now)
					ref.add(w, r.Prompt.Blocks, 1)
					active, sent[r.ID] = append(active, r), w
				case x < 6: // a first token
					r := &active[rng.IntN(len(active))]
					d.FirstToken(r, sent[r.ID], now)
				default: // an end
					k := rng.IntN(len(active))
					r := active[k]
					d.Finished(&r, sent[r.ID], now)
					ref.add(sent[r.ID], r.Prompt.Blocks, -1)
					active = append(active[:k], active[k+1:]...)
				}
				swept = swept || len(d.free) > 0
			}
			for _, r := range active {
				d.Finished(&r, sent[r.ID], now)
				ref.add(sent[r.ID], r.Prompt.Blocks, -1)
			}
			r := preq("end", Prompt{BlockTokens: 16, Blocks: system})
			if err := ref.check(d, &r, true); err != nil {
				t.Fatalf("after every request ended: %v", err)
			}
			if !swept {
				t.Errorf("no idle slot was ever swept (%d slots, %d idle)", len(d.slots), d.idle)
			}
		})
	}
}

// holdsSlot reports whether the index maps id to slot k.
func (d *Dynamo) holdsSlot(id uint64, k int32) bool {
	got, ok := d.slotOf.get(id)
	return ok && got == k
}
