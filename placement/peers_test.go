package placement

import (
	"testing"
	"time"
)

// Helpers shared by the peers' golden tests (peer_*_test.go).

// tokenPrompt is a prompt of one-token blocks whose tokens are toks: block
// j's id chains the ids before it with token j, as a tokenised prompt's
// blocks hash at block size 1, so prompts that share their first k tokens
// share their first k ids.
func tokenPrompt(toks ...uint64) Prompt {
	p := Prompt{BlockTokens: 1}
	prev := uint64(0x70726f6d7074)
	for _, t := range toks {
		prev = mix64(prev ^ mix64(t+1))
		p.Blocks = append(p.Blocks, prev)
	}
	return p
}

// seqTokens returns the tokens lo, lo+1, ..., hi-1.
func seqTokens(lo, hi int) []uint64 {
	var out []uint64
	for t := lo; t < hi; t++ {
		out = append(out, uint64(t))
	}
	return out
}

// preq is a request with prompt p (PromptTokens from its blocks).
func preq(session string, p Prompt) Request {
	return Request{Session: session, Pinned: NoPin, Prompt: p, PromptTokens: len(p.Blocks) * p.BlockTokens, Model: "test-model"}
}

func mustPick(t *testing.T, p Policy, r Request, s *Snapshot, now time.Time) int {
	t.Helper()
	return pick(t, p, r, s, now).Replica
}

func TestVTextSharedPrefix(t *testing.T) {
	a := tokenPrompt(1, 2, 3, 4)
	b := tokenPrompt(1, 2, 9)
	ta := appendPromptText(nil, &a, 4)
	tb := appendPromptText(nil, &b, 3)
	if got := ta.size(); got != 16 {
		t.Fatalf("size %d, want 16 (4 tokens of %d bytes)", got, TextBytesPerToken)
	}
	// Two equal blocks (8 bytes), then blocks whose ids differ: their text
	// shares only what their derived bytes happen to share.
	got := sharedPrefix(ta, tb)
	want := 8
	for k := int32(0); k < 4 && textByte(a.Blocks[2], k) == textByte(b.Blocks[2], k); k++ {
		want++
	}
	if got != want {
		t.Errorf("sharedPrefix = %d, want %d", got, want)
	}
	head, tail := ta.split(6)
	if head.size() != 6 || tail.size() != 10 || sharedPrefix(head, ta) != 6 {
		t.Errorf("split(6): %d + %d bytes", head.size(), tail.size())
	}
	c := cursor{t: ta}
	c.advance(6)
	if got := c.shared(tail); got != 10 {
		t.Errorf("cursor at 6 shares %d bytes with the tail, want 10", got)
	}
}
