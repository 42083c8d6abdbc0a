package kvevents

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
)

func TestDecodeErrors(t *testing.T) {
	deep := append(bytes.Repeat([]byte{0x91}, 100), 0xc0)
	cases := []struct {
		name, hex string
		raw       []byte
		want      string // substring of the error
	}{
		{name: "empty", hex: "", want: "truncated"},
		{name: "not an array", hex: "c3", want: "want an array, got a boolean"},
		{name: "one field", hex: "91 cb3ff0000000000000", want: "batch of 1 fields"},
		{name: "ts string", hex: "92 a1 78 90", want: "batch ts: want an integer, got a string"},
		{name: "trailing", hex: "92 00 90 00", want: "1 trailing bytes"},
		{name: "array32 longer than the payload", hex: "92 00 dd ffffffff", want: "truncated"},
		{name: "map32 longer than the payload", hex: "92 00 91 df 7fffffff", want: "truncated"},
		{name: "str32 longer than the payload", hex: "92 00 91 91 db 7fffffff", want: "truncated"},
		{name: "event without tag", hex: "92 00 91 90", want: "event 0: event array without its tag"},
		{name: "stored too short", hex: "92 00 91 92 ab426c6f636b53746f726564 90", want: "BlockStored with 1 fields, want at least 4"},
		{name: "map without type", hex: "92 00 91 81 a1 78 00", want: `event map without "type"`},
		{name: "map stored without token_ids", hex: "92 00 91 83 a474797065 ab426c6f636b53746f726564 ac626c6f636b5f686173686573 90 aa626c6f636b5f73697a65 10", want: "BlockStored without parent_block_hash"},
		{name: "block_size 0", hex: "92 00 91 95 ab426c6f636b53746f726564 90 c0 90 00", want: "block_size: 0: want 1 to"},
		{name: "negative token", hex: "92 00 91 95 ab426c6f636b53746f726564 90 c0 91 ff 10", want: "token id -1 out of range"},
		{name: "hash a string", hex: "92 00 91 92 ac426c6f636b52656d6f766564 91 a0", want: "block hash: want an integer, got a string"},
		{name: "negative group", hex: "92 00 91 94 ac426c6f636b52656d6f766564 90 c0 fe", want: "group_idx: -2 is negative"},
		{name: "deep nesting in a skipped field", raw: append(annotated(t, "92 00 91 92 b0416c6c426c6f636b73436c6561726564"), deep...), want: "nested deeper than 32"},
		{name: "reserved byte", hex: "92 00 91 92 b0416c6c426c6f636b73436c6561726564 c1", want: "invalid msgpack byte 0xc1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw := c.raw
			if raw == nil {
				raw = annotated(t, c.hex)
			}
			var b Batch
			err := Decode(raw, &b)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Decode(%x) = %v, want an error containing %q", raw, err, c.want)
			}
		})
	}
}

func TestDecodeTolerant(t *testing.T) {
	// What a newer or older vLLM may send and must still be read: fields
	// in any order, unknown fields and event types, fewer positional
	// fields (vLLM before PR #19737 had no medium), a batch map.
	cases := []struct {
		name, hex string
		want      Batch
	}{
		{
			name: "map keys in any order, unknown key skipped",
			hex: `92 00 91 85 a6 6d656469756d a3 435055   # medium CPU
			       a5 6578747261 92 01 02                 # "extra": [1, 2]
			       ac 626c6f636b5f686173686573 92 05 d3ffffffffffffffff  # block_hashes [5, -1]
			       a4 74797065 ac 426c6f636b52656d6f766564
			       a9 67726f75705f696478 c0`,
			want: Batch{DPRank: -1, Form: FormMap, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{5, 1<<64 - 1}, Medium: "CPU", GroupIdx: -1}}},
		},
		{
			name: "unknown event type counted",
			hex:  "93 00 92 92 a8 4e6577457665 6e74 01 91 b0416c6c426c6f636b73436c6561726564 05",
			want: Batch{DPRank: 5, Form: FormArray, Skipped: 1, Events: []Event{{Kind: AllBlocksCleared, GroupIdx: -1}}},
		},
		{
			name: "vLLM 0.8 positional stored: five fields, parent set",
			hex:  "92 cb4000000000000000 91 96 ab426c6f636b53746f726564 92 01 02 07 92 0a 0b 01 c0",
			want: Batch{TS: 2, DPRank: -1, Form: FormArray, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1, 2}, ParentBlockHash: 7, HasParent: true, TokenIDs: []uint32{10, 11}, BlockSize: 1, GroupIdx: -1}}},
		},
		{
			name: "batch as a map, float32 ts",
			hex:  "83 a6 6576656e7473 90 a2 7473 ca40400000 b2 646174615f706172616c6c656c5f72616e6b 03",
			want: Batch{TS: 3, DPRank: 3, Form: FormBatchMap},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b Batch
			if err := Decode(annotated(t, c.hex), &b); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(c.want, b, cmpopts.IgnoreUnexported(Batch{}), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestRoundTrip encodes batches in both forms and decodes them back.
func TestRoundTrip(t *testing.T) {
	b := &Batch{TS: 12.5, DPRank: 300, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{0, 127, 128, 1 << 16, 1 << 32, 1<<64 - 1}, ParentBlockHash: 1 << 40, HasParent: true,
			TokenIDs: make([]uint32, 96), BlockSize: 16, GroupIdx: 1},
		{Kind: BlockRemoved, BlockHashes: []uint64{3}, Medium: "GPU", GroupIdx: -1},
		{Kind: AllBlocksCleared, GroupIdx: -1},
	}}
	for i := range b.Events[0].TokenIDs {
		b.Events[0].TokenIDs[i] = uint32(i * 7919)
	}
	var got Batch
	for _, f := range Forms {
		b.Form = f
		raw := AppendBatch(nil, b, f)
		if err := Decode(raw, &got); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if d := cmp.Diff(b, &got, cmpopts.IgnoreUnexported(Batch{}), cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s (-sent +decoded):\n%s", f, d)
		}
		var generic any
		if err := msgpack.Unmarshal(raw, &generic); err != nil {
			t.Errorf("%s: the msgpack library cannot read AppendBatch's bytes: %v", f, err)
		}
	}
}

// FuzzDecode: Decode never panics, never reads past its input, and a batch
// it accepts is one msgpack value to an independent library too, and
// re-encodes to bytes it decodes to the same events.
func FuzzDecode(f *testing.F) {
	for _, h := range []string{v026MapHex, v026ArrayHex, v026BatchMapHex, removedMapHex, removedArrayHex, removedBatchMapHex} {
		f.Add(annotated(f, h))
	}
	f.Add(AppendBatch(nil, &Batch{DPRank: -1, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1}, BlockSize: 1}}}, FormArray))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var b Batch
		if err := Decode(raw, &b); err != nil {
			return
		}
		// The library's Skip walks the structure without giving ext
		// values a Go type (its Unmarshal refuses unregistered ext ids).
		rd := bytes.NewReader(raw)
		if err := msgpack.NewDecoder(rd).Skip(); err != nil || rd.Len() != 0 {
			t.Fatalf("Decode accepted %x, which is not one msgpack value: %v (%d bytes left)", raw, err, rd.Len())
		}
		var again Batch
		enc := AppendBatch(nil, &b, FormMap)
		if err := Decode(enc, &again); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if len(again.Events) != len(b.Events) {
			t.Fatalf("re-encoded %d events, decoded %d", len(b.Events), len(again.Events))
		}
		for i := range b.Events {
			if !slicesEqual(b.Events[i].BlockHashes, again.Events[i].BlockHashes) || b.Events[i].Kind != again.Events[i].Kind {
				t.Fatalf("event %d changed on re-encoding", i)
			}
		}
	})
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func BenchmarkDecode(b *testing.B) {
	raw := annotated(b, v026MapHex)
	var batch Batch
	b.ReportAllocs()
	for b.Loop() {
		if err := Decode(raw, &batch); err != nil {
			b.Fatal(err)
		}
	}
}
