package placement

import (
	"math/bits"
	"slices"
)

// dynBlocks is what Dynamo's active sequences hold (sequences/: per
// worker, each block of its active requests with the number of them that
// hold it), kept for all workers in one index, so that a pick walks the
// prompt once for all of them instead of once per worker, and a block is
// found by one lookup:
//
//   - A block id that some active request holds has a slot: its id, the
//     workers that hold it with their refcounts, in worker order (the
//     first inline, the others in a list of their own), and the workers
//     below 64 as bits, which the walk intersects and which tell a
//     worker's place in the order.
//   - A worker's distinct blocks are dynWorker.blocks, the slots, each
//     hold knowing its position there (removal swaps in the last).
//   - A slot that no request holds any more stays a while (idle): the
//     next turn of its conversation mostly holds it again. sweep frees the
//     idle slots once they outnumber the held ones.
//   - prev keeps, per conversation, the slots of its last finished
//     request: the next turn's prompt extends that one, so most of its
//     blocks are found there (each slot's id checked) without a lookup.
//
// The answers are the plain refcounts' (TestDynamo_IndexMatchesRefcounts).
type dynBlocks struct {
	slotOf   idTable // block id -> slot
	slots    []dynSlot
	more     [][]dynHold // the holds of the slots beyond their first
	freeMore []int32     // unused entries of more
	free     []int32     // slots out of slotOf
	idle     int         // slots in slotOf that no request holds
	sweepMin int         // the fewest idle slots that sweep frees: dynSweepMin
	prev     map[string][]int32
	spare    [][]int32 // the slot lists of finished requests, for reuse
	depth    []int32   // activeDepths' answer
}

// dynSweepMin is the fewest idle slots that sweep frees: enough that a
// sweep is rare, few beside the blocks of the requests in flight.
const dynSweepMin = 1 << 14

// dynSlot is a block id and the workers that hold it.
type dynSlot struct {
	id    uint64
	mask  uint64  // the holding workers below 64, a bit each
	first dynHold // worker < 0: no request holds the block (idle)
	more  int32   // the further holds, dynBlocks.more[more]; -1: none
	used  bool    // in slotOf
}

// dynHold is one worker's hold on a slot: refs active requests, and the
// slot's position in the worker's blocks.
type dynHold struct {
	worker, refs, pos int32
}

// noHold is the first hold of a slot no request holds.
var noHold = dynHold{worker: -1}

func newDynBlocks() dynBlocks {
	return dynBlocks{prev: make(map[string][]int32), sweepMin: dynSweepMin}
}

// activeDepths returns, for each of at least n workers, how many leading
// blocks of blocks its active requests hold (the request blocks w's
// active sequences already count). prev are slots where the blocks may be
// (prevOf).
func (d *Dynamo) activeDepths(blocks []uint64, prev []int32, n int) []int32 {
	d.depth = grow(d.depth[:0], max(n, len(d.workers)))
	clear(d.depth)
	if len(d.depth) > 64 {
		return d.activeDepthsWide(blocks, prev)
	}
	if len(d.depth) == 0 {
		return d.depth
	}
	// Up to 64 workers: the workers still holding every block so far, as
	// bits; a worker's depth is the block where it drops out.
	alive := ^uint64(0) >> (64 - len(d.depth))
	j := 0
	for ; j < len(blocks) && alive != 0; j++ {
		k := d.slotIn(prev, j, blocks[j])
		if k < 0 {
			break
		}
		m := d.slots[k].mask & alive
		for gone := alive &^ m; gone != 0; gone &= gone - 1 {
			d.depth[bits.TrailingZeros64(gone)] = int32(j)
		}
		alive = m
	}
	for ; alive != 0; alive &= alive - 1 {
		d.depth[bits.TrailingZeros64(alive)] = int32(j)
	}
	return d.depth
}

// activeDepthsWide is activeDepths beyond 64 workers: a worker is still
// in the walk at block j when its depth is j.
func (d *Dynamo) activeDepthsWide(blocks []uint64, prev []int32) []int32 {
	for j, id := range blocks {
		k := d.slotIn(prev, j, id)
		if k < 0 {
			break
		}
		alive := false
		extend := func(h *dynHold) {
			if d.depth[h.worker] == int32(j) {
				d.depth[h.worker]++
				alive = true
			}
		}
		if sl := &d.slots[k]; sl.first.worker >= 0 {
			extend(&sl.first)
			if sl.more >= 0 {
				for x := range d.more[sl.more] {
					extend(&d.more[sl.more][x])
				}
			}
		}
		if !alive {
			break
		}
	}
	return d.depth
}

// prevOf returns the slots of the last finished request of r's
// conversation: where r's leading blocks may be.
func (d *Dynamo) prevOf(r *Request) []int32 {
	if r.Session == "" {
		return nil
	}
	return d.prev[r.Session]
}

// slotIn returns the slot of block id, the j-th of a prompt, -1 when it
// has none: prev[j] when that slot is id's, else the index's.
func (d *Dynamo) slotIn(prev []int32, j int, id uint64) int32 {
	if j < len(prev) {
		if sl := &d.slots[prev[j]]; sl.used && sl.id == id {
			return prev[j]
		}
	}
	k, _ := d.slotOf.get(id)
	return k
}

// holdAll adds r's blocks to worker i's and returns their slots.
func (d *Dynamo) holdAll(r *Request, i int) []int32 {
	var slots []int32
	if n := len(d.spare); n > 0 {
		slots, d.spare = d.spare[n-1], d.spare[:n-1]
	}
	prev := d.prevOf(r)
	for j, id := range r.Prompt.Blocks {
		slots = append(slots, d.hold(id, d.slotIn(prev, j, id), i))
	}
	return slots
}

// releaseAll takes the blocks of r, at slots, out of worker i's; the
// slots are then its conversation's prev. Last first: the blocks that r
// added to the worker's are at the end of its list unless a later request
// added more, so each leaves from the end, and nothing moves.
func (d *Dynamo) releaseAll(r *Request, i int, slots []int32) {
	for _, k := range slices.Backward(slots) {
		d.release(k, i)
	}
	if r.Session != "" {
		slots, d.prev[r.Session] = d.prev[r.Session], slots
	}
	if slots != nil {
		d.spare = append(d.spare, slots[:0])
	}
	d.sweep()
}

// hold adds one reference of worker i to block id, whose slot is k (-1:
// none yet), and returns its slot.
func (d *Dynamo) hold(id uint64, k int32, i int) int32 {
	if k < 0 {
		if n := len(d.free); n > 0 {
			k, d.free = d.free[n-1], d.free[:n-1]
		} else {
			k = int32(len(d.slots))
			if len(d.slots) == cap(d.slots) {
				// Doubling: append grows a slice this large by a
				// quarter, copying it each time.
				d.slots = slices.Grow(d.slots, len(d.slots)+1)
			}
			d.slots = append(d.slots, dynSlot{})
		}
		d.slots[k] = dynSlot{id: id, first: noHold, more: -1, used: true}
		d.slotOf.put(id, k)
		d.idle++
	}
	if h := d.find(k, int32(i)); h != nil {
		h.refs++
		return k
	}
	w := d.worker(i)
	add := dynHold{worker: int32(i), refs: 1, pos: int32(len(w.blocks))}
	w.blocks = append(w.blocks, k)
	sl := &d.slots[k]
	r := d.rank(sl, int32(i))
	if i < 64 {
		sl.mask |= 1 << i
	}
	switch {
	case sl.first.worker < 0:
		sl.first = add
		d.idle--
		return k
	case sl.more < 0:
		if n := len(d.freeMore); n > 0 {
			sl.more, d.freeMore = d.freeMore[n-1], d.freeMore[:n-1]
		} else {
			sl.more = int32(len(d.more))
			d.more = append(d.more, nil)
		}
	}
	if r == 0 {
		add, sl.first = sl.first, add
	} else {
		r--
	}
	d.more[sl.more] = slices.Insert(d.more[sl.more], r, add)
	return k
}

// A slot's holds are in the order of their workers: the first, then
// more. Below 64 a worker's place is the number of bits of the mask below
// its own; the workers from 64 on follow, found by a scan.

// rank returns the number of holds on sl of the workers below i.
func (d *Dynamo) rank(sl *dynSlot, i int32) int {
	r := bits.OnesCount64(sl.mask & (1<<min(i, 64) - 1))
	if i < 64 || sl.first.worker < 0 {
		return r
	}
	for ; r < 1+d.moreLen(sl) && d.holdAt(sl, r).worker < i; r++ {
	}
	return r
}

// moreLen returns the number of holds on sl beyond its first.
func (d *Dynamo) moreLen(sl *dynSlot) int {
	if sl.more < 0 {
		return 0
	}
	return len(d.more[sl.more])
}

// holdAt returns hold r of sl, which has more than r.
func (d *Dynamo) holdAt(sl *dynSlot, r int) *dynHold {
	if r == 0 {
		return &sl.first
	}
	return &d.more[sl.more][r-1]
}

// find returns worker i's hold on slot k, nil when it holds none.
func (d *Dynamo) find(k, i int32) *dynHold {
	sl := &d.slots[k]
	if sl.first.worker < 0 || (i < 64 && sl.mask&(1<<i) == 0) {
		return nil
	}
	r := d.rank(sl, i)
	if r > d.moreLen(sl) {
		return nil
	}
	if h := d.holdAt(sl, r); h.worker == i {
		return h
	}
	return nil
}

// release drops one reference of worker i to slot k: the worker's last
// takes the block out of the worker's blocks, and the slot's last leaves
// it idle.
func (d *Dynamo) release(k int32, i int) {
	h := d.find(k, int32(i))
	if h == nil {
		return
	}
	if h.refs--; h.refs > 0 {
		return
	}
	pos := h.pos
	sl := &d.slots[k]
	r := d.rank(sl, int32(i))
	if i < 64 {
		sl.mask &^= 1 << i
	}
	switch more := d.moreLen(sl); {
	case more == 0:
		sl.first = noHold
		d.idle++
	case r == 0:
		sl.first = d.more[sl.more][0]
		d.more[sl.more] = slices.Delete(d.more[sl.more], 0, 1)
	default:
		d.more[sl.more] = slices.Delete(d.more[sl.more], r-1, r)
	}
	w := &d.workers[i]
	end := int32(len(w.blocks) - 1)
	if pos != end {
		moved := w.blocks[end]
		w.blocks[pos] = moved
		d.find(moved, int32(i)).pos = pos
	}
	w.blocks = w.blocks[:end]
}

// sweep frees the idle slots once they are at least sweepMin and
// outnumber the held ones: each slot freed was idle since the last sweep,
// so the work is a constant per block released.
func (d *Dynamo) sweep() {
	if d.idle < d.sweepMin || 2*d.idle < d.slotOf.len() {
		return
	}
	for k := range d.slots {
		sl := &d.slots[k]
		if sl.used && sl.first.worker < 0 {
			d.slotOf.del(sl.id)
			if sl.more >= 0 {
				d.freeMore = append(d.freeMore, sl.more)
			}
			*sl = dynSlot{more: -1}
			d.free = append(d.free, int32(k))
		}
	}
	d.idle = 0
	clear(d.prev)
}
