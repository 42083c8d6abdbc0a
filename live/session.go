package live

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/lm-warden/warden/live/jsonscan"
	"hash"
	"net/http"
	"strings"
	"sync"

	"github.com/lm-warden/warden/traces"
)

// Session id sources, in the order [Extract] tries them (the first one that
// yields a non-empty id wins). Where each header was verified:
//
//   - X-Dynamo-Session-ID and X-Dynamo-Parent-Session-ID: NVIDIA Dynamo's
//     canonical agent session headers, "Identify Agent Sessions"
//     (docs.nvidia.com/dynamo/dev/agents/identify-agent-sessions): when
//     X-Dynamo-Session-ID is present Dynamo uses it (and the parent
//     header) instead of any agent-native identity, and so does warden.
//   - x-session-affinity, X-Session-Id, x-opencode-session and
//     x-parent-session-id: OpenCode, sst/opencode
//     packages/opencode/src/session/llm/request.ts (LLMRequestPrep.prepare):
//     x-session-affinity and X-Session-Id carry the session id for other
//     providers, x-opencode-session for its own (opencode*) providers,
//     x-parent-session-id a subagent's parent session.
//   - x-codex-parent-thread-id: Codex, openai/codex
//     codex-rs/core/src/client.rs (X_CODEX_PARENT_THREAD_ID_HEADER) and
//     codex-rs/core/src/responses_metadata.rs (compatibility_headers: sent
//     when the thread is a subagent's). Codex's own thread id header
//     (thread-id) was not found in openai/codex's source here, so it is
//     not read; its session-id is.
//   - x-claude-code-agent-id and x-claude-code-parent-agent-id: Claude Code
//     subagents (see headerAgentID).
const (
	SourceDynamo         = "X-Dynamo-Session-ID"      // NVIDIA Dynamo's canonical header
	SourceClaudeCode     = "X-Claude-Code-Session-Id" // Claude Code
	SourceCodex          = "session-id"               // Codex CLI
	SourceOpenCode       = "x-session-id"             // OpenCode (X-Session-Id)
	SourceAffinity       = "x-session-affinity"       // OpenCode, and routers that share the convention
	SourceOpenCodeZen    = "x-opencode-session"       // OpenCode to its own providers
	SourceMetadataUserID = "metadata.user_id"         // Anthropic body
	SourcePromptCacheKey = "prompt_cache_key"         // OpenAI body
	SourceUser           = "user"                     // OpenAI body (older)
	SourcePromptHash     = "prompt-hash"              // fallback: system prompt + first user message
	SourceNone           = "none"                     // none of them, no system prompt or user message: no session
)

// Subagent headers sent by Claude Code.
const (
	headerAgentID       = "x-claude-code-agent-id"
	headerParentAgentID = "x-claude-code-parent-agent-id"
)

// Parent session headers of other agents' subagents (see the Source
// constants for where each was verified), in the order they are tried.
var parentHeaders = [...]string{"X-Dynamo-Parent-Session-ID", "x-parent-session-id", "x-codex-parent-thread-id"}

// HeaderSessionEnd, on a request, says that it is its conversation's last
// turn: once it ends the proxy forgets the conversation and frees its
// footprint at once (as DELETE /v1/sessions/{id} on the admin address
// does), instead of holding it for its return timeout and its home for
// the session TTL. It is warden's own header (no agent sends one today);
// any value but "", "0" and "false" counts.
const HeaderSessionEnd = "X-Warden-Session-End"

// sessionEnds reports whether h carries HeaderSessionEnd.
func sessionEnds(h http.Header) bool {
	switch strings.ToLower(strings.TrimSpace(h.Get(HeaderSessionEnd))) {
	case "", "0", "false":
		return false
	}
	return true
}

// fallbackPromptBytes bounds how much of a /v1/completions prompt the
// fallback hashes: completions resend the whole conversation as one string,
// so only a prefix is stable across turns.
const fallbackPromptBytes = 32 << 10

// Identity is what a request says about its conversation. Session and
// Parent are raw client values: hash them with a [Keyer] before they are
// stored or logged.
type Identity struct {
	Session string
	Parent  string // the root conversation of a subagent, or ""
	Source  string // one of the Source* constants
}

// ErrSessionTooLong is returned (wrapped) when a client's session id is
// longer than the configured maximum.
var ErrSessionTooLong = errors.New("session id too long")

// decodeBody validates a request body and decodes the fields the proxy
// needs (see jsonscan.Scan).
func decodeBody(data []byte) (jsonscan.Body, error) { return jsonscan.Scan(data) }

// extractFrom finds the session id of a request whose body decoded to b,
// trying in order: the headers X-Dynamo-Session-ID,
// X-Claude-Code-Session-Id, session-id, x-session-id, x-session-affinity,
// x-opencode-session (with a parent from X-Dynamo-Parent-Session-ID,
// x-parent-session-id or x-codex-parent-thread-id); the body's
// metadata.user_id (JSON-string form {"session_id":...} or the older
// user_<hash>_account_<uuid>_session_<uuid>); prompt_cache_key; user; and
// finally a hash of the system prompt and the first user message (Claude
// Code's billing-header system block skipped). A body with none of these
// has no session (Session "", Source SourceNone): it is placed as new each
// time. A Claude Code subagent (x-claude-code-agent-id) gets its own
// session with the root conversation as Parent. An id longer than maxLen
// bytes is an error.
func extractFrom(h http.Header, b *jsonscan.Body, api API, maxLen int) (Identity, error) {
	id := Identity{}
	for _, name := range [...]string{SourceDynamo, SourceClaudeCode, SourceCodex, SourceOpenCode, SourceAffinity, SourceOpenCodeZen} {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			id = Identity{Session: v, Source: name}
			break
		}
	}
	if id.Session != "" {
		for _, name := range parentHeaders {
			if v := strings.TrimSpace(h.Get(name)); v != "" && v != id.Session {
				if len(v) > maxLen {
					return Identity{}, fmt.Errorf("%w: %s is %d bytes (at most %d)", ErrSessionTooLong, name, len(v), maxLen)
				}
				id.Parent = v // a subagent: placed on its parent's home (placement's reason parent)
				break
			}
		}
	}
	if id.Session == "" && b.Metadata != nil && b.Metadata.UserID != "" {
		id = Identity{Session: sessionFromUserID(b.Metadata.UserID), Source: SourceMetadataUserID}
	}
	if id.Session == "" && b.PromptCacheKey != "" {
		id = Identity{Session: b.PromptCacheKey, Source: SourcePromptCacheKey}
	}
	if id.Session == "" && b.User != "" {
		id = Identity{Session: b.User, Source: SourceUser}
	}
	if len(id.Session) > maxLen {
		return Identity{}, fmt.Errorf("%w: %s is %d bytes (at most %d)", ErrSessionTooLong, id.Source, len(id.Session), maxLen)
	}
	if agent := strings.TrimSpace(h.Get(headerAgentID)); agent != "" {
		parent := id.Session
		if parent == "" {
			parent = strings.TrimSpace(h.Get(headerParentAgentID))
		}
		for _, kv := range [...][2]string{{headerAgentID, agent}, {headerParentAgentID, parent}} {
			if len(kv[1]) > maxLen {
				return Identity{}, fmt.Errorf("%w: %s is %d bytes (at most %d)", ErrSessionTooLong, kv[0], len(kv[1]), maxLen)
			}
		}
		switch {
		case parent != "":
			src := id.Source
			if src == "" {
				src = headerParentAgentID
			}
			id = Identity{Session: parent + "\x00agent\x00" + agent, Parent: parent, Source: src}
		default:
			id = Identity{Session: agent, Source: headerAgentID}
		}
	}
	if id.Session != "" {
		return id, nil
	}
	if h := promptHash(b, api); h != "" {
		return Identity{Session: h, Source: SourcePromptHash}, nil
	}
	return Identity{Source: SourceNone}, nil
}

// Extract validates a request body (raw) and returns its session; see
// extractFrom for the order of the sources.
func Extract(h http.Header, raw []byte, api API, maxLen int) (Identity, error) {
	b, err := decodeBody(raw)
	if err != nil {
		return Identity{}, err
	}
	return extractFrom(h, &b, api, maxLen)
}

// sessionFromUserID reads the session out of Anthropic's metadata.user_id.
func sessionFromUserID(u string) string {
	if strings.HasPrefix(u, "{") {
		var v struct {
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal([]byte(u), &v) == nil && v.SessionID != "" {
			return v.SessionID
		}
		return u
	}
	if i := strings.LastIndex(u, "_session_"); i >= 0 && i+len("_session_") < len(u) {
		return u[i+len("_session_"):]
	}
	return u
}

// content is a message's content: a string or a list of typed blocks.
type content []byte

// text returns the text of a content value: the string itself, or the
// text of each text block joined; non-text blocks contribute their raw JSON;
// with skipBilling, Claude Code's billing block is left out
// (traces.ContentText).
func (c content) text(skipBilling bool) string { return traces.ContentText(c, skipBilling) }

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// promptParts returns the system prompt and the first user message of a
// request body b; only called when no explicit session id was found. It
// reads the raw top-level values jsonscan.Scan kept (exact keys, each once);
// a value of another type than expected counts as absent.
func promptParts(b *jsonscan.Body, api API) (system, user string) {
	raw := b.Fallback
	var messages []message
	switch api {
	case APIAnthropic:
		system = content(raw(jsonscan.KeySystem)).text(true)
	case APIResponses:
		_ = json.Unmarshal(raw(jsonscan.KeyInstructions), &system)
		in := bytes.TrimSpace(raw(jsonscan.KeyInput))
		if len(in) > 0 && in[0] == '"' {
			return system, content(in).text(false)
		}
		_ = json.Unmarshal(in, &messages)
	}
	if p := raw(jsonscan.KeyPrompt); len(p) > 0 {
		t := content(p).text(false)
		return "", t[:min(len(t), fallbackPromptBytes)]
	}
	if api != APIResponses {
		_ = json.Unmarshal(raw(jsonscan.KeyMessages), &messages)
	}
	var sys strings.Builder
	sys.WriteString(system)
	for _, m := range messages {
		switch m.Role {
		case "system", "developer":
			sys.WriteString(content(m.Content).text(true))
			sys.WriteByte(0)
		case "user":
			return sys.String(), content(m.Content).text(false)
		}
	}
	return sys.String(), ""
}

// promptHash is the fallback session id: a digest of the system prompt and
// the first user message, which stay the same on every turn. A body with
// neither has nothing that tells its conversation from another: "", no
// session (placed as new each time, not pinned anywhere).
func promptHash(b *jsonscan.Body, api API) string {
	system, user := promptParts(b, api)
	if system == "" && user == "" {
		return ""
	}
	h := sha256.New()
	h.Write([]byte(system))
	h.Write([]byte{0, 0})
	h.Write([]byte(user))
	return "prompt:" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Keyer turns raw session ids into keyed hashes (HMAC-SHA256, 128 bits,
// hex): the only form in which an id is stored, logged or journaled. It is
// safe for concurrent use.
type Keyer struct {
	pool sync.Pool
}

// NewKeyer returns a Keyer for key.
func NewKeyer(key []byte) *Keyer {
	k := append([]byte(nil), key...)
	return &Keyer{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, k) }}}
}

// Sum returns the keyed hash of id as 32 hex digits, or "" for "".
func (k *Keyer) Sum(id string) string {
	if id == "" {
		return ""
	}
	m := k.pool.Get().(hash.Hash)
	m.Reset()
	m.Write([]byte(id))
	var buf [sha256.Size]byte
	sum := m.Sum(buf[:0])
	k.pool.Put(m)
	return hex.EncodeToString(sum[:16])
}
