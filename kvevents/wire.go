package kvevents

import "fmt"

// Kind is an event's type, its msgspec tag (the class name in
// vllm/distributed/kv_events.py).
type Kind uint8

const (
	// BlockStored: full blocks entered the prefix cache (BlockPool.cache_full_blocks).
	BlockStored Kind = iota + 1
	// BlockRemoved: cached blocks were evicted (BlockPool._maybe_evict_cached_block).
	BlockRemoved
	// AllBlocksCleared: the prefix cache was reset (BlockPool.reset_prefix_cache).
	AllBlocksCleared
)

var kindNames = [...]string{BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Form is how a batch is encoded on the wire: vLLM's msgspec structs in
// vllm/distributed/kv_events.py, as they were at each change of their
// encoding. msgspec writes an array_like struct whole (every field, a
// default too: mpack_encode_struct_array in msgspec/_core.c; omit_defaults
// applies to maps only, msgspec issue #720) and a map without the fields
// equal to their default when omit_defaults is set
// (mpack_encode_struct_object).
type Form uint8

const (
	// FormArray: KVEventBatch and its events array_like, [ts, events,
	// data_parallel_rank] with each event [tag, field...], every field
	// written (vLLM PR #16750 to before PR #42892, the fields of
	// PR #40984's BlockStored: 11).
	FormArray Form = iota + 1
	// FormMap: the events tagged maps without their defaults, the batch
	// still array_like (vLLM PR #42892, "[KV Events] Switch event structs
	// from array to map encoding"; vLLM 0.26.0 sends it, as
	// volcano-sh/kthena#1535 printed).
	FormMap
	// FormBatchMap: the batch a map too, {"ts", "events",
	// "data_parallel_rank"}, the rank left out when None (vLLM main at
	// 0181ea3: EventBatch without array_like).
	FormBatchMap
)

// Forms are the wire forms, oldest first.
var Forms = []Form{FormArray, FormMap, FormBatchMap}

// ParseForm reads a form's name (Form.String).
func ParseForm(s string) (Form, error) {
	for _, f := range Forms {
		if s == f.String() {
			return f, nil
		}
	}
	return 0, fmt.Errorf("kv events form %q: want array (vLLM before PR #42892), map (PR #42892, vLLM 0.26) or batch-map (the batch a map too, vLLM main)", s)
}

func (f Form) String() string {
	switch f {
	case FormArray:
		return "array"
	case FormMap:
		return "map"
	case FormBatchMap:
		return "batch-map"
	}
	return fmt.Sprintf("Form(%d)", uint8(f))
}

// MediumGPU is the medium of blocks in GPU memory (kv_events.MEDIUM_GPU);
// an event without a medium (None, or vLLM before PR #19737) is on the GPU too.
const MediumGPU = "GPU"

// Event is one KV-cache event. Fields a kind does not have are zero.
type Event struct {
	Kind Kind
	// BlockHashes are the blocks stored or removed, in chain order for
	// BlockStored.
	BlockHashes []uint64
	// ParentBlockHash is the hash of the block before the first stored one
	// (HasParent false: None, the chain starts at the prompt's start).
	ParentBlockHash uint64
	HasParent       bool
	// TokenIDs are the tokens of the stored blocks, BlockSize per block.
	TokenIDs  []uint32
	BlockSize int
	// Medium is "GPU", "CPU", ...; "" is None (the GPU).
	Medium string
	// GroupIdx is the KV-cache group (hybrid models have several); -1 is
	// None.
	GroupIdx int
	// CacheSpecKind is kv_cache_spec_kind ("full_attention", ...); "" is None.
	CacheSpecKind string
	// ExtraKeys, on encoding a BlockStored: write extra_keys as one None per
	// block (what vLLM sends for plain text prompts) rather than None.
	// Decoding sets it when extra_keys was a list.
	ExtraKeys bool
}

// OnGPU reports whether the event's blocks are in GPU memory.
func (e *Event) OnGPU() bool { return e.Medium == "" || e.Medium == MediumGPU }

// Batch is one KVEventBatch: the events of one engine step.
type Batch struct {
	TS     float64 // Unix seconds, as time.time()
	Events []Event
	// DPRank is the engine's data_parallel_rank, -1 when the batch has none.
	DPRank int
	// Form is how the batch was encoded (Decode sets it from the batch
	// and its first event; an array batch without events reads as
	// FormArray).
	Form Form
	// Skipped counts events of a type this package does not know, which
	// Decode skips (a later vLLM may add some).
	Skipped int

	hashes []uint64 // backing arrays, reused by Decode
	tokens []uint32
}

// Reset empties b, keeping its memory for the next Decode.
func (b *Batch) Reset() {
	clear(b.Events)
	*b = Batch{Events: b.Events[:0], DPRank: -1, hashes: b.hashes[:0], tokens: b.tokens[:0]}
}
