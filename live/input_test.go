package live

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Hostile and odd input (issue 13, items 7 to 9): each answer is checked in
// the client's API shape. apiCase is one of the three dialects.
type apiCase struct {
	name string
	path string
	api  API
	hdr  map[string]string // extra headers the dialect's clients send
}

var apiCases = []apiCase{
	{"openai", "/v1/chat/completions", APIOpenAI, nil},
	{"responses", "/v1/responses", APIResponses, nil},
	{"anthropic", "/v1/messages", APIAnthropic, map[string]string{"anthropic-version": "2023-06-01"}},
}

func (c apiCase) headers(extra map[string]string) map[string]string {
	h := map[string]string{}
	for k, v := range c.hdr {
		h[k] = v
	}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

// apiError decodes an error body in a's shape: its status-independent type
// and code (Anthropic has no code: ""), or ok false when body is not one.
func apiError(a API, body string) (typ, code, msg string, ok bool) {
	if a == APIAnthropic {
		var v anthropicError
		if json.Unmarshal([]byte(body), &v) != nil || v.Type != "error" || v.Error.Type == "" || v.Error.Message == "" {
			return "", "", "", false
		}
		return v.Error.Type, "", v.Error.Message, true
	}
	var v openAIError
	if json.Unmarshal([]byte(body), &v) != nil || v.Error.Type == "" || v.Error.Message == "" {
		return "", "", "", false
	}
	return v.Error.Type, v.Error.Code, v.Error.Message, true
}

// checkAPIError fails unless r is an error of status in a's shape with the
// given Anthropic type and OpenAI code ("" for any).
func checkAPIError(t *testing.T, a API, r resp, status int, anthropicType, openAICode string) {
	t.Helper()
	typ, code, _, ok := apiError(a, r.body)
	switch {
	case r.status != status:
		t.Errorf("status %d, want %d (body %s)", r.status, status, r.body)
	case !ok:
		t.Errorf("body %s is not an error in the %s shape", r.body, a)
	case a == APIAnthropic && anthropicType != "" && typ != anthropicType:
		t.Errorf("Anthropic error type %q, want %q (body %s)", typ, anthropicType, r.body)
	case a != APIAnthropic && openAICode != "" && code != openAICode:
		t.Errorf("OpenAI error code %q, want %q (body %s)", code, openAICode, r.body)
	}
}

// TestDuplicateKeysRefused: a key the proxy reads, given twice (the second
// time spelled with escapes, as encoding/json and Python decode it to the
// same name), is refused with 400 in the client's shape before any backend
// sees it: the proxy would route by one value while vLLM reads the other
// (issue 13, item 7).
func TestDuplicateKeysRefused(t *testing.T) {
	a := newFakeVLLM(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())+"  - name: other\n    replicas: ["+a.URL()+"]\n"))
	for _, body := range []string{
		`{"model":"qwen","mod\u0065l":"other"}`,
		`{"mod\u0065l":"qwen","model":"other"}`,
		`{"model":"qwen","\u006dodel":"other"}`,
		`{"model":"qwen","model":"other"}`,
		`{"model":"qwen","user":"a","us\u0065r":"b"}`,
		`{"model":"qwen","prompt_cache_key":"a","prompt\u005fcache_key":"b"}`,
		`{"model":"qwen","metadata":{"user_id":"a"},"m\u0065tadata":{"user_id":"b"}}`,
		`{"model":"qwen","metadata":{"user_id":"a","user\u005fid":"b"}}`,
		`{"model":"qwen","stream":false,"str\u0065am":true}`,
		`{"model":"qwen","messages":[],"m\u0065ssages":[{"role":"user","content":"b"}]}`,
		`{"model":"qwen","system":"a","syst\u0065m":"b"}`,
		`{"model":"qwen","input":"a","inp\u0075t":"b"}`,
		`{"model":"qwen","instructions":"a","instruction\u0073":"b"}`,
		`{"model":"qwen","prompt":"a","prompt":"b"}`,
	} {
		for _, c := range apiCases {
			t.Run(c.name+"/"+body, func(t *testing.T) {
				r := h.do("POST", c.path, body, c.headers(nil))
				checkAPIError(t, c.api, r, 400, "invalid_request_error", "invalid_request")
				if _, _, msg, _ := apiError(c.api, r.body); !strings.Contains(msg, "duplicate") {
					t.Errorf("message %q does not say the key is duplicated", msg)
				}
			})
		}
	}
	// Keys the proxy does not read may repeat (vLLM reads the last one; the
	// proxy has no view to disagree with), and an escaped key is still read.
	for _, body := range []string{
		`{"model":"qwen","max_tokens":1,"max_tok\u0065ns":2}`,
		`{"mod\u0065l":"qwen","metadata":{"x":1,"x":2}}`,
	} {
		if r := h.do("POST", "/v1/chat/completions", body, nil); r.status != 200 {
			t.Errorf("%s: status %d %s, want 200", body, r.status, r.body)
		}
	}
	if n := a.hits.Load(); n != 2 {
		t.Errorf("the backend received %d inference requests, want only the 2 valid ones", n)
	}
}

// gateBackend answers every inference request only once total requests
// have arrived across all the gateBackends sharing its counter, so that
// they are all in flight together; it counts the requests it got.
type gateBackend struct {
	srv     *httptest.Server
	got     atomic.Int64
	arrived *atomic.Int64
	total   int64
	open    chan struct{} // closed when arrived reaches total
	once    *sync.Once
}

func newGateBackends(t *testing.T, n int, total int64) []*gateBackend {
	arrived, open, once := new(atomic.Int64), make(chan struct{}), new(sync.Once)
	var out []*gateBackend
	for range n {
		g := &gateBackend{arrived: arrived, total: total, open: open, once: once}
		g.srv = httptest.NewServer(g)
		t.Cleanup(g.srv.Close)
		out = append(out, g)
	}
	t.Cleanup(func() { once.Do(func() { close(open) }) })
	return out
}

func (g *gateBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/metrics":
		_, _ = io.WriteString(w, "vllm:num_requests_running{engine=\"0\"} 0\n")
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	g.got.Add(1)
	if g.arrived.Add(1) >= g.total {
		g.once.Do(func() { close(g.open) })
	}
	select {
	case <-g.open:
	case <-r.Context().Done():
		return
	case <-time.After(10 * time.Second): // the test fails on the counts
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","usage":{"prompt_tokens":1,"completion_tokens":1,"input_tokens":1,"output_tokens":1}}`)
}

// TestNoSessionIDIsNoSession: bodies with no session id, no system prompt
// and no user message have nothing to tell their conversations apart; the
// fallback hash of "" would pile them all on one replica. They get no
// session: each is placed as new (least loaded), so 20 of them in flight
// together spread over the replicas (issue 13, item 8).
func TestNoSessionIDIsNoSession(t *testing.T) {
	bodies := map[API]string{
		APIOpenAI:    `{"model":"qwen","messages":[{"role":"assistant","content":"earlier answer"}]}`,
		APIResponses: `{"model":"qwen","input":[{"role":"assistant","content":"earlier answer"}]}`,
		APIAnthropic: `{"model":"qwen","max_tokens":8,"messages":[]}`,
	}
	for _, c := range apiCases {
		t.Run(c.name, func(t *testing.T) {
			const n = 20
			gates := newGateBackends(t, 4, n)
			var urls []string
			for _, g := range gates {
				urls = append(urls, g.srv.URL)
			}
			h := startProxy(t, modelsYAML("", urlsModel(urls...)))
			h.scraped()
			var results []<-chan resp
			for range n {
				results = append(results, h.doAsync(c.path, bodies[c.api], c.hdr))
			}
			for _, ch := range results {
				if r := <-ch; r.status != 200 {
					t.Errorf("status %d %s, want 200", r.status, r.body)
				}
			}
			var counts []int
			for _, g := range gates {
				counts = append(counts, int(g.got.Load()))
			}
			for i, got := range counts {
				if got == 0 {
					t.Errorf("requests per replica %v: replica %d got none; 20 requests without a session must spread by load", counts, i)
					break
				}
			}
		})
	}
}
