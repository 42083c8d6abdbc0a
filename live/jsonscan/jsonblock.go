package jsonscan

import (
	"math/bits"
	"unicode/utf8"
)

// The string scanner's block path. A coding agent's prompt is source code
// and tool output, with an escape every few bytes (a newline, a tab, a
// quote); scanning for each in turn costs several nanoseconds an escape.
// With a vector unit, blockMasks classifies 64 bytes at once into bit
// masks (bit i: byte i of the block) and strBlocks settles a whole block
// with a few word operations: which bytes are escaped, whether each escape
// is valid, where the string ends. Only \u escapes, rare in prompts, are
// checked one by one. At a fault strBlocks hands back to the
// word-at-a-time scanner (str), which finds and names it as before.

// blockBatch is how many blocks blockMasks classifies in one call.
const blockBatch = 8

// blockMask is a 64-byte block's masks, bit i for byte i: q '"', b '\\',
// c control bytes (< 0x20), v the bytes that may follow a backslash
// (escLen != 0), u 'u'.
type blockMask struct{ q, b, c, v, u uint64 }

// blockMasksGo is the reference for blockMasks: from off on, it skips the
// 64-byte blocks with no '"', '\\' or control byte, then classifies the
// first that has one and those after it, into out, up to blockBatch
// blocks or while 64 bytes remain. It returns the offset of the first
// block classified and how many were: none when fewer than 64 bytes
// remain past the skipped blocks, and next is then their offset.
func blockMasksGo(d []byte, off int, out *[blockBatch]blockMask) (next, n int) {
	classify := func(blk []byte) (m blockMask) {
		for i, ch := range blk {
			bit := uint64(1) << i
			switch {
			case ch == '"':
				m.q |= bit
			case ch == '\\':
				m.b |= bit
			case ch < 0x20:
				m.c |= bit
			}
			if escLen[ch] != 0 {
				m.v |= bit
			}
			if ch == 'u' {
				m.u |= bit
			}
		}
		return m
	}
	for ; off+64 <= len(d); off += 64 {
		if m := classify(d[off : off+64]); m.q|m.b|m.c != 0 {
			break
		}
	}
	next = off
	for ; n < blockBatch && off+64 <= len(d); off += 64 {
		out[n] = classify(d[off : off+64])
		n++
	}
	return next, n
}

const evenBits = 0x5555555555555555

// escaped returns the bytes of a block, other than backslashes, escaped by
// the backslash before them (the block starting outside an escape), and
// whether its last byte is a backslash that escapes the byte after the
// block. A backslash escapes the next byte when it is the first, third,
// ... of a run of backslashes, so a run of odd length escapes the byte
// after it (the escaped backslashes inside a run are valid escapes: there
// is nothing to check). Adding a run's first bit to the mask carries
// through the run to the byte after it; a run of odd length ends at the
// parity opposite to its start's.
func escaped(b uint64) (esc uint64, last bool) {
	starts := b &^ (b << 1)
	evenEnds := (b + starts&evenBits) &^ b
	oddEnds := (b + starts&^evenBits) &^ b
	esc = evenEnds&^evenBits | oddEnds&evenBits
	last = bits.LeadingZeros64(^b)&1 == 1 // a run of odd length reaching the last byte
	return esc, last
}

// strBlocks goes on with a string from s.pos (not inside an escape) a
// block at a time while 64 bytes remain. It returns done at the string's
// end; otherwise s.pos is where the word-at-a-time scan takes over: the
// tail, or the block holding a fault, which str then reports.
func (s *scanner) strBlocks() (done bool) {
	d := s.data
	p := s.pos
	var out [blockBatch]blockMask
	for {
		next, n := blockMasks(d, p, &out)
		if n == 0 {
			s.pos = next
			return false
		}
		carry := false // the block's first byte is escaped
		for i := range out[:n] {
			m := &out[i]
			p = next + 64*i
			b, esc := m.b, uint64(0)
			in := 0
			if carry {
				in = 1
				if b&1 != 0 {
					b &^= 1 // an escaped backslash: it starts no run
				} else {
					esc = 1
				}
			}
			e, last := escaped(b)
			esc |= e
			carry = last
			q := m.q &^ esc
			before := ^uint64(0) // the bytes before the end of the string
			if q != 0 {
				before = q&-q - 1
			}
			if (m.c|esc&^m.v)&before != 0 {
				s.pos = p - in
				return false
			}
			for u := esc & m.u & before; u != 0; u &= u - 1 {
				if !hex4(d, p+bits.TrailingZeros64(u)+1) {
					s.pos = p - in
					return false
				}
			}
			if q != 0 {
				s.pos = p + bits.TrailingZeros64(q) + 1
				return true
			}
		}
		p = next + 64*n
		if carry {
			p-- // start again at the backslash
		}
	}
}

// ValidUTF8 is utf8.Valid(d). A prompt is mostly ASCII: its ASCII runs
// are passed over 128 bytes at a time with AVX2 (asciiPrefix: about 160
// GB/s on 256 KiB bodies here, utf8.Valid 56), and utf8.Valid checks each
// stretch from a block holding a byte >= 0x80 to the next ASCII byte,
// which is a character boundary (no UTF-8 sequence holds one), then the
// runs go on. Where the block after such a stretch holds one too, the
// text is dense in multi-byte characters and utf8.Valid takes the rest
// at its own speed.
func ValidUTF8(d []byte) bool {
	for first := true; ; first = false {
		n := asciiPrefix(d)
		if len(d)-n < 128 || !blockScan || n == 0 && !first {
			return utf8.Valid(d[n:])
		}
		d = d[n:]
		j := 128
		for j < len(d) && d[j] >= 0x80 {
			j++
		}
		if !utf8.Valid(d[:j]) {
			return false
		}
		d = d[j:]
	}
}
