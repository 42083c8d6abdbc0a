package sim

import "math/bits"

// This file mirrors vLLM V1's KV block pool (vllm/v1/core/block_pool.py)
// and its free queue (FreeKVCacheBlockQueue in kv_cache_utils.py):
//
//   - block 0 is the null block and is never handed out, so a pool of
//     num_gpu_blocks blocks has num_gpu_blocks-1 usable ones and KV usage is
//     1 - free/(num_gpu_blocks-1), as vLLM reports it;
//   - the free queue is a doubly linked list threaded through the blocks,
//     initially in block-id order; allocation pops from the head, freeing
//     appends to the tail; a free block with a hash still counts as free;
//   - a cached block is evicted (its hash dropped) only when the allocator
//     pops it, never earlier ("lazy eviction");
//   - several blocks may hold the same hash (two requests computed the same
//     content); a lookup returns the first one cached, as vLLM's dict does.
//
// Everything is index based and allocation free after construction, apart
// from the growth of the hash map.

const noBlock int32 = -1

// kvBlock is one KV cache block.
type kvBlock struct {
	hash    uint64 // valid when hashed
	hashed  bool   // the block is in the prefix cache
	inFree  bool   // the block is in the free queue
	ref     int32  // requests that hold the block
	prev    int32  // free queue links (noBlock at the ends)
	next    int32  //
	dupNext int32  // next block with the same hash, in caching order
}

// blockPool is the KV cache of one replica.
type blockPool struct {
	blocks   []kvBlock
	freeHead int32
	freeTail int32
	numFree  int
	cached   blockIndex // hash -> first block that holds it

	// ever records every hash ever cached on any replica of the run, and on
	// which (everID is this pool's replica); it tells an evicted miss from
	// one computed only elsewhere or never (miss classification). nil: not
	// tracked (a long-running EngineReplica), misses then read as cold.
	ever   *everSet
	everID int
	// evictions counts cached blocks dropped by allocation.
	evictions int64
	// refFlips counts the times a block went from free to held by touch
	// or from held to free (allocation takes free blocks too, evicting
	// the cached ones: evictions counts those).
	refFlips int64
}

// newBlockPool returns a pool of numBlocks blocks, block 0 being the null
// block. numBlocks must be at least 2.
func newBlockPool(numBlocks int) *blockPool {
	p := &blockPool{
		blocks:   make([]kvBlock, numBlocks),
		freeHead: noBlock,
		freeTail: noBlock,
		cached:   newBlockIndex(numBlocks),
	}
	for i := range p.blocks {
		p.blocks[i] = kvBlock{prev: noBlock, next: noBlock, dupNext: noBlock}
	}
	for i := 1; i < numBlocks; i++ {
		p.pushTail(int32(i))
	}
	return p
}

// usable is the number of blocks that can hold KV (all but the null block).
func (p *blockPool) usable() int { return len(p.blocks) - 1 }

// usage is vllm:kv_cache_usage_perc: the fraction of usable blocks not free.
func (p *blockPool) usage() float64 {
	return 1 - float64(p.numFree)/float64(p.usable())
}

func (p *blockPool) pushTail(b int32) {
	blk := &p.blocks[b]
	blk.prev, blk.next, blk.inFree = p.freeTail, noBlock, true
	if p.freeTail == noBlock {
		p.freeHead = b
	} else {
		p.blocks[p.freeTail].next = b
	}
	p.freeTail = b
	p.numFree++
}

func (p *blockPool) unlink(b int32) {
	blk := &p.blocks[b]
	if blk.prev == noBlock {
		p.freeHead = blk.next
	} else {
		p.blocks[blk.prev].next = blk.next
	}
	if blk.next == noBlock {
		p.freeTail = blk.prev
	} else {
		p.blocks[blk.next].prev = blk.prev
	}
	blk.prev, blk.next, blk.inFree = noBlock, noBlock, false
	p.numFree--
}

// lookup returns the block that caches hash, or noBlock.
func (p *blockPool) lookup(hash uint64) int32 { return p.cached.get(hash) }

// cacheBlock puts block b in the prefix cache under hash. A block already
// cached is left alone (its hash never changes while it is held).
func (p *blockPool) cacheBlock(b int32, hash uint64) {
	blk := &p.blocks[b]
	if blk.hashed {
		return
	}
	blk.hash, blk.hashed, blk.dupNext = hash, true, noBlock
	if i := p.cached.find(hash); p.cached.slots[i].block != 0 {
		last := p.cached.slots[i].block - 1
		for p.blocks[last].dupNext != noBlock {
			last = p.blocks[last].dupNext
		}
		p.blocks[last].dupNext = b
	} else {
		p.cached.putAt(i, hash, b)
	}
	if p.ever != nil {
		p.ever.add(hash, p.everID)
	}
}

// evict drops block b's hash from the prefix cache.
func (p *blockPool) evict(b int32) {
	blk := &p.blocks[b]
	if !blk.hashed {
		return
	}
	i := p.cached.find(blk.hash)
	if first := p.cached.slots[i].block - 1; first == b {
		if blk.dupNext == noBlock {
			p.cached.delAt(i)
		} else {
			p.cached.slots[i].block = blk.dupNext + 1
		}
	} else {
		prev := first
		for p.blocks[prev].dupNext != b {
			prev = p.blocks[prev].dupNext
		}
		p.blocks[prev].dupNext = blk.dupNext
	}
	blk.hashed, blk.hash, blk.dupNext = false, 0, noBlock
	p.evictions++
}

// touch takes a reference on cached blocks found by a lookup, removing the
// free ones from the free queue (vLLM BlockPool.touch).
func (p *blockPool) touch(bs []int32) {
	for _, b := range bs {
		blk := &p.blocks[b]
		if blk.ref == 0 {
			p.refFlips++
			if blk.inFree {
				p.unlink(b)
			}
		}
		blk.ref++
	}
}

// allocate pops n blocks from the head of the free queue, evicting their
// cached hashes, and appends them to dst (vLLM BlockPool.get_new_blocks).
// The caller has checked n <= numFree.
func (p *blockPool) allocate(n int, dst []int32) []int32 {
	for range n {
		b := p.freeHead
		p.unlink(b)
		p.evict(b)
		p.blocks[b].ref = 1
		dst = append(dst, b)
	}
	return dst
}

// free drops one reference on each of bs, taken in reverse order, so that a
// request's tail reaches the free queue before its prefix and is evicted
// first (vLLM KVCacheManager.free -> BlockPool.free_blocks(reversed(...))).
func (p *blockPool) free(bs []int32) {
	for i := len(bs) - 1; i >= 0; i-- {
		b := bs[i]
		blk := &p.blocks[b]
		blk.ref--
		if blk.ref == 0 {
			p.refFlips++
			p.pushTail(b)
		}
	}
}

// blockIndex maps the hashes of a pool's cached blocks to the first block
// holding each: an open-addressing table with linear probing and
// backward-shift deletion, of a fixed size, at least twice the pool's
// blocks (a block holds at most one hash), so it never grows and stays at
// most half full. It does the work of a Go map in one probe of one slot.
type blockIndex struct {
	slots []indexSlot
	shift uint // 64 - log2(len(slots))
	n     int
}

// indexSlot is one hash and its block + 1 (0: empty).
type indexSlot struct {
	hash  uint64
	block int32
}

func newBlockIndex(numBlocks int) blockIndex {
	bits := uint(4)
	for 1<<bits < 2*numBlocks {
		bits++
	}
	return blockIndex{slots: make([]indexSlot, 1<<bits), shift: 64 - bits}
}

func (x *blockIndex) home(hash uint64) int { return int((hash * 0x9e3779b97f4a7c15) >> x.shift) }

// find returns hash's slot, or the empty slot where it would go.
func (x *blockIndex) find(hash uint64) int {
	mask := len(x.slots) - 1
	for i := x.home(hash); ; i = (i + 1) & mask {
		if sl := &x.slots[i]; sl.block == 0 || sl.hash == hash {
			return i
		}
	}
}

// get returns hash's block, or noBlock.
func (x *blockIndex) get(hash uint64) int32 { return x.slots[x.find(hash)].block - 1 }

// putAt sets hash's block in slot i, find's answer for hash.
func (x *blockIndex) putAt(i int, hash uint64, b int32) {
	sl := &x.slots[i]
	if sl.block == 0 {
		x.n++
	}
	sl.hash, sl.block = hash, b+1
}

// delAt empties the occupied slot i, moving back the entries of its probe
// run that would no longer be found.
func (x *blockIndex) delAt(i int) {
	mask := len(x.slots) - 1
	x.n--
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		sl := x.slots[j]
		if sl.block == 0 {
			break
		}
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if h := x.home(sl.hash); (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			x.slots[i] = sl
			i = j
		}
	}
	x.slots[i] = indexSlot{}
}

// everSet is the record of a run's replicas of every block hash they ever
// cached: one probe answers both questions of the miss classification
// (cached on this replica before? computed on any?), where a Go map per
// replica and one for the farm took two lookups, and two more insertions
// per block cached. It is an open-addressing table with linear probing
// whose slot holds the hash and, up to 64 replicas, their bits: the
// sets grow to every distinct block of a run, far beyond the caches, so
// each lookup is a cache miss, and one slot is one miss.
type everSet struct {
	slots []everSlot
	n     int      // slots in use
	shift uint     // 64 - log2(len(slots))
	words int      // words of bits per hash: one bit per replica
	rows  []uint64 // words > 1: the bits of hash row i at [i*words, (i+1)*words)
}

// everSlot is one hash: val is its replicas' bits (words == 1) or its row
// + 1; 0 marks an empty slot (a hash is only added with a bit).
type everSlot struct {
	hash, val uint64
}

func newEverSet(replicas int) *everSet {
	const initial = 1 << 12
	return &everSet{slots: make([]everSlot, initial), shift: 64 - 12, words: (max(replicas, 1) + 63) / 64}
}

// slot returns the index of hash's slot, or of the empty slot where it
// would go.
func (e *everSet) slot(hash uint64) int {
	mask := len(e.slots) - 1
	i := int((hash * 0x9e3779b97f4a7c15) >> e.shift)
	for {
		sl := &e.slots[i]
		if sl.val == 0 || sl.hash == hash {
			return i
		}
		i = (i + 1) & mask
	}
}

// moveTo moves the hashes to slots, an empty table of a power of two
// slots, when it is larger than the one they are in.
func (e *everSet) moveTo(slots []everSlot) {
	if len(slots) <= len(e.slots) {
		return
	}
	old := e.slots
	e.slots, e.shift = slots, uint(64-bits.Len(uint(len(slots)-1)))
	for _, sl := range old {
		if sl.val != 0 {
			e.slots[e.slot(sl.hash)] = sl
		}
	}
}

// add records that replica rep cached hash.
func (e *everSet) add(hash uint64, rep int) {
	i := e.slot(hash)
	sl := &e.slots[i]
	if e.words == 1 {
		if sl.val == 0 {
			sl.hash = hash
			e.n++
		}
		sl.val |= 1 << rep
	} else {
		if sl.val == 0 {
			sl.hash = hash
			sl.val = uint64(len(e.rows)/e.words) + 1
			e.rows = append(e.rows, make([]uint64, e.words)...)
			e.n++
		}
		e.rows[int(sl.val-1)*e.words+rep/64] |= 1 << (rep % 64)
	}
	if 2*e.n > len(e.slots) {
		e.grow()
	}
}

// grow doubles the table.
func (e *everSet) grow() { e.moveTo(make([]everSlot, 2*len(e.slots))) }

// seen reports whether replica rep ever cached hash, and whether any
// replica did.
func (e *everSet) seen(hash uint64, rep int) (here, anywhere bool) {
	sl := e.slots[e.slot(hash)]
	switch {
	case sl.val == 0:
		return false, false
	case e.words == 1:
		return sl.val&(1<<rep) != 0, true
	}
	return e.rows[int(sl.val-1)*e.words+rep/64]&(1<<(rep%64)) != 0, true
}
