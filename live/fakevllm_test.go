package live

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeVLLM is a hand-written stand-in for one vLLM API server with one or
// more data-parallel engines. It speaks OpenAI and Anthropic (streaming and
// not), keeps a prefix cache per engine (64-byte blocks of the prompt's
// canonical text, chained), and serves vLLM-style /metrics and /health.
// Its behaviour is steered by exported-style fields set before use.
type fakeVLLM struct {
	srv     *httptest.Server
	engines int

	hits atomic.Int64 // inference requests received

	// Behaviour.
	tokens      int           // output tokens per answer (default 4)
	tokenDelay  time.Duration // between streamed tokens
	hold        chan struct{} // non-nil: streams pause after the first token until closed
	dieMidway   atomic.Bool   // abort the connection after the first token
	failMetrics atomic.Bool   // /metrics answers 500
	status      atomic.Int32  // non-zero: answer inference requests with this status
	maxNumSeqs  int           // exposed in vllm:cache_config_info if > 0
	gpuBlocks   int           // num_gpu_blocks in vllm:cache_config_info; 0: 2400, < 0: label absent
	// prefillRate, if > 0, exposes vllm:request_prefill_time_seconds: each
	// finished request observes its computed prompt tokens (prompt minus
	// prefix-cache hits) / prefillRate seconds, as vLLM observes a
	// request's prefill time when it finishes. (Nothing is slept.)
	prefillRate float64
	holdFirst   chan struct{} // non-nil: streams send nothing (not even headers) until closed
	healthDown  atomic.Bool   // /health answers 503

	canceled chan struct{} // receives when a streaming request's context is cancelled

	mu       sync.Mutex
	byEngine []int             // requests served per engine
	running  []int             // requests in progress per engine
	cache    []map[uint64]bool // prefix cache per engine
	queries  []float64         // prefix_cache_queries_total per engine
	cached   []float64         // prefix_cache_hits_total per engine
	prompts  []float64         // prompt_tokens_total per engine
	gens     []float64         // generation_tokens_total per engine
	pfSum    []float64         // request_prefill_time_seconds sum per engine
	pfCount  []float64         // and count
	lastHdr  http.Header
	extra    []int // added to running (to fake load)
}

func newFakeVLLM(t testing.TB, engines int) *fakeVLLM {
	f := &fakeVLLM{
		engines:  engines,
		tokens:   4,
		canceled: make(chan struct{}, 16),
		byEngine: make([]int, engines),
		running:  make([]int, engines),
		queries:  make([]float64, engines),
		cached:   make([]float64, engines),
		prompts:  make([]float64, engines),
		gens:     make([]float64, engines),
		pfSum:    make([]float64, engines),
		pfCount:  make([]float64, engines),
		extra:    make([]int, engines),
	}
	for range engines {
		f.cache = append(f.cache, map[uint64]bool{})
	}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVLLM) URL() string { return f.srv.URL }

// served returns the requests served per engine.
func (f *fakeVLLM) served() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.byEngine...)
}

func (f *fakeVLLM) setLoad(engine, running int) {
	f.mu.Lock()
	f.extra[engine] = running
	f.mu.Unlock()
}

func (f *fakeVLLM) header() http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastHdr.Clone()
}

func (f *fakeVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		if f.healthDown.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	case "/metrics":
		if f.failMetrics.Load() {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, f.metrics())
		return
	}
	f.hits.Add(1)
	if st := f.status.Load(); st != 0 {
		http.Error(w, `{"error":"fake failure"}`, int(st))
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	engine := 0
	if v := r.Header.Get("X-data-parallel-rank"); v != "" {
		engine, _ = strconv.Atoi(v)
	}
	if engine < 0 || engine >= f.engines {
		http.Error(w, "bad rank", http.StatusBadRequest)
		return
	}
	api := APIOpenAI
	switch r.URL.Path {
	case "/v1/messages", "/v1/messages/count_tokens":
		api = APIAnthropic
	case "/v1/responses":
		api = APIResponses
	}
	text := promptText(body, api)
	prompt := max(1, len(text)/4)
	f.mu.Lock()
	f.lastHdr = r.Header.Clone()
	f.byEngine[engine]++
	f.running[engine]++
	hit := f.lookup(engine, text)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running[engine]--
		if f.prefillRate > 0 && r.URL.Path != "/v1/messages/count_tokens" {
			f.pfSum[engine] += float64(max(prompt-hit, 0)) / f.prefillRate
			f.pfCount[engine]++
		}
		f.mu.Unlock()
	}()
	if r.URL.Path == "/v1/messages/count_tokens" {
		fmt.Fprintf(w, `{"input_tokens":%d}`, prompt)
		return
	}
	f.mu.Lock()
	f.prompts[engine] += float64(prompt)
	f.gens[engine] += float64(f.tokens) // counted up front: the proxy reads them only once the answer ended
	f.mu.Unlock()
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		if api == APIAnthropic {
			fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":%d,"output_tokens":%d}}`, prompt, f.tokens)
		} else {
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, f.tokens, hit)
		}
		return
	}
	if f.holdFirst != nil {
		select {
		case <-f.holdFirst:
		case <-r.Context().Done():
			f.canceled <- struct{}{}
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(s string) bool {
		if _, err := io.WriteString(w, s); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	wait := func() bool {
		if f.tokenDelay > 0 {
			select {
			case <-r.Context().Done():
				f.canceled <- struct{}{}
				return false
			case <-time.After(f.tokenDelay):
			}
		}
		return true
	}
	_ = rc.Flush() // the headers at once, as Starlette's StreamingResponse sends them
	for i := range f.tokens {
		if !wait() {
			return
		}
		if i == 0 {
			// As vLLM, the stream opens with its first output (see
			// streamWatch): the role chunk, message_start.
			if api == APIAnthropic {
				send(fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", prompt))
				send("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
			} else {
				send("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
			}
		}
		var ok bool
		if api == APIAnthropic {
			ok = send(fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"t%d\"}}\n\n", i))
		} else {
			ok = send(fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i))
		}
		if !ok {
			return
		}
		if i == 0 {
			if f.dieMidway.Load() {
				panic(http.ErrAbortHandler) // the server drops the connection
			}
			if f.hold != nil {
				select {
				case <-f.hold:
				case <-r.Context().Done():
					f.canceled <- struct{}{}
					return
				}
			}
		}
	}
	if api == APIAnthropic {
		send("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
		send(fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":%d}}\n\n", f.tokens))
		send("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	} else {
		send(fmt.Sprintf("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", prompt, f.tokens, hit))
		send("data: [DONE]\n\n")
	}
}

// lookup walks the engine's prefix cache with the prompt's chained 64-byte
// blocks, as vLLM does with its block hashes, counts queries and hits (in
// tokens, 4 bytes each) and caches every full block. Called with f.mu held.
func (f *fakeVLLM) lookup(engine int, text []byte) int {
	var prev uint64
	hitBlocks, missed := 0, false
	for lo := 0; lo+64 <= len(text); lo += 64 {
		h := sha256.New()
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], prev)
		h.Write(b[:])
		h.Write(text[lo : lo+64])
		prev = binary.LittleEndian.Uint64(h.Sum(nil))
		if !missed && f.cache[engine][prev] {
			hitBlocks++
		} else {
			missed = true
		}
		f.cache[engine][prev] = true
	}
	f.queries[engine] += float64(max(1, len(text)/4))
	f.cached[engine] += float64(hitBlocks * 16)
	return hitBlocks * 16
}

// metrics renders a vLLM-style exposition (colons in names, an engine label
// per rank, *_created gauges to be ignored).
func (f *fakeVLLM) metrics() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	series := func(name, typ string, v func(e int) float64) {
		fmt.Fprintf(&b, "# HELP %s fake\n# TYPE %s %s\n", name, name, typ)
		for e := range f.engines {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=\"m\"} %g\n", name, e, v(e))
		}
	}
	series("vllm:num_requests_running", "gauge", func(e int) float64 { return float64(f.running[e] + f.extra[e]) })
	series("vllm:num_requests_waiting", "gauge", func(int) float64 { return 0 })
	series("vllm:kv_cache_usage_perc", "gauge", func(e int) float64 { return float64(len(f.cache[e])) / 10000 })
	series("vllm:prefix_cache_queries_total", "counter", func(e int) float64 { return f.queries[e] })
	series("vllm:prefix_cache_hits_total", "counter", func(e int) float64 { return f.cached[e] })
	series("vllm:prefix_cache_hits_created", "gauge", func(int) float64 { return 1.7e9 })
	series("vllm:prompt_tokens_total", "counter", func(e int) float64 { return f.prompts[e] })
	series("vllm:generation_tokens_total", "counter", func(e int) float64 { return f.gens[e] })
	if f.prefillRate > 0 {
		fmt.Fprintf(&b, "# HELP vllm:request_prefill_time_seconds fake\n# TYPE vllm:request_prefill_time_seconds histogram\n")
		for e := range f.engines {
			l := fmt.Sprintf("engine=\"%d\",model_name=\"m\"", e)
			fmt.Fprintf(&b, "vllm:request_prefill_time_seconds_bucket{%s,le=\"+Inf\"} %g\n", l, f.pfCount[e])
			fmt.Fprintf(&b, "vllm:request_prefill_time_seconds_sum{%s} %g\n", l, f.pfSum[e])
			fmt.Fprintf(&b, "vllm:request_prefill_time_seconds_count{%s} %g\n", l, f.pfCount[e])
		}
	}
	fmt.Fprintf(&b, "# HELP vllm:cache_config_info fake\n# TYPE vllm:cache_config_info gauge\n")
	for e := range f.engines {
		extra := ""
		if f.maxNumSeqs > 0 {
			extra = fmt.Sprintf(",max_num_seqs=\"%d\"", f.maxNumSeqs)
		}
		blocks := f.gpuBlocks
		if blocks == 0 {
			blocks = 2400
		}
		if blocks < 0 {
			fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",engine=\"%d\"%s} 1\n", e, extra)
			continue
		}
		fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",engine=\"%d\",num_gpu_blocks=\"%d\"%s} 1\n", e, blocks, extra)
	}
	return b.String()
}

// counters returns the token counters of every engine summed: prompt,
// prefix-cache queries, hits and generation tokens.
func (f *fakeVLLM) counters() (prompt, queries, hits, gen float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for e := range f.engines {
		prompt, queries, hits, gen = prompt+f.prompts[e], queries+f.queries[e], hits+f.cached[e], gen+f.gens[e]
	}
	return
}

// restart empties the caches and sets every counter back to zero, as a
// restarted vLLM does.
func (f *fakeVLLM) restart() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for e := range f.engines {
		f.cache[e] = map[uint64]bool{}
		f.queries[e], f.cached[e], f.prompts[e], f.gens[e] = 0, 0, 0, 0
	}
}

// refusingURL returns the URL of a port on which nothing listens.
func refusingURL(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}
