package live

import (
	"bytes"
	"encoding/json"

	"github.com/lm-warden/warden/internal/sse"
)

// maxSSELine bounds the bytes of one SSE event the proxy keeps; longer
// events are still delimited correctly but their data is not inspected.
const maxSSELine = sse.DefaultMax

// Usage is the token accounting of one response, -1 where unknown.
type Usage struct {
	PromptTokens int
	OutputTokens int
	CachedTokens int
}

func unknownUsage() Usage { return Usage{PromptTokens: -1, OutputTokens: -1, CachedTokens: -1} }

// usageJSON covers the usage objects of the three dialects.
type usageJSON struct {
	// OpenAI chat/completions
	PromptTokens        *int `json:"prompt_tokens"`
	CompletionTokens    *int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// Anthropic and Responses
	InputTokens        *int `json:"input_tokens"`
	OutputTokens       *int `json:"output_tokens"`
	CacheReadTokens    *int `json:"cache_read_input_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

func (u *usageJSON) merge(dst *Usage) {
	set := func(d *int, v *int) {
		if v != nil {
			*d = *v
		}
	}
	set(&dst.PromptTokens, u.PromptTokens)
	set(&dst.PromptTokens, u.InputTokens)
	set(&dst.OutputTokens, u.CompletionTokens)
	set(&dst.OutputTokens, u.OutputTokens)
	set(&dst.CachedTokens, u.CacheReadTokens)
	if u.PromptTokensDetails != nil {
		set(&dst.CachedTokens, u.PromptTokensDetails.CachedTokens)
	}
	if u.InputTokensDetails != nil {
		set(&dst.CachedTokens, u.InputTokensDetails.CachedTokens)
	}
}

// streamWatch follows one streamed response: it notes the first output
// token, the usage and whether the stream reached its proper end ([DONE],
// message_stop, response.completed) or carried an error event of its own.
type streamWatch struct {
	api         API
	frame       sse.Parser // frames the stream; respBody cuts it at frame.LastEnd
	firstToken  bool       // an event carrying output has been seen
	terminal    bool       // the stream ended as its API says it should
	upstreamErr bool       // the backend sent an error event itself
	usage       Usage
	onFirst     func() // called once, at the first output token
}

func newStreamWatch(api API, onFirst func()) *streamWatch {
	w := &streamWatch{api: api, usage: unknownUsage(), onFirst: onFirst}
	w.frame.Max = maxSSELine
	w.frame.OnEvent = w.event
	return w
}

func (w *streamWatch) Write(p []byte) (int, error) { return w.frame.Write(p) }

func (w *streamWatch) first() {
	if !w.firstToken {
		w.firstToken = true
		if w.onFirst != nil {
			w.onFirst()
		}
	}
}

// event handles one SSE event of the dialect (an overlong one is not
// inspected).
func (w *streamWatch) event(e sse.Event) {
	if e.Overlong {
		return
	}
	event, data := e.Type, e.Data
	switch w.api {
	case APIAnthropic:
		w.anthropicEvent(event, data)
	case APIResponses:
		w.responsesEvent(event, data)
	default:
		w.openAIEvent(data)
	}
}

func (w *streamWatch) openAIEvent(data []byte) {
	if bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
		w.terminal = true
		return
	}
	// Once output has begun, only an event with usage or an error needs
	// decoding (v, which escapes to the heap, is made for those only).
	if w.firstToken && !bytes.Contains(data, []byte(`"usage"`)) && !bytes.Contains(data, []byte(`"error"`)) {
		return
	}
	var v struct {
		Error   json.RawMessage `json:"error"`
		Usage   *usageJSON      `json:"usage"`
		Choices []struct {
			Text  string `json:"text"`
			Delta struct {
				Content   string          `json:"content"`
				Reasoning string          `json:"reasoning_content"`
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &v) != nil {
		return
	}
	if len(v.Error) > 0 && string(v.Error) != "null" {
		w.upstreamErr = true
	}
	if v.Usage != nil {
		v.Usage.merge(&w.usage)
	}
	for _, c := range v.Choices {
		if c.Text != "" || c.Delta.Content != "" || c.Delta.Reasoning != "" || len(c.Delta.ToolCalls) > 0 {
			w.first()
		}
	}
}

func (w *streamWatch) anthropicEvent(event, data []byte) {
	switch string(event) {
	case "content_block_delta":
		w.first()
	case "message_stop":
		w.terminal = true
	case "error":
		w.upstreamErr = true
	case "message_start":
		var v struct {
			Message struct {
				Usage *usageJSON `json:"usage"`
			} `json:"message"`
		}
		if json.Unmarshal(data, &v) == nil && v.Message.Usage != nil {
			v.Message.Usage.merge(&w.usage)
			// Anthropic's input_tokens exclude cache reads; count the whole prompt.
			if v.Message.Usage.CacheReadTokens != nil && w.usage.PromptTokens >= 0 {
				w.usage.PromptTokens += *v.Message.Usage.CacheReadTokens
			}
		}
	case "message_delta":
		var v struct {
			Usage *struct {
				OutputTokens *int `json:"output_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(data, &v) == nil && v.Usage != nil && v.Usage.OutputTokens != nil {
			w.usage.OutputTokens = *v.Usage.OutputTokens
		}
	}
}

func (w *streamWatch) responsesEvent(event, data []byte) {
	typ := string(event)
	switch typ {
	case "response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta":
		w.first()
	case "response.completed", "response.incomplete", "response.failed":
		w.terminal = true
		var v struct {
			Response struct {
				Usage *usageJSON `json:"usage"`
			} `json:"response"`
		}
		if json.Unmarshal(data, &v) == nil && v.Response.Usage != nil {
			v.Response.Usage.merge(&w.usage)
		}
	case "error":
		w.upstreamErr = true
	}
}

// bodyUsage reads the usage of a non-streamed JSON response.
func bodyUsage(api API, data []byte) Usage {
	u := unknownUsage()
	raw, ok := memberValue(data, "usage")
	if !ok {
		return u
	}
	var v *usageJSON
	if json.Unmarshal(raw, &v) != nil || v == nil {
		return u
	}
	v.merge(&u)
	if api == APIAnthropic && v.CacheReadTokens != nil && u.PromptTokens >= 0 {
		u.PromptTokens += *v.CacheReadTokens
	}
	return u
}
