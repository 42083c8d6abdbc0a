package emulator

import (
	"io"
	"strings"
)

// The OpenAI Responses API (POST /v1/responses) as vLLM serves it. A
// response holds one assistant message item with one output_text part.
// Its status is "completed", or "incomplete" with incomplete_details
// {"reason":"max_output_tokens"} when the answer stopped at
// max_output_tokens; the stream ends with response.completed either way
// (vLLM's behaviour; the proxy takes response.completed, .incomplete and
// .failed as a stream's proper end). usage counts input_tokens with the
// cached ones included and gives them in input_tokens_details.cached_tokens
// (0 when none: never null, unlike chat's prompt_tokens_details).

type responsesUsage struct {
	InputTokens         int                   `json:"input_tokens"`
	InputTokensDetails  responsesInputDetail  `json:"input_tokens_details"`
	OutputTokens        int                   `json:"output_tokens"`
	OutputTokensDetails responsesOutputDetail `json:"output_tokens_details"`
	TotalTokens         int                   `json:"total_tokens"`
}

type responsesInputDetail struct {
	CachedTokens int `json:"cached_tokens"`
}

type responsesOutputDetail struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

type responsesPart struct {
	Type        string `json:"type"` // output_text
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type responsesItem struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"` // message
	Status  string          `json:"status"`
	Role    string          `json:"role"`
	Content []responsesPart `json:"content"`
}

type responsesIncomplete struct {
	Reason string `json:"reason"`
}

type responsesObject struct {
	ID                string               `json:"id"`
	Object            string               `json:"object"` // response
	CreatedAt         int64                `json:"created_at"`
	Model             string               `json:"model"`
	Status            string               `json:"status"`
	IncompleteDetails *responsesIncomplete `json:"incomplete_details"`
	Error             any                  `json:"error"`
	Output            []responsesItem      `json:"output"`
	MaxOutputTokens   int                  `json:"max_output_tokens"`
	ParallelToolCalls bool                 `json:"parallel_tool_calls"`
	ToolChoice        string               `json:"tool_choice"`
	Tools             []any                `json:"tools"`
	Usage             *responsesUsage      `json:"usage"`
}

// itemID is the id of the response's message item.
func (c *call) itemID() string { return "msg_" + strings.TrimPrefix(c.id, "resp_") }

func (c *call) responsesUsage() *responsesUsage {
	return &responsesUsage{
		InputTokens:        c.req.PromptTokens,
		InputTokensDetails: responsesInputDetail{CachedTokens: c.cached},
		OutputTokens:       c.gen,
		TotalTokens:        c.req.PromptTokens + c.gen,
	}
}

// responses is the response object: in progress (no output, no usage) or
// finished.
func (c *call) responses(finished bool) responsesObject {
	r := responsesObject{
		ID: c.id, Object: "response", CreatedAt: c.created(), Model: c.model(), Status: "in_progress",
		Output: []responsesItem{}, MaxOutputTokens: c.req.MaxTokens, ParallelToolCalls: true,
		ToolChoice: "auto", Tools: []any{},
	}
	if !finished {
		return r
	}
	r.Status = "completed"
	if c.capped {
		r.Status = "incomplete"
		r.IncompleteDetails = &responsesIncomplete{Reason: "max_output_tokens"}
	}
	r.Output = []responsesItem{c.item("completed", c.text())}
	r.Usage = c.responsesUsage()
	return r
}

func (c *call) item(status, text string) responsesItem {
	content := []responsesPart{}
	if status == "completed" {
		content = []responsesPart{{"output_text", text, []any{}}}
	}
	return responsesItem{ID: c.itemID(), Type: "message", Status: status, Role: "assistant", Content: content}
}

// writeResponsesEvent writes one Responses stream event: the event name
// is its type, and its data carries the type and the sequence number.
func (c *call) writeResponsesEvent(w io.Writer, typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = c.seq
	c.seq++
	return writeEvent(w, typ, fields)
}

// writeResponsesStart writes the events that open a stream, before any
// token: response.created and response.in_progress.
func (c *call) writeResponsesStart(w io.Writer) error {
	for _, typ := range []string{"response.created", "response.in_progress"} {
		if err := c.writeResponsesEvent(w, typ, map[string]any{"response": c.responses(false)}); err != nil {
			return err
		}
	}
	return nil
}

// writeResponsesOpen writes the events that open the message item and its
// text part.
func (c *call) writeResponsesOpen(w io.Writer) error {
	c.started = true
	if err := c.writeResponsesEvent(w, "response.output_item.added", map[string]any{
		"output_index": 0, "item": c.item("in_progress", ""),
	}); err != nil {
		return err
	}
	return c.writeResponsesEvent(w, "response.content_part.added", map[string]any{
		"item_id": c.itemID(), "output_index": 0, "content_index": 0, "part": responsesPart{"output_text", "", []any{}},
	})
}

// writeResponsesToken writes the delta of one generated token.
func (c *call) writeResponsesToken(w io.Writer) error {
	if !c.started {
		if err := c.writeResponsesOpen(w); err != nil {
			return err
		}
	}
	return c.writeResponsesEvent(w, "response.output_text.delta", map[string]any{
		"item_id": c.itemID(), "output_index": 0, "content_index": 0, "delta": c.token(), "logprobs": []any{},
	})
}

// writeResponsesEnd writes the events that close the text, the item and
// the response, the last being response.completed with the usage.
func (c *call) writeResponsesEnd(w io.Writer) error {
	if !c.started {
		if err := c.writeResponsesOpen(w); err != nil {
			return err
		}
	}
	text := c.text()
	for _, ev := range []struct {
		typ    string
		fields map[string]any
	}{
		{"response.output_text.done", map[string]any{"item_id": c.itemID(), "output_index": 0, "content_index": 0, "text": text, "logprobs": []any{}}},
		{"response.content_part.done", map[string]any{"item_id": c.itemID(), "output_index": 0, "content_index": 0, "part": responsesPart{"output_text", text, []any{}}}},
		{"response.output_item.done", map[string]any{"output_index": 0, "item": c.item("completed", text)}},
		{"response.completed", map[string]any{"response": c.responses(true)}},
	} {
		if err := c.writeResponsesEvent(w, ev.typ, ev.fields); err != nil {
			return err
		}
	}
	return nil
}
