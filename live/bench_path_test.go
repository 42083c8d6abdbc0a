package live

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkProxyPath is one request through the proxy, unpaced, for CPU
// and allocation profiles of the request path (the client and the
// backend, in the same process, are counted too: compare runs, not
// absolute figures). json: a 64 KB or 256 KB chat request answered with a small
// JSON body; stream: a small request answered with 32 SSE events;
// answer-1MB: a small request answered with 1 MiB of JSON, more than a
// client's socket may hold unsent (upstream's clientNotSentLowat), so that the
// writes to the client wait for it as they do for a remote one.
//
//	go test -run '^$' -bench ProxyPath -benchmem -cpuprofile cpu.out ./live/
func BenchmarkProxyPath(b *testing.B) {
	var events strings.Builder
	for i := range 31 {
		fmt.Fprintf(&events, "data: {\"choices\":[{\"delta\":{\"content\":\"token %d\"}}]}\n\n", i)
	}
	events.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":31}}\n\ndata: [DONE]\n\n")
	for _, tc := range []struct {
		name   string
		size   int
		stream bool
		answer int // bytes of the JSON answer's content; 0: a small one
	}{{"json-64KB", 64 << 10, false, 0}, {"json-256KB", 256 << 10, false, 0}, {"stream", 1 << 10, true, 0}, {"answer-1MB", 1 << 10, false, 1 << 20}} {
		answer := `{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`
		if tc.answer > 0 {
			answer = `{"choices":[{"message":{"content":"` + strings.Repeat("y", tc.answer) + `"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`
		}
		b.Run(tc.name, func(b *testing.B) {
			backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/metrics" || r.URL.Path == "/health" {
					return
				}
				_, _ = io.Copy(io.Discard, r.Body)
				if tc.stream {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, events.String())
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, answer)
			}))
			defer backend.Close()
			h := startProxy(b, modelsYAML("limits: {max_body_bytes: 1MiB}\n", urlsModel(backend.URL)))
			body := fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":%q}]}`, testModel, tc.stream, strings.Repeat("x", tc.size-80))
			send := func(session int) {
				postTimed(b, h.client, h.url, body, "X-Claude-Code-Session-Id", "bench-"+strconv.Itoa(session%64))
			}
			send(0)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				send(i)
				i++
			}
		})
	}
}
