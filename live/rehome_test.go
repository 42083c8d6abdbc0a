package live

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/lm-warden/warden/emulator"
)

// startSmallEmulator serves a two-replica emulated farm whose replicas
// each hold 3200 tokens of KV cache (num_gpu_blocks 200), one listener a
// replica, until the test ends, and returns their URLs.
func startSmallEmulator(t *testing.T) []string {
	t.Helper()
	_, urls := serveEmulator(t, "model: "+emulatedModel+"\ngpu: RTX A4000\nreplicas: 2\n"+
		"vllm: {max_num_seqs: 32, num_gpu_blocks: 200, max_model_len: 3200}\n", emulator.Options{Speed: 1000, Seed: 1})
	return urls
}

// flush fills replica url's prefix cache with unrelated prompts sent to
// it directly (not through the proxy): a cache-filling burst that evicts
// every conversation cached there.
func flush(t *testing.T, url string) {
	t.Helper()
	for i := range 4 {
		body, _ := json.Marshal(map[string]any{"model": emulatedModel, "max_tokens": 4, "messages": []map[string]string{
			{"role": "user", "content": fmt.Sprintf("burst %d ", i) + strings.Repeat(fmt.Sprintf("filler %d ", i), 1000)}}})
		res, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("burst %d: status %d", i, res.StatusCode)
		}
	}
}

// TestRehomeWhenCold is issue 38's proxy check on an emulated farm: with
// rehome: cold, a session whose home was flushed (a cache-filling burst)
// is re-homed on the turn after the one that found its home cold, while
// a session whose home still holds it stays; with rehome off (the
// default) the flushed one stays too. Streamed (include_usage) and
// non-streamed answers alike carry the cached tokens the proxy reads.
func TestRehomeWhenCold(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rehome string
		stream bool
		moved  bool
	}{
		{"cold/plain", "cold", false, true},
		{"cold/stream", "cold", true, true},
		{"off/plain", "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			urls := startSmallEmulator(t)
			extra := ""
			if tc.rehome != "" {
				extra = "    rehome: " + tc.rehome + "\n"
			}
			h := startProxy(t, modelsYAML("", "  - name: "+emulatedModel+"\n    replicas: ["+urls[0]+", "+urls[1]+"]\n"+extra))
			h.scraped()
			body := func(s string, turn int) string {
				b := chatBody(emulatedModel, s, turn, tc.stream)
				if tc.stream {
					b = strings.Replace(b, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
				}
				return b
			}
			requests := func() []int64 {
				var n []int64
				for _, r := range h.status().Models[0].Replicas {
					n = append(n, r.Requests)
				}
				return n
			}
			// turn sends one turn and returns the replica that served it,
			// once the proxy has recorded its answer.
			turn := func(s string, k int) int {
				before := requests()
				if r := h.do("POST", "/v1/chat/completions", body(s, k), sessionHdr(s)); r.status != 200 {
					t.Fatalf("%s turn %d: status %d %s", s, k, r.status, r.body)
				}
				var served int
				h.waitFor("the answer recorded", func(st StatusReport) bool {
					for i, r := range st.Models[0].Replicas {
						if r.Requests > before[i] {
							served = i
							return true
						}
					}
					return false
				})
				return served
			}
			a0 := turn("a", 0)
			b0 := turn("b", 0)
			if a0 == b0 {
				t.Fatalf("a and b both homed on %d", a0)
			}
			if got := turn("a", 1); got != a0 {
				t.Fatalf("a's warm turn 1 on %d, want its home %d", got, a0)
			}
			if got := turn("b", 1); got != b0 {
				t.Fatalf("b's warm turn 1 on %d, want its home %d", got, b0)
			}
			flush(t, urls[a0])
			if got := turn("a", 2); got != a0 {
				t.Fatalf("a's turn 2 on %d: the proxy cannot know its home is cold before the answer", got)
			}
			if got := turn("b", 2); got != b0 {
				t.Fatalf("b (home still warm) turn 2 on %d, want %d", got, b0)
			}
			a3 := turn("a", 3)
			if got := turn("b", 3); got != b0 {
				t.Fatalf("b (home still warm) turn 3 on %d, want %d", got, b0)
			}
			st := h.status().Models[0]
			if !tc.moved {
				if a3 != a0 {
					t.Fatalf("rehome off: a's turn 3 on %d, want its home %d", a3, a0)
				}
				for i, r := range st.Replicas {
					if r.Rehomes != 0 || r.RehomedIn != 0 {
						t.Errorf("rehome off: replica %d rehomes %d, rehomed_in %d", i, r.Rehomes, r.RehomedIn)
					}
				}
				return
			}
			if a3 == a0 {
				t.Fatalf("a's turn 3 stayed on its flushed home %d", a0)
			}
			if got := turn("a", 4); got != a3 {
				t.Errorf("a's turn 4 on %d, want its new home %d", got, a3)
			}
			st = h.status().Models[0]
			if r := st.Replicas[a0]; r.Rehomes != 1 || r.ObservedCachedTokens == 0 || r.ObservedPromptTokens <= r.ObservedCachedTokens {
				t.Errorf("flushed home %d: rehomes %d, observed %d cached of %d, want 1 and some but not all cached",
					a0, r.Rehomes, r.ObservedCachedTokens, r.ObservedPromptTokens)
			}
			if r := st.Replicas[a3]; r.RehomedIn != 1 || r.Rehomes != 0 {
				t.Errorf("new home %d: rehomed_in %d, rehomes %d, want 1, 0", a3, r.RehomedIn, r.Rehomes)
			}
			h.waitMetrics(fmt.Sprintf(`warden_rehomes_total{model="%s",replica="%d"} 1`, emulatedModel, a0),
				fmt.Sprintf(`warden_requests_total{model="%s",reason="rehome",replica="%d"} 1`, emulatedModel, a3))
		})
	}
}

// TestEndSession: an explicit end of a conversation, by DELETE
// /v1/sessions/{id} on the admin address or by X-Warden-Session-End on
// its last turn, frees its home and footprint at once (without it the
// conversation stays homed for the TTL and held for its return timeout).
func TestEndSession(t *testing.T) {
	urls := startSmallEmulator(t)
	h := startProxy(t, modelsYAML("", "  - name: "+emulatedModel+"\n    replicas: ["+urls[0]+", "+urls[1]+"]\n"))
	h.scraped()
	sessions := func() (n, fp int) {
		for _, r := range h.status().Models[0].Replicas {
			n += r.Sessions
			fp += r.FootprintTokens
		}
		return n, fp
	}
	del := func(id string) int {
		req, _ := http.NewRequest("DELETE", h.admin+"/v1/sessions/"+id, nil)
		res, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if r := h.do("POST", "/v1/chat/completions", chatBody(emulatedModel, "a", 0, false), sessionHdr("a")); r.status != 200 {
		t.Fatalf("a: %d %s", r.status, r.body)
	}
	h.waitFor("a's answer recorded", func(st StatusReport) bool {
		fp := 0
		for _, r := range st.Models[0].Replicas {
			fp += r.FootprintTokens
		}
		return fp > 0
	})
	if n, _ := sessions(); n != 1 {
		t.Fatalf("%d sessions after a's first turn, want 1", n)
	}
	if got := del("a"); got != http.StatusNoContent {
		t.Fatalf("DELETE /v1/sessions/a: %d, want 204", got)
	}
	if n, fp := sessions(); n != 0 || fp != 0 {
		t.Errorf("after DELETE: %d sessions, footprint %d, want 0, 0", n, fp)
	}
	if got := del("a"); got != http.StatusNotFound {
		t.Errorf("DELETE of an unknown session: %d, want 404", got)
	}
	if got := del(strings.Repeat("x", 5000)); got != http.StatusBadRequest {
		t.Errorf("DELETE of an overlong id: %d, want 400", got)
	}

	// The header on a last turn.
	hdr := sessionHdr("b")
	if r := h.do("POST", "/v1/chat/completions", chatBody(emulatedModel, "b", 0, false), hdr); r.status != 200 {
		t.Fatalf("b: %d", r.status)
	}
	hdr[HeaderSessionEnd] = "true"
	if r := h.do("POST", "/v1/chat/completions", chatBody(emulatedModel, "b", 1, false), hdr); r.status != 200 {
		t.Fatalf("b's last turn: %d", r.status)
	}
	h.waitFor("b forgotten after its last turn", func(st StatusReport) bool {
		n, fp := 0, 0
		for _, r := range st.Models[0].Replicas {
			n += r.Sessions
			fp += r.FootprintTokens
		}
		return n == 0 && fp == 0
	})
}
