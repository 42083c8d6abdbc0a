package emulator

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/lm-warden/warden/traces"
)

// responsesUsageJSON is the usage object the proxy reads from a Responses
// answer (live/sse.go usageJSON: input_tokens, output_tokens,
// input_tokens_details.cached_tokens).
type responsesUsageJSON struct {
	InputTokens        *int `json:"input_tokens"`
	OutputTokens       *int `json:"output_tokens"`
	TotalTokens        *int `json:"total_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

type responsesJSON struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *responsesUsageJSON `json:"usage"`
}

// answer checks a finished response object and returns its answer.
func (r *responsesJSON) answer(t testing.TB) answer {
	t.Helper()
	if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") {
		t.Errorf("object %q id %q, want a response resp_...", r.Object, r.ID)
	}
	if len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" || r.Output[0].Status != "completed" ||
		len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" {
		t.Fatalf("output %+v, want one completed assistant message with one output_text", r.Output)
	}
	u := r.Usage
	if u == nil || u.InputTokens == nil || u.OutputTokens == nil || u.TotalTokens == nil || u.InputTokensDetails == nil || u.InputTokensDetails.CachedTokens == nil {
		t.Fatalf("usage %+v, want input_tokens, output_tokens, total_tokens and input_tokens_details.cached_tokens", u)
	}
	if *u.TotalTokens != *u.InputTokens+*u.OutputTokens {
		t.Errorf("usage total %d != input %d + output %d", *u.TotalTokens, *u.InputTokens, *u.OutputTokens)
	}
	a := answer{text: r.Output[0].Content[0].Text, promptTokens: *u.InputTokens, outputTokens: *u.OutputTokens,
		cached: *u.InputTokensDetails.CachedTokens, finish: r.Status}
	if r.IncompleteDetails != nil {
		a.finish += "/" + r.IncompleteDetails.Reason
	}
	return a
}

// askResponses sends a Responses request and decodes its answer, checking
// the stream's events: response.created, response.in_progress, the item
// and part openings, one output_text.delta per token, their closings and
// response.completed, with increasing sequence numbers.
func askResponses(t testing.TB, base string, body map[string]any) answer {
	t.Helper()
	status, out := post(t, base+"/v1/responses", body)
	if status != 200 {
		t.Fatalf("/v1/responses: %d %s", status, out)
	}
	if stream, _ := body["stream"].(bool); !stream {
		var r responsesJSON
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("%v in %s", err, out)
		}
		return r.answer(t)
	}
	var names []string
	var text string
	var final answer
	for i, ev := range parseSSE(t, out) {
		var v struct {
			Type     string        `json:"type"`
			Seq      *int          `json:"sequence_number"`
			Delta    string        `json:"delta"`
			Response responsesJSON `json:"response"`
		}
		if err := json.Unmarshal([]byte(ev.data), &v); err != nil || v.Type != ev.name {
			t.Fatalf("event %q: %v, %s", ev.name, err, ev.data)
		}
		if v.Seq == nil || *v.Seq != i {
			t.Errorf("event %d %s: sequence_number %v", i, ev.name, v.Seq)
		}
		if len(names) == 0 || names[len(names)-1] != ev.name {
			names = append(names, ev.name)
		}
		switch ev.name {
		case "response.output_text.delta":
			text += v.Delta
		case "response.completed":
			final = v.Response.answer(t)
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.done response.content_part.done response.output_item.done response.completed"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("events\n%s\nwant\n%s", got, want)
	}
	if text != final.text {
		t.Errorf("deltas %q, completed text %q", text, final.text)
	}
	return final
}

// TestResponsesAPI: /v1/responses answers streamed and not, with a string
// input and with message items, in the shapes the proxy reads (its
// usage), and a second turn that carries the first answer hits the cache.
func TestResponsesAPI(t *testing.T) {
	r := start(t, testFarm(t, 1, ""), Options{})
	instructions := strings.Repeat("You are a careful assistant. ", 20)
	user := strings.Repeat("Please read this file. ", 30)
	items := func(users, answers []string) []map[string]any {
		var out []map[string]any
		for i, u := range users {
			out = append(out, map[string]any{"role": "user", "content": []map[string]string{{"type": "input_text", "text": u}}})
			if i < len(answers) {
				out = append(out, map[string]any{"type": "message", "role": "assistant", "content": []map[string]string{{"type": "output_text", "text": answers[i]}}})
			}
		}
		return out
	}
	for _, stream := range []bool{false, true} {
		for _, input := range []any{user, items([]string{user}, nil)} {
			t.Run(fmt.Sprintf("stream=%v input=%T", stream, input), func(t *testing.T) {
				body := map[string]any{"model": testModel, "instructions": instructions, "input": input, "max_output_tokens": 40, "stream": stream}
				a := askResponses(t, r.urls[0], body)
				if len(a.text) != 40*bytesPerToken || a.outputTokens != 40 || a.finish != "incomplete/max_output_tokens" {
					t.Errorf("answer %q (%d tokens, status %q), want 40 tokens, incomplete/max_output_tokens", a.text, a.outputTokens, a.finish)
				}
				raw, _ := json.Marshal(body)
				if want := traces.TextTokens(traces.PromptText(raw, traces.DialectResponses)); a.promptTokens != want {
					t.Errorf("input tokens %d, want %d (4 bytes of canonical text each)", a.promptTokens, want)
				}
			})
		}
		t.Run(fmt.Sprintf("second turn stream=%v", stream), func(t *testing.T) {
			u := fmt.Sprintf("First question %v. ", stream) + strings.Repeat("context ", 300)
			instructions := fmt.Sprintf("Own prefix %v. ", stream) + instructions
			first := askResponses(t, r.urls[0], map[string]any{"instructions": instructions, "input": items([]string{u}, nil), "max_output_tokens": 100, "stream": stream})
			if first.cached != 0 {
				t.Errorf("first turn cached %d, want 0", first.cached)
			}
			second := askResponses(t, r.urls[0], map[string]any{"instructions": instructions, "input": items([]string{u, "And then?"}, []string{first.text}), "max_output_tokens": 20, "stream": stream})
			if want := (first.promptTokens + first.outputTokens - 1) / 16 * 16; second.cached != want {
				t.Errorf("second turn cached %d, want %d", second.cached, want)
			}
		})
	}
}
