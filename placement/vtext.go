package placement

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// The prompt as text: the rule of doc.go, "The prompt as text". A peer that
// reads characters (SGLang's and Ray's radix trees, production-stack's
// 128-character chunks) or pseudo-tokens of 4 bytes (llm-d, AIBrix) reads
// this text. It is never built byte by byte: a vtext describes it as
// pieces of blocks, and two pieces with the same block id and offset are
// the same bytes, so comparing and hashing work on pieces (one per block)
// and look at single bytes only where two different blocks meet.

// TextBytesPerToken is the number of text bytes per token: 4, as llm-d's
// estimate tokenizer packs them (tokenizer/estimate.go bytesPerToken) and
// as the proxy's canonical text counts them (traces.TextBytesPerToken).
const TextBytesPerToken = 4

// textPiece is n bytes of block id's text from byte off.
type textPiece struct {
	id  uint64
	off int32
	n   int32
}

// vtext is a text as pieces of block texts, in order.
type vtext []textPiece

// textByte is byte off of the text of the block whose id is id: byte
// off%8 of mix64(id + (off/8+1) x golden). Equal ids give equal text;
// different ids give independent bytes.
func textByte(id uint64, off int32) byte {
	w := mix64(id + uint64(off/8+1)*0x9e3779b97f4a7c15)
	return byte(w >> (8 * uint(off%8)))
}

// appendPromptText appends p's text (the first tokens tokens of its
// blocks, TextBytesPerToken bytes each) to dst.
func appendPromptText(dst vtext, p *Prompt, tokens int) vtext {
	for j, id := range p.Blocks {
		n := p.blockLen(j, tokens)
		if n <= 0 {
			break
		}
		dst = append(dst, textPiece{id: id, n: int32(n * TextBytesPerToken)})
	}
	return dst
}

// size is the text's length in bytes.
func (t vtext) size() int {
	n := 0
	for _, p := range t {
		n += int(p.n)
	}
	return n
}

// first is the text's first byte; t must not be empty.
func (t vtext) first() byte { return textByte(t[0].id, t[0].off) }

// cursor is a position in a vtext: byte o of piece i.
type cursor struct {
	t vtext
	i int
	o int32
}

// done reports whether the cursor is at the end of its text.
func (c *cursor) done() bool { return c.i >= len(c.t) }

// first is the byte at the cursor; the cursor must not be done.
func (c *cursor) first() byte { p := c.t[c.i]; return textByte(p.id, p.off+c.o) }

// advance moves the cursor k bytes on.
func (c *cursor) advance(k int) {
	for k > 0 && c.i < len(c.t) {
		r := int(c.t[c.i].n - c.o)
		if k < r {
			c.o += int32(k)
			return
		}
		k -= r
		c.i, c.o = c.i+1, 0
	}
}

// rest copies the text from the cursor to the end.
func (c *cursor) rest() vtext {
	if c.done() {
		return nil
	}
	out := make(vtext, 0, len(c.t)-c.i)
	p := c.t[c.i]
	out = append(out, textPiece{id: p.id, off: p.off + c.o, n: p.n - c.o})
	return append(out, c.t[c.i+1:]...)
}

// shared is the number of leading bytes that the text from the cursor
// and b have in common.
func (c *cursor) shared(b vtext) int {
	n := 0
	i, oa := c.i, c.o
	j, ob := 0, int32(0)
	a := c.t
	for i < len(a) && j < len(b) {
		pa, pb := a[i], b[j]
		step := min(pa.n-oa, pb.n-ob)
		if pa.id != pb.id || pa.off+oa != pb.off+ob {
			for k := range step {
				if textByte(pa.id, pa.off+oa+k) != textByte(pb.id, pb.off+ob+k) {
					return n + int(k)
				}
			}
		}
		n += int(step) // the same bytes
		oa += step
		ob += step
		if oa == pa.n {
			i, oa = i+1, 0
		}
		if ob == pb.n {
			j, ob = j+1, 0
		}
	}
	return n
}

// sharedPrefix is the number of leading bytes a and b have in common.
func sharedPrefix(a, b vtext) int {
	c := cursor{t: a}
	return c.shared(b)
}

// split returns t's first k bytes and the rest, as new slices that share
// no memory with t (tree nodes keep them).
func (t vtext) split(k int) (head, tail vtext) {
	rest := int32(k)
	for i, p := range t {
		if rest >= p.n {
			rest -= p.n
			continue
		}
		head = append(make(vtext, 0, i+1), t[:i]...)
		if rest > 0 {
			head = append(head, textPiece{id: p.id, off: p.off, n: rest})
		}
		tail = make(vtext, 0, len(t)-i)
		tail = append(tail, textPiece{id: p.id, off: p.off + rest, n: p.n - rest})
		tail = append(tail, t[i+1:]...)
		return head, tail
	}
	return append(vtext(nil), t...), nil
}

// chunkHashes calls f with the hash of each chunk of size bytes of t, in
// order; the last chunk may be shorter. A chunk's hash is xxhash64 over
// the pieces that cover it (block id, offset and length, little endian):
// chunks of equal text at an equal prefix hash alike, as the peers' hashes
// of the bytes do (the hash decides placement only; it is never compared
// with a peer's own). f returns false to stop.
func chunkHashes(t vtext, size int, f func(h uint64) bool) {
	var d xxhash.Digest
	var buf [16]byte
	d.Reset()
	fill := 0
	for _, p := range t {
		off, n := p.off, int(p.n)
		for n > 0 {
			take := min(n, size-fill)
			binary.LittleEndian.PutUint64(buf[:8], p.id)
			binary.LittleEndian.PutUint32(buf[8:12], uint32(off))
			binary.LittleEndian.PutUint32(buf[12:], uint32(take))
			_, _ = d.Write(buf[:])
			fill += take
			off += int32(take)
			n -= take
			if fill == size {
				if !f(d.Sum64()) {
					return
				}
				d.Reset()
				fill = 0
			}
		}
	}
	if fill > 0 {
		f(d.Sum64())
	}
}
