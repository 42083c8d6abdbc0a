package emulator

import (
	"math/rand/v2"

	"github.com/lm-warden/warden/traces"
)

// Prompts and answers as the engine sees them.
//
// A prompt's blocks are the canonical-text blocks of traces/text.go (one
// token = 4 bytes, 16-token blocks, chained keyed ids), so equal prefixes
// hit. The answer to a request is deterministic text of 4 bytes per token
// (three letters and a space; the last token ends with a period) drawn from
// a generator seeded by the emulator's seed and the prompt's last block id.
// The blocks that the answer completes during decode get the ids of the
// canonical text of the prompt followed by the answer as the next turn will
// send it: an assistant message (traces.MessageText) for chat and
// Anthropic, the bare text for completions. A following turn that carries
// the answer therefore hits the blocks cached during decode, as in vLLM.
// The prompt's own full blocks are hashed from that extended text as well,
// since the prompt's last token may be short of 4 bytes (tokens = bytes/4
// rounded up) and its missing bytes are the continuation's first ones.

// blockKey keys the emulator's block ids.
var blockKey = []byte(traces.EmulatorBlockKey)

// bytesPerToken is the length of one output token of an answer.
const bytesPerToken = traces.TextBytesPerToken

// answerText returns the answer of n tokens to a prompt whose last block id
// is last.
func answerText(seed, last uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, last))
	b := make([]byte, 0, n*bytesPerToken)
	for i := range n {
		for range bytesPerToken - 1 {
			b = append(b, byte('a'+rng.IntN(26)))
		}
		if i == n-1 {
			b = append(b, '.')
		} else {
			b = append(b, ' ')
		}
	}
	return string(b)
}

// continuation is what follows a prompt's canonical text once the answer
// is part of the conversation.
func continuation(api API, answer string) string {
	if api == APICompletions {
		return answer
	}
	return traces.MessageText("assistant", answer)
}

// engineRequest builds the engine's view of a request at the farm's block
// size (a multiple of traces.TextBlockTokens): the prompt's block ids and
// those its answer completes; it also returns the answer.
func engineRequest(api API, r *Request, seed uint64, blockSize int) (*traces.Request, string) {
	ids := traces.TextBlockIDs(blockKey, r.Text, r.PromptTokens)
	answer := answerText(seed, ids[len(ids)-1], r.MaxTokens)
	ext := append(append([]byte(nil), r.Text...), continuation(api, answer)...)
	extIDs := traces.TextBlockIDs(blockKey, ext, traces.TextTokens(ext))

	// The prompt's full blocks are taken from the extended text too: the
	// text may end inside its last token (4 bytes), whose missing bytes are
	// the continuation's first ones in the next turn.
	m := blockSize / traces.TextBlockTokens
	p, o := r.PromptTokens, r.MaxTokens
	full16 := p / traces.TextBlockTokens
	promptIDs := append(extIDs[:full16:full16], ids[full16:]...)
	req := &traces.Request{
		PromptTokens: p,
		OutputTokens: o,
		CachedTokens: -1,
		Replica:      -1,
		HashIDs:      regroup(promptIDs, m, 0, (p+blockSize-1)/blockSize),
		// Full blocks from floor(p/B) to floor((p+o)/B)-1 (traces.Request),
		// as far as they lie inside the text: a completions prompt is not
		// token aligned, so its answer's last block may not be known yet
		// (it is then not cached, as if its content were still unknown).
		OutputHashIDs: regroup(extIDs, m, p/blockSize, min((p+o)/blockSize, len(ext)/(blockSize*bytesPerToken))),
	}
	return req, answer
}

// regroup returns the ids of blocks [from, to) of m 16-token blocks each,
// from the ids of the 16-token blocks: a block's id is the id of its last
// 16-token block (ids chain, so it names the whole prefix) or, for a
// trailing partial block, the last id there is.
func regroup(ids []uint64, m, from, to int) []uint64 {
	out := make([]uint64, 0, max(to-from, 0))
	for k := from; k < to; k++ {
		j := min((k+1)*m-1, len(ids)-1)
		out = append(out, ids[j])
	}
	return out
}
