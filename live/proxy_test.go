package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
)

const testModel = "qwen"

func urlsModel(urls ...string) string {
	return "  - name: " + testModel + "\n    replicas: [" + strings.Join(urls, ", ") + "]\n"
}

func sessionHdr(s string) map[string]string { return map[string]string{"X-Claude-Code-Session-Id": s} }

// servedBy returns the index of the only fake (or engine) that served
// requests, failing if the work was split.
func onlyOne(t *testing.T, counts []int, want int) int {
	t.Helper()
	idx := -1
	for i, n := range counts {
		if n == 0 {
			continue
		}
		if idx >= 0 || n != want {
			t.Fatalf("requests per replica = %v, want all %d on one replica", counts, want)
		}
		idx = i
	}
	if idx < 0 {
		t.Fatalf("requests per replica = %v, want %d on one", counts, want)
	}
	return idx
}

func TestFourTurnsStayHome(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
			h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())))
			h.scraped()
			for turn := range 4 {
				r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "s1", turn, stream), sessionHdr("s1"))
				if r.status != 200 {
					t.Fatalf("turn %d: status %d: %s", turn, r.status, r.body)
				}
				if stream && !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
					t.Fatalf("turn %d: stream does not end with [DONE]: %q", turn, r.body)
				}
			}
			onlyOne(t, []int{sum(a.Served()), sum(b.Served())}, 4)
			st := h.status().Models[0]
			if st.LaterTurns != 3 || st.LaterTurnsHome != 3 || st.StickyPct == nil || *st.StickyPct != 100 {
				t.Errorf("later turns %d, home %d, sticky %v; want 3, 3, 100", st.LaterTurns, st.LaterTurnsHome, st.StickyPct)
			}
			h.waitMetrics(
				`warden_later_turns_home_total{model="qwen"} 3`,
				`reason="sticky",replica=`,
				`warden_ttfb_seconds_count{model="qwen"} 4`,
				`warden_output_tokens_total{model="qwen"} 16`,
			)
			if strings.Contains(h.metrics(), `"s1"`) {
				t.Errorf("/metrics mentions the session id")
			}
		})
	}
}

func TestDataParallelLayout(t *testing.T) {
	f := fakevllm.New(t, 2)
	h := startProxy(t, modelsYAML("", "  - name: qwen\n    url: "+f.URL()+"\n    data_parallel_size: 2\n"))
	st := h.scraped()
	if st.Models[0].Layout != "data-parallel" || len(st.Models[0].Replicas) != 2 {
		t.Fatalf("status: layout %q with %d replicas, want data-parallel with 2", st.Models[0].Layout, len(st.Models[0].Replicas))
	}
	// The client's own rank header must never choose the rank.
	for turn := range 4 {
		hdr := sessionHdr("dp-1")
		hdr["X-data-parallel-rank"] = "1"
		if r := h.do("POST", "/v1/messages", anthropicBody(testModel, "dp-1", turn, true), hdr); r.status != 200 {
			t.Fatalf("turn %d: %d %s", turn, r.status, r.body)
		}
	}
	home := onlyOne(t, f.Served(), 4)
	if home != 0 {
		t.Errorf("first session homed on rank %d, want 0 (lowest ID on a tie)", home)
	}
	if got := f.Header().Get("X-data-parallel-rank"); got != "0" {
		t.Errorf("backend saw X-data-parallel-rank %q, want 0 (set by the proxy)", got)
	}
	// A second session goes to the other rank (fewer sessions held).
	if r := h.do("POST", "/v1/messages", anthropicBody(testModel, "dp-2", 0, false), sessionHdr("dp-2")); r.status != 200 {
		t.Fatalf("dp-2: %d %s", r.status, r.body)
	}
	if got := f.Served(); got[1] != 1 {
		t.Errorf("per rank %v, want the second session on rank 1", got)
	}
}

func TestSecondSessionGoesToLessLoaded(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	a.Hold, b.Hold = make(chan struct{}), make(chan struct{})
	h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())))
	h.scraped()
	var wg sync.WaitGroup
	wg.Go(func() {
		h.do("POST", "/v1/chat/completions", chatBody(testModel, "busy", 0, true), sessionHdr("busy"))
	})
	h.waitFor("one request at a backend", func(StatusReport) bool { return sum(a.Served(), b.Served()) == 1 })
	busy := onlyOne(t, []int{sum(a.Served()), sum(b.Served())}, 1)
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "calm", 0, false), sessionHdr("calm")); r.status != 200 {
		t.Fatalf("calm: %d %s", r.status, r.body)
	}
	counts := []int{sum(a.Served()), sum(b.Served())}
	if counts[1-busy] != 1 {
		t.Errorf("per replica %v: the second session did not go to the idle replica %d", counts, 1-busy)
	}
	close(a.Hold)
	close(b.Hold)
	wg.Wait()
}

func TestSpillAndReturnHome(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	a.Hold = make(chan struct{})
	h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())+"    spill_threshold: 1\n"))
	h.scraped()
	// Two turns of s in flight on its home (a: lowest ID on a tie).
	var wg sync.WaitGroup
	for turn := range 2 {
		wg.Go(func() {
			h.do("POST", "/v1/chat/completions", chatBody(testModel, "s", turn, true), sessionHdr("s"))
		})
		h.waitFor("turns at home", func(StatusReport) bool { return sum(a.Served()) == turn+1 })
	}
	// Home is over its threshold (2 > 1): the next turn spills to b.
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "s", 2, false), sessionHdr("s")); r.status != 200 {
		t.Fatalf("spill turn: %d %s", r.status, r.body)
	}
	if got := sum(b.Served()); got != 1 {
		t.Fatalf("b served %d, want the spilled turn", got)
	}
	close(a.Hold)
	wg.Wait()
	h.waitFor("home drained", func(st StatusReport) bool { return st.Models[0].InFlight == 0 })
	// Home is below its threshold again: the next turn returns home.
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "s", 3, false), sessionHdr("s")); r.status != 200 {
		t.Fatalf("return turn: %d %s", r.status, r.body)
	}
	if got := []int{sum(a.Served()), sum(b.Served())}; got[0] != 3 || got[1] != 1 {
		t.Errorf("per replica %v, want [3 1]", got)
	}
	h.waitFor("one spilled in, two sticky at home", func(st StatusReport) bool {
		return st.Models[0].Replicas[1].SpilledIn == 1 && st.Models[0].Replicas[0].Sticky == 2
	})
	if !strings.Contains(h.metrics(), `warden_spills_total{model="qwen",replica="0"} 1`) {
		t.Errorf("/metrics: no spill counted from home 0")
	}
}

func TestAffinityOffIsVLLMBalancer(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())+"    affinity: off\n"))
	h.scraped()
	// Equal load: vLLM's rotating start spreads one session's turns.
	for turn := range 4 {
		if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "s", turn, false), sessionHdr("s")); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	if got := []int{sum(a.Served()), sum(b.Served())}; got[0] != 2 || got[1] != 2 {
		t.Errorf("per replica %v, want [2 2] (turns placed afresh, rotating)", got)
	}
	// A loaded replica (4*waiting + running) is avoided.
	a.SetLoad(0, 100)
	h.waitFor("load scraped", func(st StatusReport) bool {
		r := st.Models[0].Replicas[0].Running
		return r != nil && *r >= 100 && st.Models[0].Replicas[0].ScrapeState == "ok"
	})
	for turn := range 4 {
		h.do("POST", "/v1/chat/completions", chatBody(testModel, "t", turn, false), sessionHdr("t"))
	}
	if got := []int{sum(a.Served()), sum(b.Served())}; got[0] != 2 || got[1] != 6 {
		t.Errorf("per replica %v, want [2 6]: everything on the idle replica", got)
	}
	st := h.status().Models[0]
	if st.Affinity || st.Strategy != "least-loaded" {
		t.Errorf("status affinity %v strategy %q, want off / least-loaded", st.Affinity, st.Strategy)
	}
}

// TestBackendKilledMidStream: the replica (warden emulate --fault
// die-mid-stream=1) drops the connection after the first of the answer's
// two tokens; the client gets the token once, then the API's error event
// in whole events, and the proxy counts an upstream stream error.
func TestBackendKilledMidStream(t *testing.T) {
	for _, tc := range []struct {
		path, body, wantErr, mustNot string
	}{
		{"/v1/chat/completions", strings.Replace(chatBody(emulatedModel, "k", 0, true), `"stream":true`, `"stream":true,"max_tokens":2`, 1), `data: {"error":{`, "[DONE]"},
		{"/v1/messages", strings.Replace(anthropicBody(emulatedModel, "k", 0, true), `"max_tokens":64`, `"max_tokens":2`, 1), "event: error\ndata: {\"type\":\"error\"", "message_stop"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			h := startProxy(t, modelsYAML("", "  - name: "+emulatedModel+"\n    replicas: ["+startEmulator(t, "die-mid-stream=1")+"]\n"))
			r := h.do("POST", tc.path, tc.body, sessionHdr("k"))
			if r.status != 200 {
				t.Fatalf("status %d, want 200 (headers were sent before the failure)", r.status)
			}
			if !strings.Contains(r.body, tc.wantErr) || strings.Contains(r.body, tc.mustNot) {
				t.Fatalf("stream = %q, want an error event and no %s", r.body, tc.mustNot)
			}
			if !strings.HasSuffix(r.body, "\n\n") || tokenEvents(r.body) != 1 {
				t.Errorf("stream = %q: want whole events, the first token once", r.body)
			}
			h.waitFor("in flight released", func(st StatusReport) bool { return st.Models[0].InFlight == 0 })
			if !strings.Contains(h.metrics(), `kind="stream"`) {
				t.Errorf("/metrics: no upstream stream error counted")
			}
		})
	}
}

// tokenEvents counts the events of an SSE body that carry a token of the
// answer: OpenAI chunks with delta content, Anthropic content_block_delta.
func tokenEvents(body string) int {
	n := 0
	for line := range strings.Lines(body) {
		data, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type    string `json:"type"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		if ev.Type == "content_block_delta" || len(ev.Choices) > 0 && ev.Choices[0].Delta.Content != "" {
			n++
		}
	}
	return n
}

func TestRefusedConnectionIsRetried(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	// Scrape once at start, then not again for the test's duration.
	h := startProxy(t, "client_api_keys: ["+testKey+"]\nscrape_interval: 1h\nmodels:\n"+urlsModel(a.URL(), b.URL()))
	h.scraped()
	a.Close() // replica 0 now refuses connections, still looks healthy
	r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "r", 0, true), sessionHdr("r"))
	if r.status != 200 || !strings.Contains(r.body, "[DONE]") {
		t.Fatalf("status %d body %q, want success on the other replica", r.status, r.body)
	}
	if sum(b.Served()) != 1 {
		t.Fatalf("b served %d, want 1", sum(b.Served()))
	}
	h.waitMetrics(
		`warden_requests_total{model="qwen",reason="retried",replica="1"} 1`,
		`warden_upstream_errors_total{kind="connect",model="qwen",replica="0"} 1`,
		`warden_ejections_total{model="qwen",replica="0"} 1`,
	)
	h.waitFor("replica 0 ejected, one retried on 1, none in flight", func(st StatusReport) bool {
		m := st.Models[0]
		return m.Replicas[0].State == "ejected" && m.Replicas[1].Retried == 1 && m.InFlight == 0
	})
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	a := fakevllm.New(t, 1)
	a.Hold = make(chan struct{})
	defer close(a.Hold)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", h.url+"/v1/chat/completions", strings.NewReader(chatBody(testModel, "d", 0, true)))
	req.Header.Set("Authorization", "Bearer "+testKey)
	res, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(res.Body)
	for { // read up to the first token
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before the first token: %v", err)
		}
		if strings.Contains(line, `"`+fakevllm.Token(0)+`"`) {
			break
		}
	}
	cancel()
	res.Body.Close()
	select {
	case <-a.Canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's request was not cancelled after the client left")
	}
	h.waitFor("in flight released", func(st StatusReport) bool { return st.Models[0].InFlight == 0 })
}

func TestAllReplicasDown(t *testing.T) {
	h := startProxy(t, modelsYAML("", urlsModel(fakevllm.RefusingURL(t), fakevllm.RefusingURL(t))))
	// Before the health probes notice, a request fails over and gets 503.
	r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "x", 0, false), nil)
	if r.status != http.StatusServiceUnavailable || !isOpenAIError(r.body) {
		t.Errorf("OpenAI before probes: %d %s, want 503 in OpenAI's shape", r.status, r.body)
	}
	h.waitFor("replicas down", func(st StatusReport) bool {
		return st.Models[0].Replicas[0].State == "down" && st.Models[0].Replicas[1].State == "down"
	})
	r = h.do("POST", "/v1/chat/completions", chatBody(testModel, "x", 0, false), nil)
	if r.status != http.StatusServiceUnavailable || !isOpenAIError(r.body) {
		t.Errorf("OpenAI: %d %s, want 503 in OpenAI's shape", r.status, r.body)
	}
	r = h.do("POST", "/v1/messages", anthropicBody(testModel, "x", 0, true), nil)
	if r.status != 529 || anthropicErrorType(r.body) != "overloaded_error" {
		t.Errorf("Anthropic: %d %s, want 529 overloaded_error", r.status, r.body)
	}
}

func TestScrapeFailingRoutesOnLocalCounts(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	a.FailMetrics.Store(true)
	b.FailMetrics.Store(true)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())))
	h.waitFor("scrapes failing", func(st StatusReport) bool {
		for _, r := range st.Models[0].Replicas {
			if r.ScrapeState != "failed" || r.State != "healthy" {
				return false
			}
		}
		return true
	})
	for turn := range 4 {
		if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "f", turn, true), sessionHdr("f")); r.status != 200 {
			t.Fatalf("turn %d: %d %s", turn, r.status, r.body)
		}
	}
	onlyOne(t, []int{sum(a.Served()), sum(b.Served())}, 4)
	h.do("POST", "/v1/chat/completions", chatBody(testModel, "g", 0, false), sessionHdr("g"))
	if got := []int{sum(a.Served()), sum(b.Served())}; got[0] != 4 || got[1] != 1 {
		t.Errorf("per replica %v, want the second session on the other replica", got)
	}
}

func TestBadInputNeverReachesBackend(t *testing.T) {
	a := fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("limits: {max_body_bytes: 4KiB, max_header_bytes: 2KiB, max_session_id: 64}\n", urlsModel(a.URL())))
	long := strings.Repeat("x", 65)
	for _, tc := range []struct {
		name, path, body string
		hdr              map[string]string
		status           int
		anthropicType    string // "" for an OpenAI-shaped error
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model":`, nil, 400, ""},
		{"malformed JSON anthropic", "/v1/messages", `{"model": qwen}`, nil, 400, "invalid_request_error"},
		{"missing model", "/v1/chat/completions", `{"messages":[]}`, nil, 400, ""},
		{"wrong type", "/v1/chat/completions", `{"model":"qwen","user":7}`, nil, 400, ""},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9"}`, nil, 404, ""},
		{"unknown model anthropic", "/v1/messages", `{"model":"claude-9"}`, nil, 404, "not_found_error"},
		{"oversized body", "/v1/chat/completions", `{"model":"qwen","x":"` + strings.Repeat("a", 5000) + `"}`, nil, 413, ""},
		{"oversized body anthropic", "/v1/messages", `{"model":"qwen","x":"` + strings.Repeat("a", 5000) + `"}`, nil, 413, "request_too_large"},
		{"long session header", "/v1/chat/completions", `{"model":"qwen"}`, map[string]string{"session-id": long}, 400, ""},
		{"long prompt_cache_key", "/v1/chat/completions", `{"model":"qwen","prompt_cache_key":"` + long + `"}`, nil, 400, ""},
		{"long metadata.user_id", "/v1/messages", `{"model":"qwen","metadata":{"user_id":"` + long + `"}}`, nil, 400, "invalid_request_error"},
		{"invalid UTF-8", "/v1/chat/completions", "{\"model\":\"qwen\",\"user\":\"\xff\xfe\"}", nil, 400, ""},
		{"wrong key", "/v1/chat/completions", `{"model":"qwen"}`, map[string]string{"Authorization": "Bearer nope"}, 401, ""},
		{"no key anthropic", "/v1/messages", `{"model":"qwen"}`, map[string]string{"Authorization": ""}, 401, "authentication_error"},
		{"wrong method", "/v1/chat/completions", ``, map[string]string{"X-Method": "GET"}, 405, ""},
		{"unknown path", "/v1/embeddings", `{"model":"qwen"}`, nil, 404, ""},
		{"oversized headers", "/v1/chat/completions", `{"model":"qwen"}`, map[string]string{"X-Big": strings.Repeat("h", 3<<10)}, 431, ""},
		{"oversized headers anthropic", "/v1/messages", `{"model":"qwen"}`, map[string]string{"X-Big": strings.Repeat("h", 3<<10)}, 431, "request_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "POST"
			if tc.hdr["X-Method"] != "" {
				method = tc.hdr["X-Method"]
			}
			r := h.do(method, tc.path, tc.body, tc.hdr)
			if r.status != tc.status {
				t.Errorf("status %d, want %d (%s)", r.status, tc.status, r.body)
			}
			if tc.anthropicType != "" {
				if got := anthropicErrorType(r.body); got != tc.anthropicType {
					t.Errorf("Anthropic error type %q, want %q in %s", got, tc.anthropicType, r.body)
				}
			} else if !isOpenAIError(r.body) {
				t.Errorf("body %s is not an OpenAI error", r.body)
			}
		})
	}
	t.Run("headers over the backstop", func(t *testing.T) {
		// Over four times the limit, Go's http.Server answers itself,
		// before any handler, with a plain-text 431 (see doc.go).
		r := h.do("POST", "/v1/chat/completions", `{"model":"qwen"}`, map[string]string{"X-Big": strings.Repeat("h", 16<<10)})
		if r.status != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("status %d, want 431", r.status)
		}
	})
	if n := a.Hits.Load(); n != 0 {
		t.Errorf("the backend received %d inference requests, want 0", n)
	}
}

func TestModelsAndAuthHeaders(t *testing.T) {
	a := fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("backend_api_key: sk-backend\ntrusted_pin_header: X-Warden-Replica\n",
		urlsModel(a.URL())+"  - name: other\n    replicas: ["+a.URL()+"]\n"))
	r := h.do("GET", "/v1/models", "", nil)
	if r.status != 200 || !strings.Contains(r.body, `{"id":"other","object":"model"`) || strings.Index(r.body, `"other"`) > strings.Index(r.body, `"qwen"`) {
		t.Errorf("/v1/models = %d %s, want both models, sorted", r.status, r.body)
	}
	r = h.do("GET", "/v1/models", "", map[string]string{"anthropic-version": "2023-06-01"})
	if !strings.Contains(r.body, `"type":"model","id":"other"`) || !strings.Contains(r.body, `"has_more":false`) {
		t.Errorf("Anthropic /v1/models = %s", r.body)
	}
	h.do("POST", "/v1/messages", anthropicBody(testModel, "p", 0, false), map[string]string{"x-api-key": testKey, "Authorization": "", "X-Warden-Replica": "0"})
	hdr := a.Header()
	if hdr.Get("Authorization") != "Bearer sk-backend" || hdr.Get("x-api-key") != "" || hdr.Get("X-Warden-Replica") != "" {
		t.Errorf("backend saw Authorization %q, x-api-key %q, pin %q; want the backend key only",
			hdr.Get("Authorization"), hdr.Get("x-api-key"), hdr.Get("X-Warden-Replica"))
	}
	h.waitFor("one client-pinned request", func(st StatusReport) bool { return st.Models[1].Replicas[0].ClientPinned == 1 })
}

func TestReloadKeepsSessions(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())))
	h.scraped()
	h.do("POST", "/v1/chat/completions", chatBody(testModel, "a", 0, false), sessionHdr("a"))
	h.do("POST", "/v1/chat/completions", chatBody(testModel, "b", 0, false), sessionHdr("b"))
	cfg, err := ParseConfig("r.yaml", []byte("listen: 127.0.0.1:0\n"+modelsYAML("", urlsModel(a.URL(), b.URL())+"  - name: added\n    replicas: ["+b.URL()+"]\n")))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.srv.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	st := h.status()
	if len(st.Models) != 2 || st.Models[1].Sessions != 2 {
		t.Fatalf("after reload: %d models, %d sessions on qwen; want 2 models and the 2 sessions kept", len(st.Models), st.Models[1].Sessions)
	}
	before := []int{sum(a.Served()), sum(b.Served())}
	h.do("POST", "/v1/chat/completions", chatBody(testModel, "a", 1, false), sessionHdr("a"))
	h.do("POST", "/v1/chat/completions", chatBody(testModel, "b", 1, false), sessionHdr("b"))
	after := []int{sum(a.Served()), sum(b.Served())}
	if after[0]-before[0] != 1 || after[1]-before[1] != 1 {
		t.Errorf("after reload per replica %v -> %v: sessions did not stay home", before, after)
	}
	if st := h.status(); st.Models[1].LaterTurnsHome != 2 {
		t.Errorf("later turns at home %d, want 2", st.Models[1].LaterTurnsHome)
	}
}

func TestDrainFinishesStreams(t *testing.T) {
	a := fakevllm.New(t, 1)
	a.Hold = make(chan struct{})
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())))
	got := make(chan resp, 1)
	go func() {
		got <- h.do("POST", "/v1/chat/completions", chatBody(testModel, "d", 0, true), sessionHdr("d"))
	}()
	h.waitFor("a stream at the backend", func(StatusReport) bool { return a.Hits.Load() == 1 })
	stopped := make(chan error, 1)
	go func() { stopped <- h.stop() }()
	// Draining: the listener is closed to new connections while the stream
	// is held...
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(h.url, "http://"), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the proxy still accepts connections while draining")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// ...and the stream in progress finishes normally.
	close(a.Hold)
	r := <-got
	if r.status != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
		t.Errorf("drained stream: %d %q, want a complete stream", r.status, r.body)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Serve after drain: %v", err)
	}
}

func TestOverlongEventCutMidwayEndsBeforeTheErrorEvent(t *testing.T) {
	big := strings.Repeat("x", maxSSELine+1024)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			return // /metrics and /health
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t0\"}}]}\n\n")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\""+big)
		// The handler returns mid-event: the stream ends early.
	}))
	defer backend.Close()
	h := startProxy(t, modelsYAML("", urlsModel(backend.URL)))
	r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "o", 0, true), sessionHdr("o"))
	if r.status != 200 {
		t.Fatalf("status %d, want 200", r.status)
	}
	if !strings.Contains(r.body, "x\n\ndata: {\"error\":{") || !strings.HasSuffix(r.body, "\n\n") {
		t.Fatalf("stream ends %q, want the torn event ended before the error event", r.body[max(0, len(r.body)-200):])
	}
}

func TestDialTimeoutIsRetryable(t *testing.T) {
	_, err := (&net.Dialer{Deadline: time.Now().Add(-time.Second)}).Dial("tcp", "127.0.0.1:1")
	if err == nil {
		t.Skip("dial with a past deadline succeeded")
	}
	if !retryable(nil, err) {
		t.Errorf("retryable(%v) = false, want true: the dial reached no replica", err)
	}
	if retryable(nil, context.DeadlineExceeded) || retryable(nil, fmt.Errorf("wrapped: %w", context.Canceled)) {
		t.Error("a deadline or a cancellation is retryable, want not")
	}
}

// A 503 from a session's home before any byte is retried on another
// replica, and the session stays homed: the next turn goes home again,
// where its prefix cache still is.
func TestRetryKeepsTheSessionHome(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())))
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "k", 0, false), sessionHdr("k")); r.status != 200 {
		t.Fatalf("turn 0: %d %s", r.status, r.body)
	}
	home, other := a, b
	if sum(b.Served()) == 1 {
		home, other = b, a
	}
	home.Status.Store(http.StatusServiceUnavailable)
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "k", 1, false), sessionHdr("k")); r.status != 200 {
		t.Fatalf("turn 1 (home answers 503): %d %s, want success elsewhere", r.status, r.body)
	}
	if sum(other.Served()) != 1 {
		t.Fatalf("the other replica served %d, want the retried turn", sum(other.Served()))
	}
	home.Status.Store(0)
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "k", 2, false), sessionHdr("k")); r.status != 200 {
		t.Fatalf("turn 2: %d %s", r.status, r.body)
	}
	if got := sum(home.Served()); got != 2 {
		t.Errorf("home served %d of turns 0 and 2, want both: the retry must not move the session's home", got)
	}
}

// /v1/messages/count_tokens is no conversation turn: it neither creates
// nor refreshes a session, and counts in no turn, stayed or request series
// (it has its own counter).
func TestCountTokensIsNotATurn(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())))
	h.scraped()
	countTokens := func() {
		t.Helper()
		r := h.do("POST", "/v1/messages/count_tokens", anthropicBody(testModel, "s1", 1, false), sessionHdr("s1"))
		if r.status != 200 || !strings.Contains(r.body, "input_tokens") {
			t.Fatalf("count_tokens: %d %s", r.status, r.body)
		}
	}
	turn := func(n int) {
		t.Helper()
		if r := h.do("POST", "/v1/messages", anthropicBody(testModel, "s1", n, false), sessionHdr("s1")); r.status != 200 {
			t.Fatalf("turn %d: %d %s", n, r.status, r.body)
		}
	}
	requests := func(st StatusReport) (n int64) {
		for _, r := range st.Models[0].Replicas {
			n += r.Requests
		}
		return n
	}
	countTokens()
	h.waitMetrics(seriesCountTokens + `{model="` + testModel + `"} 1`)
	if st := h.status().Models[0]; st.Sessions != 0 || st.LaterTurns != 0 || requests(h.status()) != 0 {
		t.Fatalf("after count_tokens alone: %d sessions, %d later turns, %d requests; want none", st.Sessions, st.LaterTurns, requests(h.status()))
	}
	turn(0)
	countTokens()
	turn(1)
	countTokens()
	h.waitMetrics(seriesCountTokens + `{model="` + testModel + `"} 3`)
	st := h.waitFor("two turns counted", func(st StatusReport) bool { return requests(st) == 2 })
	m := st.Models[0]
	if m.Sessions != 1 || m.LaterTurns != 1 || m.LaterTurnsHome != 1 {
		t.Errorf("%d sessions, %d later turns (%d home); want 1 session and turn 1 alone, at home", m.Sessions, m.LaterTurns, m.LaterTurnsHome)
	}
	var sticky, fresh int64
	for _, r := range m.Replicas {
		sticky += r.Sticky
		fresh += r.New
	}
	if sticky != 1 || fresh != 1 {
		t.Errorf("%d new and %d sticky requests, want 1 and 1 (count_tokens is neither)", fresh, sticky)
	}
	if met := h.metrics(); strings.Contains(met, `reason="least-loaded",replica="0"} 1`) || strings.Contains(met, `reason="least-loaded",replica="1"} 1`) {
		t.Error("count_tokens was counted in warden_requests_total")
	}
}

// Through the proxy, with bodies recycled at once: concurrent sessions of
// 256 KB bodies, half of them answered by a backend before it reads the
// body (so the proxy's handler ends while net/http's transport still
// writes the body). Every body the backend reads is exactly the one its
// request carried.
func TestProxyBodiesNeverMix(t *testing.T) {
	var mu sync.Mutex
	var bad []string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			return
		}
		want := r.Header.Get("X-Claude-Code-Session-Id")
		check := func() {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				return // an early answer may find the rest of the body cut off: no bytes to mix
			}
			if !bytes.Contains(b, []byte(`"content":"`+want)) ||
				bytes.Count(b, []byte(want)) != bytes.Count(b, []byte("session-")) {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("session %s: the backend read a body of %d bytes that is not its own", want, len(b)))
				mu.Unlock()
			}
		}
		early := strings.HasSuffix(want, "-early")
		if !early {
			check()
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
		if early {
			w.(http.Flusher).Flush()
			check()
		}
	}))
	defer backend.Close()
	h := startProxy(t, modelsYAML("limits: {max_body_bytes: 1MiB}\n", urlsModel(backend.URL)))
	var wg sync.WaitGroup
	for s := range 8 {
		wg.Go(func() {
			id := fmt.Sprintf("session-%d", s)
			if s%2 == 1 {
				id += "-early"
			}
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"%s"}]}`,
				testModel, strings.Repeat(id+" ", (256<<10)/(len(id)+1)))
			for range 15 {
				if r := h.do("POST", "/v1/chat/completions", body, sessionHdr(id)); r.status != http.StatusOK {
					t.Errorf("%s: status %d: %s", id, r.status, r.body)
					return
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
}
