package live

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
)

// waiters returns how many requests of model wait for admission.
func (h *harness) waiters(model string) int {
	m := h.srv.state.Load().models[model]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.adm.waiting.Len()
}

// waitFor polls cond every few milliseconds for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// admissionModel: one replica whose KV cache (60 blocks of 16 tokens, 960
// tokens, from vllm:cache_config_info) holds one of the test's
// conversations (~600 tokens) but not two.
func admissionModel(url, extra string) string {
	return urlsModel(url) + "    admission: kv\n" + extra
}

// TestAdmissionWaitsForHeadroom: with admission: kv, a new conversation
// that fits on no replica waits at the proxy, without reaching the
// backend, until the conversation holding the cache goes idle
// (active_window), and is then served; a later turn of an admitted
// conversation never waits.
func TestAdmissionWaitsForHeadroom(t *testing.T) {
	a := fakevllm.New(t, 1)
	a.GPUBlocks = 60
	h := startProxy(t, modelsYAML("", admissionModel(a.URL(), "    active_window: 1500ms\n")))
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "first", 0, false), sessionHdr("first")); r.status != 200 {
		t.Fatalf("first conversation: status %d %s", r.status, r.body)
	}
	second := h.doAsync("/v1/chat/completions", chatBody(testModel, "second", 0, true), sessionHdr("second"))
	waitFor(t, "the second conversation to wait for admission", func() bool { return h.waiters(testModel) == 1 })
	// A later turn of the admitted conversation is served meanwhile.
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "first", 1, false), sessionHdr("first")); r.status != 200 {
		t.Fatalf("later turn while another waits: status %d %s", r.status, r.body)
	}
	if n := a.Hits.Load(); n != 2 || h.waiters(testModel) != 1 {
		t.Fatalf("backend hits %d, waiters %d while the second waits: want 2 and 1", n, h.waiters(testModel))
	}
	// The first conversation goes idle 1.5 s after its last request: the
	// second is admitted.
	r := <-second
	if r.status != 200 || !strings.Contains(r.body, "[DONE]") {
		t.Fatalf("second conversation after the first went idle: status %d body %q", r.status, r.body)
	}
	if n, w := a.Hits.Load(), h.waiters(testModel); n != 3 || w != 0 {
		t.Errorf("backend hits %d, waiters %d after admission: want 3 and 0", n, w)
	}
}

// TestAdmissionTimeout: a new conversation that waits longer than
// admission_timeout is refused in its client's shape, 429
// rate_limit_error (OpenAI) or 529 overloaded_error (Anthropic), with
// Retry-After, and never reaches the backend.
func TestAdmissionTimeout(t *testing.T) {
	a := fakevllm.New(t, 1)
	a.GPUBlocks = 60
	h := startProxy(t, modelsYAML("", admissionModel(a.URL(), "    admission_timeout: 200ms\n")))
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "first", 0, false), sessionHdr("first")); r.status != 200 {
		t.Fatalf("first conversation: status %d %s", r.status, r.body)
	}
	r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "second", 0, true), sessionHdr("second"))
	var v openAIError
	_ = json.Unmarshal([]byte(r.body), &v)
	if r.status != 429 || v.Error.Type != "rate_limit_error" || r.header.Get("Retry-After") == "" || !strings.Contains(v.Error.Message, "admission_timeout") {
		t.Errorf("OpenAI after the admission timeout: status %d Retry-After %q body %s, want 429 rate_limit_error with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
	}
	// Trailing blanks after the JSON make the body, so the estimated prompt
	// (~4 bytes a token), as large as the others.
	r = h.do("POST", "/v1/messages", anthropicBody(testModel, "third", 0, true)+strings.Repeat(" ", 3000), sessionHdr("third"))
	if r.status != 529 || anthropicErrorType(r.body) != "overloaded_error" || r.header.Get("Retry-After") == "" {
		t.Errorf("Anthropic after the admission timeout: status %d Retry-After %q body %s, want 529 overloaded_error with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
	}
	if n, w := a.Hits.Load(), h.waiters(testModel); n != 1 || w != 0 {
		t.Errorf("backend hits %d, waiters %d: want only the first conversation and an empty queue", n, w)
	}
}

// TestAdmissionAfterConversationsGoQuiet: two conversations fill the KV
// cache of both replicas, each sends three turns and goes quiet (it has
// finished; the proxy is not told). A new conversation that arrives then
// waits while they may still come back (their return timeout, from the
// gaps they left between their turns) and is admitted within seconds,
// not after the two-minute active window. With a think time of 1 s
// between turns the timeout is 2.5 s (RFC 6298's SRTT + 4 RTTVAR over two
// gaps of ~1 s), so the newcomer waits over a second: an idle
// conversation in its think time still holds its room; with a closed
// loop (no think time) it is MinHold, 1 s.
func TestAdmissionAfterConversationsGoQuiet(t *testing.T) {
	for _, tt := range []struct {
		name             string
		think            time.Duration
		minWait, maxWait time.Duration
	}{
		{"closed loop", 0, 0, 5 * time.Second},
		{"think time 1s", time.Second, time.Second, 8 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
			a.GPUBlocks, b.GPUBlocks = 60, 60 // 960 tokens each: one conversation of the test, not two
			h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())+"    balance: kv\n    admission: kv\n    admission_timeout: 15s\n"))
			h.scraped()
			var wg sync.WaitGroup
			for _, s := range []string{"a", "b"} {
				wg.Go(func() {
					for turn := range 3 {
						if turn > 0 {
							time.Sleep(tt.think)
						}
						if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, s, turn, false), sessionHdr(s)); r.status != 200 {
							t.Errorf("conversation %s turn %d: status %d %s", s, turn, r.status, r.body)
						}
					}
				})
			}
			wg.Wait()
			if sa, sb := a.Served(), b.Served(); sa[0] != 3 || sb[0] != 3 {
				t.Fatalf("served %v and %v, want each conversation's 3 turns on a replica of its own", sa, sb)
			}
			start := time.Now()
			r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "c", 0, true), sessionHdr("c"))
			waited := time.Since(start)
			if r.status != 200 || !strings.Contains(r.body, "[DONE]") {
				t.Fatalf("new conversation after the others went quiet: status %d after %v, body %.200s; want it admitted within %v", r.status, waited.Round(time.Millisecond), r.body, tt.maxWait)
			}
			st := h.status().Models[0]
			if waited < tt.minWait || waited > tt.maxWait || st.Admission == nil || st.Admission.Waits != 1 {
				t.Errorf("new conversation admitted after %v (admission %+v), want one wait of %v to %v", waited.Round(time.Millisecond), st.Admission, tt.minWait, tt.maxWait)
			}
			// The quiet conversations stay active (homed, within the active
			// window) but are released (the newcomer was admitted when the
			// first of them was); the newcomer's turn ended just now: held.
			h.waitFor("both quiet conversations released", func(st StatusReport) bool {
				held, active := 0, 0
				for _, rs := range st.Models[0].Replicas {
					held, active = held+rs.Held, active+rs.Active
				}
				return held == 1 && active == 3
			})
		})
	}
}

func TestAdmissionConfig(t *testing.T) {
	base := "listen: 127.0.0.1:0\nclient_api_keys: [k]\nmodels:\n  - name: m\n    replicas: [http://127.0.0.1:1]\n"
	cfg, err := ParseConfig("c.yaml", []byte(base+"    balance: kv\n    admission: kv\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m := cfg.Models[0]; m.Balance != "kv" || m.Admission != "kv" || m.AdmissionTimeout.D() != DefaultAdmissionTimeout {
		t.Errorf("parsed %+v", m)
	}
	for _, tt := range []struct{ yaml, want string }{
		{"    balance: tokens\n", `balance: want sessions or kv, got "tokens"`},
		{"    admission: on\n", `admission: want off or kv, got "on"`},
	} {
		if _, err := ParseConfig("c.yaml", []byte(base+tt.yaml)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want %q", tt.yaml, err, tt.want)
		}
	}
}
