package kvevents

import (
	"bytes"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// annotated reads hex written with comments: "# ..." to the end of a line
// is dropped, so a golden byte string can say which msgspec rule wrote
// each byte.
func annotated(t testing.TB, s string) []byte {
	t.Helper()
	var sb strings.Builder
	for line := range strings.Lines(s) {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		sb.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(sb.String())
	if err != nil {
		t.Fatalf("annotated hex: %v", err)
	}
	return b
}

// v026Tokens are the token ids of the BlockStored that vLLM 0.26.0 sent
// for Qwen3-8B in volcano-sh/kthena#1535 (printed there as Python values).
var v026Tokens = []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667}

// v026Batch is that batch: one BlockStored, the int hash
// 15760518052499183552 (above MaxInt64: msgpack uint64), no parent,
// block_size 16, medium GPU, extra_keys [None], group_idx 0,
// kv_cache_spec_kind full_attention, data_parallel_rank 0.
func v026Batch() *Batch {
	return &Batch{
		TS: 1789095808.8378847, DPRank: 0,
		Events: []Event{{
			Kind: BlockStored, BlockHashes: []uint64{15760518052499183552}, TokenIDs: v026Tokens,
			BlockSize: 16, Medium: "GPU", GroupIdx: 0, CacheSpecKind: "full_attention", ExtraKeys: true,
		}},
	}
}

// v026TokenBytes is token_ids: 16 elements need array16 (fixarray holds 15).
const v026TokenBytes = `
  dc 0010
  ce 0002505c  cd 0368  cc c6  cd 2368  cd 0176  cd 0117  cd 1a42  cd 013b
  cd 15f0  1e  ce 0002505d  cc c6  ce 0002505c  ce 00012d23  cc c6  ce 00025073
`

// v026MapHex is the bytes msgspec writes for v026Batch, rule by rule
// (msgspec/_core.c: mpack_encode_long picks the shortest integer, Python
// floats are float64, strings fixstr below 32 bytes; a tagged Struct
// writes "type" first; omit_defaults drops kv_cache_spec_sliding_window,
// which is None).
const v026MapHex = `
93                                   # batch: array_like [ts, events, rank]
  cb 41da a8db e035 9fe7             # ts float64 1789095808.8378847
  91                                 # events: 1
    8b                               # map of 11: type + 10 fields (sliding_window omitted)
      a4 74797065                    # "type"
      ab 426c6f636b53746f726564      # "BlockStored"
      ac 626c6f636b5f686173686573    # "block_hashes"
      91 cf dab8 9baa 7b58 57c0      # [15760518052499183552] uint64
      b1 706172656e745f626c6f636b5f68617368  # "parent_block_hash"
      c0                             # None
      a9 746f6b656e5f696473          # "token_ids"
` + v026TokenBytes + `
      aa 626c6f636b5f73697a65        # "block_size"
      10                             # 16
      a7 6c6f72615f6964              # "lora_id"
      c0
      a6 6d656469756d                # "medium"
      a3 475055                      # "GPU"
      a9 6c6f72615f6e616d65          # "lora_name"
      c0
      aa 65787472615f6b657973        # "extra_keys"
      91 c0                          # [None]
      a9 67726f75705f696478          # "group_idx"
      00
      b2 6b765f63616368655f737065635f6b696e64  # "kv_cache_spec_kind"
      ae 66756c6c5f617474656e74696f6e          # "full_attention"
  00                                 # data_parallel_rank 0
`

// The same batch before vLLM PR #42892: the event a positional array, tag
// first, every field in declaration order, kv_cache_spec_sliding_window
// (None) too: msgspec writes an array_like struct whole
// (mpack_encode_struct_array), omit_defaults or not.
const v026ArrayHex = `
93
  cb 41da a8db e035 9fe7
  91
    9c                               # array of 12: tag + 11 fields
      ab 426c6f636b53746f726564      # "BlockStored"
      91 cf dab8 9baa 7b58 57c0      # block_hashes
      c0                             # parent_block_hash
` + v026TokenBytes + `
      10                             # block_size
      c0                             # lora_id
      a3 475055                      # medium
      c0                             # lora_name
      91 c0                          # extra_keys
      00                             # group_idx
      ae 66756c6c5f617474656e74696f6e
      c0                             # kv_cache_spec_sliding_window: None, written
  00
`

// The same batch as vLLM main sends it (EventBatch without array_like,
// at 0181ea3): the batch a map too, its fields in declaration order (a
// subclass's KVEventBatch.events keeps EventBatch's place), the event as
// in v026MapHex.
const v026BatchMapHex = `
83                                   # map of 3 (omit_defaults: the rank is not None)
  a2 7473                            # "ts"
  cb 41da a8db e035 9fe7
  a6 6576656e7473                    # "events"
  91
    8b
      a4 74797065 ab 426c6f636b53746f726564
      ac 626c6f636b5f686173686573 91 cf dab8 9baa 7b58 57c0
      b1 706172656e745f626c6f636b5f68617368 c0
      a9 746f6b656e5f696473
` + v026TokenBytes + `
      aa 626c6f636b5f73697a65 10
      a7 6c6f72615f6964 c0
      a6 6d656469756d a3 475055
      a9 6c6f72615f6e616d65 c0
      aa 65787472615f6b657973 91 c0
      a9 67726f75705f696478 00
      b2 6b765f63616368655f737065635f6b696e64 ae 66756c6c5f617474656e74696f6e
  b2 646174615f706172616c6c656c5f72616e6b  # "data_parallel_rank"
  00
`

// removedMapHex is a BlockRemoved and an AllBlocksCleared as vLLM 0.26
// sends them with a byte hash (32 bytes, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
// unset): its key is the low 64 bits of the bytes. The batch's rank is
// None: the array_like batch writes it as nil.
const removedMapHex = `
93 cb 3ff0000000000000               # [1.0, events, None]
  92
    84 a4 74797065 ac 426c6f636b52656d6f766564   # {"type": "BlockRemoved",
       ac 626c6f636b5f686173686573 91 c4 20      #  "block_hashes": [bin8 of 32:
          0000000000000000 0000000000000000 0000000000000000 0102030405060708 #  ]
       a6 6d656469756d a3 475055                 #  "medium": "GPU",
       a9 67726f75705f696478 00                  #  "group_idx": 0}
    81 a4 74797065 b0 416c6c426c6f636b73436c6561726564  # {"type": "AllBlocksCleared"}
  c0                                 # data_parallel_rank None
`

// removedArrayHex is such a batch (an int hash) before PR #42892.
const removedArrayHex = `
93 cb 3ff0000000000000
  92
    94 ac 426c6f636b52656d6f766564 91 cf 0102030405060708 a3 475055 00  # [tag, hashes, medium, group_idx]
    91 b0 416c6c426c6f636b73436c6561726564                              # [tag]
  c0                                 # data_parallel_rank None
`

// removedBatchMapHex is it as vLLM main sends it: the rank, None, left out.
const removedBatchMapHex = `
82                                   # map of 2: ts, events
  a2 7473 cb 3ff0000000000000
  a6 6576656e7473
  92
    84 a4 74797065 ac 426c6f636b52656d6f766564
       ac 626c6f636b5f686173686573 91 cf 0102030405060708
       a6 6d656469756d a3 475055
       a9 67726f75705f696478 00
    81 a4 74797065 b0 416c6c426c6f636b73436c6561726564
`

func TestDecodeGolden(t *testing.T) {
	// The annotated bytes, written by msgspec's rules for each form of
	// vLLM's structs, are checked three ways: Decode reads them as the
	// batch vLLM 0.26.0 printed (and the removal batch), AppendBatch
	// writes them byte for byte, and an independent msgpack library reads
	// the same values.
	if got := annotated(t, v026TokenBytes); len(got) != 3+5*5+7*3+3*2+1 {
		t.Fatalf("token bytes: %d", len(got))
	}
	removed := func() *Batch {
		return &Batch{TS: 1, DPRank: -1, Events: []Event{
			{Kind: BlockRemoved, BlockHashes: []uint64{0x0102030405060708}, Medium: "GPU", GroupIdx: 0},
			{Kind: AllBlocksCleared, GroupIdx: -1},
		}}
	}
	cases := []struct {
		name string
		hex  string
		want *Batch
		form Form
	}{
		{"v0.26.0-map", v026MapHex, v026Batch(), FormMap},
		{"pre-42892-array", v026ArrayHex, v026Batch(), FormArray},
		{"main-batch-map", v026BatchMapHex, v026Batch(), FormBatchMap},
		{"removed-cleared-map", removedMapHex, removed(), FormMap},
		{"removed-cleared-array", removedArrayHex, removed(), FormArray},
		{"removed-cleared-batch-map", removedBatchMapHex, removed(), FormBatchMap},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw := annotated(t, c.hex)
			var got Batch
			if err := Decode(raw, &got); err != nil {
				t.Fatal(err)
			}
			c.want.Form = c.form
			if d := cmp.Diff(c.want, &got, cmpopts.IgnoreUnexported(Batch{}), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("decoded (-want +got):\n%s", d)
			}
			if c.name != "removed-cleared-map" { // its hash was bytes; AppendBatch writes ints
				if enc := AppendBatch(nil, c.want, c.form); !bytes.Equal(enc, raw) {
					t.Errorf("AppendBatch:\n got %x\nwant %x", enc, raw)
				}
			}
			var generic any
			if err := msgpack.Unmarshal(raw, &generic); err != nil {
				t.Fatalf("msgpack library: %v", err)
			}
			golden := filepath.Join("testdata", c.name+".msgpack")
			if *update {
				if err := os.WriteFile(golden, raw, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if !bytes.Equal(want, raw) {
				t.Errorf("%s differs from the annotated bytes", golden)
			}
		})
	}
}

// TestV026AsPrinted compares the annotated bytes of each form, read by an
// independent msgpack library, with the batch as vLLM 0.26.0's subscriber
// printed it in kthena#1535 (Python's repr, in Go values): the map form
// as printed; the array form the same fields in declaration order, the
// sliding window's None too; the batch-map form the batch's fields by name.
func TestV026AsPrinted(t *testing.T) {
	tokens := make([]any, len(v026Tokens))
	for i, v := range v026Tokens {
		tokens[i] = uint64(v)
	}
	ts := 1789095808.8378847
	event := map[string]any{
		"type": "BlockStored", "block_hashes": []any{uint64(15760518052499183552)}, "parent_block_hash": nil,
		"token_ids": tokens, "block_size": uint64(16), "lora_id": nil, "medium": "GPU", "lora_name": nil,
		"extra_keys": []any{nil}, "group_idx": uint64(0), "kv_cache_spec_kind": "full_attention",
	}
	positional := []any{"BlockStored"}
	for _, name := range storedFields {
		positional = append(positional, event[name]) // kv_cache_spec_sliding_window: nil
	}
	for _, c := range []struct {
		name, hex string
		want      any
	}{
		{"map", v026MapHex, []any{ts, []any{event}, uint64(0)}},
		{"array", v026ArrayHex, []any{ts, []any{positional}, uint64(0)}},
		{"batch-map", v026BatchMapHex, map[string]any{"ts": ts, "events": []any{event}, "data_parallel_rank": uint64(0)}},
	} {
		var got any
		if err := msgpack.Unmarshal(annotated(t, c.hex), &got); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(widen(c.want), widen(got)); d != "" {
			t.Errorf("%s (-vLLM 0.26.0 +decoded):\n%s", c.name, d)
		}
	}
}

// widen turns every integer of a generic msgpack value into a uint64 (the
// library returns the width it read), recursively.
func widen(v any) any {
	switch x := v.(type) {
	case int8:
		return uint64(x)
	case uint8:
		return uint64(x)
	case int16:
		return uint64(x)
	case uint16:
		return uint64(x)
	case int32:
		return uint64(x)
	case uint32:
		return uint64(x)
	case int64:
		return uint64(x)
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = widen(x[i])
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = widen(e)
		}
		return out
	}
	return v
}
