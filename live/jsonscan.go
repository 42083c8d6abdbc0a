package live

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
)

// The proxy must validate a request body as JSON and read a handful of its
// top-level fields, without re-encoding it and without paying
// encoding/json's byte-at-a-time scanner on prompts of hundreds of
// kilobytes (about 1 ms per 256 KB). scanBody does both in one pass: a
// strict RFC 8259 validator whose string scanning looks at 8 bytes at a
// time, which hands only the values of the wanted top-level keys to
// encoding/json. Keys match exactly (case-sensitive, as vLLM's pydantic
// models do); a duplicate key's last value wins. UTF-8 is checked by the
// caller (utf8.Valid) before.

// maxJSONDepth bounds nesting, as encoding/json does.
const maxJSONDepth = 10000

// syntaxError is a malformed body, with the byte offset of the fault.
type syntaxError struct {
	off int64
	msg string
}

func (e *syntaxError) Error() string {
	return fmt.Sprintf("malformed JSON at byte %d: %s", e.off, e.msg)
}

type scanner struct {
	data []byte
	pos  int
}

func (s *scanner) fail(msg string) error { return &syntaxError{off: int64(s.pos), msg: msg} }

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// scanBody validates data as one JSON object and decodes the fields of
// body from it.
func scanBody(data []byte) (body, error) {
	var b body
	var fieldErr error
	s := &scanner{data: data}
	s.ws()
	if s.pos >= len(data) || data[s.pos] != '{' {
		return b, s.fail("want a JSON object")
	}
	s.pos++
	s.ws()
	if s.pos < len(data) && data[s.pos] == '}' {
		s.pos++
	} else {
		for {
			s.ws()
			keyStart := s.pos
			if err := s.str(); err != nil {
				return b, err
			}
			key := data[keyStart+1 : s.pos-1]
			s.ws()
			if s.pos >= len(data) || data[s.pos] != ':' {
				return b, s.fail("want ':' after an object key")
			}
			s.pos++
			s.ws()
			valStart := s.pos
			if err := s.value(1); err != nil {
				return b, err
			}
			if err := b.set(key, data[valStart:s.pos]); err != nil && fieldErr == nil {
				fieldErr = err // reported once the whole body is known to be JSON
			}
			s.ws()
			if s.pos >= len(data) {
				return b, s.fail("unexpected end of input in an object")
			}
			if data[s.pos] == ',' {
				s.pos++
				continue
			}
			if data[s.pos] != '}' {
				return b, s.fail("want ',' or '}' in an object")
			}
			s.pos++
			break
		}
	}
	s.ws()
	if s.pos != len(data) {
		return b, s.fail("unexpected data after the top-level object")
	}
	return b, fieldErr
}

// set decodes one top-level value into b if key is a field the proxy needs.
func (b *body) set(key, raw []byte) error {
	var dst any
	switch string(key) {
	case "model":
		dst = &b.Model
	case "stream":
		dst = &b.Stream
	case "metadata":
		dst = &b.Metadata
	case "prompt_cache_key":
		dst = &b.PromptCacheKey
	case "user":
		dst = &b.User
	default:
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := string(key)
			if te.Field != "" {
				field += "." + te.Field
			}
			return fmt.Errorf("field %s: want a %s, got a JSON %s", field, te.Type, te.Value)
		}
		return fmt.Errorf("field %s: %v", key, err)
	}
	return nil
}

// value skips one JSON value, validating it.
func (s *scanner) value(depth int) error {
	if depth > maxJSONDepth {
		return s.fail("nested too deeply")
	}
	if s.pos >= len(s.data) {
		return s.fail("unexpected end of input, want a value")
	}
	switch c := s.data[s.pos]; {
	case c == '"':
		return s.str()
	case c == '{':
		s.pos++
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == '}' {
			s.pos++
			return nil
		}
		for {
			s.ws()
			if err := s.str(); err != nil {
				return err
			}
			s.ws()
			if s.pos >= len(s.data) || s.data[s.pos] != ':' {
				return s.fail("want ':' after an object key")
			}
			s.pos++
			s.ws()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.ws()
			if s.pos >= len(s.data) {
				return s.fail("unexpected end of input in an object")
			}
			if s.data[s.pos] == '}' {
				s.pos++
				return nil
			}
			if s.data[s.pos] != ',' {
				return s.fail("want ',' or '}' in an object")
			}
			s.pos++
		}
	case c == '[':
		s.pos++
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == ']' {
			s.pos++
			return nil
		}
		for {
			s.ws()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.ws()
			if s.pos >= len(s.data) {
				return s.fail("unexpected end of input in an array")
			}
			if s.data[s.pos] == ']' {
				s.pos++
				return nil
			}
			if s.data[s.pos] != ',' {
				return s.fail("want ',' or ']' in an array")
			}
			s.pos++
		}
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	}
	return s.fail(fmt.Sprintf("unexpected character %q", s.data[s.pos]))
}

func (s *scanner) literal(lit string) error {
	if len(s.data)-s.pos < len(lit) || string(s.data[s.pos:s.pos+len(lit)]) != lit {
		return s.fail("invalid literal, want " + lit)
	}
	s.pos += len(lit)
	return nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (s *scanner) digits() bool {
	start := s.pos
	for s.pos < len(s.data) && isDigit(s.data[s.pos]) {
		s.pos++
	}
	return s.pos > start
}

func (s *scanner) number() error {
	d := s.data
	if d[s.pos] == '-' {
		s.pos++
	}
	switch {
	case s.pos < len(d) && d[s.pos] == '0':
		s.pos++
	case s.pos < len(d) && d[s.pos] >= '1' && d[s.pos] <= '9':
		s.digits()
	default:
		return s.fail("invalid number")
	}
	if s.pos < len(d) && d[s.pos] == '.' {
		s.pos++
		if !s.digits() {
			return s.fail("invalid number: want digits after '.'")
		}
	}
	if s.pos < len(d) && (d[s.pos] == 'e' || d[s.pos] == 'E') {
		s.pos++
		if s.pos < len(d) && (d[s.pos] == '+' || d[s.pos] == '-') {
			s.pos++
		}
		if !s.digits() {
			return s.fail("invalid number: want digits in the exponent")
		}
	}
	return nil
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special reports, as high bits, the bytes of an 8-byte word that are '"',
// '\\' or a control character (< 0x20). Bytes >= 0x80 never match.
func special(w uint64) uint64 {
	hasZero := func(x uint64) uint64 { return (x - lsb) &^ x & msb }
	quote := hasZero(w ^ (lsb * '"'))
	bslash := hasZero(w ^ (lsb * '\\'))
	ctrl := (w - lsb*0x20) &^ w & msb
	return quote | bslash | ctrl
}

// str skips a string starting at s.pos (which must be '"'), validating
// escapes and rejecting raw control characters.
func (s *scanner) str() error {
	d := s.data
	if s.pos >= len(d) || d[s.pos] != '"' {
		return s.fail("want a string")
	}
	s.pos++
	for {
		// Fast path: 8 bytes at a time until a byte that needs a look.
		for s.pos+8 <= len(d) {
			m := special(binary.LittleEndian.Uint64(d[s.pos:]))
			if m == 0 {
				s.pos += 8
				continue
			}
			// The lowest flagged byte is exact; bytes above it may be false
			// positives of the borrow, so only the first one is trusted.
			s.pos += bits.TrailingZeros64(m) / 8
			break
		}
		if s.pos >= len(d) {
			return s.fail("unterminated string")
		}
		switch c := d[s.pos]; {
		case c == '"':
			s.pos++
			return nil
		case c == '\\':
			s.pos++
			if s.pos >= len(d) {
				return s.fail("unterminated escape")
			}
			switch d[s.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos++
			case 'u':
				if len(d)-s.pos < 5 {
					return s.fail("short \\u escape")
				}
				for _, h := range d[s.pos+1 : s.pos+5] {
					if !(isDigit(h) || (h|0x20) >= 'a' && (h|0x20) <= 'f') {
						return s.fail("invalid \\u escape")
					}
				}
				s.pos += 5
			default:
				return s.fail("invalid escape")
			}
		case c < 0x20:
			return s.fail("control character in a string")
		default:
			s.pos++
		}
	}
}
