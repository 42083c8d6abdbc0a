package live

import (
	"bytes"
	"encoding/json"
)

// maxSSELine bounds the bytes of one SSE event the reader keeps; longer
// events are still delimited correctly but their data is not inspected.
const maxSSELine = 1 << 20

// sseReader splits a Server-Sent Events byte stream, fed in arbitrary
// chunks, into events (per the WHATWG rules the proxy needs: "event:" and
// "data:" fields, lines ending in \n, \r\n or \r, an event dispatched at a
// blank line). It never modifies the stream; it only watches it.
type sseReader struct {
	line     []byte // the current, incomplete line
	event    []byte // the current event's type
	data     []byte // the current event's data lines joined by \n
	hasData  bool
	overlong bool // the current event outgrew maxSSELine: not inspected
	lastCR   bool // the previous chunk ended in \r (a following \n is part of it)
	// mid is true while the stream is inside an event or a line. (An
	// injected error event depends on what the proxy has passed on, not on
	// what it has read: respBody tracks that itself, see respBody.torn.)
	mid bool
	// onEvent is called for each complete event.
	onEvent func(event, data []byte)
}

// Write feeds p to the reader. It never fails.
func (s *sseReader) Write(p []byte) (int, error) {
	n := len(p)
	if s.lastCR && len(p) > 0 && p[0] == '\n' {
		p = p[1:]
	}
	s.lastCR = false
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			s.appendLine(p)
			s.mid = true
			break
		}
		s.appendLine(p[:i])
		if p[i] == '\r' {
			if i+1 < len(p) && p[i+1] == '\n' {
				i++
			} else if i+1 == len(p) {
				s.lastCR = true
			}
		}
		p = p[i+1:]
		s.endLine()
	}
	return n, nil
}

func (s *sseReader) appendLine(b []byte) {
	if len(s.line)+len(b) > maxSSELine {
		s.overlong = true
		return
	}
	s.line = append(s.line, b...)
}

func (s *sseReader) endLine() {
	line := s.line
	s.line = s.line[:0]
	if len(line) == 0 {
		s.dispatch()
		return
	}
	s.mid = true
	if line[0] == ':' { // comment
		return
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "event":
		s.event = append(s.event[:0], value...)
	case "data":
		if len(s.data)+len(value) > maxSSELine {
			s.overlong = true
			return
		}
		if s.hasData {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, value...)
		s.hasData = true
	}
}

func (s *sseReader) dispatch() {
	if (s.hasData || len(s.event) > 0) && !s.overlong && s.onEvent != nil {
		s.onEvent(s.event, s.data)
	}
	s.event, s.data = s.event[:0], s.data[:0]
	s.hasData, s.overlong, s.mid = false, false, false
}

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
	sse         sseReader
	firstToken  bool // an event carrying output has been seen
	terminal    bool // the stream ended as its API says it should
	upstreamErr bool // the backend sent an error event itself
	usage       Usage
	onFirst     func() // called once, at the first output token
}

func newStreamWatch(api API, onFirst func()) *streamWatch {
	w := &streamWatch{api: api, usage: unknownUsage(), onFirst: onFirst}
	w.sse.onEvent = w.event
	return w
}

func (w *streamWatch) Write(p []byte) (int, error) { return w.sse.Write(p) }

func (w *streamWatch) first() {
	if !w.firstToken {
		w.firstToken = true
		if w.onFirst != nil {
			w.onFirst()
		}
	}
}

// event handles one SSE event of the dialect.
func (w *streamWatch) event(event, data []byte) {
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
	if !w.firstToken || bytes.Contains(data, []byte(`"usage"`)) || bytes.Contains(data, []byte(`"error"`)) {
		if json.Unmarshal(data, &v) != nil {
			return
		}
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
	var v struct {
		Usage *usageJSON `json:"usage"`
	}
	if json.Unmarshal(data, &v) != nil || v.Usage == nil {
		return u
	}
	v.Usage.merge(&u)
	if api == APIAnthropic && v.Usage.CacheReadTokens != nil && u.PromptTokens >= 0 {
		u.PromptTokens += *v.Usage.CacheReadTokens
	}
	return u
}
