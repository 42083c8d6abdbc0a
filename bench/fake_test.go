package bench

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeServer is a hand-written OpenAI/Anthropic streaming server standing in
// for a vLLM farm of one or more engines. It computes each request's
// canonical text independently of bench (from the JSON body), keeps a prefix
// cache per engine (chained 64-byte blocks), exposes vLLM-style /metrics and
// records what it received. It stays beside the emulator (emulated, in
// e2e_test.go) for what the emulator cannot do: record each request as
// sent, fail every n-th stream with an error event after its first token,
// answer every request with one status, or lack /v1/models.
type fakeServer struct {
	srv     *httptest.Server
	engines int

	ttft       time.Duration // before the first token
	tokenDelay time.Duration // between tokens
	failEvery  int           // > 0: every failEvery-th request dies with an error event after its first token
	status     int           // != 0: answer every inference request with this status
	noModels   bool          // /v1/models answers 404

	mu       sync.Mutex
	n        int                 // inference requests received
	cache    []map[uint64]bool   // per engine
	queries  []float64           // per engine
	hits     []float64           // per engine
	running  []int               // per engine
	done     []float64           // per engine
	homes    map[string]int      // session header -> engine (sticky routing)
	received []receivedRequest   // every inference request
	bySess   map[string][]string // session header -> canonical texts, in order
}

type receivedRequest struct {
	Header       http.Header
	Body         map[string]any
	PromptTokens int
	Engine       int
}

func newFakeServer(t testing.TB, engines int) *fakeServer {
	f := &fakeServer{engines: engines, homes: map[string]int{}, bySess: map[string][]string{}}
	for range engines {
		f.cache = append(f.cache, map[uint64]bool{})
	}
	f.queries = make([]float64, engines)
	f.hits = make([]float64, engines)
	f.running = make([]int, engines)
	f.done = make([]float64, engines)
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeServer) URL() string { return f.srv.URL }

func (f *fakeServer) requests() []receivedRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]receivedRequest(nil), f.received...)
}

// canonical builds a request's canonical text the way live/journal.go does:
// the system prompt (Anthropic's field, or OpenAI's system message with its
// role marker), then "\x00role\x00" + text per message.
func canonical(body map[string]any) string {
	var b strings.Builder
	if s, ok := body["system"].(string); ok {
		b.WriteString(s)
	}
	msgs, _ := body["messages"].([]any)
	for _, m := range msgs {
		mm, _ := m.(map[string]any)
		role, _ := mm["role"].(string)
		text, _ := mm["content"].(string)
		b.WriteString("\x00" + role + "\x00" + text)
	}
	return b.String()
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/v1/models":
		if f.noModels {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
		return
	case "/metrics":
		io.WriteString(w, f.metrics())
		return
	case "/v1/chat/completions", "/v1/messages":
	default:
		http.NotFound(w, r)
		return
	}
	anthropic := r.URL.Path == "/v1/messages"
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, `{"error":{"message":"bad json","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	text := canonical(body)
	prompt := len(text) / 4
	maxTokens := int(body["max_tokens"].(float64))
	sess := r.Header.Get(HeaderSessionID)

	f.mu.Lock()
	f.n++
	n := f.n
	e, ok := f.homes[sess]
	if !ok {
		e = len(f.homes) % f.engines
		f.homes[sess] = e
	}
	cached := f.lookup(e, text)
	f.running[e]++
	f.received = append(f.received, receivedRequest{Header: r.Header.Clone(), Body: body, PromptTokens: prompt, Engine: e})
	f.bySess[sess] = append(f.bySess[sess], text)
	status := f.status
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running[e]--
		f.mu.Unlock()
	}()
	if status != 0 {
		w.WriteHeader(status)
		io.WriteString(w, `{"error":{"message":"fake overload","type":"server_error"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(event, data string) bool {
		if event != "" {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	pause := func(d time.Duration) bool {
		if d <= 0 {
			return r.Context().Err() == nil
		}
		select {
		case <-r.Context().Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	if anthropic {
		send("message_start", fmt.Sprintf(`{"type":"message_start","message":{"usage":{"input_tokens":%d,"output_tokens":1}}}`, prompt))
	} else {
		send("", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
	}
	if !pause(f.ttft) {
		return
	}
	for i := range maxTokens {
		if i > 0 && !pause(f.tokenDelay) {
			return
		}
		tok := " ans"
		if anthropic {
			send("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, tok))
		} else {
			send("", fmt.Sprintf(`{"choices":[{"index":0,"delta":{"content":%q}}]}`, tok))
		}
		if i == 0 && f.failEvery > 0 && n%f.failEvery == 0 {
			if anthropic {
				send("error", `{"type":"error","error":{"type":"overloaded_error","message":"fake failure mid-stream"}}`)
			} else {
				send("", `{"error":{"message":"fake failure mid-stream","type":"server_error","param":null,"code":null}}`)
			}
			return
		}
	}
	f.mu.Lock()
	f.done[e]++
	f.mu.Unlock()
	if anthropic {
		send("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":%d}}`, maxTokens))
		send("message_stop", `{"type":"message_stop"}`)
	} else {
		send("", fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, maxTokens, cached))
		send("", "[DONE]")
	}
}

// lookup walks engine e's cache along the text's chained 64-byte blocks,
// counts queries and hits in tokens and caches every full block. f.mu held.
func (f *fakeServer) lookup(e int, text string) int {
	var prev uint64
	hit, missed := 0, false
	for lo := 0; lo+64 <= len(text); lo += 64 {
		h := sha256.New()
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], prev)
		h.Write(b[:])
		h.Write([]byte(text[lo : lo+64]))
		prev = binary.LittleEndian.Uint64(h.Sum(nil))
		if !missed && f.cache[e][prev] {
			hit += 16
		} else {
			missed = true
		}
		f.cache[e][prev] = true
	}
	f.queries[e] += float64(len(text) / 4)
	f.hits[e] += float64(hit)
	return hit
}

func (f *fakeServer) metrics() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	series := func(name, typ string, v func(e int) float64) {
		fmt.Fprintf(&b, "# HELP %s fake\n# TYPE %s %s\n", name, name, typ)
		for e := range f.engines {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=\"fake-model\"} %g\n", name, e, v(e))
		}
	}
	series("vllm:num_requests_running", "gauge", func(e int) float64 { return float64(f.running[e]) })
	series("vllm:num_requests_waiting", "gauge", func(int) float64 { return 0 })
	series("vllm:kv_cache_usage_perc", "gauge", func(e int) float64 { return float64(len(f.cache[e])) / 1e4 })
	series("vllm:prefix_cache_queries_total", "counter", func(e int) float64 { return f.queries[e] })
	series("vllm:prefix_cache_hits_total", "counter", func(e int) float64 { return f.hits[e] })
	series("vllm:prefix_cache_hits_created", "gauge", func(int) float64 { return 1.7e9 })
	series("vllm:num_preemptions_total", "counter", func(int) float64 { return 0 })
	fmt.Fprintf(&b, "# HELP vllm:request_success_total fake\n# TYPE vllm:request_success_total counter\n")
	for e := range f.engines {
		fmt.Fprintf(&b, "vllm:request_success_total{engine=\"%d\",finished_reason=\"length\",model_name=\"fake-model\"} %g\n", e, f.done[e])
	}
	return b.String()
}
