package placement

// Prompt is what a prefix-aware policy knows of a request's prompt,
// coordinate-free: the chain of block ids that equal prefixes share. The
// simulator fills it from the trace (traces.Request.HashIDs, block_size
// tokens a block); the proxy from the canonical text (traces.TextBlockIDs:
// 16 tokens of 4 bytes a block). Equal ids at position j mean an equal
// prefix up to the end of block j, as in vLLM's prefix cache.
//
// The peers' routers that read characters or pseudo-tokens see the text
// that the rule in doc.go ("The prompt as text") derives from these ids:
// no policy needs the prompt's real bytes.
type Prompt struct {
	// BlockTokens is the number of tokens in each block of Blocks (the
	// trace's block_size); 0 when Blocks is empty.
	BlockTokens int
	// Blocks are the chained block ids, ceil(Request.PromptTokens /
	// BlockTokens) of them; the last covers a partial block when the
	// prompt is not a whole number of blocks, and its id differs from any
	// full block's.
	Blocks []uint64
	// Held, when not nil, is aligned with Snapshot.Replicas: how many
	// leading full blocks of Blocks each replica holds in its KV cache now
	// (from vLLM's KV events in the proxy, the block pools in the
	// simulator). nil means unknown. Only policies that say they read it
	// (HeldReader) need it filled.
	Held []int
}

// Tokens returns how many tokens of the prompt Blocks describe: tokens,
// the request's PromptTokens, when Blocks covers it, else the whole blocks.
func (p *Prompt) tokens(promptTokens int) int {
	if p.BlockTokens <= 0 || len(p.Blocks) == 0 {
		return 0
	}
	full := len(p.Blocks) * p.BlockTokens
	if promptTokens > full-p.BlockTokens && promptTokens <= full {
		return promptTokens
	}
	return full
}

// blockLen returns the tokens in block j of a prompt of tokens tokens.
func (p *Prompt) blockLen(j, tokens int) int {
	return min(p.BlockTokens, tokens-j*p.BlockTokens)
}
