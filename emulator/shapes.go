package emulator

import (
	"encoding/json"
	"io"
	"net/http"
)

// The JSON shapes of vLLM's OpenAI and Anthropic servers.

// usage is OpenAI's usage object as vLLM fills it with
// --enable-prompt-tokens-details: prompt_tokens_details is null when no
// prompt token was served from the prefix cache.
type usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	PromptTokensDetails *promptTokenDetails `json:"prompt_tokens_details"`
}

type promptTokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (c *call) usage() *usage {
	u := &usage{PromptTokens: c.req.PromptTokens, CompletionTokens: c.gen, TotalTokens: c.req.PromptTokens + c.gen}
	if c.cached > 0 {
		u.PromptTokensDetails = &promptTokenDetails{CachedTokens: c.cached}
	}
	return u
}

// anthropicUsage follows Anthropic's convention, which the proxy reads:
// input_tokens exclude the tokens read from the cache.
type anthropicUsage struct {
	InputTokens          int `json:"input_tokens"`
	OutputTokens         int `json:"output_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens"`
}

func (c *call) anthropicUsage() anthropicUsage {
	return anthropicUsage{InputTokens: c.req.PromptTokens - c.cached, OutputTokens: c.gen, CacheReadInputTokens: c.cached}
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Text         *string      `json:"text,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason"`
}

type openAIResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

type anthropicBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicMessage struct {
	ID           string           `json:"id"`
	Type         string           `json:"type"`
	Role         string           `json:"role"`
	Model        string           `json:"model"`
	Content      []anthropicBlock `json:"content"`
	StopReason   *string          `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"`
	Usage        anthropicUsage   `json:"usage"`
}

// response is the non-streamed answer of a finished request.
func (c *call) response() any {
	reason := c.finishReason()
	text := c.text()
	switch c.api {
	case APIResponses:
		return c.responses(true)
	case APIMessages:
		return anthropicMessage{ID: c.id, Type: "message", Role: "assistant", Model: c.model(),
			Content: []anthropicBlock{{"text", text}}, StopReason: &reason, Usage: c.anthropicUsage()}
	case APICompletions:
		return openAIResponse{ID: c.id, Object: "text_completion", Created: c.created(), Model: c.model(),
			Choices: []chatChoice{{Text: &text, FinishReason: &reason}}, Usage: c.usage()}
	}
	return openAIResponse{ID: c.id, Object: "chat.completion", Created: c.created(), Model: c.model(),
		Choices: []chatChoice{{Message: &chatMessage{"assistant", text}, FinishReason: &reason}}, Usage: c.usage()}
}

func (c *call) model() string  { return c.e.model }
func (c *call) created() int64 { return c.e.created }

// chunk is one OpenAI stream chunk carrying text (or only a finish reason).
func (c *call) chunk(text string, role string, reason *string) openAIResponse {
	if c.api == APICompletions {
		return openAIResponse{ID: c.id, Object: "text_completion", Created: c.created(), Model: c.model(),
			Choices: []chatChoice{{Text: &text, FinishReason: reason}}}
	}
	return openAIResponse{ID: c.id, Object: "chat.completion.chunk", Created: c.created(), Model: c.model(),
		Choices: []chatChoice{{Delta: &chatMessage{role, text}, FinishReason: reason}}}
}

// writeToken writes the events of one generated token (with, for the
// first, the events that open the answer).
func (c *call) writeToken(w io.Writer) error {
	if c.api == APIResponses {
		return c.writeResponsesToken(w)
	}
	if c.api == APIMessages {
		if !c.started {
			c.started = true
			start := struct {
				Type    string           `json:"type"`
				Message anthropicMessage `json:"message"`
			}{"message_start", anthropicMessage{
				ID: c.id, Type: "message", Role: "assistant", Model: c.model(), Content: []anthropicBlock{},
				Usage: anthropicUsage{InputTokens: c.req.PromptTokens - c.cached, CacheReadInputTokens: c.cached},
			}}
			if err := writeEvent(w, "message_start", start); err != nil {
				return err
			}
			if err := writeEvent(w, "content_block_start", struct {
				Type         string         `json:"type"`
				Index        int            `json:"index"`
				ContentBlock anthropicBlock `json:"content_block"`
			}{"content_block_start", 0, anthropicBlock{"text", ""}}); err != nil {
				return err
			}
		}
		return writeEvent(w, "content_block_delta", struct {
			Type  string         `json:"type"`
			Index int            `json:"index"`
			Delta anthropicBlock `json:"delta"`
		}{"content_block_delta", 0, anthropicBlock{"text_delta", c.token()}})
	}
	if !c.started && c.api == APIChat {
		c.started = true
		if err := writeEvent(w, "", c.chunk("", "assistant", nil)); err != nil {
			return err
		}
	}
	return writeEvent(w, "", c.chunk(c.token(), "", nil))
}

// writeEnd writes the events that close a finished answer.
func (c *call) writeEnd(w io.Writer) error {
	if c.api == APIResponses {
		return c.writeResponsesEnd(w)
	}
	reason := c.finishReason()
	if c.api == APIMessages {
		if err := writeEvent(w, "content_block_stop", struct {
			Type  string `json:"type"`
			Index int    `json:"index"`
		}{"content_block_stop", 0}); err != nil {
			return err
		}
		type delta struct {
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		}
		type outUsage struct {
			OutputTokens int `json:"output_tokens"`
		}
		if err := writeEvent(w, "message_delta", struct {
			Type  string   `json:"type"`
			Delta delta    `json:"delta"`
			Usage outUsage `json:"usage"`
		}{"message_delta", delta{StopReason: reason}, outUsage{c.gen}}); err != nil {
			return err
		}
		return writeEvent(w, "message_stop", struct {
			Type string `json:"type"`
		}{"message_stop"})
	}
	if err := writeEvent(w, "", c.chunk("", "", &reason)); err != nil {
		return err
	}
	if c.req.IncludeUsage {
		u := c.chunk("", "", nil)
		u.Choices = []chatChoice{}
		u.Usage = c.usage()
		if err := writeEvent(w, "", u); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, "data: [DONE]\n\n")
	return err
}

// writeEvent writes one server-sent event (OpenAI's have no event name).
func writeEvent(w io.Writer, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	out := make([]byte, 0, len(b)+len(name)+16)
	if name != "" {
		out = append(append(append(out, "event: "...), name...), '\n')
	}
	out = append(append(append(out, "data: "...), b...), "\n\n"...)
	_, err = w.Write(out)
	return err
}

// errorBody renders an error in the API's shape: vLLM's OpenAI error
// object, or Anthropic's.
func errorBody(api API, e *APIError) any {
	if api == APIMessages {
		typ := map[int]string{
			http.StatusNotFound:              "not_found_error",
			http.StatusRequestEntityTooLarge: "request_too_large",
			http.StatusServiceUnavailable:    "overloaded_error",
			http.StatusInternalServerError:   "api_error",
		}[e.Status]
		if typ == "" {
			typ = "invalid_request_error"
		}
		type detail struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		}
		return struct {
			Type  string `json:"type"`
			Error detail `json:"error"`
		}{"error", detail{typ, e.Message}}
	}
	typ := map[int]string{
		http.StatusNotFound:              "NotFoundError",
		http.StatusRequestEntityTooLarge: "RequestEntityTooLarge",
		http.StatusServiceUnavailable:    "ServiceUnavailableError",
		http.StatusInternalServerError:   "InternalServerError",
	}[e.Status]
	if typ == "" {
		typ = "BadRequestError"
	}
	var param *string
	if e.Param != "" {
		param = &e.Param
	}
	type detail struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	}
	return struct {
		Error detail `json:"error"`
	}{detail{e.Message, typ, param, e.Status}}
}

func writeError(w http.ResponseWriter, api API, e *APIError) {
	writeJSON(w, e.Status, errorBody(api, e))
}

// writeStreamError ends a stream with an error event: OpenAI `data:
// {"error":...}` without [DONE], Anthropic `event: error`, Responses
// `event: error` with {"type":"error","code","message","param"}.
func writeStreamError(w io.Writer, c *call, msg string) error {
	api := c.api
	e := &APIError{Status: http.StatusInternalServerError, Message: msg}
	switch api {
	case APIMessages:
		return writeEvent(w, "error", errorBody(api, e))
	case APIResponses:
		return c.writeResponsesEvent(w, "error", map[string]any{"code": "InternalServerError", "message": msg, "param": nil})
	}
	return writeEvent(w, "", errorBody(api, e))
}
