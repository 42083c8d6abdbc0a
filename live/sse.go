package live

import (
	"bytes"
	"encoding/json"
	"github.com/lm-warden/warden/live/jsonscan"
	"math"

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

// streamWatch follows one streamed response: it notes the first output,
// the usage and whether the stream reached its proper end ([DONE],
// message_stop, response.completed) or carried an error event of its own.
//
// The first output is the first event that vLLM sends only once the
// engine has produced the request's first token, not the first event
// that carries text: from it on the stream is timed by stream_idle, not
// first_token (issue 46 item 1: a replica that sent its role chunk and
// then went silent was waited on for first_token). In vLLM's code:
//
//   - chat completions (vllm/entrypoints/openai/chat_completion/serving.py,
//     serving_chat.py before; OpenAIServingChat.
//     chat_completion_stream_generator): the role chunk is sent at
//     first_iteration of `async for res in result_generator`, with the
//     engine's first RequestOutput, whose tokens follow in the same
//     iteration (a reasoning or tool parser may hold their text back);
//   - completions (vllm/entrypoints/openai/completion/serving.py,
//     serving_completion.py; completion_stream_generator): a chunk per
//     RequestOutput, none for an empty one ("Chunked prefill case");
//   - Anthropic messages (vllm/entrypoints/anthropic/serving.py,
//     serving_messages.py before; AnthropicServingMessages.
//     message_stream_converter): message_start is made from the first chat
//     chunk (first_item), the role chunk above;
//   - Responses (vllm/entrypoints/openai/responses/serving.py,
//     serving_responses.py before; OpenAIServingResponses.
//     responses_stream_generator): response.created and
//     response.in_progress are sent before the engine's results are read;
//     the processor (_process_simple_streaming_events) sends
//     response.output_item.added with the first delta.
//
// So every event of the OpenAI and Anthropic streams is output but an
// error event (and Anthropic's ping, which vLLM does not send and a
// keep-alive may), and every Responses event but those three and
// response.queued.
type streamWatch struct {
	api         API
	frame       sse.Parser // frames the stream; respBody cuts it at frame.LastEnd
	firstToken  bool       // an event that comes with the first output has been seen
	terminal    bool       // the stream ended as its API says it should
	upstreamErr bool       // the backend sent an error event itself
	nextSeq     int64      // Responses: the sequence_number after the last event's
	usage       Usage
	onFirst     func() // called once, at the first output
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
		// Too long to read; output unless a Responses event, whose type
		// is not known (response.created carries the request's
		// instructions and tools).
		if w.api != APIResponses {
			w.first()
		}
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
		Error json.RawMessage `json:"error"`
		Usage *usageJSON      `json:"usage"`
	}
	if json.Unmarshal(data, &v) != nil {
		w.first() // not vLLM's, but an event: not held to first_token
		return
	}
	if len(v.Error) > 0 && string(v.Error) != "null" {
		w.upstreamErr = true
		return
	}
	if v.Usage != nil {
		v.Usage.merge(&w.usage)
	}
	w.first() // the role chunk, or a completion's first text
}

func (w *streamWatch) anthropicEvent(event, data []byte) {
	switch string(event) {
	case "error", "ping":
	default:
		w.first() // message_start, with vLLM's first output
	}
	switch string(event) {
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
	if n, ok := sequenceNumber(data); ok && n < math.MaxInt64 {
		w.nextSeq = n + 1
	}
	typ := string(event)
	switch typ {
	case "response.created", "response.in_progress", "response.queued", "error":
	default:
		w.first() // response.output_item.added, with vLLM's first output
	}
	switch typ {
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

// sequenceNumber reads a Responses event's sequence_number, a
// non-negative integer: the first "sequence_number" key in data (a key:
// inside a JSON string its quotes would be escaped), which vLLM's events
// have at their top level only.
func sequenceNumber(data []byte) (int64, bool) {
	i := bytes.Index(data, []byte(`"sequence_number"`))
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(data[i+len(`"sequence_number"`):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return 0, false
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	var n int64
	digits := 0
	for _, c := range rest {
		if c < '0' || c > '9' {
			break
		}
		if n > (math.MaxInt64-9)/10 {
			return 0, false
		}
		n = n*10 + int64(c-'0')
		digits++
	}
	return n, digits > 0
}

// bodyUsage reads the usage of a non-streamed JSON response.
func bodyUsage(api API, data []byte) Usage {
	u := unknownUsage()
	raw, ok := jsonscan.MemberValue(data, "usage")
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
