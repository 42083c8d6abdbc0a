package live

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/lm-warden/warden/emulator"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

const emulatedModel = "Qwen/Qwen3-4B-Instruct-2507"

// startEmulator serves a one-replica emulated farm (warden emulate) with
// faults on 127.0.0.1 until the test ends and returns its URL.
func startEmulator(t *testing.T, faults string) string {
	t.Helper()
	f, err := sim.ParseFarm([]byte("model: "+emulatedModel+"\ngpu: RTX A4000\nreplicas: 1\nvllm: {max_num_seqs: 32, max_model_len: 32768}\n"), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fl, err := emulator.ParseFaults(faults)
	if err != nil {
		t.Fatal(err)
	}
	e, err := emulator.New(f, emulator.Options{Speed: 1000, Seed: 1, Faults: fl})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Serve(ctx, []net.Listener{ln}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("emulator: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return "http://" + ln.Addr().String()
}

// responsesBody is an OpenAI Responses request of a session.
func responsesBody(model, session string, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": model, "instructions": strings.Repeat("You are a careful coding agent. ", 40),
		"input": "first message of " + session + strings.Repeat(" context", 100), "max_output_tokens": 16, "stream": stream})
	return string(b)
}

// TestEmulatedStallIsEjected: the proxy in front of two emulated replicas,
// replica 0 started with `warden emulate --fault stall-after-headers=1`
// (headers, then silence, /health OK). With timeouts.first_token small,
// each request landing there ends with the API's error event and no normal
// end, and after ejectConsecutive of them the replica is ejected, so new
// sessions are served by replica 1: the emulator's fault is what the
// proxy's first-token timeout and outlier detection are for. Responses
// streams from the emulator are read by the proxy as such (usage counted).
func TestEmulatedStallIsEjected(t *testing.T) {
	for _, tc := range []struct {
		name, path       string
		body             func(s string) string
		wantErr, mustNot string
		good             string // in a good stream's body
	}{
		{"openai", "/v1/chat/completions", func(s string) string {
			return strings.Replace(chatBody(emulatedModel, s, 0, true), `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
		},
			`data: {"error":{`, "[DONE]", "data: [DONE]"},
		{"responses", "/v1/responses", func(s string) string { return responsesBody(emulatedModel, s, true) },
			"event: error\ndata: {\"type\":\"error\"", "response.completed", "event: response.completed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad, good := startEmulator(t, "stall-after-headers=1"), startEmulator(t, "")
			h := startProxy(t, "client_api_keys: ["+testKey+"]\nscrape_interval: 50ms\n"+
				"timeouts: {drain: 5s, health: 1s, first_token: 1s}\nmodels:\n"+
				"  - name: "+emulatedModel+"\n    replicas: ["+bad+", "+good+"]\n")
			h.scraped()
			stalled, served := 0, 0 // served: prompt tokens
			// The prompt tokens of the good answers, by the emulator's rule
			// (4 bytes of canonical text per token).
			d := map[string]traces.Dialect{"/v1/chat/completions": traces.DialectOpenAI, "/v1/responses": traces.DialectResponses}[tc.path]
			count := func(body string) { served += traces.TextTokens(traces.PromptText([]byte(body), d)) }
			// New sessions until replica 0 is ejected. (A loaded machine may
			// also time out replica 1 now and then: the client cannot tell
			// which replica a timeout came from, so the count is a bound.)
			ejected := func() bool { return h.status().Models[0].Replicas[0].State == "ejected" }
			for i := 0; i < 40 && !ejected(); i++ {
				s := fmt.Sprintf("s%d", i)
				r := h.do("POST", tc.path, tc.body(s), sessionHdr(s))
				if r.status == 200 && strings.Contains(r.body, tc.good) {
					count(tc.body(s))
					continue // replica 1
				}
				stalled++
				if r.status != 200 || !strings.Contains(r.body, tc.wantErr) || strings.Contains(r.body, tc.mustNot) {
					t.Fatalf("stalled request: status %d body %q, want 200, an error event and no %s", r.status, r.body, tc.mustNot)
				}
			}
			if stalled < ejectConsecutive {
				t.Fatalf("only %d requests reached the stalled replica", stalled)
			}
			h.waitFor("the stalled replica ejected", func(st StatusReport) bool {
				return st.Models[0].Replicas[0].State == "ejected"
			})
			for i := range 4 {
				s := fmt.Sprintf("after%d", i)
				if r := h.do("POST", tc.path, tc.body(s), sessionHdr(s)); r.status != 200 || !strings.Contains(r.body, tc.good) {
					t.Fatalf("after ejection: status %d body %q, want a good answer from replica 1", r.status, r.body)
				}
				count(tc.body(s))
			}
			h.waitMetrics(`kind="timeout",model="`+emulatedModel+`",replica="0"}`,
				`warden_ejections_total{model="`+emulatedModel+`",replica="0"} 1`)
			// Every good answer's usage reached the proxy (for Responses:
			// response.completed's usage.input_tokens).
			h.waitMetrics(fmt.Sprintf(`warden_prompt_tokens_total{model="%s"} %d`, emulatedModel, served))
		})
	}
}
