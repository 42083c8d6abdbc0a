package live

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
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
	a := fakevllm.New(t, 1)
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
	if n := a.Hits.Load(); n != 2 {
		t.Errorf("the backend received %d inference requests, want only the 2 valid ones", n)
	}
}

// TestInvalidUTF8Refused: a body that is not UTF-8 is refused with 400 in
// the client's shape, wherever the bad byte is, and before any syntax
// error it has; raw UTF-8 passes.
func TestInvalidUTF8Refused(t *testing.T) {
	a := fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())))
	long := strings.Repeat("x", 100)
	for _, body := range []string{
		"{\"model\":\"qwen\",\"user\":\"\xff\"}",
		"{\"model\":\"qwen\",\"user\":\"" + long + "\xc3\"}",
		"{\"model\":\"qwen\",\"user\":\"" + long + "\xed\xa0\x80" + long + "\"}", // a surrogate
		"{\"model\":\"qwen\",\"k\xff\":1}",
		"{\"model\":\"qwen\",\"user\":\"\xff\"", // and malformed
		"{\"model\":\"qwen\"}\xff",              // outside the object
	} {
		for _, c := range apiCases {
			t.Run(c.name+"/"+fmt.Sprintf("%.40q", body), func(t *testing.T) {
				r := h.do("POST", c.path, body, c.headers(nil))
				checkAPIError(t, c.api, r, 400, "invalid_request_error", "invalid_request")
				if _, _, msg, _ := apiError(c.api, r.body); !strings.Contains(msg, "UTF-8") {
					t.Errorf("message %q does not say the body is not UTF-8", msg)
				}
			})
		}
	}
	for _, body := range []string{`{"model":"qwen","user":"é"}`, `{"model":"qwen","user":"` + long + `日本` + long + `"}`} {
		if r := h.do("POST", "/v1/chat/completions", body, nil); r.status != 200 {
			t.Errorf("%.40q: status %d %s, want 200", body, r.status, r.body)
		}
	}
	if n := a.Hits.Load(); n != 2 {
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

// TestWrongMethodAndUnknownPath: a known API path with the wrong method is
// 405 with Allow; an unknown path is 404 with a not-found code (not
// model_not_found); both in the client's shape (issue 13, item 9).
func TestWrongMethodAndUnknownPath(t *testing.T) {
	a := fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())))
	for _, c := range apiCases {
		for _, method := range []string{"GET", "PUT", "DELETE", "PATCH", "OPTIONS"} {
			t.Run(c.name+"/"+method, func(t *testing.T) {
				r := h.do(method, c.path, "", c.headers(nil))
				checkAPIError(t, c.api, r, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed")
				if got := r.header.Get("Allow"); got != "POST" {
					t.Errorf("Allow %q, want POST", got)
				}
			})
		}
		t.Run(c.name+"/models POST", func(t *testing.T) {
			r := h.do("POST", "/v1/models", `{}`, c.headers(nil))
			checkAPIError(t, c.api, r, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed")
			if got := r.header.Get("Allow"); got != "GET, HEAD" {
				t.Errorf("Allow %q, want GET, HEAD", got)
			}
		})
		for _, path := range []string{"/v1/embeddings", "/v2/chat/completions", "/", "/v1/chat/completions/", "/v1/messages/batches"} {
			t.Run(c.name+"/unknown "+path, func(t *testing.T) {
				r := h.do("POST", path, `{"model":"qwen"}`, c.headers(nil))
				api := c.api
				if api == APIResponses {
					api = APIOpenAI // an unknown path has no dialect of its own: OpenAI's shape
				}
				checkAPIError(t, api, r, http.StatusNotFound, "not_found_error", "not_found")
			})
		}
	}
	if n := a.Hits.Load(); n != 0 {
		t.Errorf("the backend received %d inference requests, want 0", n)
	}
}

// TestContentType: a POST body is JSON when its Content-Type is
// application/json (any parameters, any case), application/<x>+json, or
// absent (what FastAPI, which vLLM runs on, reads as JSON too); anything
// else is 415 in the client's shape (issue 13, item 9).
func TestContentType(t *testing.T) {
	a := fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())))
	body := `{"model":"qwen","messages":[{"role":"user","content":"hi"}],"input":"hi","max_tokens":4}`
	for _, tc := range []struct {
		ct     string // "" deletes the header
		status int
	}{
		{"application/json", 200},
		{"application/json; charset=utf-8", 200},
		{"Application/JSON;charset=UTF-8", 200},
		{"application/vnd.api+json", 200},
		{"", 200},
		{"text/plain", 415},
		{"application/x-www-form-urlencoded", 415},
		{"multipart/form-data; boundary=x", 415},
		{"application/jsonx", 415},
		{"application/json;;", 415},
		{"json", 415},
	} {
		for _, c := range apiCases {
			t.Run(c.name+"/"+tc.ct, func(t *testing.T) {
				r := h.do("POST", c.path, body, c.headers(map[string]string{"Content-Type": tc.ct}))
				if tc.status == 200 {
					if r.status != 200 {
						t.Errorf("status %d %s, want 200", r.status, r.body)
					}
					return
				}
				checkAPIError(t, c.api, r, http.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_media_type")
			})
		}
	}
}

// rawRequest sends a request whose body is shorter than its declared
// Content-Length on a raw connection; with closeWrite the client then
// half-closes, else it waits for the proxy's read timeout. It returns the
// answer's status line, body and the connection's two addresses.
func rawRequest(t *testing.T, addr, path string, hdr map[string]string, closeWrite bool) (string, string, []string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	var extra strings.Builder
	for k, v := range hdr {
		fmt.Fprintf(&extra, "%s: %s\r\n", k, v)
	}
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n%sContent-Length: 1000\r\n\r\n{\"model\":\"qwen\"", path, testKey, extra.String())
	if closeWrite {
		_ = conn.(*net.TCPConn).CloseWrite()
	}
	b, _ := io.ReadAll(conn)
	out := string(b)
	status, _, _ := strings.Cut(out, "\r\n")
	_, body, _ := strings.Cut(out, "\r\n\r\n")
	local, remote := conn.LocalAddr().(*net.TCPAddr), conn.RemoteAddr().(*net.TCPAddr)
	return status, body, []string{"127.0.0.1", fmt.Sprint(local.Port), fmt.Sprint(remote.Port), local.String(), remote.String()}
}

// TestShortBodyNamesNoAddress: a body shorter than its Content-Length,
// whether the client half-closes or stalls until timeouts.read, gets an
// error in its shape that names no socket address (issue 13, item 9).
func TestShortBodyNamesNoAddress(t *testing.T) {
	a := fakevllm.New(t, 1)
	h := startProxy(t, "client_api_keys: ["+testKey+"]\nscrape_interval: 50ms\ntimeouts: {read: 300ms, drain: 5s, health: 1s}\nmodels:\n"+urlsModel(a.URL()))
	addr := strings.TrimPrefix(h.url, "http://")
	for _, c := range apiCases {
		for _, tc := range []struct {
			name       string
			closeWrite bool
			status     string
		}{
			{"client half-closes", true, "HTTP/1.1 400"},
			{"client stalls past timeouts.read", false, "HTTP/1.1 408"},
		} {
			t.Run(c.name+"/"+tc.name, func(t *testing.T) {
				status, body, addrs := rawRequest(t, addr, c.path, c.hdr, tc.closeWrite)
				if !strings.HasPrefix(status, tc.status) {
					t.Errorf("status line %q, want %s (body %s)", status, tc.status, body)
				}
				if _, _, _, ok := apiError(c.api, body); !ok {
					t.Errorf("body %q is not an error in the %s shape", body, c.api)
				}
				for _, s := range addrs {
					if strings.Contains(body, s) {
						t.Errorf("body %q names the socket address part %q", body, s)
					}
				}
			})
		}
	}
	if n := a.Hits.Load(); n != 0 {
		t.Errorf("the backend received %d inference requests, want 0", n)
	}
}

// resettingURL returns the URL of a listener that accepts connections and
// closes them at once (a backend behind a relay that is not up yet, a
// crashed process whose port a supervisor holds).
func resettingURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // RST, not FIN
			}
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return "http://" + ln.Addr().String()
}

// unavailableURL returns the URL of a server that answers everything,
// /health included, with 503 (vLLM while its engine is dead).
func unavailableURL(t *testing.T) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, `{"error":"engine dead"}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// slowDownURL returns the URL of a server whose /health takes a while to
// answer 503 (longer than the proxy's probe timeout in these tests) and
// whose inference requests get a dropped connection (reset) or a 503 of
// its own: what a replica still starting behind a relay looks like. Until
// its probe has answered, the proxy knows nothing of its health.
func slowDownURL(t *testing.T, mode string) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/health":
			select {
			case <-r.Context().Done():
			case <-time.After(300 * time.Millisecond):
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/metrics":
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			if mode == "reset" {
				panic(http.ErrAbortHandler) // the server drops the connection
			}
			http.Error(w, `{"error":"engine starting"}`, http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// TestStartAnswersLikeLater: in the first milliseconds after start, before
// any probe has said a replica is healthy, a request gets the answer the
// proxy gives later when no replica can take it: 503 (OpenAI shapes) or
// 529 overloaded_error (Anthropic), in the client's shape, never 502 or a
// backend's own 503 (issue 13, item 9).
func TestStartAnswersLikeLater(t *testing.T) {
	for _, tc := range []struct {
		name string
		urls func(t *testing.T) []string
	}{
		{"connections reset", func(t *testing.T) []string { return []string{resettingURL(t), resettingURL(t)} }},
		{"everything 503", func(t *testing.T) []string { return []string{unavailableURL(t), unavailableURL(t)} }},
		{"slow health, connections reset", func(t *testing.T) []string { return []string{slowDownURL(t, "reset"), slowDownURL(t, "reset")} }},
		{"slow health, everything 503", func(t *testing.T) []string { return []string{slowDownURL(t, "503"), slowDownURL(t, "503")} }},
		{"connections refused", func(t *testing.T) []string { return []string{fakevllm.RefusingURL(t), fakevllm.RefusingURL(t)} }},
		{"one reset one refused", func(t *testing.T) []string { return []string{resettingURL(t), fakevllm.RefusingURL(t)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startProxy(t, modelsYAML("", urlsModel(tc.urls(t)...)))
			check := func(when string) {
				for _, c := range apiCases {
					body := `{"model":"qwen","messages":[{"role":"user","content":"hi"}],"input":"hi","max_tokens":4}`
					r := h.do("POST", c.path, body, c.headers(nil))
					status := http.StatusServiceUnavailable
					if c.api == APIAnthropic {
						status = 529
					}
					t.Run(when+"/"+c.name, func(t *testing.T) {
						checkAPIError(t, c.api, r, status, "overloaded_error", "service_unavailable")
					})
				}
			}
			check("at start") // sent at once: Serve has just been started
			h.waitFor("replicas down", func(st StatusReport) bool {
				for _, r := range st.Models[0].Replicas {
					if r.State != "down" {
						return false
					}
				}
				return true
			})
			check("later")
		})
	}
}

func TestJSONContentTypes(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   bool
	}{
		{nil, true}, {[]string{""}, true}, {[]string{"application/json"}, true}, {[]string{"Application/JSON"}, true},
		{[]string{"application/json; charset=utf-8"}, true}, {[]string{"application/vnd.api+json"}, true},
		{[]string{"text/plain"}, false}, {[]string{"application/json", "application/json"}, false},
		{[]string{"application/jsonx"}, false}, {[]string{"application/json;"}, true}, {[]string{" application/json"}, true},
	} {
		if got := isJSONContentType(tc.values); got != tc.want {
			t.Errorf("isJSONContentType(%q) = %v, want %v", tc.values, got, tc.want)
		}
	}
}
