package traces

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// parseFast decodes a request line written the way Writer writes it (and
// most tools do): one object of known keys, integer numbers, strings
// without escapes, arrays of unsigned integers. It fills r exactly as
// encoding/json would (keys in order, the last of a duplicate winning, an
// array replacing the slice's contents) and reports true; on anything else
// (another key spelling, an escape, a float, null, bad syntax) it reports
// false, leaving r partly filled, and the caller decodes the line with
// encoding/json, whose errors name the field. A trace of long prompts is
// mostly hash ids, which encoding/json reads an order of magnitude slower.
//
// memo, when not nil, remembers the hash-id arrays of the lines parsed
// with it (see idMemo).
func parseFast(line []byte, r *Request, memo *idMemo) bool {
	p := fastParser{b: line, memo: memo}
	p.ws()
	if !p.byte('{') {
		return false
	}
	p.ws()
	if p.byte('}') {
		return p.end()
	}
	for {
		key, ok := p.str()
		if !ok {
			return false
		}
		p.ws()
		if !p.byte(':') {
			return false
		}
		p.ws()
		switch string(key) {
		case "t_ms":
			ok = p.int64(&r.ArrivalMs)
		case "think_ms":
			ok = p.int64(&r.ThinkMs)
		case "turn":
			ok = p.int(&r.Turn)
		case "prompt_tokens":
			ok = p.int(&r.PromptTokens)
		case "output_tokens":
			ok = p.int(&r.OutputTokens)
		case "cached_tokens":
			ok = p.int(&r.CachedTokens)
		case "replica":
			ok = p.int(&r.Replica)
		case "session":
			ok = p.string(&r.Session)
		case "parent":
			ok = p.string(&r.Parent)
		case "model":
			ok = p.string(&r.Model)
		case "hash_ids":
			r.HashIDs, ok = p.uints(r.HashIDs)
		case "output_hash_ids":
			r.OutputHashIDs, ok = p.uints(r.OutputHashIDs)
		default:
			return false // unknown, or a spelling encoding/json matches case-insensitively
		}
		if !ok {
			return false
		}
		p.ws()
		if p.byte('}') {
			return p.end()
		}
		if !p.byte(',') {
			return false
		}
		p.ws()
	}
}

type fastParser struct {
	b    []byte
	i    int
	memo *idMemo
}

// idMemo holds the hash-id arrays of recent lines, as written and as read,
// by their first id. Requests that share a prefix repeat its ids line
// after line (a system prompt, the earlier turns of a conversation), and
// comparing the text with a line before is an order of magnitude faster
// than reading the numbers again: the ids up to the last comma of the
// text both lines share are those read before.
type idMemo struct {
	// Two ways for each of 32 sets, the set by the first id (hashed): a
	// trace's few shared prefixes rarely meet three in a set.
	slots [64]idMemoSlot
	tick  uint64
}

type idMemoSlot struct {
	raw  []byte   // an array's text, from its first id up to its closing bracket
	ids  []uint64 // what it reads as
	used uint64   // the memo's tick when it was last found or written
}

// find returns the slot that holds an array starting with the id first,
// or nil and the slot to write one in (of its set's two, the one used
// least recently).
func (m *idMemo) find(first uint64) (hit, victim *idMemoSlot) {
	m.tick++
	set := m.slots[2*((first*0x9e3779b97f4a7c15)>>59):][:2]
	for i := range set {
		if sl := &set[i]; len(sl.ids) > 0 && sl.ids[0] == first {
			sl.used = m.tick
			return sl, sl
		}
	}
	if set[1].used < set[0].used {
		return nil, &set[1]
	}
	return nil, &set[0]
}

// idMemoMin is the fewest ids an array must hold to be remembered.
const idMemoMin = 8

// commonPrefix returns the length of the common prefix of a and b: 64
// bytes at a time (bytes.Equal is the runtime's vector compare), then one
// at a time.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	a, b = a[:n], b[:n]
	i := 0
	for i+64 <= n && bytes.Equal(a[i:i+64], b[i:i+64]) {
		i += 64
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// ws skips JSON white space.
func (p *fastParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *fastParser) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// end reports whether only white space follows.
func (p *fastParser) end() bool {
	p.ws()
	return p.i == len(p.b)
}

// str reads a string without escapes or control characters, in valid
// UTF-8 (what encoding/json would keep byte for byte).
func (p *fastParser) str() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			return s, utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

func (p *fastParser) string(dst *string) bool {
	s, ok := p.str()
	if ok {
		*dst = string(s)
	}
	return ok
}

// digits reads a JSON integer: an optional minus (when signed), then 0 or
// a non-zero digit followed by digits, with no fraction or exponent.
func (p *fastParser) digits(signed bool) ([]byte, bool) {
	start := p.i
	if signed && p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	first := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	n := p.i - first
	if n == 0 || (n > 1 && p.b[first] == '0') {
		return nil, false
	}
	if p.i < len(p.b) {
		switch p.b[p.i] {
		case '.', 'e', 'E':
			return nil, false
		}
	}
	return p.b[start:p.i], true
}

func (p *fastParser) int64(dst *int64) bool {
	d, ok := p.digits(true)
	if !ok {
		return false
	}
	v, err := strconv.ParseInt(string(d), 10, 64)
	if err != nil {
		return false
	}
	*dst = v
	return true
}

func (p *fastParser) int(dst *int) bool {
	d, ok := p.digits(true)
	if !ok {
		return false
	}
	v, err := strconv.ParseInt(string(d), 10, strconv.IntSize)
	if err != nil {
		return false
	}
	*dst = int(v)
	return true
}

// uints reads an array of unsigned integers into dst[:0], as encoding/json
// decodes an array into a slice (an empty array gives an empty, non-nil
// slice).
func (p *fastParser) uints(dst []uint64) ([]uint64, bool) {
	if !p.byte('[') {
		return dst, false
	}
	dst = dst[:0]
	if dst == nil {
		dst = []uint64{}
	}
	p.ws()
	if p.byte(']') {
		return dst, true
	}
	first, remembered, reused := p.i, (*idMemoSlot)(nil), 0
	for {
		start := p.i
		var v uint64
		var ok bool
		if p.i+24 <= len(p.b) {
			var n int
			v, n, ok = uintWords(p.b[p.i : p.i+24])
			p.i += n
		} else {
			v, ok = p.uintBytes()
		}
		if !ok {
			return dst, false
		}
		if n := p.i - start; n == 0 || (n > 1 && p.b[start] == '0') {
			return dst, false
		}
		dst = append(dst, v)
		if len(dst) == 1 && p.memo != nil {
			// The ids another line shares with this one, read before: those
			// followed by a comma inside the common text.
			sl, victim := p.memo.find(v)
			remembered = victim // this array replaces the slot's when it is read
			if sl != nil {
				if shared := sl.raw[:commonPrefix(sl.raw, p.b[first:])]; len(shared) > 0 {
					if n := bytes.Count(shared, comma); n > 1 {
						dst = append(dst[:0], sl.ids[:n]...)
						p.i = first + bytes.LastIndexByte(shared, ',') + 1
						p.ws()
						reused = n
						continue
					}
				}
			}
		}
		if p.i < len(p.b) {
			switch p.b[p.i] {
			case ',':
				p.i++
				if p.i < len(p.b) && p.b[p.i]-'0' > 9 {
					p.ws()
				}
				continue
			case ']':
				p.remember(remembered, first, dst, reused)
				p.i++
				return dst, true
			}
		}
		// Anything else after the digits: white space, or not an integer
		// (a fraction, an exponent), or bad syntax.
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.remember(remembered, first, dst, reused)
			p.i++
			return dst, true
		}
		if !p.byte(',') {
			return dst, false
		}
		p.ws()
	}
}

var comma = []byte{','}

// remember keeps the array just read, from first up to the closing
// bracket at p.i, and its ids in the memo's slot sl (nil: none), unless
// the first reused ids, taken from the slot, are three quarters of it or
// more: the slot then serves the next line about as well (the same
// prefix, another tail) and is not copied again; a line that extends it
// further (a conversation's next turn) replaces it.
func (p *fastParser) remember(sl *idMemoSlot, first int, ids []uint64, reused int) {
	if sl == nil || len(ids) < idMemoMin || 4*reused >= 3*len(ids) {
		return
	}
	sl.raw = append(sl.raw[:0], p.b[first:p.i]...)
	sl.ids = append(sl.ids[:0], ids...)
	sl.used = p.memo.tick
}

// pow10 are the powers of ten up to 10^8.
var pow10 = [9]uint64{1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000}

// uintWords reads the digits at the start of b (24 bytes or more), eight
// bytes at a time, and returns their value and count. It reports false on
// more than 20 digits or a value past 2^64-1; no digit at all is 0 digits.
func uintWords(b []byte) (v uint64, n int, ok bool) {
	b = b[:24]
	x := binary.LittleEndian.Uint64(b)
	n = leadingDigits(x)
	if n < 8 {
		return parseEight(x << (64 - 8*n)), n, true // the digits moved to the top, zeros below
	}
	v = parseEight(x)
	x = binary.LittleEndian.Uint64(b[8:])
	n = leadingDigits(x)
	if n < 8 {
		return v*pow10[n] + parseEight(x<<(64-8*n)), 8 + n, true
	}
	v = v*1e8 + parseEight(x)
	x = binary.LittleEndian.Uint64(b[16:])
	n = leadingDigits(x)
	if n > 4 {
		return 0, 0, false // 21 digits or more
	}
	hi, lo := bits.Mul64(v, pow10[n]) // v < 10^16: only 20 digits may overflow
	sum, carry := bits.Add64(lo, parseEight(x<<(64-8*n)), 0)
	if hi != 0 || carry != 0 {
		return 0, 0, false
	}
	return sum, 16 + n, true
}

// uintBytes reads the digits at p.i one byte at a time, near the end of
// the line, as uintWords does.
func (p *fastParser) uintBytes() (uint64, bool) {
	start := p.i
	var v uint64
	for p.i < len(p.b) && p.i-start < 19 {
		c := p.b[p.i] - '0'
		if c > 9 {
			return v, true
		}
		v = v*10 + uint64(c)
		p.i++
	}
	if p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		// A 20th digit: it may overflow; a 21st always does.
		d := uint64(p.b[p.i] - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
		p.i++
		if p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			return 0, false
		}
	}
	return v, true
}

// leadingDigits returns how many of the eight bytes of x (little-endian:
// the first byte low) are ASCII digits before the first that is not.
// Subtracting '0' from each byte leaves a digit at 0 to 9; a byte below
// '0' wraps to 0x80 or more, one above '9' reaches 0x80 once 0x76 is
// added; the borrows and carries only move up, past the first non-digit.
func leadingDigits(x uint64) int {
	const zeros, sevens, highs = 0x3030303030303030, 0x7676767676767676, 0x8080808080808080
	d := x - zeros
	return bits.TrailingZeros64((d|(d+sevens))&highs) >> 3
}

// parseEight is the value of eight ASCII digits loaded little-endian (the
// first digit in the low byte): pairs, then quads, then the eight.
func parseEight(x uint64) uint64 {
	x = (x & 0x0f0f0f0f0f0f0f0f) * (10<<8 + 1) >> 8
	x = (x & 0x00ff00ff00ff00ff) * (100<<16 + 1) >> 16
	return (x & 0x0000ffff0000ffff) * (10000<<32 + 1) >> 32
}
