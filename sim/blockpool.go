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
	cached   map[uint64]int32 // hash -> first block that holds it

	// ever records every hash ever cached on any replica of the run, and on
	// which (everID is this pool's replica); it tells an evicted miss from
	// one computed only elsewhere or never (miss classification). nil: not
	// tracked (a long-running EngineReplica), misses then read as cold.
	ever   *everSet
	everID int
	// evictions counts cached blocks dropped by allocation.
	evictions int64
}

// newBlockPool returns a pool of numBlocks blocks, block 0 being the null
// block. numBlocks must be at least 2.
func newBlockPool(numBlocks int) *blockPool {
	p := &blockPool{
		blocks:   make([]kvBlock, numBlocks),
		freeHead: noBlock,
		freeTail: noBlock,
		cached:   make(map[uint64]int32),
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
func (p *blockPool) lookup(hash uint64) int32 {
	b, ok := p.cached[hash]
	if !ok {
		return noBlock
	}
	return b
}

// cacheBlock puts block b in the prefix cache under hash. A block already
// cached is left alone (its hash never changes while it is held).
func (p *blockPool) cacheBlock(b int32, hash uint64) {
	blk := &p.blocks[b]
	if blk.hashed {
		return
	}
	blk.hash, blk.hashed, blk.dupNext = hash, true, noBlock
	if first, ok := p.cached[hash]; ok {
		last := first
		for p.blocks[last].dupNext != noBlock {
			last = p.blocks[last].dupNext
		}
		p.blocks[last].dupNext = b
	} else {
		p.cached[hash] = b
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
	first := p.cached[blk.hash]
	if first == b {
		if blk.dupNext == noBlock {
			delete(p.cached, blk.hash)
		} else {
			p.cached[blk.hash] = blk.dupNext
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
		if blk.ref == 0 && blk.inFree {
			p.unlink(b)
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
			p.pushTail(b)
		}
	}
}

// freeOrder appends the free queue, head first, to dst (tests and goldens).
func (p *blockPool) freeOrder(dst []int32) []int32 {
	for b := p.freeHead; b != noBlock; b = p.blocks[b].next {
		dst = append(dst, b)
	}
	return dst
}

// everSet is the record of a run's replicas of every block hash they ever
// cached: one map lookup answers both questions of the miss classification
// (cached on this replica before? computed on any?), where a set per
// replica and one for the farm took two, and cost two more insertions per
// block cached.
type everSet struct {
	row   map[uint64]int32 // hash -> its row of bits
	words int              // words per row: one bit per replica
	bits  []uint64
}

func newEverSet(replicas int) *everSet {
	return &everSet{row: make(map[uint64]int32), words: (max(replicas, 1) + 63) / 64}
}

// add records that replica rep cached hash.
func (e *everSet) add(hash uint64, rep int) {
	i, ok := e.row[hash]
	if !ok {
		i = int32(len(e.bits) / e.words)
		e.row[hash] = i
		for range e.words {
			e.bits = append(e.bits, 0)
		}
	}
	e.bits[int(i)*e.words+rep/64] |= 1 << (rep % 64)
}

// seen reports whether replica rep ever cached hash, and whether any
// replica did.
func (e *everSet) seen(hash uint64, rep int) (here, anywhere bool) {
	i, ok := e.row[hash]
	if !ok {
		return false, false
	}
	return e.bits[int(i)*e.words+rep/64]&(1<<(rep%64)) != 0, true
}
