package bench

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/lm-warden/warden/traces"
)

// Prompt text. The synthetic sessions of package traces have token counts,
// not text; bench turns them into text by the project's canonical-text rule
// (live/journal.go's journal block model, which the emulator also follows):
// the canonical text of a request is the system prompt, then each message as
// "\x00" + role + "\x00" + text, in order, and one token is 4 bytes of it.
//
// Every generated segment is a run of 4-byte "tokens", each a space and a
// common three-letter English word (" the", " and", ...), so a real
// tokenizer also sees about one token per 4 bytes. A segment's words come
// from a PCG stream seeded with the segment's key:
//
//   - the system prompt's key depends only on its size, so it is the same
//     text for every session of every seed, as in the generator;
//   - the first user message and each later user text are keyed by the seed,
//     the session id and the segment index, so they are unique per session.
//
// The role markers are part of the canonical text, so each message's text is
// shortened by the markers it brings: the system prompt by its own marker
// (OpenAI only: Anthropic's system field has none), the first user message
// by "\x00user\x00", a later user text by its marker and by the previous
// assistant message's marker "\x00assistant\x00" (the answer itself is the
// server's text, appended as it came). With answers of 4 bytes per token,
// the canonical text of turn k is then exactly 4 x PromptTokens bytes, and
// its 64-byte blocks (16 tokens) line up with the generator's block ids: the
// shared system prompt gives shared blocks, the block that straddles into
// the first message is the session's own.

// BytesPerToken is the canonical text's size of one token.
const BytesPerToken = 4

// Role markers of the canonical text.
const (
	markerSystem    = "\x00system\x00"
	markerUser      = "\x00user\x00"
	markerAssistant = "\x00assistant\x00"
)

// words are the "tokens" of generated text: 64 common three-letter words.
var words = [64]string{
	"the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was", "one", "our", "out",
	"day", "get", "has", "him", "his", "how", "man", "new", "now", "old", "see", "two", "way", "who", "boy", "did",
	"its", "let", "put", "say", "she", "too", "use", "add", "run", "set", "end", "big", "few", "try", "ask", "own",
	"why", "yes", "off", "far", "low", "top", "red", "key", "map", "log", "sum", "row", "box", "tag", "pin", "fix",
}

// segmentText returns exactly n bytes of text (n >= 0) for the segment key.
func segmentText(key uint64, n int) string {
	if n <= 0 {
		return ""
	}
	rng := rand.New(rand.NewPCG(key, 0x62656e6368)) // "bench"
	var b strings.Builder
	b.Grow(n + BytesPerToken)
	for b.Len() < n {
		v := rng.Uint64()
		for k := 0; k < 10 && b.Len() < n; k++ {
			b.WriteByte(' ')
			b.WriteString(words[v&63])
			v >>= 6
		}
	}
	return b.String()[:n]
}

// segmentKey hashes the words naming a segment.
func segmentKey(parts ...string) uint64 {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return binary.LittleEndian.Uint64(h.Sum(nil))
}

// Message is one message of a chat request.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Conversation is one synthetic session on the wire: the texts of its
// messages so far. Make it with NewConversation; for turn k call Prompt, send
// it, then Answer with the text the server streamed back.
type Conversation struct {
	Session   traces.Session
	UUID      string // the session id sent as X-Claude-Code-Session-Id
	api       API
	seed      uint64
	sysTokens int
	system    string
	msgs      []Message // user, assistant, user, ...
}

// NewConversation prepares session s of the generator seeded with seed for
// api. The system prompt has systemTokens tokens (the workload's).
func NewConversation(s traces.Session, systemTokens int, seed uint64, api API) *Conversation {
	c := &Conversation{Session: s, UUID: SessionUUID(seed, s.ID), api: api, seed: seed, sysTokens: systemTokens}
	sysBytes := BytesPerToken * systemTokens
	if api == OpenAI && systemTokens > 0 {
		sysBytes -= len(markerSystem)
	}
	c.system = segmentText(segmentKey("system", fmt.Sprint(systemTokens)), sysBytes)
	return c
}

// SessionUUID is the session id bench sends for session id of seed: a
// version-4-shaped UUID derived from both, so the same seed sends the same
// ids.
func SessionUUID(seed uint64, id string) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("warden-bench\x00%d\x00%s", seed, id)))
	sum[6] = sum[6]&0x0f | 0x40
	sum[8] = sum[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// System returns the system prompt's text; HasSystem whether one is sent
// (the workload has a system prompt).
func (c *Conversation) System() string { return c.system }

// HasSystem reports whether the requests carry a system prompt.
func (c *Conversation) HasSystem() bool { return c.sysTokens > 0 }

// Prompt appends turn k's new user text and returns the messages to send
// (the slice is the conversation's own; do not modify it). Turns must come
// in order, each after the previous turn's Answer.
func (c *Conversation) Prompt(k int) []Message {
	w := len(c.msgs)
	if w != 2*k {
		panic(fmt.Sprintf("bench: turn %d of %s prompted with %d messages so far", k, c.Session.ID, w))
	}
	req := &c.Session.Turns[k]
	var n int
	var key uint64
	if k == 0 {
		first := req.PromptTokens - c.sysTokens
		n = BytesPerToken*first - len(markerUser)
		key = segmentKey("first", fmt.Sprint(c.seed), c.Session.ID)
	} else {
		prev := &c.Session.Turns[k-1]
		added := req.PromptTokens - prev.PromptTokens - prev.OutputTokens
		n = BytesPerToken*added - len(markerUser) - len(markerAssistant)
		key = segmentKey("user", fmt.Sprint(c.seed), c.Session.ID, fmt.Sprint(k))
	}
	c.msgs = append(c.msgs, Message{Role: "user", Content: segmentText(key, n)})
	return c.msgs
}

// Answer records the assistant's answer to the last Prompt.
func (c *Conversation) Answer(text string) {
	c.msgs = append(c.msgs, Message{Role: "assistant", Content: text})
}
