package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// This file reads msgpack by hand rather than through a reflection-based
// library: a peer's payload is untrusted, so every length is checked
// against the bytes that remain before anything is allocated, nesting is
// bounded (a skipped value of a million nested arrays would otherwise
// exhaust the stack), and a batch decodes without allocating once its
// Batch has grown to size.

// maxDepth bounds the nesting of values Decode skips (extra_keys holds
// tuples of lists; nothing vLLM sends nests deeper than four).
const maxDepth = 32

// Decode reads one KVEventBatch payload (the third frame of a message)
// into b, which it resets first. Events may be in either Form, even mixed.
// Unknown fields are skipped, unknown event types counted in b.Skipped.
func Decode(payload []byte, b *Batch) error {
	b.Reset()
	r := reader{b: payload}
	if err := r.batch(b); err != nil {
		return fmt.Errorf("kv event batch: byte %d: %w", r.i, err)
	}
	if r.i != len(payload) {
		return fmt.Errorf("kv event batch: %d trailing bytes after the batch", len(payload)-r.i)
	}
	return nil
}

var errTruncated = errors.New("truncated")

type reader struct {
	b []byte
	i int
}

func (r *reader) left() int { return len(r.b) - r.i }

func (r *reader) peek() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	return r.b[r.i], nil
}

func (r *reader) next(n int) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, errTruncated
	}
	s := r.b[r.i : r.i+n]
	r.i += n
	return s, nil
}

func (r *reader) u8() (byte, error) {
	s, err := r.next(1)
	if err != nil {
		return 0, err
	}
	return s[0], nil
}

// length reads an n-byte big-endian length.
func (r *reader) length(n int) (int, error) {
	s, err := r.next(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range s {
		v = v<<8 | uint64(c)
	}
	if v > uint64(r.left()) {
		return 0, errTruncated
	}
	return int(v), nil
}

// nilNext consumes a nil and reports true, or consumes nothing.
func (r *reader) nilNext() bool {
	if r.i < len(r.b) && r.b[r.i] == 0xc0 {
		r.i++
		return true
	}
	return false
}

// arrayLen reads an array header. The count is at most the bytes left,
// since each element takes at least one.
func (r *reader) arrayLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	var n int
	switch {
	case c >= 0x90 && c <= 0x9f:
		n = int(c & 0x0f)
	case c == 0xdc:
		n, err = r.length(2)
	case c == 0xdd:
		n, err = r.length(4)
	default:
		return 0, fmt.Errorf("want an array, got %s", typeName(c))
	}
	if err == nil && n > r.left() {
		err = errTruncated
	}
	return n, err
}

// mapLen reads a map header; each entry takes at least two bytes.
func (r *reader) mapLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	var n int
	switch {
	case c >= 0x80 && c <= 0x8f:
		n = int(c & 0x0f)
	case c == 0xde:
		n, err = r.length(2)
	case c == 0xdf:
		n, err = r.length(4)
	default:
		return 0, fmt.Errorf("want a map, got %s", typeName(c))
	}
	if err == nil && 2*n > r.left() {
		err = errTruncated
	}
	return n, err
}

// str reads a string; the bytes alias the payload.
func (r *reader) str() ([]byte, error) {
	c, err := r.u8()
	if err != nil {
		return nil, err
	}
	var n int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
	case c == 0xd9:
		n, err = r.length(1)
	case c == 0xda:
		n, err = r.length(2)
	case c == 0xdb:
		n, err = r.length(4)
	default:
		return nil, fmt.Errorf("want a string, got %s", typeName(c))
	}
	if err != nil {
		return nil, err
	}
	return r.next(n)
}

// optStr reads a string or nil ("").
func (r *reader) optStr() (string, error) {
	if r.nilNext() {
		return "", nil
	}
	s, err := r.str()
	return string(s), err
}

// int reads any msgpack integer as an int64 (a uint64 above MaxInt64 is
// an error).
func (r *reader) int() (int64, error) {
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, fmt.Errorf("integer %d out of range", v)
	}
	return int64(v), nil
}

// integer reads any msgpack integer: its bits and whether it is negative
// (then v holds the two's complement).
func (r *reader) integer() (v uint64, neg bool, err error) {
	c, err := r.u8()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), false, nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, nil
	}
	var s []byte
	switch c {
	case 0xcc, 0xd0:
		s, err = r.next(1)
	case 0xcd, 0xd1:
		s, err = r.next(2)
	case 0xce, 0xd2:
		s, err = r.next(4)
	case 0xcf, 0xd3:
		s, err = r.next(8)
	default:
		return 0, false, fmt.Errorf("want an integer, got %s", typeName(c))
	}
	if err != nil {
		return 0, false, err
	}
	switch c {
	case 0xcc:
		return uint64(s[0]), false, nil
	case 0xcd:
		return uint64(binary.BigEndian.Uint16(s)), false, nil
	case 0xce:
		return uint64(binary.BigEndian.Uint32(s)), false, nil
	case 0xcf:
		return binary.BigEndian.Uint64(s), false, nil
	case 0xd0:
		x := int64(int8(s[0]))
		return uint64(x), x < 0, nil
	case 0xd1:
		x := int64(int16(binary.BigEndian.Uint16(s)))
		return uint64(x), x < 0, nil
	case 0xd2:
		x := int64(int32(binary.BigEndian.Uint32(s)))
		return uint64(x), x < 0, nil
	}
	x := int64(binary.BigEndian.Uint64(s))
	return uint64(x), x < 0, nil
}

// optInt reads an integer or nil (def).
func (r *reader) optInt(def int) (int, error) {
	if r.nilNext() {
		return def, nil
	}
	v, err := r.int()
	if err != nil {
		return 0, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, fmt.Errorf("integer %d out of range", v)
	}
	return int(v), nil
}

// float reads a float32, float64 or integer as a float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		s, err := r.next(5)
		if err != nil {
			return 0, err
		}
		return float64(math.Float32frombits(binary.BigEndian.Uint32(s[1:]))), nil
	case 0xcb:
		s, err := r.next(9)
		if err != nil {
			return 0, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(s[1:])), nil
	}
	v, err := r.int()
	return float64(v), err
}

// hash reads an ExternalBlockHash: an integer (its 64 bits) or bytes (the
// low 64 bits of their big-endian value, as maybe_convert_block_hash
// makes the int from the bytes).
func (r *reader) hash() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n int
	switch c {
	case 0xc4:
		r.i++
		n, err = r.length(1)
	case 0xc5:
		r.i++
		n, err = r.length(2)
	case 0xc6:
		r.i++
		n, err = r.length(4)
	default:
		v, _, err := r.integer()
		if err != nil {
			return 0, fmt.Errorf("block hash: %w", err)
		}
		return v, nil
	}
	if err != nil {
		return 0, err
	}
	s, err := r.next(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range s[max(0, n-8):] {
		v = v<<8 | uint64(c)
	}
	return v, nil
}

// skip skips one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("values nested deeper than %d", maxDepth)
	}
	c, err := r.u8()
	if err != nil {
		return err
	}
	var n, elems int
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return nil
	case c >= 0x80 && c <= 0x8f:
		elems = 2 * int(c&0x0f)
	case c >= 0x90 && c <= 0x9f:
		elems = int(c & 0x0f)
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
	default:
		switch c {
		case 0xcc, 0xd0:
			n = 1
		case 0xcd, 0xd1, 0xd4: // fixext 1: type and 1 byte
			n = 2
		case 0xd5:
			n = 3
		case 0xce, 0xd2, 0xca:
			n = 4
		case 0xcf, 0xd3, 0xcb:
			n = 8
		case 0xd6:
			n = 5
		case 0xd7:
			n = 9
		case 0xd8:
			n = 17
		case 0xc4, 0xd9:
			n, err = r.length(1)
		case 0xc5, 0xda:
			n, err = r.length(2)
		case 0xc6, 0xdb:
			n, err = r.length(4)
		case 0xc7, 0xc8, 0xc9: // ext 8/16/32: length, then type byte
			n, err = r.length(1 << (c - 0xc7))
			n++
		case 0xdc:
			elems, err = r.length(2)
		case 0xdd:
			elems, err = r.length(4)
		case 0xde:
			elems, err = r.length(2)
			elems *= 2
		case 0xdf:
			elems, err = r.length(4)
			elems *= 2
		default: // 0xc1, never used
			return fmt.Errorf("invalid msgpack byte 0x%02x", c)
		}
	}
	if err != nil {
		return err
	}
	if elems > r.left() {
		return errTruncated
	}
	if _, err := r.next(n); err != nil {
		return err
	}
	for range elems {
		if err := r.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// typeName names the msgpack type a byte starts.
func typeName(c byte) string {
	switch {
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3):
		return "an integer"
	case c <= 0x8f || c == 0xde || c == 0xdf:
		return "a map"
	case c <= 0x9f || c == 0xdc || c == 0xdd:
		return "an array"
	case c <= 0xbf || (c >= 0xd9 && c <= 0xdb):
		return "a string"
	case c == 0xc0:
		return "nil"
	case c == 0xc2 || c == 0xc3:
		return "a boolean"
	case c == 0xca || c == 0xcb:
		return "a float"
	case c >= 0xc4 && c <= 0xc6:
		return "bytes"
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

// batch reads a KVEventBatch: [ts, events, rank?] (array_like) or a map
// of the same fields by name.
func (r *reader) batch(b *Batch) error {
	c, err := r.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		var haveTS, haveEvents bool
		for range n {
			k, err := r.str()
			if err != nil {
				return fmt.Errorf("batch key: %w", err)
			}
			switch string(k) {
			case "ts":
				b.TS, err = r.float()
				haveTS = true
			case "events":
				err = r.events(b)
				haveEvents = true
			case "data_parallel_rank":
				b.DPRank, err = r.optInt(-1)
			default:
				err = r.skip(0)
			}
			if err != nil {
				return fmt.Errorf("batch %s: %w", k, err)
			}
		}
		if !haveTS || !haveEvents {
			return errors.New("batch map without ts or events")
		}
		b.Form = FormBatchMap
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("batch of %d fields, want ts and events", n)
	}
	if b.TS, err = r.float(); err != nil {
		return fmt.Errorf("batch ts: %w", err)
	}
	if err := r.events(b); err != nil {
		return err
	}
	if n >= 3 {
		if b.DPRank, err = r.optInt(-1); err != nil {
			return fmt.Errorf("batch data_parallel_rank: %w", err)
		}
	}
	for range n - 3 {
		if err := r.skip(0); err != nil {
			return err
		}
	}
	return nil
}

func isMap(c byte) bool { return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf }

func (r *reader) events(b *Batch) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := range n {
		c, err := r.peek()
		if err != nil {
			return err
		}
		if i == 0 {
			b.Form = FormArray
			if isMap(c) {
				b.Form = FormMap
			}
		}
		e := Event{GroupIdx: -1}
		var known bool
		if isMap(c) {
			known, err = r.mapEvent(b, &e)
		} else {
			known, err = r.arrayEvent(b, &e)
		}
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if !known {
			b.Skipped++
			continue
		}
		b.Events = append(b.Events, e)
	}
	if n == 0 {
		b.Form = FormArray
	}
	return nil
}

func tagKind(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

// The positional fields of each event after its tag, in the order of
// their declaration in kv_events.py (array_like encodes them so).
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

// requiredFields is how many leading fields of each kind must be present.
func requiredFields(k Kind) int {
	switch k {
	case BlockStored:
		return 4 // block_hashes, parent_block_hash, token_ids, block_size
	case BlockRemoved:
		return 1
	}
	return 0
}

func fieldsOf(k Kind) []string {
	switch k {
	case BlockStored:
		return storedFields
	case BlockRemoved:
		return removedFields
	}
	return nil
}

// arrayEvent reads [tag, field...]. It reports false for an unknown tag
// (the event skipped).
func (r *reader) arrayEvent(b *Batch, e *Event) (bool, error) {
	n, err := r.arrayLen()
	if err != nil {
		return false, err
	}
	if n == 0 {
		return false, errors.New("event array without its tag")
	}
	tag, err := r.str()
	if err != nil {
		return false, fmt.Errorf("tag: %w", err)
	}
	e.Kind = tagKind(tag)
	names := fieldsOf(e.Kind)
	if e.Kind == 0 {
		names = nil
	}
	if need := requiredFields(e.Kind); n-1 < need {
		return false, fmt.Errorf("%s with %d fields, want at least %d", e.Kind, n-1, need)
	}
	for j := range n - 1 {
		if j >= len(names) {
			if err := r.skip(0); err != nil {
				return false, err
			}
			continue
		}
		if err := r.field(b, e, names[j]); err != nil {
			return false, fmt.Errorf("%s %s: %w", e.Kind, names[j], err)
		}
	}
	return e.Kind != 0, nil
}

// mapEvent reads {"type": tag, field: value, ...}, keys in any order: a
// first pass finds the tag, a second reads the fields.
func (r *reader) mapEvent(b *Batch, e *Event) (bool, error) {
	start := r.i
	n, err := r.mapLen()
	if err != nil {
		return false, err
	}
	var tag []byte
	for range n {
		k, err := r.str()
		if err != nil {
			return false, fmt.Errorf("event key: %w", err)
		}
		if string(k) == "type" {
			if tag, err = r.str(); err != nil {
				return false, fmt.Errorf("type: %w", err)
			}
			continue
		}
		if err := r.skip(0); err != nil {
			return false, err
		}
	}
	if tag == nil {
		return false, errors.New(`event map without "type"`)
	}
	if e.Kind = tagKind(tag); e.Kind == 0 {
		return false, nil
	}
	end := r.i
	r.i = start
	if _, err := r.mapLen(); err != nil {
		return false, err
	}
	names := fieldsOf(e.Kind)
	seen := 0
	for range n {
		k, _ := r.str() // read in the first pass
		idx := -1
		for j, name := range names {
			if string(k) == name {
				idx = j
				break
			}
		}
		if idx < 0 {
			if err := r.skip(0); err != nil {
				return false, err
			}
			continue
		}
		if idx < requiredFields(e.Kind) {
			seen |= 1 << idx
		}
		if err := r.field(b, e, names[idx]); err != nil {
			return false, fmt.Errorf("%s %s: %w", e.Kind, names[idx], err)
		}
	}
	if need := requiredFields(e.Kind); seen != 1<<need-1 {
		for j := range need {
			if seen&(1<<j) == 0 {
				return false, fmt.Errorf("%s without %s", e.Kind, names[j])
			}
		}
	}
	r.i = end
	return true, nil
}

// maxBlockSize bounds block_size (vLLM's largest is 256; some backends 1024).
const maxBlockSize = 1 << 16

// field reads the value of the named field into e.
func (r *reader) field(b *Batch, e *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		var n int
		if n, err = r.arrayLen(); err != nil {
			return err
		}
		start := len(b.hashes)
		for range n {
			h, err := r.hash()
			if err != nil {
				return err
			}
			b.hashes = append(b.hashes, h)
		}
		e.BlockHashes = b.hashes[start:len(b.hashes):len(b.hashes)]
	case "parent_block_hash":
		if !r.nilNext() {
			e.ParentBlockHash, err = r.hash()
			e.HasParent = err == nil
		}
	case "token_ids":
		var n int
		if n, err = r.arrayLen(); err != nil {
			return err
		}
		start := len(b.tokens)
		for range n {
			v, err := r.int()
			if err != nil {
				return err
			}
			if v < 0 || v > math.MaxUint32 {
				return fmt.Errorf("token id %d out of range", v)
			}
			b.tokens = append(b.tokens, uint32(v))
		}
		e.TokenIDs = b.tokens[start:len(b.tokens):len(b.tokens)]
	case "block_size":
		var v int64
		if v, err = r.int(); err != nil {
			return err
		}
		if v < 1 || v > maxBlockSize {
			return fmt.Errorf("%d: want 1 to %d", v, maxBlockSize)
		}
		e.BlockSize = int(v)
	case "medium":
		e.Medium, err = r.optStr()
	case "group_idx":
		e.GroupIdx, err = r.optInt(-1)
		if err == nil && e.GroupIdx < -1 {
			err = fmt.Errorf("%d is negative", e.GroupIdx)
		}
	case "kv_cache_spec_kind":
		e.CacheSpecKind, err = r.optStr()
	case "extra_keys":
		c, perr := r.peek()
		if perr != nil {
			return perr
		}
		e.ExtraKeys = c != 0xc0
		err = r.skip(0)
	default: // lora_id, lora_name, kv_cache_spec_sliding_window: not used
		err = r.skip(0)
	}
	return err
}
