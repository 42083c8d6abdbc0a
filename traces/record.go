package traces

// Contract shared with sim/ and live/ (owned by the traces helper, who may add
// fields and functions but keeps these names and meanings).

// Request is one request of a trace: one line of the JSONL format (FORMAT.md).
type Request struct {
	ArrivalMs    int64  `json:"t_ms"`             // arrival, ms from the start of the trace
	Session      string `json:"session"`          // opaque; recorded ids are keyed hashes
	Parent       string `json:"parent,omitempty"` // parent session (subagents)
	Turn         int    `json:"turn"`             // 0-based turn within the session
	Model        string `json:"model,omitempty"`  //
	PromptTokens int    `json:"prompt_tokens"`    //
	OutputTokens int    `json:"output_tokens"`    //
	CachedTokens int    `json:"cached_tokens"`    // -1: unknown
	Replica      int    `json:"replica"`          // -1: unknown
	ThinkMs      int64  `json:"think_ms"`         // client time between the previous turn's end and this send
	// HashIDs are the prompt's blocks at the header's block size, in order:
	// len == ceil(PromptTokens/BlockSize); the last one may cover a partial
	// block. Equal ids mean equal content with an equal prefix (chained).
	HashIDs []uint64 `json:"hash_ids"`
	// OutputHashIDs (optional) are the blocks that the generated tokens
	// complete: full blocks from index floor(PromptTokens/BlockSize) to
	// floor((PromptTokens+OutputTokens)/BlockSize)-1. They let a later turn
	// that repeats the answer hit the blocks cached during decode.
	OutputHashIDs []uint64 `json:"output_hash_ids,omitempty"`
}

// Session is one conversation: its requests in turn order.
type Session struct {
	ID     string
	Parent string
	// ParentTurn is, for a subagent session (Parent != ""), the parent's
	// turn after which it was spawned; -1 when unknown.
	ParentTurn int
	Turns      []Request
	// Subagents are the sessions this one spawned, in spawn order, each
	// with the request it follows as ParentTurn (Generator.NextFamily);
	// nil elsewhere (a trace lists subagents as sessions of their own).
	Subagents []Session
	// SharedTokens is the prompt prefix the session shares with others of
	// its agent kind: its system prompt (0: unknown).
	SharedTokens int
}

// Clone returns a deep copy of r: its hash id slices are copied, so the
// copy survives a Reader reusing its buffers.
func (r *Request) Clone() Request {
	c := *r
	c.HashIDs = append([]uint64(nil), r.HashIDs...)
	if r.OutputHashIDs != nil {
		c.OutputHashIDs = append([]uint64(nil), r.OutputHashIDs...)
	}
	return c
}
