package live

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Every line ending the SSE standard allows ends an event for the proxy: it
// passes a complete event on at once (not at the end of the stream), and
// when the backend dies mid-event the client keeps the complete ones and
// gets the error event, not the torn one.
func TestStreamLineEndings(t *testing.T) {
	for _, tc := range []struct{ name, nl, blank string }{
		{"LF", "\n", "\n"},
		{"CRLF", "\r\n", "\r\n"},
		{"CR", "\r", "\r"},
		{"LF then CRLF", "\n", "\r\n"},
		{"CRLF then CR", "\r\n", "\r"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := "data: {\"choices\":[{\"delta\":{\"content\":\"t0\"}}]}" + tc.nl + tc.blank
			release := make(chan struct{})
			backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/chat/completions" {
					return // /metrics and /health
				}
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, first)
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"torn")
				// The handler returns mid-event: the stream ends early.
			}))
			defer backend.Close()
			h := startProxy(t, modelsYAML("", urlsModel(backend.URL)))
			req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(chatBody(testModel, "e", 0, true)))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Claude-Code-Session-Id", "e")
			res, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			got := make(chan string, 1)
			go func() {
				var b []byte
				buf := make([]byte, 4096)
				for len(b) < len(first) {
					n, err := res.Body.Read(buf)
					b = append(b, buf[:n]...)
					if err != nil {
						break
					}
				}
				got <- string(b)
			}()
			select {
			case b := <-got:
				if b != first {
					t.Fatalf("first read %q, want the first event %q", b, first)
				}
			case <-time.After(10 * time.Second):
				close(release)
				t.Fatalf("the proxy held back a complete event ending in %q", tc.nl+tc.blank)
			}
			close(release)
			rest, _ := io.ReadAll(res.Body)
			if strings.Contains(string(rest), "torn") || !strings.HasPrefix(string(rest), "data: {\"error\":{") && !strings.HasPrefix(string(rest), "\ndata: {\"error\":{") {
				t.Errorf("after the first event %q, want the error event and no torn event", rest)
			}
		})
	}
}
