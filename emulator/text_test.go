package emulator

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestAnswerBlocksAreNextTurnBlocks checks the rule that makes decode
// blocks hit: the blocks a request's answer completes are exactly the
// blocks of the next turn's prompt at the same positions, for every API
// and for block sizes that are multiples of 16.
func TestAnswerBlocksAreNextTurnBlocks(t *testing.T) {
	system := strings.Repeat("sys ", 37)
	u2 := "second question"
	for _, api := range []API{APIChat, APIMessages, APICompletions} {
		for pad := range 4 { // the prompt's text ends anywhere inside a token
			u1 := strings.Repeat("first question ", 23) + strings.Repeat("!", pad)
			for _, bs := range []int{16, 32, 64} {
				for _, out := range []int{1, 15, 16, 17, 100} {
					t.Run(fmt.Sprintf("%s/pad%d/bs%d/out%d", api, pad, bs, out), func(t *testing.T) {
						body := func(answers []string) []byte {
							var v map[string]any
							switch api {
							case APIChat:
								v = chatBody(system, []string{u1, u2}[:len(answers)+1], answers, out, false)
							case APIMessages:
								v = anthropicBody(system, []string{u1, u2}[:len(answers)+1], answers, out, false)
							default:
								p := system + u1
								if len(answers) > 0 {
									p += answers[0] + u2
								}
								v = map[string]any{"prompt": p, "max_tokens": out}
							}
							b, _ := json.Marshal(v)
							return b
						}
						r1, err := ParseRequest(api, body(nil))
						if err != nil {
							t.Fatal(err)
						}
						e1, ans := engineRequest(api, r1, 7, bs)
						if len(ans) != out*bytesPerToken {
							t.Fatalf("answer of %d bytes", len(ans))
						}
						r2, err := ParseRequest(api, body([]string{ans}))
						if err != nil {
							t.Fatal(err)
						}
						e2, _ := engineRequest(api, r2, 7, bs)
						full := e1.PromptTokens / bs
						want := append(slices.Clone(e1.HashIDs[:full]), e1.OutputHashIDs...)
						n := (e1.PromptTokens + out) / bs
						if api == APICompletions {
							n = min(n, (len(r1.Text)+len(ans))/(bs*bytesPerToken)) // blocks inside the text
						}
						if len(want) != n {
							t.Fatalf("%d prompt + output blocks, want %d", len(want), n)
						}
						if got := e2.HashIDs[:len(want)]; !slices.Equal(got, want) {
							t.Errorf("next turn's first %d blocks differ from the prompt's and answer's", len(want))
						}
						if len(e1.HashIDs) != (e1.PromptTokens+bs-1)/bs {
							t.Errorf("%d hash ids for %d tokens at block size %d", len(e1.HashIDs), e1.PromptTokens, bs)
						}
					})
				}
			}
		}
	}
}

func TestAnswerText(t *testing.T) {
	a := answerText(1, 2, 5)
	if len(a) != 20 || a != answerText(1, 2, 5) || a == answerText(2, 2, 5) || a == answerText(1, 3, 5) {
		t.Errorf("answers not deterministic per seed and prompt: %q", a)
	}
	if !strings.HasSuffix(a, ".") || strings.Count(a, " ") != 4 {
		t.Errorf("answer %q: want 5 words of 3 letters, the last ending with a period", a)
	}
}

// FuzzParseRequest: any body is either a valid request or a 400 error;
// never a panic.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"x"}]},{"role":"user","content":null}]}`,
		`{"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1"}],"messages":[{"role":"user","content":"q"}],"max_tokens":3}`,
		`{"prompt":["a",1,2],"max_tokens":1}`,
		`{"prompt":"abc","max_completion_tokens":0}`,
		`{"messages":"x"}`, `[`, `null`, `{} {}`, `{"max_tokens":-1}`,
		`{"instructions":"be brief","input":"hi","max_output_tokens":4,"stream":true}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},{"type":"function_call_output","call_id":"c","output":"x"}]}`,
		`{"input":[],"previous_response_id":"resp_1"}`,
	} {
		for api := range 4 {
			f.Add(uint8(api), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, api uint8, body []byte) {
		a := API(api % 4)
		r, err := ParseRequest(a, body)
		if err != nil {
			ae, ok := err.(*APIError)
			if !ok || ae.Status != 400 || ae.Message == "" {
				t.Fatalf("error %v (%T), want a 400 *APIError", err, err)
			}
			return
		}
		if r.MaxTokens < 1 || r.PromptTokens < 1 || r.PromptTokens < len(r.Text)/bytesPerToken {
			t.Fatalf("request %+v", r)
		}
		if r.PromptTokens+r.MaxTokens < 1<<20 {
			req, ans := engineRequest(a, r, 1, 32)
			if len(ans) != r.MaxTokens*bytesPerToken || len(req.HashIDs) != (r.PromptTokens+31)/32 {
				t.Fatalf("engine request %d ids, answer %d bytes", len(req.HashIDs), len(ans))
			}
		}
	})
}
