package traces

import (
	"encoding/binary"
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
func parseFast(line []byte, r *Request) bool {
	p := fastParser{b: line}
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
	b []byte
	i int
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
	for {
		start := p.i
		var v uint64
		// Eight digits at a time, twice at most, then one at a time: 19
		// digits never overflow.
		for p.i+8 <= len(p.b) && p.i-start <= 8 {
			x := binary.LittleEndian.Uint64(p.b[p.i:])
			if !eightDigits(x) {
				break
			}
			v = v*1e8 + parseEight(x)
			p.i += 8
		}
		for p.i < len(p.b) && p.i-start < 19 {
			c := p.b[p.i] - '0'
			if c > 9 {
				break
			}
			v = v*10 + uint64(c)
			p.i++
		}
		if p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			// A 20th digit: it may overflow; a 21st always does.
			d := uint64(p.b[p.i] - '0')
			if v > (1<<64-1-d)/10 {
				return dst, false
			}
			v = v*10 + d
			p.i++
			if p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
				return dst, false
			}
		}
		n := p.i - start
		if n == 0 || (n > 1 && p.b[start] == '0') {
			return dst, false
		}
		if p.i < len(p.b) {
			switch p.b[p.i] {
			case '.', 'e', 'E':
				return dst, false
			}
		}
		dst = append(dst, v)
		p.ws()
		if p.byte(']') {
			return dst, true
		}
		if !p.byte(',') {
			return dst, false
		}
		p.ws()
	}
}

// eightDigits reports whether the eight bytes of x (little-endian) are all
// ASCII digits: each is 0x30 to 0x3f, and adding 6 keeps it below 0x40.
func eightDigits(x uint64) bool {
	const hi, thirties, sixes = 0xf0f0f0f0f0f0f0f0, 0x3030303030303030, 0x0606060606060606
	return x&hi == thirties && (x+sixes)&hi == thirties
}

// parseEight is the value of eight ASCII digits loaded little-endian (the
// first digit in the low byte): pairs, then quads, then the eight.
func parseEight(x uint64) uint64 {
	x = (x & 0x0f0f0f0f0f0f0f0f) * (10<<8 + 1) >> 8
	x = (x & 0x00ff00ff00ff00ff) * (100<<16 + 1) >> 16
	return (x & 0x0000ffff0000ffff) * (10000<<32 + 1) >> 32
}
