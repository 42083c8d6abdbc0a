package emulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

func TestMain(m *testing.M) {
	// go-zeromq/zmq4 v0.17.0's PUB socket never stops its writer goroutine:
	// Close cancels the socket but never calls pubMWriter.Close (one
	// goroutine per publisher, kvevents.Publisher).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

const (
	testModel = "Qwen/Qwen3-4B-Instruct-2507"
	testSpeed = 100 // a 26 ms decode step takes 0.26 ms
)

func testFarm(t testing.TB, replicas int, extra string) *sim.Farm {
	t.Helper()
	spec := fmt.Sprintf("model: %s\ngpu: RTX A4000\nreplicas: %d\nvllm: {max_num_seqs: 32, max_model_len: 32768%s}\n", testModel, replicas, extra)
	f, err := sim.ParseFarm([]byte(spec), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// running is an emulator served on 127.0.0.1 until the test ends.
type running struct {
	e    *Emulator
	urls []string
}

func start(t testing.TB, f *sim.Farm, opts Options) *running {
	t.Helper()
	if opts.Speed == 0 {
		opts.Speed = testSpeed
	}
	e, err := New(f, opts)
	if err != nil {
		t.Fatal(err)
	}
	r := &running{e: e}
	lns := make([]net.Listener, e.Listeners())
	for i := range lns {
		if lns[i], err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		r.urls = append(r.urls, "http://"+lns[i].Addr().String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Serve(ctx, lns) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return r
}

// post sends a JSON body and returns the status and the body read whole.
func post(t testing.TB, url string, body any, hdr ...string) (int, []byte) {
	t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

type sseEvent struct {
	name string
	data string
}

func parseSSE(t testing.TB, body []byte) []sseEvent {
	t.Helper()
	var evs []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" {
				evs = append(evs, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return evs
}

// answer is what a client reads from any of the APIs.
type answer struct {
	text         string
	promptTokens int
	outputTokens int
	cached       int // -1: prompt_tokens_details null
	finish       string
}

func chatBody(system string, turns []string, answers []string, maxTokens int, stream bool) map[string]any {
	msgs := []map[string]any{{"role": "system", "content": system}}
	for i, u := range turns {
		msgs = append(msgs, map[string]any{"role": "user", "content": u})
		if i < len(answers) {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": answers[i]})
		}
	}
	b := map[string]any{"model": testModel, "messages": msgs, "max_tokens": maxTokens, "stream": stream}
	if stream {
		b["stream_options"] = map[string]any{"include_usage": true}
	}
	return b
}

func anthropicBody(system string, turns []string, answers []string, maxTokens int, stream bool) map[string]any {
	var msgs []map[string]any
	for i, u := range turns {
		msgs = append(msgs, map[string]any{"role": "user", "content": []map[string]string{{"type": "text", "text": u}}})
		if i < len(answers) {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": []map[string]string{{"type": "text", "text": answers[i]}}})
		}
	}
	return map[string]any{"model": testModel, "system": system, "messages": msgs, "max_tokens": maxTokens, "stream": stream}
}

// ask sends body to path and decodes the answer of any API, streamed or
// not, checking the shape of the stream on the way.
func ask(t testing.TB, base, path string, body map[string]any, hdr ...string) answer {
	t.Helper()
	status, out := post(t, base+path, body, hdr...)
	if status != http.StatusOK {
		t.Fatalf("%s: %d %s", path, status, out)
	}
	stream, _ := body["stream"].(bool)
	a := answer{cached: -1}
	type usageJSON struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		CacheRead    int `json:"cache_read_input_tokens"`
	}
	openAIUsage := func(u *usageJSON) {
		if u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("usage %+v: total != prompt + completion", u)
		}
		a.promptTokens, a.outputTokens = u.PromptTokens, u.CompletionTokens
		if u.PromptTokensDetails != nil {
			a.cached = u.PromptTokensDetails.CachedTokens
			if a.cached == 0 {
				t.Error("prompt_tokens_details.cached_tokens is 0, want null (vLLM)")
			}
		}
	}
	anthropicUsage := func(u *usageJSON) {
		a.promptTokens = u.InputTokens + u.CacheRead
		if u.CacheRead > 0 {
			a.cached = u.CacheRead
		}
	}
	if !stream {
		var v struct {
			Choices []struct {
				Text    *string `json:"text"`
				Message *struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
			StopReason string     `json:"stop_reason"`
			Usage      *usageJSON `json:"usage"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("%s: %v in %s", path, err, out)
		}
		if path == "/v1/messages" {
			if len(v.Content) != 1 || v.Content[0].Type != "text" {
				t.Fatalf("content %s", out)
			}
			a.text, a.finish = v.Content[0].Text, v.StopReason
			anthropicUsage(v.Usage)
			a.outputTokens = v.Usage.OutputTokens
			return a
		}
		if len(v.Choices) != 1 {
			t.Fatalf("choices %s", out)
		}
		c := v.Choices[0]
		switch {
		case c.Text != nil:
			a.text = *c.Text
		case c.Message != nil && c.Message.Role == "assistant":
			a.text = c.Message.Content
		default:
			t.Fatalf("no text in %s", out)
		}
		a.finish = c.FinishReason
		openAIUsage(v.Usage)
		return a
	}
	evs := parseSSE(t, out)
	if path == "/v1/messages" {
		var names []string
		for _, ev := range evs {
			if len(names) == 0 || names[len(names)-1] != ev.name {
				names = append(names, ev.name)
			}
			var v struct {
				Type    string `json:"type"`
				Message struct {
					Usage usageJSON `json:"usage"`
				} `json:"message"`
				Delta struct {
					Type       string `json:"type"`
					Text       string `json:"text"`
					StopReason string `json:"stop_reason"`
				} `json:"delta"`
				Usage usageJSON `json:"usage"`
			}
			if err := json.Unmarshal([]byte(ev.data), &v); err != nil || v.Type != ev.name {
				t.Fatalf("event %s: %v, %s", ev.name, err, ev.data)
			}
			switch ev.name {
			case "message_start":
				anthropicUsage(&v.Message.Usage)
			case "content_block_delta":
				a.text += v.Delta.Text
			case "message_delta":
				a.finish, a.outputTokens = v.Delta.StopReason, v.Usage.OutputTokens
			}
		}
		want := "message_start content_block_start content_block_delta content_block_stop message_delta message_stop"
		if got := strings.Join(names, " "); got != want {
			t.Errorf("events %s, want %s", got, want)
		}
		return a
	}
	if len(evs) == 0 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %s", out)
	}
	for _, ev := range evs[:len(evs)-1] {
		var v struct {
			Object  string `json:"object"`
			Choices []struct {
				Text  *string `json:"text"`
				Delta *struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usageJSON `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev.data), &v); err != nil {
			t.Fatalf("chunk %s: %v", ev.data, err)
		}
		for _, c := range v.Choices {
			if c.Text != nil {
				a.text += *c.Text
			}
			if c.Delta != nil {
				a.text += c.Delta.Content
			}
			if c.FinishReason != nil {
				a.finish = *c.FinishReason
			}
		}
		if v.Usage != nil {
			openAIUsage(v.Usage)
		}
	}
	return a
}

func TestAPIs(t *testing.T) {
	r := start(t, testFarm(t, 1, ""), Options{})
	system := strings.Repeat("You are a careful assistant. ", 20)
	user := strings.Repeat("Please read this file. ", 30)
	for _, tc := range []struct {
		path   string
		stream bool
		body   map[string]any
		finish string
	}{
		{"/v1/chat/completions", false, chatBody(system, []string{user}, nil, 40, false), "length"},
		{"/v1/chat/completions", true, chatBody(system, []string{user}, nil, 40, true), "length"},
		{"/v1/completions", false, map[string]any{"model": testModel, "prompt": system + user, "max_tokens": 40}, "length"},
		{"/v1/completions", true, map[string]any{"prompt": system + user, "max_tokens": 40, "stream": true,
			"stream_options": map[string]any{"include_usage": true}}, "length"},
		{"/v1/messages", false, anthropicBody(system, []string{user}, nil, 40, false), "max_tokens"},
		{"/v1/messages", true, anthropicBody(system, []string{user}, nil, 40, true), "max_tokens"},
	} {
		t.Run(fmt.Sprintf("%s stream=%v", tc.path, tc.stream), func(t *testing.T) {
			a := ask(t, r.urls[0], tc.path, tc.body)
			if len(a.text) != 40*bytesPerToken || a.outputTokens != 40 || a.finish != tc.finish {
				t.Errorf("answer %q (%d tokens, finish %q), want 40 tokens and %q", a.text, a.outputTokens, a.finish, tc.finish)
			}
			raw, _ := json.Marshal(tc.body)
			api := map[string]API{"/v1/chat/completions": APIChat, "/v1/completions": APICompletions, "/v1/messages": APIMessages}[tc.path]
			if want := traces.TextTokens(traces.PromptText(raw, api.dialect())); a.promptTokens != want {
				t.Errorf("prompt tokens %d, want %d (4 bytes of canonical text each)", a.promptTokens, want)
			}
		})
	}
	// The same request twice gives the same answer (deterministic text).
	a1 := ask(t, r.urls[0], "/v1/chat/completions", chatBody("x", []string{"same"}, nil, 8, false))
	a2 := ask(t, r.urls[0], "/v1/chat/completions", chatBody("x", []string{"same"}, nil, 8, true))
	if a1.text != a2.text {
		t.Errorf("answers differ: %q and %q", a1.text, a2.text)
	}
}

// TestSecondTurnHits: a second turn that carries the first answer is served
// from the cache up to the last block the first turn computed (its prompt
// and the blocks its answer filled during decode); another prefix misses.
func TestSecondTurnHits(t *testing.T) {
	r := start(t, testFarm(t, 1, ""), Options{})
	system := strings.Repeat("Shared system prompt for agents. ", 40)
	for _, api := range []string{"/v1/chat/completions", "/v1/messages"} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%v", api, stream), func(t *testing.T) {
				body := chatBody
				if api == "/v1/messages" {
					body = anthropicBody
				}
				user := fmt.Sprintf("First question of session %s %v. ", api, stream) + strings.Repeat("context ", 300)
				first := ask(t, r.urls[0], api, body(system, []string{user}, nil, 100, stream))
				second := ask(t, r.urls[0], api, body(system, []string{user, "And then?"}, []string{first.text}, 20, stream))
				want := (first.promptTokens + first.outputTokens - 1) / 16 * 16
				if second.cached != want {
					t.Errorf("second turn cached %d tokens, want %d (prompt %d + answer %d, the last token's KV never computed)",
						second.cached, want, first.promptTokens, first.outputTokens)
				}
			})
		}
	}
	a := ask(t, r.urls[0], "/v1/chat/completions", chatBody(strings.Repeat("Another system prompt. ", 40), []string{"hello"}, nil, 4, false))
	if a.cached != -1 {
		t.Errorf("a different prefix hit %d tokens, want null", a.cached)
	}
}

// scrape reads one /metrics page with the parser Prometheus uses.
func scrape(t testing.TB, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// value sums the samples of name whose labels include want.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	var sum float64
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(want); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == want[i] && l.GetValue() == want[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

func TestMetricsAgreeWithRequests(t *testing.T) {
	f := testFarm(t, 1, "")
	r := start(t, f, Options{})
	var prompt, output, cached int
	for i := range 5 {
		a := ask(t, r.urls[0], "/v1/chat/completions", chatBody("shared system prompt "+strings.Repeat("s", 200), []string{fmt.Sprintf("q%d", i%2)}, nil, 10+i, i%2 == 0))
		prompt += a.promptTokens
		output += a.outputTokens
		cached += max(a.cached, 0)
	}
	fams := scrape(t, r.urls[0])
	for _, c := range []struct {
		name string
		want float64
		lbl  []string
	}{
		{"vllm:prompt_tokens_total", float64(prompt), nil},
		{"vllm:generation_tokens_total", float64(output), nil},
		{"vllm:prefix_cache_queries_total", float64(prompt), nil},
		{"vllm:prefix_cache_hits_total", float64(cached), nil},
		{"vllm:request_success_total", 5, []string{"finished_reason", "length"}},
		{"vllm:request_success_total", 0, []string{"finished_reason", "stop"}},
		{"vllm:time_to_first_token_seconds", 5, nil},
		{"vllm:e2e_request_latency_seconds", 5, nil},
		{"vllm:num_requests_running", 0, nil},
		{"vllm:num_preemptions_total", 0, nil},
		{"vllm:cache_config_info", 1, []string{"num_gpu_blocks", fmt.Sprint(f.NumGPUBlocks), "block_size", "16", "engine", "0"}},
		{"vllm:kv_cache_usage_perc", 0, []string{"model_name", testModel, "engine", "0"}},
	} {
		if got := value(fams, c.name, c.lbl...); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.lbl, got, c.want)
		}
	}
	if cached == 0 {
		t.Error("no request hit the shared system prompt")
	}
	for _, l := range fams["vllm:cache_config_info"].GetMetric()[0].GetLabel() {
		if l.GetName() == "model_name" {
			t.Error("cache_config_info has a model_name label")
		}
	}
}

func TestDataParallelLayout(t *testing.T) {
	r := start(t, testFarm(t, 4, ""), Options{Layout: LayoutDP})
	if len(r.urls) != 1 {
		t.Fatalf("%d listeners, want 1", len(r.urls))
	}
	base := r.urls[0]
	for rank := range 4 {
		ask(t, base, "/v1/chat/completions", chatBody("s", []string{"pinned"}, nil, 3, false), RankHeader, fmt.Sprint(rank))
		ask(t, base, "/v1/chat/completions", chatBody("s", []string{"pinned"}, nil, 3, false), RankHeader, fmt.Sprint(rank))
	}
	fams := scrape(t, base)
	for rank := range 4 {
		if got := value(fams, "vllm:request_success_total", "engine", fmt.Sprint(rank)); got != 2 {
			t.Errorf("engine %d served %g requests, want 2", rank, got)
		}
	}
	if got := value(fams, "vllm:cache_config_info"); got != 4 {
		t.Errorf("%g cache_config_info series, want one per engine", got)
	}
	// Without the header (or with a non-integer one, which vLLM ignores),
	// the balancer spreads concurrent requests.
	var wg sync.WaitGroup
	for i := range 8 {
		hdr := []string{}
		if i%2 == 1 {
			hdr = []string{RankHeader, "not-a-rank"}
		}
		wg.Go(func() {
			ask(t, base, "/v1/chat/completions", chatBody("s", []string{fmt.Sprint("balanced ", i, strings.Repeat(" x", 2000))}, nil, 50, true), hdr...)
		})
	}
	wg.Wait()
	fams = scrape(t, base)
	used := 0
	for rank := range 4 {
		if value(fams, "vllm:request_success_total", "engine", fmt.Sprint(rank)) > 2 {
			used++
		}
	}
	if used < 2 {
		t.Errorf("the balancer used %d engines for 8 concurrent requests", used)
	}
	status, out := post(t, base+"/v1/chat/completions", chatBody("s", []string{"x"}, nil, 3, false), RankHeader, "7")
	if status != http.StatusBadRequest || !strings.Contains(string(out), "out of range") {
		t.Errorf("rank 7 of 4: %d %s", status, out)
	}
}

func TestBadInput(t *testing.T) {
	r := start(t, testFarm(t, 1, ""), Options{})
	base := r.urls[0]
	long := strings.Repeat("y", 4*40000)
	for _, tc := range []struct {
		name, path, body string
		status           int
		contains         string
	}{
		{"not JSON", "/v1/chat/completions", `{"messages": [`, 400, "invalid JSON"},
		{"messages not a list", "/v1/chat/completions", `{"messages": "hi"}`, 400, "messages"},
		{"no messages", "/v1/chat/completions", `{"model": "` + testModel + `"}`, 400, "messages"},
		{"empty messages", "/v1/chat/completions", `{"messages": []}`, 400, "must not be empty"},
		{"no role", "/v1/chat/completions", `{"messages": [{"content": "x"}]}`, 400, "role"},
		{"bad content", "/v1/chat/completions", `{"messages": [{"role": "user", "content": 3}]}`, 400, "content"},
		{"max_tokens type", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}`, 400, "max_tokens"},
		{"max_tokens 0", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}`, 400, "at least 1"},
		{"unknown model", "/v1/chat/completions", `{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}`, 404, "does not exist"},
		{"prompt too long", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "` + long + `"}]}`, 400, "maximum context length is 32768 tokens"},
		{"output too long", "/v1/completions", `{"prompt": "hi", "max_tokens": 40000}`, 400, "'max_tokens' or 'max_completion_tokens' is too large: 40000"},
		{"no prompt", "/v1/completions", `{"max_tokens": 3}`, 400, "prompt"},
		{"anthropic not JSON", "/v1/messages", `[`, 400, `"type":"error"`},
		{"anthropic bad system", "/v1/messages", `{"system": 5, "messages": [{"role": "user", "content": "x"}]}`, 400, "invalid_request_error"},
		{"anthropic unknown model", "/v1/messages", `{"model": "claude", "messages": [{"role": "user", "content": "x"}]}`, 404, "not_found_error"},
		{"unknown path", "/v1/nothing", `{}`, 404, "Not Found"},
		{"responses no input", "/v1/responses", `{"model": "` + testModel + `"}`, 400, "input: required"},
		{"responses empty input", "/v1/responses", `{"input": []}`, 400, "input: must not be empty"},
		{"responses item not an object", "/v1/responses", `{"input": ["hi"]}`, 400, "input: expected a string or a list of item objects"},
		{"responses bad role", "/v1/responses", `{"input": [{"role": 3, "content": "x"}]}`, 400, "input[0].role"},
		{"responses bad content", "/v1/responses", `{"input": [{"role": "user", "content": 3}]}`, 400, "input[0].content"},
		{"responses max_output_tokens 0", "/v1/responses", `{"input": "x", "max_output_tokens": 0}`, 400, "max_output_tokens must be at least 1"},
		{"responses instructions", "/v1/responses", `{"input": "x", "instructions": 5}`, 400, "instructions: expected a string"},
		{"responses previous_response_id", "/v1/responses", `{"input": "x", "previous_response_id": "resp_1"}`, 400, "previous_response_id"},
		{"responses output too long", "/v1/responses", `{"input": "x", "max_output_tokens": 40000}`, 400, "is too large: 40000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := post(t, base+tc.path, tc.body)
			if status != tc.status || !strings.Contains(string(out), tc.contains) {
				t.Fatalf("%d %s, want %d containing %q", status, out, tc.status, tc.contains)
			}
			if tc.path == "/v1/nothing" {
				return
			}
			var v map[string]json.RawMessage
			if err := json.Unmarshal(out, &v); err != nil {
				t.Fatal(err)
			}
			if tc.path == "/v1/messages" {
				if string(v["type"]) != `"error"` {
					t.Errorf("Anthropic error without type error: %s", out)
				}
				return
			}
			var e struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    int     `json:"code"`
			}
			if err := json.Unmarshal(v["error"], &e); err != nil || e.Message == "" || e.Type == "" || e.Code != tc.status {
				t.Errorf("OpenAI error shape: %s", out)
			}
		})
	}
	// The server still works.
	ask(t, base, "/v1/chat/completions", chatBody("s", []string{"ok"}, nil, 2, false))
	resp, err := http.Get(base + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != testModel || models.Data[0].MaxModelLen != 32768 {
		t.Errorf("/v1/models: %+v %v", models, err)
	}
}

// TestClientGoneAborts: a client that hangs up mid-stream frees its
// request (vLLM aborts it): nothing stays running.
func TestClientGoneAborts(t *testing.T) {
	r := start(t, testFarm(t, 1, ""), Options{Speed: 1})
	body, _ := json.Marshal(chatBody("s", []string{"a long answer please"}, nil, 2000, true))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.urls[0]+"/v1/chat/completions", bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil { // the stream has begun
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	for {
		fams := scrape(t, r.urls[0])
		if value(fams, "vllm:request_success_total", "finished_reason", "abort") == 1 {
			if run := value(fams, "vllm:num_requests_running"); run != 0 {
				t.Errorf("%g running after the abort", run)
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New(testFarm(t, 1, ""), Options{Speed: -1}); err == nil {
		t.Error("speed -1 accepted")
	}
	if _, err := New(testFarm(t, 1, ", block_size: 8"), Options{}); err == nil || !strings.Contains(err.Error(), "block_size") {
		t.Errorf("block_size 8: %v", err)
	}
	e, err := New(testFarm(t, 2, ""), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Serve(context.Background(), nil); err == nil {
		t.Error("Serve with no listener accepted")
	}
	for _, s := range []string{"urls", "dp"} {
		l, err := ParseLayout(s)
		if err != nil || l.String() != s {
			t.Errorf("ParseLayout(%q) = %v, %v", s, l, err)
		}
	}
	if _, err := ParseLayout("ring"); err == nil {
		t.Error("layout ring accepted")
	}
}

// TestHistogramsInModelTime: TTFT and end-to-end latency are the model's
// own durations, whatever the speed (the wall clock only paces delivery).
func TestHistogramsInModelTime(t *testing.T) {
	sums := map[float64][2]float64{}
	for _, speed := range []float64{50, 400} {
		r := start(t, testFarm(t, 1, ""), Options{Speed: speed})
		ask(t, r.urls[0], "/v1/chat/completions", chatBody("s", []string{strings.Repeat("long prompt ", 800)}, nil, 30, true))
		fams := scrape(t, r.urls[0])
		sum := func(name string) float64 {
			return fams[name].GetMetric()[0].GetHistogram().GetSampleSum()
		}
		sums[speed] = [2]float64{sum("vllm:time_to_first_token_seconds"), sum("vllm:e2e_request_latency_seconds")}
	}
	if sums[50] != sums[400] || sums[50][0] <= 0 || sums[50][1] <= sums[50][0] {
		t.Errorf("model-time TTFT and e2e at speed 50 %v, at speed 400 %v: want equal and positive", sums[50], sums[400])
	}
}

func BenchmarkEngineRequest(b *testing.B) {
	body, _ := json.Marshal(chatBody(strings.Repeat("system prompt ", 1000), []string{strings.Repeat("user turn ", 3000)}, nil, 256, true))
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		r, err := ParseRequest(APIChat, body)
		if err != nil {
			b.Fatal(err)
		}
		engineRequest(APIChat, r, 1, 16)
	}
}

func BenchmarkStreamedChat(b *testing.B) {
	r := start(b, testFarm(b, 1, ""), Options{Speed: 1e5})
	body := chatBody("s", []string{"short question"}, nil, 16, true)
	b.ReportAllocs()
	for b.Loop() {
		ask(b, r.urls[0], "/v1/chat/completions", body)
	}
}

// TestDataParallelFrontEndByRelease: without a rank header, a request
// reaches vLLM's front end as the farm's release runs it (sim.DPFrontEnd).
// One keep-alive connection's sequential requests, on idle engines: 0.26
// (a dense model's engines report no counts; the connection's API server
// rotates) spreads them over every engine, while 0.13 (counts published,
// a fixed scan start) sends each to the same engine, idle again by then.
func TestDataParallelFrontEndByRelease(t *testing.T) {
	for _, c := range []struct {
		version string
		engines int
	}{{"0.26", 4}, {"0.13", 1}} {
		t.Run(c.version, func(t *testing.T) {
			r := start(t, testFarm(t, 4, ", version: \""+c.version+"\""), Options{Layout: LayoutDP})
			tr := &http.Transport{MaxConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			for i := range 8 {
				b, _ := json.Marshal(chatBody("s", []string{fmt.Sprint("turn ", i)}, nil, 3, false))
				resp, err := client.Post(r.urls[0]+"/v1/chat/completions", "application/json", bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				time.Sleep(5 * time.Millisecond) // 0.5 s of model time: the engine is idle and its counts published
			}
			fams := scrape(t, r.urls[0])
			used := 0
			for rank := range 4 {
				if value(fams, "vllm:request_success_total", "engine", fmt.Sprint(rank)) > 0 {
					used++
				}
			}
			if used != c.engines {
				t.Errorf("vLLM %s: one connection's 8 sequential requests reached %d engines, want %d", c.version, used, c.engines)
			}
		})
	}
}
