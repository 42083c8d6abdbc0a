package traces

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"strings"
)

// Canonical prompt text and its token blocks: the one rule by which the
// proxy's journal, the emulator and the benchmark client turn a request
// body into prefix-cache blocks without a tokenizer.
//
// The canonical text of a request (PromptText) is its system prompt, then
// each message's role and text, in order: "\x00role\x00text" per message,
// so appending a message only appends text (a later turn's text starts with
// the earlier turn's text plus the answer). One token is TextBytesPerToken
// bytes of canonical text (TextTokens); a block is TextBlockTokens tokens,
// TextBlockBytes bytes. Block j's id (TextBlockIDs) is a keyed SHA-256 of
// block j-1's id and the block's bytes, so equal ids mean an equal prefix,
// as in vLLM's prefix cache.
const (
	TextBlockTokens   = 16
	TextBytesPerToken = 4
	TextBlockBytes    = TextBlockTokens * TextBytesPerToken
)

// EmulatorBlockKey keys the block ids of `warden emulate`'s engines
// (TextBlockIDs of the canonical text), which its KV events publish: a
// proxy that computes a prompt's ids with it finds them in those events.
const EmulatorBlockKey = "warden emulate"

// BillingPrefix starts Claude Code's per-request system block (it carries a
// changing cch= value); the canonical text skips it in system prompts.
const BillingPrefix = "x-anthropic-billing-header:"

// Dialect is the API a request body is written in, as far as its canonical
// text is concerned.
type Dialect uint8

const (
	DialectOpenAI    Dialect = iota // chat/completions (messages) and completions (prompt)
	DialectResponses                // OpenAI Responses: instructions, then input
	DialectAnthropic                // Anthropic Messages: system, then messages
)

// TextTokens is the approximate token count of canonical text: one token
// per TextBytesPerToken bytes, rounded up, at least 1.
func TextTokens(text []byte) int {
	return max(1, (len(text)+TextBytesPerToken-1)/TextBytesPerToken)
}

// TextBlockIDs returns the chained keyed ids of text's blocks, exactly
// ceil(tokens/TextBlockTokens) of them. A block wholly inside the text and
// inside tokens is a full block: its id hashes the key, the previous id and
// its 64 bytes. Ids beyond the text are chained from the last one (tokens
// may exceed the text's own count when a server reports more); a final
// partial block gets an id that no full block can have.
func TextBlockIDs(key []byte, text []byte, tokens int) []uint64 {
	n := (tokens + TextBlockTokens - 1) / TextBlockTokens
	ids := make([]uint64, 0, max(n, 0))
	var prev uint64
	var buf [8]byte
	var sum [sha256.Size]byte
	h := sha256.New()
	for j := range n {
		h.Reset()
		h.Write(key)
		binary.LittleEndian.PutUint64(buf[:], prev)
		h.Write(buf[:])
		lo := j * TextBlockBytes
		full := (j+1)*TextBlockTokens <= tokens
		switch {
		case lo+TextBlockBytes <= len(text) && full:
			h.Write(text[lo : lo+TextBlockBytes])
		case lo < len(text):
			h.Write(text[lo:min(len(text), lo+TextBlockBytes)])
		default:
			binary.LittleEndian.PutUint64(buf[:], uint64(j))
			h.Write([]byte("beyond-text"))
			h.Write(buf[:])
		}
		if !full {
			h.Write([]byte("partial")) // a partial block never equals a full one
		}
		prev = binary.LittleEndian.Uint64(h.Sum(sum[:0]))
		ids = append(ids, prev)
	}
	return ids
}

// MessageText is the canonical text of one message: "\x00role\x00text".
// Appending it to a request's canonical text gives the canonical text of
// the request with that message appended.
func MessageText(role, text string) string { return "\x00" + role + "\x00" + text }

// PromptText is the canonical text of a request body: for a completions
// body its prompt; otherwise the system prompt (Anthropic system, or
// Responses instructions), then each message's MessageText in order (a
// Responses string input is one user message). A body that is not JSON or
// whose fields have other types contributes what it can (possibly nothing).
func PromptText(body []byte, d Dialect) []byte {
	var v struct {
		System       json.RawMessage `json:"system"`
		Messages     []textMessage   `json:"messages"`
		Instructions string          `json:"instructions"`
		Input        json.RawMessage `json:"input"`
		Prompt       json.RawMessage `json:"prompt"`
	}
	_ = json.Unmarshal(body, &v)
	var b bytes.Buffer
	if len(v.Prompt) > 0 {
		b.WriteString(ContentText(v.Prompt, false))
		return b.Bytes()
	}
	b.WriteString(ContentText(v.System, true))
	b.WriteString(v.Instructions)
	if d == DialectResponses {
		in := bytes.TrimSpace(v.Input)
		if len(in) > 0 && in[0] == '"' {
			b.WriteString(MessageText("user", ContentText(in, false)))
			return b.Bytes()
		}
		_ = json.Unmarshal(in, &v.Messages)
	}
	for _, m := range v.Messages {
		b.WriteString(MessageText(m.Role, ContentText(m.Content, m.Role == "system")))
	}
	return b.Bytes()
}

type textMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// ContentText returns the text of a JSON content value: the string itself,
// or the text of each block of a list joined by NUL bytes (so that one text
// block reads as the string); a block without text contributes its raw
// JSON. With skipBilling, text blocks starting with BillingPrefix are left
// out. null or empty gives "".
func ContentText(c []byte, skipBilling bool) string {
	c = bytes.TrimSpace(c)
	if len(c) == 0 || string(c) == "null" {
		return ""
	}
	if c[0] == '"' {
		var s string
		if json.Unmarshal(c, &s) == nil {
			return s
		}
		return ""
	}
	var blocks []json.RawMessage
	if json.Unmarshal(c, &blocks) != nil {
		return string(c)
	}
	var sb strings.Builder
	for _, raw := range blocks {
		var blk struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		text := string(raw)
		if json.Unmarshal(raw, &blk) == nil && blk.Text != "" {
			if skipBilling && strings.HasPrefix(blk.Text, BillingPrefix) {
				continue
			}
			text = blk.Text
		}
		if sb.Len() > 0 {
			sb.WriteByte(0) // blocks are separated; one text block reads as the string
		}
		sb.WriteString(text)
	}
	return sb.String()
}
