package jsonscan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"unicode/utf8"
)

// The proxy must validate a request body as JSON and read a handful of its
// top-level fields, without re-encoding it and without paying
// encoding/json's byte-at-a-time scanner on prompts of hundreds of
// kilobytes (about 1 ms per 256 KB). Scan does both in one pass: a
// strict RFC 8259 validator whose string scanning takes 64 bytes at a time
// with AVX2 (jsonblock.go) or 8 without, which hands only the values of
// the wanted top-level keys to encoding/json. UTF-8 is checked by the
// caller (utf8.Valid) before.
//
// Keys are compared after unescaping, exactly (case-sensitive), as vLLM's
// pydantic models and Python's json do: "mod\u0065l" is "model", "Model" is
// not. A key the proxy reads (readKeyNames, and metadata.user_id) given
// twice is refused: Python keeps the last value, and a proxy that read
// another one would route by a model, or a session, that the backend does
// not serve. Other keys may repeat: the proxy has no view of them to
// disagree with.

// Body is the part of a request body the proxy decodes (Scan); every
// other field is skipped by the decoder without being stored.
type Body struct {
	Model          string    `json:"model"`
	Stream         bool      `json:"stream"`
	Metadata       *Metadata `json:"metadata"`
	PromptCacheKey string    `json:"prompt_cache_key"`
	User           string    `json:"user"`

	// fallback holds the raw values (slices of the request body, nil when
	// absent) of system, messages, instructions, input and prompt, in the
	// order of the Key* constants from KeySystem: what the fallback
	// session id hashes.
	fallback [numReadKeys - KeySystem][]byte
}

// Fallback returns the raw value (a slice of the request body, nil when
// absent) of one of the keys the fallback session id hashes: KeySystem,
// KeyMessages, KeyInstructions, KeyInput or KeyPrompt.
func (b *Body) Fallback(k int) []byte { return b.fallback[k-KeySystem] }

// Metadata is the part of Anthropic's metadata the proxy reads.
type Metadata struct {
	UserID string `json:"user_id"`
}

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
	// quote and bslash are the next '"' and '\\' at or after pos once
	// found (len(data): none), 0 before: the scan only moves forward, so
	// each byte is searched once for each, whatever the number of strings.
	quote, bslash int
	// blocks: long strings are scanned a block at a time (strBlocks).
	blocks bool
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

// Top-level keys the proxy reads: the fields of Body and the raw values
// the fallback session id hashes (Body.Fallback). Each may appear once.
const (
	keyModel = iota
	keyStream
	keyMetadata
	KeyPromptCacheKey
	keyUser
	KeySystem       // Anthropic
	KeyMessages     // chat, Anthropic
	KeyInstructions // Responses
	KeyInput        // Responses
	KeyPrompt       // completions
	numReadKeys
)

var readKeyNames = [numReadKeys]string{"model", "stream", "metadata", "prompt_cache_key", "user",
	"system", "messages", "instructions", "input", "prompt"}

// keyIndex returns the read-key index of an unescaped key, or -1.
func keyIndex(k string) int {
	switch k {
	case "model":
		return keyModel
	case "stream":
		return keyStream
	case "metadata":
		return keyMetadata
	case "prompt_cache_key":
		return KeyPromptCacheKey
	case "user":
		return keyUser
	case "system":
		return KeySystem
	case "messages":
		return KeyMessages
	case "instructions":
		return KeyInstructions
	case "input":
		return KeyInput
	case "prompt":
		return KeyPrompt
	}
	return -1
}

// readKey returns the read-key index of a validated object key (quoted,
// escapes as sent), or -1. A key without escapes is compared in place.
func readKey(quoted []byte) int {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') >= 0 {
		return keyIndex(unescapeKey(quoted))
	}
	if len(inner) > len("prompt_cache_key") {
		return -1
	}
	return keyIndex(string(inner))
}

// isKey reports whether a validated object key (quoted, escapes as sent)
// is name once unescaped.
func isKey(quoted []byte, name string) bool {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') >= 0 {
		return unescapeKey(quoted) == name
	}
	return string(inner) == name
}

// unescapeKey decodes a validated quoted key with escapes.
func unescapeKey(quoted []byte) string {
	var k string
	_ = json.Unmarshal(quoted, &k) // validated by str: cannot fail
	return k
}

// ErrDuplicateKey is wrapped by the error for a key the proxy reads given
// twice.
var ErrDuplicateKey = errors.New("duplicate key")

func duplicateKey(name string) error {
	return fmt.Errorf("%w %q: the proxy and the backend could read different values; send each key once", ErrDuplicateKey, name)
}

// Scan validates data as one JSON object and decodes the fields of
// body from it. A syntax error takes precedence over a field's error.
func Scan(data []byte) (Body, error) { return scanWith(data, blockScan) }

// scanWith is Scan with the block path on or off.
func scanWith(data []byte, blocks bool) (Body, error) {
	var b Body
	var fieldErr error
	var seen [numReadKeys]bool
	s := &scanner{data: data, blocks: blocks}
	s.ws()
	if s.pos >= len(data) || data[s.pos] != '{' {
		return b, s.fail("want a JSON object")
	}
	err := s.members(1, func(quotedKey, val []byte) {
		k := readKey(quotedKey)
		if k < 0 || fieldErr != nil {
			return
		}
		if seen[k] {
			fieldErr = duplicateKey(readKeyNames[k])
			return
		}
		seen[k] = true
		fieldErr = b.set(k, val)
	})
	if err != nil {
		return b, err
	}
	s.ws()
	if s.pos != len(data) {
		return b, s.fail("unexpected data after the top-level object")
	}
	return b, fieldErr
}

// MemberValue returns the raw value of the top-level member name of the
// JSON object data (the last, if it is sent twice, as encoding/json reads
// it), and false when data is not one valid object or has no such member.
// It reads a response's usage without decoding the rest of the answer.
func MemberValue(data []byte, name string) ([]byte, bool) {
	s := &scanner{data: data, blocks: blockScan}
	s.ws()
	if s.pos >= len(data) || data[s.pos] != '{' {
		return nil, false
	}
	var val []byte
	found := false
	if err := s.members(1, func(quotedKey, v []byte) {
		if isKey(quotedKey, name) {
			val, found = v, true
		}
	}); err != nil {
		return nil, false
	}
	if s.ws(); s.pos != len(data) {
		return nil, false
	}
	return val, found
}

// members scans the object at s.pos (which must be '{'), calling visit with
// each member's key (quoted, escapes as sent) and raw value, in order;
// depth is that of the values. visit == nil only validates.
func (s *scanner) members(depth int, visit func(quotedKey, val []byte)) error {
	d := s.data
	s.pos++
	s.ws()
	if s.pos < len(d) && d[s.pos] == '}' {
		s.pos++
		return nil
	}
	for {
		s.ws()
		keyStart := s.pos
		if err := s.str(); err != nil {
			return err
		}
		keyEnd := s.pos
		s.ws()
		if s.pos >= len(d) || d[s.pos] != ':' {
			return s.fail("want ':' after an object key")
		}
		s.pos++
		s.ws()
		valStart := s.pos
		if err := s.value(depth); err != nil {
			return err
		}
		if visit != nil {
			visit(d[keyStart:keyEnd], d[valStart:s.pos])
		}
		s.ws()
		if s.pos >= len(d) {
			return s.fail("unexpected end of input in an object")
		}
		if d[s.pos] == '}' {
			s.pos++
			return nil
		}
		if d[s.pos] != ',' {
			return s.fail("want ',' or '}' in an object")
		}
		s.pos++
	}
}

// set decodes the value of read key k into b.
func (b *Body) set(k int, raw []byte) error {
	var dst any
	switch k {
	case keyModel:
		dst = &b.Model
	case keyStream:
		dst = &b.Stream
	case keyMetadata:
		m, err := decodeMetadata(raw)
		b.Metadata = m
		return err
	case KeyPromptCacheKey:
		dst = &b.PromptCacheKey
	case keyUser:
		dst = &b.User
	default:
		// The fallback's fields are kept raw; promptParts reads them only
		// when no explicit session id was found.
		b.fallback[k-KeySystem] = raw
		return nil
	}
	return unmarshalField(readKeyNames[k], raw, dst)
}

// unmarshalField decodes one value the proxy reads, naming the field on a
// type mismatch. The usual values, a string without escapes and true or
// false, are taken as they are (raw is a value the scanner validated);
// anything else goes through encoding/json, whose reflection was a tenth
// of the request path's own CPU (issue 13, item 12).
func unmarshalField(name string, raw []byte, dst any) error {
	switch p := dst.(type) {
	case *string:
		if len(raw) >= 2 && raw[0] == '"' {
			if in := raw[1 : len(raw)-1]; bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
				*p = string(in)
				return nil
			}
		}
	case *bool:
		switch string(raw) {
		case "true":
			*p = true
			return nil
		case "false":
			*p = false
			return nil
		}
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := name
			if te.Field != "" {
				field += "." + te.Field
			}
			return fmt.Errorf("field %s: want a %s, got a JSON %s", field, te.Type, te.Value)
		}
		return fmt.Errorf("field %s: %v", name, err)
	}
	return nil
}

// decodeMetadata reads metadata.user_id from metadata's validated raw
// value: null is no metadata; user_id matches exactly and only once.
func decodeMetadata(raw []byte) (*Metadata, error) {
	switch raw[0] {
	case 'n':
		return nil, nil
	case '{':
	default:
		return nil, fmt.Errorf("field metadata: want an object, got a JSON %s", jsonKind(raw[0]))
	}
	m := &Metadata{}
	var err error
	seen := false
	s := &scanner{data: raw, blocks: blockScan}
	_ = s.members(2, func(quotedKey, val []byte) { // validated already: cannot fail
		if err != nil || !isKey(quotedKey, "user_id") {
			return
		}
		if seen {
			err = duplicateKey("metadata.user_id")
			return
		}
		seen = true
		err = unmarshalField("metadata.user_id", val, &m.UserID)
	})
	return m, err
}

// jsonKind names the kind of a JSON value by its first byte.
func jsonKind(c byte) string {
	switch c {
	case '"':
		return "string"
	case '[':
		return "array"
	case '{':
		return "object"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
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
		return s.members(depth+1, nil)
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
// '\\' or a control character (< 0x20); the lowest flagged byte is exact.
func special(w uint64) uint64 {
	hasZero := func(x uint64) uint64 { return (x - lsb) &^ x & msb }
	return hasZero(w^(lsb*'"')) | hasZero(w^(lsb*'\\')) | (w-lsb*0x20)&^w&msb
}

// nextSpecial is the index of the next byte at or after s.pos inside a
// string that ends it or needs a look: '"', '\\' or a control character
// (len(data): none). In source code and tool output, escapes come every
// few bytes: the next 16 bytes are looked at a word at a time first. Past
// them, the next quote and backslash are found with bytes.IndexByte
// (vectorised) and remembered until the scan passes them, and the bytes
// before are checked for control characters a word at a time.
func (s *scanner) nextSpecial() int {
	d, p := s.data, s.pos
	if p+16 <= len(d) {
		if m := special(binary.LittleEndian.Uint64(d[p:])); m != 0 {
			return p + bits.TrailingZeros64(m)/8
		}
		if m := special(binary.LittleEndian.Uint64(d[p+8:])); m != 0 {
			return p + 8 + bits.TrailingZeros64(m)/8
		}
		p += 16
	}
	return s.farSpecial(p)
}

// farSpecial is nextSpecial's search from p on, past the first bytes.
func (s *scanner) farSpecial(p int) int {
	d := s.data
	if s.quote < p {
		s.quote = indexFrom(d, p, '"')
	}
	if s.bslash < p {
		s.bslash = indexFrom(d, p, '\\')
	}
	end := min(s.quote, s.bslash)
	if i := ctrlIndex(d[p:end]); i >= 0 {
		return p + i
	}
	return end
}

// ctrlIndex is the index of the first control character (< 0x20) in b,
// or -1: 32 bytes at a time while there is none, then 8, then 1. In a word
// the flag of the lowest such byte is exact (a borrow only flags bytes above
// a true one).
func ctrlIndex(b []byte) int {
	ctrl := func(w uint64) uint64 { return (w - lsb*0x20) &^ w & msb }
	i := 0
	for ; i+32 <= len(b); i += 32 {
		w := b[i : i+32]
		if ctrl(binary.LittleEndian.Uint64(w))|ctrl(binary.LittleEndian.Uint64(w[8:]))|
			ctrl(binary.LittleEndian.Uint64(w[16:]))|ctrl(binary.LittleEndian.Uint64(w[24:])) != 0 {
			break
		}
	}
	for ; i+8 <= len(b); i += 8 {
		if m := ctrl(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return i
		}
	}
	return -1
}

// indexFrom is the index of the first c in d at or after from, or len(d).
func indexFrom(d []byte, from int, c byte) int {
	if i := bytes.IndexByte(d[from:], c); i >= 0 {
		return from + i
	}
	return len(d)
}

// str skips a string starting at s.pos (which must be '"'), validating
// escapes and rejecting raw control characters. The prompts in a body are
// long strings, most of its bytes: see nextSpecial and escapeRun.
func (s *scanner) str() error {
	d := s.data
	if s.pos >= len(d) || d[s.pos] != '"' {
		return s.fail("want a string")
	}
	s.pos++
	if s.blocks && len(d)-s.pos >= 64 {
		// A key or a role ends within a word: look at it first.
		if m := special(binary.LittleEndian.Uint64(d[s.pos:])); m != 0 {
			if i := s.pos + bits.TrailingZeros64(m)/8; d[i] == '"' {
				s.pos = i + 1
				return nil
			}
		}
		if s.strBlocks() {
			return nil
		}
	}
	for {
		end := s.nextSpecial()
		if end < len(d) && d[end] < 0x20 {
			s.pos = end
			return s.fail("control character in a string")
		}
		s.pos = end
		if end == len(d) {
			return s.fail("unterminated string")
		}
		if d[end] == '"' {
			s.pos++
			return nil
		}
		n, err := s.escape(end)
		if err != nil {
			return err
		}
		s.pos = end + n
		if done, err := s.escapeRun(); done || err != nil {
			return err
		}
	}
}

// escapeRunGap is how many words in a row without an escape end an
// escape run: a line of code has a stretch of a few words between its
// escapes, which went back and forth to the sparse search at one.
const escapeRunGap = 4

// escLen is the length of an escape by the byte after its backslash: 2,
// 6 for \u (four hex digits follow), 0 for none (RFC 8259 section 7).
var escLen = [256]uint8{'"': 2, '\\': 2, '/': 2, 'b': 2, 'f': 2, 'n': 2, 'r': 2, 't': 2, 'u': 6}

// escape validates the escape whose backslash is at i and returns its
// length. A fault is reported at the byte after the backslash.
func (s *scanner) escape(i int) (int, error) {
	d := s.data
	if i+1 >= len(d) {
		s.pos = i + 1
		return 0, s.fail("unterminated escape")
	}
	switch escLen[d[i+1]] {
	case 2:
		return 2, nil
	case 6:
		if len(d)-(i+1) < 5 {
			s.pos = i + 1
			return 0, s.fail("short \\u escape")
		}
		if !hex4(d, i+2) {
			s.pos = i + 1
			return 0, s.fail("invalid \\u escape")
		}
		return 6, nil
	}
	s.pos = i + 1
	return 0, s.fail("invalid escape")
}

// hex4 reports whether d holds four hex digits at i.
func hex4(d []byte, i int) bool {
	if i+4 > len(d) {
		return false
	}
	for _, h := range d[i : i+4] {
		if !(isDigit(h) || (h|0x20) >= 'a' && (h|0x20) <= 'f') {
			return false
		}
	}
	return true
}

// escapeRun goes on from s.pos, just past an escape, while escapes stay
// dense: in source code and tool output one comes every few bytes (a
// newline, a tab, a quote), and finding each with nextSpecial cost more
// than the rest of the scan. It takes the string 8 bytes at a time and
// handles every flagged byte of a word in turn (special's flags above
// the lowest may be false, so each is read: a byte that is none of the
// three is passed over), skipping the bytes an escape consumed. It stops
// at the string's end (done), at a fault, after escapeRunGap words in a
// row with nothing to flag (the sparse search takes over after them) or
// near the end of the data.
func (s *scanner) escapeRun() (done bool, err error) {
	d := s.data
	p, skip := s.pos, s.pos // skip: the bytes before it are consumed
	clean := 0              // words in a row with nothing flagged
	for p+8 <= len(d) {
		m := special(binary.LittleEndian.Uint64(d[p:]))
		if m == 0 {
			if clean++; clean == escapeRunGap {
				s.pos = p + 8
				return false, nil
			}
			p += 8
			continue
		}
		clean = 0
		for ; m != 0; m &= m - 1 {
			i := p + bits.TrailingZeros64(m)/8
			if i < skip {
				continue
			}
			switch c := d[i]; {
			case c == '"':
				s.pos = i + 1
				return true, nil
			case c == '\\':
				if i+1 < len(d) && escLen[d[i+1]] == 2 { // the usual escape, inline
					skip = i + 2
					break
				}
				n, err := s.escape(i)
				if err != nil {
					return false, err
				}
				skip = i + n
			case c < 0x20:
				s.pos = i
				return false, s.fail("control character in a string")
			}
		}
		p = max(p+8, skip)
	}
	s.pos = p
	return false, nil
}
