package traces

// Block hashing. A block id is a 64-bit hash that chains the id of the block
// before it with a description of the block's content, so that equal ids mean
// equal content at an equal prefix, as vLLM's prefix cache hashes blocks.
// The hash is not cryptographic: a mixing function (splitmix64's finalizer)
// applied word by word. Collisions among a few billion ids are negligible.

// rootParent is the "parent id" of the first block of every prompt.
const rootParent uint64 = 0x6c6d2d77617264 // "lm-ward"

// mix64 is splitmix64's finalizer: a bijective avalanche of 64 bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// hasher absorbs 64-bit words in order; the result depends on every word and
// on their order.
type hasher struct{ h uint64 }

func newHasher(parent uint64) hasher { return hasher{h: mix64(parent + 0x9e3779b97f4a7c15)} }

func (h *hasher) add(w uint64) { h.h = mix64(h.h ^ mix64(w+0x9e3779b97f4a7c15)) }

func (h *hasher) sum() uint64 { return mix64(h.h ^ 0x5bd1e9955bd1e995) }

// hashWords hashes a short fixed list of words (segment ids and the like).
func hashWords(words ...uint64) uint64 {
	h := newHasher(0x7365676d656e74) // "segment"
	for _, w := range words {
		h.add(w)
	}
	return h.sum()
}

// piece is the part of one content segment that lies in one block:
// tokens [off, off+n) of segment seg.
type piece struct {
	seg uint64
	off int
	n   int
}

// blockID hashes a block made of pieces, chained to its parent block id.
// A partial block (pieces summing to less than the block size) hashes
// differently from any full block because the lengths are part of the input.
func blockID(parent uint64, pieces []piece) uint64 {
	h := newHasher(parent)
	for _, p := range pieces {
		h.add(p.seg)
		h.add(uint64(p.off))
		h.add(uint64(p.n))
	}
	h.add(uint64(len(pieces)))
	return h.sum()
}

// blockChain hashes a growing token stream made of segments, block by block,
// incrementally: appending a segment hashes only the blocks it touches.
// It keeps the ids of the full blocks (O(blocks) memory) and the pieces of
// the trailing partial block.
type blockChain struct {
	size    int      // tokens per block
	full    []uint64 // ids of the full blocks, in order
	pending []piece  // pieces of the trailing partial block
	fill    int      // tokens in the trailing partial block
}

func (c *blockChain) parent() uint64 {
	if len(c.full) == 0 {
		return rootParent
	}
	return c.full[len(c.full)-1]
}

// tokens is the number of tokens appended so far.
func (c *blockChain) tokens() int { return len(c.full)*c.size + c.fill }

// appendSegment appends n tokens of segment seg (offsets 0..n-1).
func (c *blockChain) appendSegment(seg uint64, n int) {
	off := 0
	for n > 0 {
		take := min(c.size-c.fill, n)
		c.pending = append(c.pending, piece{seg: seg, off: off, n: take})
		c.fill += take
		off += take
		n -= take
		if c.fill == c.size {
			c.full = append(c.full, blockID(c.parent(), c.pending))
			c.pending = c.pending[:0]
			c.fill = 0
		}
	}
}

// appendIDs appends the ids of all blocks, the trailing partial one included,
// to dst: ceil(tokens/size) ids.
func (c *blockChain) appendIDs(dst []uint64) []uint64 {
	dst = append(dst, c.full...)
	if c.fill > 0 {
		dst = append(dst, blockID(c.parent(), c.pending))
	}
	return dst
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int) int { return (a + b - 1) / b }
