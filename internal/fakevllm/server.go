package fakevllm

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lm-warden/warden/traces"
)

// Server is a hand-written stand-in for one vLLM API server with one or
// more data-parallel engines. It speaks OpenAI (chat, completions,
// Responses) and Anthropic, streaming and not; keeps a prefix cache per
// engine (64-byte blocks of the prompt's canonical text, traces.PromptText,
// chained); serves vLLM-style /metrics, /health and /v1/models; and
// records every inference request it receives. Its fields steer its
// faults: the plain ones are set before the first request, the atomic ones
// at any time.
type Server struct {
	srv     *httptest.Server
	engines int

	// Hits counts the inference requests received (those answered Status
	// and stalled included).
	Hits atomic.Int64

	// Model is the id /v1/models answers and the model_name label of
	// /metrics (New: "fake-model").
	Model string
	// Tokens is the output tokens of every answer (New: 4).
	Tokens int
	// MaxTokens answers each request its max_tokens (or
	// max_completion_tokens, max_output_tokens) instead, as vLLM does with
	// ignore_eos; a request without one gets Tokens.
	MaxTokens bool
	// TTFT is waited before a stream's first token.
	TTFT time.Duration
	// TokenDelay is waited before every streamed token, the first
	// included.
	TokenDelay time.Duration
	// Hold, non-nil, pauses every stream after its first token until it is
	// closed.
	Hold chan struct{}
	// HoldFirst, non-nil, holds every stream before it sends anything (its
	// headers included) until it is closed.
	HoldFirst chan struct{}
	// Stall wedges every inference request as a stuck vLLM does (see
	// Stall's values) until the client leaves; /health and /metrics still
	// answer.
	Stall Stall
	// FailEvery > 0 ends every FailEvery-th inference request's stream
	// with an error event ("fake failure mid-stream") after its first
	// token, without its normal end.
	FailEvery int
	// NoModels: /v1/models answers 404.
	NoModels bool
	// MaxNumSeqs > 0 is exposed as max_num_seqs in vllm:cache_config_info.
	MaxNumSeqs int
	// GPUBlocks is num_gpu_blocks in vllm:cache_config_info: 0 gives 2400,
	// < 0 leaves the label out.
	GPUBlocks int
	// PrefillRate > 0 exposes vllm:request_prefill_time_seconds: each
	// finished request observes its computed prompt tokens (prompt minus
	// prefix-cache hits) / PrefillRate seconds, as vLLM observes a
	// request's prefill time when it finishes. Nothing is slept.
	PrefillRate float64
	// SessionHeader, if set, routes a request without
	// X-data-parallel-rank by this header: each new value goes to the
	// next engine in turn and stays there, as a farm behind a sticky
	// router would serve it. Without it, such a request goes to engine 0.
	SessionHeader string

	// FailMetrics: /metrics answers 500.
	FailMetrics atomic.Bool
	// HealthDown: /health answers 503.
	HealthDown atomic.Bool
	// Status, non-zero, answers every inference request with this status
	// and an error body ("fake failure").
	Status atomic.Int32

	// Canceled receives (without blocking, up to its capacity of 16) when
	// the context of a request that waits (a stream held or delayed, a
	// stalled request) ends.
	Canceled chan struct{}

	mu       sync.Mutex
	n        int               // inference requests past Status and Stall
	served   []int             // requests served per engine
	running  []int             // requests in progress per engine
	extra    []int             // added to running (SetLoad)
	cache    []map[uint64]bool // prefix cache per engine
	counters []Counters        // per engine
	done     []float64         // request_success_total per engine
	pfSum    []float64         // request_prefill_time_seconds sum per engine
	pfCount  []float64         // and count
	homes    map[string]int    // SessionHeader value -> engine
	received []Request         // every inference request past Status and Stall
}

// Stall is how a wedged server answers an inference request before it
// goes silent.
type Stall uint8

const (
	StallNone         Stall = iota
	StallNoHeaders          // nothing, not even headers (streamed or not)
	StallAfterHeaders       // an event stream's headers
	StallAfterToken         // an event stream's headers and first token
)

// Request is one inference request as the server received it.
type Request struct {
	Path         string
	Header       http.Header
	Body         map[string]any // nil if the body is no JSON object
	Text         string         // its canonical text (traces.PromptText)
	PromptTokens int            // len(Text)/4, at least 1
	Engine       int
}

// New serves a fake with engines data-parallel engines on 127.0.0.1 until
// the test ends.
func New(t testing.TB, engines int) *Server {
	s := &Server{
		engines:  engines,
		Model:    "fake-model",
		Tokens:   4,
		Canceled: make(chan struct{}, 16),
		served:   make([]int, engines),
		running:  make([]int, engines),
		extra:    make([]int, engines),
		counters: make([]Counters, engines),
		done:     make([]float64, engines),
		pfSum:    make([]float64, engines),
		pfCount:  make([]float64, engines),
		homes:    map[string]int{},
	}
	for range engines {
		s.cache = append(s.cache, map[uint64]bool{})
	}
	s.srv = httptest.NewServer(s)
	t.Cleanup(s.srv.Close)
	return s
}

// URL is the server's base URL.
func (s *Server) URL() string { return s.srv.URL }

// Close stops the server (its port then refuses connections) and waits
// for the requests in progress.
func (s *Server) Close() { s.srv.Close() }

// Served returns the requests served per engine.
func (s *Server) Served() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.served...)
}

// SetLoad adds running requests to an engine's vllm:num_requests_running.
func (s *Server) SetLoad(engine, running int) {
	s.mu.Lock()
	s.extra[engine] = running
	s.mu.Unlock()
}

// Requests returns every inference request received, in order (those
// answered Status and stalled left out).
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.received...)
}

// Header returns the headers of the last inference request (nil before
// any).
func (s *Server) Header() http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.received) == 0 {
		return nil
	}
	return s.received[len(s.received)-1].Header.Clone()
}

// RefusingURL returns the URL of a port of 127.0.0.1 on which nothing
// listens.
func RefusingURL(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// canceled reports a request whose context ended while it waited.
func (s *Server) canceled() {
	select {
	case s.Canceled <- struct{}{}:
	default:
	}
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		if s.HealthDown.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		return
	case "/metrics":
		if s.FailMetrics.Load() {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, s.metrics())
		return
	case "/v1/models":
		if s.NoModels {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, s.Model)
		return
	}
	s.Hits.Add(1)
	if st := s.Status.Load(); st != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(st))
		_, _ = io.WriteString(w, `{"error":{"message":"fake failure","type":"server_error"}}`)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	if s.Stall != StallNone {
		s.stall(w, r, body)
		return
	}
	s.infer(w, r, body)
}

// dialect is the API of a path.
func dialect(path string) traces.Dialect {
	switch path {
	case "/v1/messages", "/v1/messages/count_tokens":
		return traces.DialectAnthropic
	case "/v1/responses":
		return traces.DialectResponses
	}
	return traces.DialectOpenAI
}

// request is what infer reads of a body.
type request struct {
	Stream              bool `json:"stream"`
	MaxTokens           int  `json:"max_tokens"`
	MaxCompletionTokens int  `json:"max_completion_tokens"`
	MaxOutputTokens     int  `json:"max_output_tokens"`
}

// tokens is the output length of the answer to req.
func (s *Server) tokens(req request) int {
	if s.MaxTokens {
		for _, n := range []int{req.MaxCompletionTokens, req.MaxTokens, req.MaxOutputTokens} {
			if n > 0 {
				return n
			}
		}
	}
	return s.Tokens
}

// engine is the engine that serves r, or -1 for a rank out of range.
// Called with s.mu held.
func (s *Server) engine(r *http.Request) int {
	if v := r.Header.Get("X-data-parallel-rank"); v != "" {
		e, _ := strconv.Atoi(v)
		if e < 0 || e >= s.engines {
			return -1
		}
		return e
	}
	if s.SessionHeader == "" {
		return 0
	}
	sess := r.Header.Get(s.SessionHeader)
	e, ok := s.homes[sess]
	if !ok {
		e = len(s.homes) % s.engines
		s.homes[sess] = e
	}
	return e
}

// infer answers one inference request.
func (s *Server) infer(w http.ResponseWriter, r *http.Request, body []byte) {
	d := dialect(r.URL.Path)
	text := traces.PromptText(body, d)
	prompt := max(1, len(text)/4)
	var req request
	_ = json.Unmarshal(body, &req)
	tokens := s.tokens(req)
	var fields map[string]any
	_ = json.Unmarshal(body, &fields)
	countOnly := r.URL.Path == "/v1/messages/count_tokens"

	s.mu.Lock()
	engine := s.engine(r)
	if engine < 0 {
		s.mu.Unlock()
		http.Error(w, "bad rank", http.StatusBadRequest)
		return
	}
	s.n++
	n := s.n
	s.received = append(s.received, Request{Path: r.URL.Path, Header: r.Header.Clone(), Body: fields,
		Text: string(text), PromptTokens: prompt, Engine: engine})
	s.served[engine]++
	s.running[engine]++
	hit := s.lookup(engine, text)
	if !countOnly {
		s.counters[engine].Prompt += float64(prompt)
		s.counters[engine].Gen += float64(tokens) // counted up front: the proxy reads them only once the answer ended
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running[engine]--
		if s.PrefillRate > 0 && !countOnly {
			s.pfSum[engine] += float64(max(prompt-hit, 0)) / s.PrefillRate
			s.pfCount[engine]++
		}
		s.mu.Unlock()
	}()
	anthropic := d == traces.DialectAnthropic
	switch {
	case countOnly:
		fmt.Fprintf(w, `{"input_tokens":%d}`, prompt)
	case !req.Stream:
		w.Header().Set("Content-Type", "application/json")
		if anthropic {
			fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":%d,"output_tokens":%d}}`, prompt, tokens)
		} else {
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, tokens, hit)
		}
		s.finished(engine)
	default:
		if s.stream(w, r, anthropic, answer{prompt: prompt, tokens: tokens, cached: hit, fail: s.FailEvery > 0 && n%s.FailEvery == 0}) {
			s.finished(engine)
		}
	}
}

// finished counts a request answered to its end.
func (s *Server) finished(engine int) {
	s.mu.Lock()
	s.done[engine]++
	s.mu.Unlock()
}

// opening is the events a stream opens with, as vLLM sends them with its
// first output: the role chunk; message_start and content_block_start.
func opening(anthropic bool, prompt int) string {
	if anthropic {
		return fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", prompt) +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
	}
	return "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
}

// tokenEvent is the event of a stream's i-th token.
func tokenEvent(anthropic bool, i int) string {
	if anthropic {
		return fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":%q}}\n\n", Token(i))
	}
	return fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", Token(i))
}

// stall answers as s.Stall says, then nothing until the client leaves
// (Canceled is told). The request reaches no engine.
func (s *Server) stall(w http.ResponseWriter, r *http.Request, body []byte) {
	if s.Stall != StallNoHeaders {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		if s.Stall == StallAfterToken {
			d := dialect(r.URL.Path)
			anthropic := d == traces.DialectAnthropic
			_, _ = io.WriteString(w, opening(anthropic, max(1, len(traces.PromptText(body, d))/4))+tokenEvent(anthropic, 0))
		}
		_ = http.NewResponseController(w).Flush()
	}
	<-r.Context().Done()
	s.canceled()
}

// Token is the text of a stream's i-th output token: "t000", "t001", ...
// (i modulo 1000), four bytes, one token of canonical text as
// traces.TextTokens counts it, so that a client that sends the answer back
// in its next turn (bench) sends the prompt it meant to.
func Token(i int) string { return fmt.Sprintf("t%03d", i%1000) }

// answer is what a stream tells.
type answer struct {
	prompt, tokens, cached int
	fail                   bool // an error event after the first token
}

// wait waits d, or until the request's context ends (false).
func (s *Server) wait(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.Context().Done():
		s.canceled()
		return false
	case <-t.C:
		return true
	}
}

// await waits until ch is closed, or until the request's context ends
// (false).
func (s *Server) await(r *http.Request, ch chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	case <-r.Context().Done():
		s.canceled()
		return false
	}
}

// stream answers a streaming request in vLLM's SSE shapes; it reports
// whether the stream reached its normal end.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, anthropic bool, a answer) bool {
	if !s.await(r, s.HoldFirst) {
		return false
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(s string) bool {
		if _, err := io.WriteString(w, s); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	_ = rc.Flush() // the headers at once, as Starlette's StreamingResponse sends them
	if !s.wait(r, s.TTFT) {
		return false
	}
	for i := range a.tokens {
		if !s.wait(r, s.TokenDelay) {
			return false
		}
		if i == 0 {
			send(opening(anthropic, a.prompt))
		}
		if !send(tokenEvent(anthropic, i)) {
			return false
		}
		if i > 0 {
			continue
		}
		if a.fail {
			if anthropic {
				send("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"fake failure mid-stream\"}}\n\n")
			} else {
				send("data: {\"error\":{\"message\":\"fake failure mid-stream\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n")
			}
			return false
		}
		if !s.await(r, s.Hold) {
			return false
		}
	}
	if anthropic {
		send("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
		send(fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":%d}}\n\n", a.tokens))
		send("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	} else {
		send(fmt.Sprintf("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", a.prompt, a.tokens, a.cached))
		send("data: [DONE]\n\n")
	}
	return true
}
