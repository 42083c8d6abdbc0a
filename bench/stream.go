package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/lm-warden/warden/internal/sse"
)

// API is the wire protocol bench speaks to the target.
type API string

// The APIs bench speaks, both streaming.
const (
	OpenAI    API = "openai"    // POST /v1/chat/completions
	Anthropic API = "anthropic" // POST /v1/messages
)

// ParseAPI reads an --api value.
func ParseAPI(s string) (API, error) {
	switch API(s) {
	case OpenAI, Anthropic:
		return API(s), nil
	}
	return "", fmt.Errorf("api %q: want openai or anthropic", s)
}

// Path is the API's endpoint.
func (a API) Path() string {
	if a == Anthropic {
		return "/v1/messages"
	}
	return "/v1/chat/completions"
}

// HeaderSessionID is the header by which Claude Code names its session; bench
// sends it on every request, with the session's UUID.
const HeaderSessionID = "X-Claude-Code-Session-Id"

// headerAgentID names a Claude Code subagent (sent with the parent's session
// id in HeaderSessionID).
const headerAgentID = "x-claude-code-agent-id"

// anthropicVersion is the anthropic-version header bench sends.
const anthropicVersion = "2023-06-01"

// requestSpec is everything one request needs besides its conversation.
type requestSpec struct {
	target    string // base URL, no trailing slash
	api       API
	model     string
	apiKey    string
	ignoreEOS bool // OpenAI only: vLLM's ignore_eos
}

// chatBody is an OpenAI chat completions request.
type chatBody struct {
	Model         string    `json:"model"`
	Messages      []Message `json:"messages"`
	MaxTokens     int       `json:"max_tokens"`
	Stream        bool      `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	IgnoreEOS bool `json:"ignore_eos,omitempty"` // vLLM's extension: generate max_tokens tokens
}

// messagesBody is an Anthropic messages request.
type messagesBody struct {
	Model     string    `json:"model"`
	System    string    `json:"system,omitempty"`
	Messages  []Message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	Stream    bool      `json:"stream"`
	Metadata  struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
}

// newRequest builds turn k of conversation c (after c.Prompt(k)), the way
// Claude Code sends it: the session's UUID in X-Claude-Code-Session-Id and,
// for Anthropic, in metadata.user_id's JSON form; a subagent adds
// x-claude-code-agent-id with its own UUID under its parent's session id.
func newRequest(ctx context.Context, spec *requestSpec, c *Conversation, msgs []Message, maxTokens int) (*http.Request, error) {
	sessionID, agentID := c.UUID, ""
	if c.Session.Parent != "" {
		sessionID, agentID = SessionUUID(c.seed, c.Session.Parent), c.UUID
	}
	var body []byte
	var err error
	switch spec.api {
	case Anthropic:
		b := messagesBody{Model: spec.model, Messages: msgs, MaxTokens: maxTokens, Stream: true}
		if c.HasSystem() {
			b.System = c.System()
		}
		uid, _ := json.Marshal(struct {
			DeviceID    string `json:"device_id"`
			AccountUUID string `json:"account_uuid"`
			SessionID   string `json:"session_id"`
		}{DeviceID: "warden-bench", AccountUUID: "", SessionID: sessionID})
		b.Metadata.UserID = string(uid)
		body, err = json.Marshal(b)
	default:
		all := msgs
		if c.HasSystem() {
			all = append([]Message{{Role: "system", Content: c.System()}}, msgs...)
		}
		b := chatBody{Model: spec.model, Messages: all, MaxTokens: maxTokens, Stream: true, IgnoreEOS: spec.ignoreEOS}
		b.StreamOptions.IncludeUsage = true
		body, err = json.Marshal(b)
	}
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, spec.target+spec.api.Path(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set(HeaderSessionID, sessionID)
	if agentID != "" {
		req.Header.Set(headerAgentID, agentID)
	}
	setAuth(req.Header, spec.api, spec.apiKey)
	return req, nil
}

// setAuth sets the API's credentials headers.
func setAuth(h http.Header, api API, key string) {
	if api == Anthropic {
		h.Set("anthropic-version", anthropicVersion)
		if key != "" {
			h.Set("x-api-key", key)
		}
		return
	}
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
}

// outcome is what one streamed answer gave.
type outcome struct {
	sent         time.Time     // when the request was sent (zero: not sent)
	elapsed      time.Duration // sent to the stream's end
	level        int           // the open step's sessions at the first token (0: none came)
	TTFB         time.Duration // send to the first non-empty text delta; -1 if none came
	Text         string        // the answer's text, as streamed
	Tokens       int           // output tokens: usage when reported, else text deltas counted
	Deltas       int           // text deltas received
	PromptTokens int           // usage.prompt_tokens / input_tokens; -1 unknown
	CachedTokens int           // usage.prompt_tokens_details.cached_tokens; -1 unknown
	Done         bool          // the stream ended properly ([DONE] or message_stop)
}

// ErrStream is wrapped by every error that a server's answer caused (a
// status, an error event, a malformed or truncated stream), as opposed to
// the client's own (cancellation, timeout) or the network's.
var ErrStream = errors.New("bad answer")

// maxEventBytes bounds one SSE event.
const maxEventBytes = 4 << 20

// readStream reads a streamed answer of api from r. sent is when the
// request was sent; now tells the time (time.Now), asked once, at the
// first text delta. It returns what it read even when it
// fails: the error says why the stream did not finish properly.
func readStream(r io.Reader, api API, sent time.Time, now func() time.Time) (outcome, error) {
	o := outcome{TTFB: -1, PromptTokens: -1, CachedTokens: -1}
	usageTokens := -1
	var text strings.Builder
	dispatch := func(e sse.Event) error {
		if e.Overlong {
			return fmt.Errorf("%w: an event longer than %d bytes", ErrStream, maxEventBytes)
		}
		if len(e.Data) == 0 {
			return nil
		}
		d, event := e.Data, string(e.Type)
		if api == OpenAI {
			if string(bytes.TrimSpace(d)) == "[DONE]" {
				o.Done = true
				return nil
			}
			var ev struct {
				Choices []struct {
					Delta struct {
						Content *string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
				Usage *struct {
					PromptTokens        int `json:"prompt_tokens"`
					CompletionTokens    int `json:"completion_tokens"`
					PromptTokensDetails *struct {
						CachedTokens *int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
				Error *apiError `json:"error"`
			}
			if err := json.Unmarshal(d, &ev); err != nil {
				return fmt.Errorf("%w: malformed event %.80q: %v", ErrStream, d, err)
			}
			if ev.Error != nil {
				return fmt.Errorf("%w: error event: %s", ErrStream, ev.Error)
			}
			for _, ch := range ev.Choices {
				if ch.Delta.Content != nil && *ch.Delta.Content != "" {
					o.delta(*ch.Delta.Content, &text, sent, now)
				}
			}
			if u := ev.Usage; u != nil {
				usageTokens, o.PromptTokens = u.CompletionTokens, u.PromptTokens
				if u.PromptTokensDetails != nil && u.PromptTokensDetails.CachedTokens != nil {
					o.CachedTokens = *u.PromptTokensDetails.CachedTokens
				}
			}
			return nil
		}
		var ev struct {
			Type    string `json:"type"`
			Message struct {
				Usage struct {
					InputTokens *int `json:"input_tokens"`
				} `json:"usage"`
			} `json:"message"`
			Delta struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"delta"`
			Usage *struct {
				OutputTokens *int `json:"output_tokens"`
			} `json:"usage"`
			Error *apiError `json:"error"`
		}
		if err := json.Unmarshal(d, &ev); err != nil {
			return fmt.Errorf("%w: malformed event %.80q: %v", ErrStream, d, err)
		}
		typ := ev.Type
		if typ == "" {
			typ = event
		}
		switch typ {
		case "message_start":
			if v := ev.Message.Usage.InputTokens; v != nil {
				o.PromptTokens = *v
			}
		case "content_block_delta":
			if ev.Delta.Text != "" {
				o.delta(ev.Delta.Text, &text, sent, now)
			}
		case "message_delta":
			if ev.Usage != nil && ev.Usage.OutputTokens != nil {
				usageTokens = *ev.Usage.OutputTokens
			}
		case "message_stop":
			o.Done = true
		case "error":
			if ev.Error == nil {
				ev.Error = &apiError{Message: string(d)}
			}
			return fmt.Errorf("%w: error event: %s", ErrStream, ev.Error)
		}
		return nil
	}
	finish := func(err error) (outcome, error) {
		o.Text = text.String()
		o.Tokens = o.Deltas
		if usageTokens >= 0 {
			o.Tokens = usageTokens
		}
		return o, err
	}
	// The first error or the proper end stops the reading; events after
	// it in the same chunk are not looked at.
	var failed error
	stopped := func() bool { return failed != nil || o.Done }
	p := sse.Parser{Max: maxEventBytes, OnEvent: func(e sse.Event) {
		if !stopped() {
			failed = dispatch(e)
		}
	}}
	buf := make([]byte, 32<<10)
	for !stopped() {
		n, err := r.Read(buf)
		_, _ = p.Write(buf[:n])
		if err == io.EOF {
			p.Flush() // a last event without its blank line
			break
		}
		if err != nil && !stopped() {
			return finish(err)
		}
	}
	if failed != nil {
		return finish(failed)
	}
	if !o.Done {
		end := "[DONE]"
		if api == Anthropic {
			end = "message_stop"
		}
		return finish(fmt.Errorf("%w: the stream ended before %s", ErrStream, end))
	}
	return finish(nil)
}

func (o *outcome) delta(s string, text *strings.Builder, sent time.Time, now func() time.Time) {
	if o.TTFB < 0 {
		o.TTFB = now().Sub(sent)
	}
	o.Deltas++
	text.WriteString(s)
}

// apiError is the error object of both APIs' error bodies and events.
type apiError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Code    any    `json:"code"`
}

func (e *apiError) String() string {
	if e.Type != "" {
		return e.Type + ": " + e.Message
	}
	return e.Message
}

// statusError reads a non-2xx answer's body (at most 4 KiB) into an error
// that quotes the API's error message when the body has one.
func statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &v) == nil {
		var e apiError
		switch {
		case len(v.Error) > 0 && json.Unmarshal(v.Error, &e) == nil && e.Message != "":
			msg = e.String()
		case len(v.Error) > 0 && v.Error[0] == '"':
			_ = json.Unmarshal(v.Error, &msg)
		case v.Message != "":
			msg = v.Message
		}
	}
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	return fmt.Errorf("%w: HTTP %s: %s", ErrStream, resp.Status, msg)
}
