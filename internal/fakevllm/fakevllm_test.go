package fakevllm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lm-warden/warden/internal/archtest"
	"github.com/lm-warden/warden/metrics/vllm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestArchitecture: the fake reads prompts with traces' canonical-text
// rule and depends on nothing it stands in for or serves (the proxy, the
// load generator, the emulator and the simulator).
func TestArchitecture(t *testing.T) {
	archtest.Check(t, "internal/fakevllm", archtest.Rules{
		Imports: []string{"traces"},
		Never:   []string{"live/...", "bench/...", "emulator/...", "sim/...", "placement/...", "cmd/...", "epp/..."},
	})
}

// longPrompt is a chat body whose canonical text spans several 64-byte
// blocks, the same for the same session.
func longPrompt(session string, stream bool, extra string) string {
	b, _ := json.Marshal(map[string]any{"model": "fake-model", "stream": stream, "messages": []map[string]string{
		{"role": "system", "content": strings.Repeat("You are a careful coding agent. ", 20)},
		{"role": "user", "content": "first message of " + session + extra},
	}})
	return string(b)
}

// post sends body to path with headers and returns the status and what
// was read of the body; an error reading it (a dropped connection) is
// returned as such.
func post(url, path, body string, hdr map[string]string) (int, string, error) {
	req, err := http.NewRequest("POST", url+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// until polls cond (no deadline: go test's own ends a test that hangs).
func until(cond func() bool) {
	for !cond() {
		time.Sleep(time.Millisecond)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// engines parses the server's /metrics as the proxy's scraper does.
func engines(t *testing.T, s *Server) []vllm.Engine {
	t.Helper()
	res, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	es, err := vllm.Parse(res.Body, vllm.MaxPageBytes)
	if err != nil {
		t.Fatalf("/metrics does not parse as vLLM's: %v", err)
	}
	return es
}

// TestAnswers: each API's answer, streamed and not, in its shape, with
// Tokens tokens of Token text and the prompt's usage; the request is
// recorded and counted on the engine its rank header names.
func TestAnswers(t *testing.T) {
	chat := longPrompt("s", true, "")
	anth := `{"model":"fake-model","max_tokens":64,"system":"be brief","stream":true,"messages":[{"role":"user","content":"hello there"}]}`
	for _, tc := range []struct {
		name, path, body string
		want             []string
	}{
		{"chat stream", "/v1/chat/completions", chat, []string{`"role":"assistant"`, `"content":"t000"`, `"content":"t002"`, `"completion_tokens":3`, "data: [DONE]\n\n"}},
		{"chat json", "/v1/chat/completions", strings.Replace(chat, `"stream":true`, `"stream":false`, 1), []string{`"object":"chat.completion"`, `"completion_tokens":3`}},
		{"messages stream", "/v1/messages", anth, []string{"event: message_start", "event: content_block_start", `"text":"t001"`, `"output_tokens":3`, "event: message_stop"}},
		{"messages json", "/v1/messages", strings.Replace(anth, `"stream":true`, `"stream":false`, 1), []string{`"type":"message"`, `"output_tokens":3`}},
		{"count tokens", "/v1/messages/count_tokens", anth, []string{`{"input_tokens":`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(t, 2)
			s.Tokens = 3
			status, body, err := post(s.URL(), tc.path, tc.body, map[string]string{"X-data-parallel-rank": "1", "X-Test": "yes"})
			if err != nil || status != http.StatusOK {
				t.Fatalf("%d %q %v", status, body, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("answer %q lacks %q", body, w)
				}
			}
			if got := s.Served(); got[0] != 0 || got[1] != 1 {
				t.Errorf("served %v, want [0 1]", got)
			}
			reqs := s.Requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests recorded, want 1", len(reqs))
			}
			r := reqs[0]
			if r.Path != tc.path || r.Engine != 1 || r.Header.Get("X-Test") != "yes" || s.Header().Get("X-Test") != "yes" || r.Body["model"] != "fake-model" {
				t.Errorf("recorded %+v", r)
			}
			if r.PromptTokens != max(1, len(r.Text)/4) || !strings.Contains(r.Text, "\x00user\x00") {
				t.Errorf("recorded text %q, %d prompt tokens", r.Text, r.PromptTokens)
			}
			if want := fmt.Sprintf("%d", r.PromptTokens); !strings.Contains(body, want) {
				t.Errorf("answer %q does not tell the %s prompt tokens", body, want)
			}
			c := s.PerEngine()[1]
			wantPrompt, wantGen := float64(r.PromptTokens), 3.0
			if tc.path == "/v1/messages/count_tokens" {
				wantPrompt, wantGen = 0, 0
			}
			if c.Prompt != wantPrompt || c.Gen != wantGen || c.Queries != float64(r.PromptTokens) || s.Hits.Load() != 1 {
				t.Errorf("engine 1 counters %+v, hits %d: want prompt %v, generation %v, queries %d", c, s.Hits.Load(), wantPrompt, wantGen, r.PromptTokens)
			}
		})
	}
}

// TestPrefixCache: a prompt sent again to its engine hits its full blocks
// (16 tokens each), on another engine nothing; Restart empties the caches
// and zeroes the counters, and /metrics shows each engine's own.
func TestPrefixCache(t *testing.T) {
	s := New(t, 2)
	body := longPrompt("s", false, "")
	cached := func(rank string) int {
		t.Helper()
		_, b, err := post(s.URL(), "/v1/chat/completions", body, map[string]string{"X-data-parallel-rank": rank})
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(b), &v); err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		return v.Usage.PromptTokensDetails.CachedTokens
	}
	if got := cached("0"); got != 0 {
		t.Fatalf("the first request: %d cached tokens, want 0", got)
	}
	text := s.Requests()[0].Text
	full := len(text) / 64 * 16 // tokens in full blocks
	if full < 32 {
		t.Fatalf("the prompt has %d tokens of full blocks: the test wants several", full)
	}
	for i, tc := range []struct {
		rank string
		want int
	}{{"0", full}, {"1", 0}, {"1", full}} {
		if got := cached(tc.rank); got != tc.want {
			t.Errorf("request %d on engine %s: %d cached tokens, want %d", i+2, tc.rank, got, tc.want)
		}
	}
	es, per := engines(t, s), s.PerEngine()
	queries := float64(2 * (len(text) / 4))
	for e := range 2 {
		if es[e].PrefixHits != float64(full) || es[e].PrefixQueries != queries || per[e].Hits != float64(full) || per[e].Queries != queries {
			t.Errorf("engine %d: /metrics %+v, counters %+v: want %d hits of %v queried tokens", e, es[e], per[e], full, queries)
		}
	}
	if sum := s.Counters(); sum.Hits != float64(2*full) {
		t.Errorf("summed counters %+v, want %d hits", sum, 2*full)
	}
	s.Restart()
	if c := s.Counters(); c != (Counters{}) {
		t.Errorf("after Restart: %+v, want zero", c)
	}
	if got := cached("0"); got != 0 {
		t.Errorf("after Restart: %d cached tokens, want 0 (the cache emptied)", got)
	}
}

// TestRouting: a rank header picks the engine (out of range: 400); without
// one, SessionHeader keeps each session on the engine its first request
// got, new sessions in turn; without either, engine 0.
func TestRouting(t *testing.T) {
	s := New(t, 2)
	if status, _, _ := post(s.URL(), "/v1/chat/completions", longPrompt("x", false, ""), map[string]string{"X-data-parallel-rank": "2"}); status != http.StatusBadRequest {
		t.Errorf("rank 2 of 2 engines: %d, want 400", status)
	}
	post(s.URL(), "/v1/chat/completions", longPrompt("x", false, ""), nil)
	if got := s.Served(); got[0] != 1 || got[1] != 0 {
		t.Errorf("no rank, no session header: served %v, want [1 0]", got)
	}
	s = New(t, 2)
	s.SessionHeader = "X-Session"
	var got []int
	for _, sess := range []string{"a", "b", "a", "c", "b"} {
		post(s.URL(), "/v1/chat/completions", longPrompt(sess, false, ""), map[string]string{"X-Session": sess})
		r := s.Requests()
		got = append(got, r[len(r)-1].Engine)
	}
	if fmt.Sprint(got) != "[0 1 0 0 1]" {
		t.Errorf("engines of sessions a b a c b: %v, want [0 1 0 0 1]", got)
	}
}

// TestMaxTokens: with MaxTokens a request gets its max_tokens (or
// max_completion_tokens) tokens, one without gets Tokens.
func TestMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		field string
		want  int
	}{{`"max_tokens":7,`, 7}, {`"max_completion_tokens":5,`, 5}, {"", 4}} {
		s := New(t, 1)
		s.MaxTokens = true
		body := strings.Replace(longPrompt("s", true, ""), `{`, `{`+tc.field, 1)
		_, b, _ := post(s.URL(), "/v1/chat/completions", body, nil)
		if n := strings.Count(b, `"content":"t`); n != tc.want || !strings.Contains(b, fmt.Sprintf(`"completion_tokens":%d`, tc.want)) {
			t.Errorf("%s: %d tokens streamed in %q, want %d", tc.field, n, b, tc.want)
		}
	}
}

// TestFaults: each switch of the fake does what it says.
func TestFaults(t *testing.T) {
	chat, anth := longPrompt("s", true, ""), `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name  string
		set   func(s *Server)
		check func(t *testing.T, s *Server)
	}{
		{"status", func(s *Server) { s.Status.Store(503) }, func(t *testing.T, s *Server) {
			status, body, _ := post(s.URL(), "/v1/chat/completions", chat, nil)
			if status != 503 || !strings.Contains(body, "fake failure") || s.Hits.Load() != 1 || s.Served()[0] != 0 || len(s.Requests()) != 0 {
				t.Errorf("%d %q, hits %d, served %v: want 503, counted as a hit only", status, body, s.Hits.Load(), s.Served())
			}
			s.Status.Store(0)
			if status, _, _ := post(s.URL(), "/v1/chat/completions", chat, nil); status != 200 {
				t.Errorf("after Status 0: %d, want 200", status)
			}
		}},
		{"fail metrics", func(s *Server) { s.FailMetrics.Store(true) }, func(t *testing.T, s *Server) {
			if status, _ := get(t, s.URL()+"/metrics"); status != 500 {
				t.Errorf("/metrics %d, want 500", status)
			}
		}},
		{"health down", func(s *Server) { s.HealthDown.Store(true) }, func(t *testing.T, s *Server) {
			if status, _ := get(t, s.URL()+"/health"); status != 503 {
				t.Errorf("/health %d, want 503", status)
			}
			s.HealthDown.Store(false)
			if status, _ := get(t, s.URL()+"/health"); status != 200 {
				t.Errorf("/health %d, want 200", status)
			}
		}},
		{"models", func(s *Server) {}, func(t *testing.T, s *Server) {
			if status, body := get(t, s.URL()+"/v1/models"); status != 200 || !strings.Contains(body, `"id":"fake-model"`) {
				t.Errorf("/v1/models %d %q", status, body)
			}
		}},
		{"no models", func(s *Server) { s.NoModels = true }, func(t *testing.T, s *Server) {
			if status, _ := get(t, s.URL()+"/v1/models"); status != 404 {
				t.Errorf("/v1/models %d, want 404", status)
			}
		}},
		{"fail every 2nd", func(s *Server) { s.FailEvery = 2 }, func(t *testing.T, s *Server) {
			for i, path := range []string{"/v1/chat/completions", "/v1/chat/completions", "/v1/messages", "/v1/messages"} {
				body := chat
				if path == "/v1/messages" {
					body = anth
				}
				_, b, err := post(s.URL(), path, body, nil)
				failed := strings.Contains(b, "fake failure mid-stream")
				ended := strings.Contains(b, "[DONE]") || strings.Contains(b, "message_stop")
				if err != nil || failed != (i%2 == 1) || ended == failed || strings.Count(b, Token(0)) != 1 {
					t.Errorf("request %d: %q (%v): want the error event on every 2nd, after the first token, and no end then", i+1, b, err)
				}
			}
			if es := engines(t, s); es[0].Requests != 2 {
				t.Errorf("request_success_total %v, want the 2 that ended", es[0].Requests)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(t, 1)
			tc.set(s)
			tc.check(t, s)
		})
	}
}

// TestHold: with Hold a stream stops after its first token, counted as
// running, until Hold is closed; a client that leaves meanwhile is told
// on Canceled. HoldFirst holds even the headers.
func TestHold(t *testing.T) {
	s := New(t, 1)
	s.Hold = make(chan struct{})
	// A client that reads the first token, then leaves.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", s.URL()+"/v1/chat/completions", strings.NewReader(longPrompt("a", true, "")))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(res.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("no first token: %v", err)
		}
		if strings.Contains(line, Token(0)) {
			break
		}
	}
	if es := engines(t, s); es[0].Running != 1 {
		t.Errorf("running %v while held, want 1", es[0].Running)
	}
	cancel()
	res.Body.Close()
	<-s.Canceled
	// A client that waits gets the whole stream once Hold is closed.
	done := make(chan string)
	go func() {
		_, b, _ := post(s.URL(), "/v1/chat/completions", longPrompt("b", true, ""), nil)
		done <- b
	}()
	until(func() bool { return s.Hits.Load() == 2 })
	close(s.Hold)
	if b := <-done; !strings.Contains(b, "[DONE]") {
		t.Errorf("after Hold closed: %q, want the whole stream", b)
	}

	s = New(t, 1)
	s.HoldFirst = make(chan struct{})
	s.SetLoad(0, 5)
	go func() {
		_, b, _ := post(s.URL(), "/v1/messages", `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
		done <- b
	}()
	until(func() bool { return engines(t, s)[0].Running == 6 }) // 5 set, 1 held before its headers
	close(s.HoldFirst)
	if b := <-done; !strings.Contains(b, "message_stop") {
		t.Errorf("after HoldFirst closed: %q, want the whole stream", b)
	}
}

// TestMetrics: the exposition parses as vLLM's, with cache_config_info's
// labels as set and the prefill histogram when PrefillRate is.
func TestMetrics(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		set                    func(s *Server)
		blocks, seqs           int
		prefill                bool
		wantPrefillSecondsOver float64 // the prompt's tokens over the rate
	}{
		{"defaults", func(*Server) {}, 2400, 0, false, 0},
		{"blocks and seqs", func(s *Server) { s.GPUBlocks, s.MaxNumSeqs = 60, 32 }, 60, 32, false, 0},
		{"no blocks", func(s *Server) { s.GPUBlocks = -1 }, 0, 0, false, 0},
		{"prefill", func(s *Server) { s.PrefillRate = 1000 }, 2400, 0, true, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(t, 2)
			tc.set(s)
			post(s.URL(), "/v1/chat/completions", longPrompt("s", false, ""), map[string]string{"X-data-parallel-rank": "1"})
			es := engines(t, s)
			if len(es) != 2 {
				t.Fatalf("%d engines on /metrics, want 2", len(es))
			}
			for _, e := range es {
				if e.BlockSize != 16 || e.NumGPUBlocks != tc.blocks || e.MaxNumSeqs != tc.seqs || e.HasPrefill != tc.prefill {
					t.Errorf("engine %d: %+v, want %d blocks, max_num_seqs %d, prefill %v", e.Engine, e, tc.blocks, tc.seqs, tc.prefill)
				}
			}
			prompt := float64(s.Requests()[0].PromptTokens)
			if e := es[1]; e.PromptTokens != prompt || e.GenerationTokens != 4 || e.Requests != 1 {
				t.Errorf("engine 1: %+v, want %v prompt tokens, 4 generated, 1 request", e, prompt)
			}
			if tc.prefill && (es[1].PrefillRequests != 1 || es[1].PrefillSeconds != prompt/tc.wantPrefillSecondsOver) {
				t.Errorf("engine 1 prefill %v s over %v requests, want %v over 1", es[1].PrefillSeconds, es[1].PrefillRequests, prompt/tc.wantPrefillSecondsOver)
			}
		})
	}
}

// TestRefusingURL: nothing answers there.
func TestRefusingURL(t *testing.T) {
	res, err := http.Get(RefusingURL(t) + "/health")
	if err == nil {
		res.Body.Close()
		t.Fatal("a request to RefusingURL got an answer")
	}
}

// TestStall: a stalled request gets what its Stall says and then nothing
// until the client leaves, which Canceled tells; it reaches no engine.
func TestStall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stall   Stall
		stream  bool
		headers bool   // the response's headers arrive
		want    string // the whole body: what came before the silence
	}{
		{"no headers, streamed", StallNoHeaders, true, false, ""},
		{"no headers, JSON", StallNoHeaders, false, false, ""},
		{"after headers", StallAfterHeaders, true, true, ""},
		{"after token", StallAfterToken, true, true, opening(false, 0) + tokenEvent(false, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(t, 1)
			s.Stall = tc.stall
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.URL()+"/v1/chat/completions", strings.NewReader(longPrompt("s", tc.stream, "")))
			type result struct {
				res *http.Response
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := http.DefaultClient.Do(req)
				done <- result{res, err}
			}()
			until(func() bool { return s.Hits.Load() == 1 })
			var body string
			if tc.headers {
				r := <-done
				if r.err != nil || r.res.StatusCode != 200 || r.res.Header.Get("Content-Type") != "text/event-stream" {
					t.Fatalf("%v %v: want a stream's headers", r.res, r.err)
				}
				br := bufio.NewReader(r.res.Body)
				if tc.stall == StallAfterToken {
					for !strings.Contains(body, Token(0)) {
						line, err := br.ReadString('\n')
						if err != nil {
							t.Fatalf("%q, %v: no first token", body, err)
						}
						body += line
					}
				}
				cancel()
				rest, _ := io.ReadAll(br)
				body += string(rest)
				r.res.Body.Close()
				if body != tc.want {
					t.Errorf("stalled body %q, want %q", body, tc.want)
				}
			} else {
				cancel()
				if r := <-done; r.err == nil {
					r.res.Body.Close()
					t.Fatalf("headers (%d) came from a server stalled before them", r.res.StatusCode)
				}
			}
			<-s.Canceled
			if s.Served()[0] != 0 || len(s.Requests()) != 0 {
				t.Errorf("served %v, %d recorded: a stalled request reaches no engine", s.Served(), len(s.Requests()))
			}
		})
	}
}
