package emulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/lm-warden/warden/traces"
)

// API is the dialect of an inference endpoint.
type API uint8

const (
	APIChat        API = iota // POST /v1/chat/completions
	APICompletions            // POST /v1/completions
	APIMessages               // POST /v1/messages (Anthropic)
	APIResponses              // POST /v1/responses (OpenAI Responses)
)

func (a API) String() string {
	switch a {
	case APIChat:
		return "chat"
	case APICompletions:
		return "completions"
	case APIMessages:
		return "messages"
	case APIResponses:
		return "responses"
	}
	return fmt.Sprintf("API(%d)", uint8(a))
}

func (a API) dialect() traces.Dialect {
	switch a {
	case APIMessages:
		return traces.DialectAnthropic
	case APIResponses:
		return traces.DialectResponses
	}
	return traces.DialectOpenAI
}

// maxTokensParam is the name of the output-length field of a.
func (a API) maxTokensParam() string {
	if a == APIResponses {
		return "max_output_tokens"
	}
	return "max_tokens"
}

// DefaultMaxTokens is the output length of a request that names none.
const DefaultMaxTokens = 256

// Request is what the emulator reads from an inference request body.
type Request struct {
	Model        string // "" when absent (the served model is assumed)
	Stream       bool
	IncludeUsage bool // OpenAI stream_options.include_usage
	MaxTokens    int  // output tokens to generate (>= 1)
	// Text is the canonical prompt text (traces.PromptText) and
	// PromptTokens its token count (traces.TextTokens).
	Text         []byte
	PromptTokens int
}

// APIError is an error answered to the client in the endpoint's shape:
// OpenAI {"error":{"message","type","param","code"}} as vLLM writes it, or
// Anthropic {"type":"error","error":{"type","message"}}.
type APIError struct {
	Status  int
	Message string
	Param   string // OpenAI param, "" for null
}

func (e *APIError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

func badRequest(param, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusBadRequest, Param: param, Message: fmt.Sprintf(format, args...)}
}

// requestBody is the union of the fields the four dialects use.
type requestBody struct {
	Model         *string `json:"model"`
	Stream        *bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	System              json.RawMessage `json:"system"`
	// Responses
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Input              json.RawMessage `json:"input"`
	Instructions       json.RawMessage `json:"instructions"`
	PreviousResponseID *string         `json:"previous_response_id"`
}

// ParseRequest reads and validates an inference request body of api. Bad
// input gives an *APIError with status 400 that names the field at fault.
func ParseRequest(api API, body []byte) (*Request, error) {
	var b requestBody
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&b); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, badRequest(te.Field, "%s: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return nil, badRequest("", "invalid JSON body: %v", err)
	}
	if dec.More() {
		return nil, badRequest("", "invalid JSON body: data after the top-level value")
	}
	r := &Request{MaxTokens: DefaultMaxTokens}
	if b.Model != nil {
		r.Model = *b.Model
	}
	if b.Stream != nil {
		r.Stream = *b.Stream
	}
	if b.StreamOptions != nil && b.StreamOptions.IncludeUsage != nil {
		r.IncludeUsage = *b.StreamOptions.IncludeUsage
	}
	switch {
	case api == APIResponses:
		if b.MaxOutputTokens != nil {
			r.MaxTokens = *b.MaxOutputTokens
		}
	case b.MaxCompletionTokens != nil && api == APIChat:
		r.MaxTokens = *b.MaxCompletionTokens
	case b.MaxTokens != nil:
		r.MaxTokens = *b.MaxTokens
	}
	if r.MaxTokens < 1 {
		p := api.maxTokensParam()
		return nil, badRequest(p, "%s must be at least 1, got %d.", p, r.MaxTokens)
	}
	switch api {
	case APIResponses:
		if b.PreviousResponseID != nil && *b.PreviousResponseID != "" {
			return nil, badRequest("previous_response_id", "previous_response_id: the emulator stores no responses; send the whole conversation in input")
		}
		if err := checkInstructions(b.Instructions); err != nil {
			return nil, err
		}
		if err := checkInput(b.Input); err != nil {
			return nil, err
		}
	case APICompletions:
		if err := checkPrompt(b.Prompt); err != nil {
			return nil, err
		}
	default:
		if err := checkMessages(b.Messages); err != nil {
			return nil, err
		}
		if api == APIMessages {
			if err := checkContent("system", b.System, true); err != nil {
				return nil, err
			}
		}
	}
	r.Text = traces.PromptText(body, api.dialect())
	r.PromptTokens = traces.TextTokens(r.Text)
	return r, nil
}

// checkPrompt accepts a completions prompt: a string or a non-empty list of
// strings or of token ids.
func checkPrompt(p json.RawMessage) error {
	p = bytes.TrimSpace(p)
	if len(p) == 0 || string(p) == "null" {
		return badRequest("prompt", "prompt: required (a string or a list of strings)")
	}
	if p[0] == '"' {
		return nil
	}
	var list []json.RawMessage
	if json.Unmarshal(p, &list) != nil || len(list) == 0 {
		return badRequest("prompt", "prompt: expected a string or a non-empty list")
	}
	for i, item := range list {
		var s string
		var n int
		if json.Unmarshal(item, &s) != nil && json.Unmarshal(item, &n) != nil {
			return badRequest("prompt", "prompt[%d]: expected a string or a token id", i)
		}
	}
	return nil
}

// checkMessages accepts a non-empty list of messages, each with a string
// role and a content that is a string, a list of blocks or null.
func checkMessages(m json.RawMessage) error {
	m = bytes.TrimSpace(m)
	if len(m) == 0 || string(m) == "null" {
		return badRequest("messages", "messages: required (a non-empty list)")
	}
	var list []struct {
		Role    *string         `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(m, &list); err != nil {
		return badRequest("messages", "messages: expected a list of {role, content} objects")
	}
	if len(list) == 0 {
		return badRequest("messages", "messages: must not be empty")
	}
	for i, msg := range list {
		if msg.Role == nil || *msg.Role == "" {
			return badRequest("messages", "messages[%d].role: required", i)
		}
		if err := checkContent(fmt.Sprintf("messages[%d].content", i), msg.Content, true); err != nil {
			return err
		}
	}
	return nil
}

// checkContent accepts a content value: a string, a list of objects, or
// (when nullable) null or nothing.
func checkContent(field string, c json.RawMessage, nullable bool) error {
	c = bytes.TrimSpace(c)
	if len(c) == 0 || string(c) == "null" {
		if nullable {
			return nil
		}
		return badRequest(field, "%s: required", field)
	}
	switch c[0] {
	case '"':
		return nil
	case '[':
		var blocks []map[string]json.RawMessage
		if json.Unmarshal(c, &blocks) != nil {
			return badRequest(field, "%s: expected a string or a list of content blocks", field)
		}
		return nil
	}
	return badRequest(field, "%s: expected a string or a list of content blocks", field)
}

// checkInstructions accepts Responses instructions: a string or null.
func checkInstructions(c json.RawMessage) error {
	c = bytes.TrimSpace(c)
	if len(c) == 0 || string(c) == "null" || c[0] == '"' {
		return nil
	}
	return badRequest("instructions", "instructions: expected a string")
}

// checkInput accepts a Responses input: a string, or a non-empty list of
// items, each an object; a message item (one with a role) has a string
// role and a content that is a string or a list of content parts. Other
// items (function_call_output, reasoning...) are taken as they are.
func checkInput(in json.RawMessage) error {
	in = bytes.TrimSpace(in)
	if len(in) == 0 || string(in) == "null" {
		return badRequest("input", "input: required (a string or a non-empty list of items)")
	}
	if in[0] == '"' {
		return nil
	}
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(in, &items); err != nil {
		return badRequest("input", "input: expected a string or a list of item objects")
	}
	if len(items) == 0 {
		return badRequest("input", "input: must not be empty")
	}
	for i, item := range items {
		if item == nil {
			return badRequest("input", "input[%d]: expected an item object", i)
		}
		role, ok := item["role"]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal(role, &s) != nil || s == "" {
			return badRequest("input", "input[%d].role: expected a non-empty string", i)
		}
		if err := checkContent(fmt.Sprintf("input[%d].content", i), item["content"], false); err != nil {
			return err
		}
	}
	return nil
}
