package sim

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
	// watch, when set, is told of every block cached and evicted
	// (EngineReplica.WatchCache: the emulator's KV events).
	watch *CacheWatch
	// held, when set, records which replicas cache each hash now (heldID
	// is this pool's bit): the run's placement.HeldIndex (routing.go).
	held   *heldIndex
	heldID int
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
	}
	p.cached = newBlockIndex(p.blocks)
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
	if i := p.cached.find(hash); p.cached.slots[i] != 0 {
		last := p.cached.blockAt(i)
		for p.blocks[last].dupNext != noBlock {
			last = p.blocks[last].dupNext
		}
		p.blocks[last].dupNext = b
	} else {
		p.cached.putAt(i, hash, b)
		if p.held != nil {
			p.held.add(hash, p.heldID)
		}
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
	if first := p.cached.blockAt(i); first == b {
		if blk.dupNext == noBlock {
			p.cached.delAt(i)
			if p.held != nil {
				p.held.remove(blk.hash, p.heldID)
			}
		} else {
			p.cached.setBlockAt(i, blk.dupNext)
		}
	} else {
		prev := first
		for p.blocks[prev].dupNext != b {
			prev = p.blocks[prev].dupNext
		}
		p.blocks[prev].dupNext = blk.dupNext
	}
	if p.watch != nil {
		p.watch.Removed(blk.hash)
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
//
// A slot is 8 bytes: 32 bits of the hash's mix (its fingerprint, whose
// leading bits are also its home slot) and the block + 1. The full hash is
// the block's own (kvBlock.hash), read only when a fingerprint matches, on
// a block that the caller reads next anyway (lookup touches it, cacheBlock
// and evict hold it): half the memory of a slot holding the hash, so twice
// the slots per cache line and per page, for a table that the lookups of
// every prompt walk at random (the most time a plan's simulations take).
type blockIndex struct {
	slots  []uint64 // fingerprint<<32 | block+1; 0: empty
	shift  uint     // 64 - log2(len(slots))
	n      int
	blocks []kvBlock // the pool's blocks, whose hash a slot's block holds
}

// newBlockIndex returns the index of a pool of blocks.
func newBlockIndex(blocks []kvBlock) blockIndex {
	bits := uint(4)
	for 1<<bits < 2*len(blocks) {
		bits++
	}
	return blockIndex{slots: make([]uint64, 1<<bits), shift: 64 - bits, blocks: blocks}
}

// fpMask keeps a slot's fingerprint.
const fpMask uint64 = 0xffffffff00000000

// mix spreads hash over 64 bits: its top 32 are the fingerprint, and the
// top log2(len(slots)) of those the home slot.
func mix(hash uint64) uint64 { return hash * 0x9e3779b97f4a7c15 }

// homeOf is the home slot of a slot's entry, from its fingerprint.
func (x *blockIndex) homeOf(slot uint64) int { return int(slot >> x.shift) }

// find returns hash's slot, or the empty slot where it would go.
func (x *blockIndex) find(hash uint64) int {
	mask := len(x.slots) - 1
	m := mix(hash)
	fp := m & fpMask
	for i := int(m >> x.shift); ; i = (i + 1) & mask {
		sl := x.slots[i]
		if sl == 0 || (sl&fpMask == fp && x.blocks[uint32(sl)-1].hash == hash) {
			return i
		}
	}
}

// blockAt is slot i's block, noBlock when it is empty.
func (x *blockIndex) blockAt(i int) int32 { return int32(uint32(x.slots[i])) - 1 }

// get returns hash's block, or noBlock.
func (x *blockIndex) get(hash uint64) int32 { return x.blockAt(x.find(hash)) }

// putAt sets hash's block in slot i, find's answer for hash; block b
// holds hash.
func (x *blockIndex) putAt(i int, hash uint64, b int32) {
	if x.slots[i] == 0 {
		x.n++
	}
	x.slots[i] = mix(hash)&fpMask | uint64(uint32(b+1))
}

// setBlockAt makes block b, which holds the same hash, slot i's block.
func (x *blockIndex) setBlockAt(i int, b int32) {
	x.slots[i] = x.slots[i]&fpMask | uint64(uint32(b+1))
}

// delAt empties the occupied slot i, moving back the entries of its probe
// run that would no longer be found.
func (x *blockIndex) delAt(i int) {
	mask := len(x.slots) - 1
	x.n--
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		sl := x.slots[j]
		if sl == 0 {
			break
		}
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if h := x.homeOf(sl); (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			x.slots[i] = sl
			i = j
		}
	}
	x.slots[i] = 0
}
