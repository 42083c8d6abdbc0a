package kvevents

import (
	"encoding/binary"
	"math"
)

// AppendBatch appends b encoded as vLLM's msgspec encoder writes a
// KVEventBatch in form f (b.Form is ignored), and returns the extended
// buffer. The bytes are msgspec's, not merely equivalent msgpack:
//
//   - integers take the shortest encoding (positive fixint, then uint8 to
//     uint64; negatives fixint, then int8 to int64), floats float64, str
//     fixstr then str8/16/32 (mpack_encode_long, mpack_encode_float,
//     mpack_encode_cstr in msgspec/_core.c);
//   - an array_like struct is written whole, every field in declaration
//     order, a default too (mpack_encode_struct_array: omit_defaults does
//     not apply): the batch [ts, events, data_parallel_rank] with None
//     (b.DPRank < 0) as nil in FormArray and FormMap; an event [tag,
//     field...] in FormArray, BlockStored's 11 fields (extra_keys,
//     group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window nil
//     when None; the sliding window always: warden has no sliding-window
//     layers), BlockRemoved's 3;
//   - a struct as a map (mpack_encode_struct_object) is its fields by
//     name in declaration order, a tagged one "type" first, those with a
//     default left out when equal to it (omit_defaults): an event in
//     FormMap and FormBatchMap, the batch in FormBatchMap (the rank left
//     out when None). Fields without a default are always written:
//     BlockStored's lora_id and lora_name, None here (warden has no LoRA).
func AppendBatch(dst []byte, b *Batch, f Form) []byte {
	if f == FormBatchMap {
		n := 2
		if b.DPRank >= 0 {
			n = 3
		}
		dst = appendMapLen(dst, n)
		dst = appendStr(dst, "ts")
		dst = appendFloat(dst, b.TS)
		dst = appendStr(dst, "events")
		dst = appendEvents(dst, b, FormMap)
		if b.DPRank >= 0 {
			dst = appendStr(dst, "data_parallel_rank")
			dst = appendInt(dst, int64(b.DPRank))
		}
		return dst
	}
	dst = appendArrayLen(dst, 3)
	dst = appendFloat(dst, b.TS)
	dst = appendEvents(dst, b, f)
	if b.DPRank < 0 {
		return append(dst, 0xc0)
	}
	return appendInt(dst, int64(b.DPRank))
}

func appendEvents(dst []byte, b *Batch, f Form) []byte {
	dst = appendArrayLen(dst, len(b.Events))
	for i := range b.Events {
		dst = appendEvent(dst, &b.Events[i], f)
	}
	return dst
}

// fieldVal is one field of an event: its name and its value, or its
// default (None, def true).
type fieldVal struct {
	name string
	def  bool
	put  func([]byte) []byte
}

func appendEvent(dst []byte, e *Event, f Form) []byte {
	var fields []fieldVal
	switch e.Kind {
	case BlockStored:
		fields = []fieldVal{
			{name: "block_hashes", put: func(d []byte) []byte { return appendHashes(d, e.BlockHashes) }},
			{name: "parent_block_hash", put: func(d []byte) []byte {
				if !e.HasParent {
					return append(d, 0xc0)
				}
				return appendUint(d, e.ParentBlockHash)
			}},
			{name: "token_ids", put: func(d []byte) []byte {
				d = appendArrayLen(d, len(e.TokenIDs))
				for _, t := range e.TokenIDs {
					d = appendUint(d, uint64(t))
				}
				return d
			}},
			{name: "block_size", put: func(d []byte) []byte { return appendInt(d, int64(e.BlockSize)) }},
			{name: "lora_id", put: appendNil},
			{name: "medium", put: func(d []byte) []byte { return appendOptStr(d, e.Medium) }},
			{name: "lora_name", put: appendNil},
			{name: "extra_keys", def: !e.ExtraKeys, put: func(d []byte) []byte {
				d = appendArrayLen(d, len(e.BlockHashes))
				for range e.BlockHashes {
					d = append(d, 0xc0)
				}
				return d
			}},
			{name: "group_idx", def: e.GroupIdx < 0, put: func(d []byte) []byte { return appendInt(d, int64(e.GroupIdx)) }},
			{name: "kv_cache_spec_kind", def: e.CacheSpecKind == "", put: func(d []byte) []byte { return appendStr(d, e.CacheSpecKind) }},
			{name: "kv_cache_spec_sliding_window", def: true},
		}
	case BlockRemoved:
		fields = []fieldVal{
			{name: "block_hashes", put: func(d []byte) []byte { return appendHashes(d, e.BlockHashes) }},
			{name: "medium", put: func(d []byte) []byte { return appendOptStr(d, e.Medium) }},
			{name: "group_idx", def: e.GroupIdx < 0, put: func(d []byte) []byte { return appendInt(d, int64(e.GroupIdx)) }},
		}
	}
	tag := e.Kind.String()
	if f == FormArray {
		dst = appendArrayLen(dst, len(fields)+1)
		dst = appendStr(dst, tag)
		for _, fv := range fields {
			if fv.def {
				dst = append(dst, 0xc0) // the default, None, written in place
				continue
			}
			dst = fv.put(dst)
		}
		return dst
	}
	n := 1
	for _, fv := range fields {
		if !fv.def {
			n++
		}
	}
	dst = appendMapLen(dst, n)
	dst = appendStr(dst, "type")
	dst = appendStr(dst, tag)
	for _, fv := range fields {
		if !fv.def {
			dst = appendStr(dst, fv.name)
			dst = fv.put(dst)
		}
	}
	return dst
}

func appendNil(d []byte) []byte { return append(d, 0xc0) }

func appendHashes(d []byte, hs []uint64) []byte {
	d = appendArrayLen(d, len(hs))
	for _, h := range hs {
		d = appendUint(d, h)
	}
	return d
}

func appendArrayLen(d []byte, n int) []byte {
	switch {
	case n < 16:
		return append(d, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(d, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(d, 0xdd), uint32(n))
}

func appendMapLen(d []byte, n int) []byte {
	switch {
	case n < 16:
		return append(d, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(d, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(d, 0xdf), uint32(n))
}

func appendStr(d []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		d = append(d, 0xa0|byte(n))
	case n <= math.MaxUint8:
		d = append(d, 0xd9, byte(n))
	case n <= math.MaxUint16:
		d = binary.BigEndian.AppendUint16(append(d, 0xda), uint16(n))
	default:
		d = binary.BigEndian.AppendUint32(append(d, 0xdb), uint32(n))
	}
	return append(d, s...)
}

func appendOptStr(d []byte, s string) []byte {
	if s == "" {
		return append(d, 0xc0)
	}
	return appendStr(d, s)
}

func appendUint(d []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(d, byte(v))
	case v <= math.MaxUint8:
		return append(d, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(d, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(d, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(d, 0xcf), v)
}

func appendInt(d []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(d, uint64(v))
	case v >= -32:
		return append(d, byte(int8(v)))
	case v >= math.MinInt8:
		return append(d, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(d, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(d, 0xd2), uint32(int32(v)))
	}
	return binary.BigEndian.AppendUint64(append(d, 0xd3), uint64(v))
}

func appendFloat(d []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(append(d, 0xcb), math.Float64bits(v))
}
