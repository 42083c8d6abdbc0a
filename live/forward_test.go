package live

import (
	"bufio"
	"github.com/lm-warden/warden/live/internal/rawbackend"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// probeOK answers the proxy's /health and /metrics probes of a raw
// backend; it reports whether req was one.
func probeOK(w *bufio.Writer, req *http.Request) bool {
	if req.URL.Path == "/health" || req.URL.Path == "/metrics" {
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
		return true
	}
	return false
}

// postChat sends a chat request and returns the response unread, for the
// tests that look at its trailers or at how its body ends.
func postChat(h *harness) (*http.Response, error) {
	req, err := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(chatBody(testModel, "s", 0, false)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	return h.client.Do(req)
}

// TestForwardHeaders: what the replica gets of the client's headers (the
// hop-by-hop ones and those the proxy owns are not passed on, its own
// are set) and what the client gets of the replica's.
func TestForwardHeaders(t *testing.T) {
	var mu sync.Mutex
	var got *http.Request
	srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, n int) bool {
		if probeOK(w, req) {
			return true
		}
		mu.Lock()
		got = req
		mu.Unlock()
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-End: yes\r\nContent-Length: 11\r\n\r\n" + rawbackend.OK)
		return true
	})
	h := startProxy(t, modelsYAML("", urlsModel(srv.URL())))
	r := h.do("POST", "/v1/chat/completions?trace=1", chatBody(testModel, "s", 0, false), map[string]string{
		"Connection":               "X-Client-Hop",
		"X-Client-Hop":             "1",
		"Proxy-Authorization":      "Basic eA==",
		"Te":                       "trailers",
		"Upgrade":                  "h2c",
		"X-Data-Parallel-Rank":     "7",
		"X-Forwarded-For":          "6.6.6.6",
		"X-Forwarded-Host":         "evil.example",
		"X-Claude-Code-Session-Id": "s",
	})
	if r.status != 200 || r.body != rawbackend.OK {
		t.Fatalf("got %d %q", r.status, r.body)
	}
	if r.header.Get("X-End") != "yes" || r.header.Get("X-Hop") != "" || r.header.Get("Keep-Alive") != "" {
		t.Errorf("client got response headers %v", r.header)
	}
	mu.Lock()
	defer mu.Unlock()
	if got == nil {
		t.Fatal("the replica got no request")
	}
	want := map[string]string{
		"X-Client-Hop":             "",
		"Proxy-Authorization":      "",
		"Upgrade":                  "",
		"Authorization":            "", // the client's key is the proxy's, not the replica's
		"X-Data-Parallel-Rank":     "", // only ever the proxy's; this replica has no rank
		"Te":                       "trailers",
		"X-Forwarded-For":          "127.0.0.1",
		"X-Forwarded-Host":         strings.TrimPrefix(h.url, "http://"),
		"X-Forwarded-Proto":        "http",
		"X-Claude-Code-Session-Id": "s",
		"Content-Type":             "application/json",
	}
	for k, v := range want {
		if g := strings.Join(got.Header.Values(k), ","); g != v {
			t.Errorf("replica got %s: %q, want %q", k, g, v)
		}
	}
	if got.URL.RawQuery != "trace=1" || got.URL.Path != "/v1/chat/completions" {
		t.Errorf("replica got %s", got.URL)
	}
	if got.Host != strings.TrimPrefix(srv.URL(), "http://") {
		t.Errorf("replica got Host %q", got.Host)
	}
}

// TestForwardTrailers: a replica's trailers reach the client.
func TestForwardTrailers(t *testing.T) {
	srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, n int) bool {
		if probeOK(w, req) {
			return true
		}
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTrailer: X-Checksum\r\nTransfer-Encoding: chunked\r\n\r\nb\r\n" + rawbackend.OK + "\r\n0\r\nX-Checksum: abc\r\n\r\n")
		return true
	})
	h := startProxy(t, modelsYAML("", urlsModel(srv.URL())))
	res, err := postChat(h)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || string(b) != rawbackend.OK {
		t.Fatalf("body %q, %v", b, err)
	}
	if res.Trailer.Get("X-Checksum") != "abc" {
		t.Errorf("trailers %v, want X-Checksum: abc", res.Trailer)
	}
}

// TestForwardTornBody: a replica that dies inside a JSON body leaves the
// client with a broken connection, or, when none of the body had reached
// it (a Content-Length body within the first 32 KiB), a 502 in its shape;
// never a short body it could take for the whole answer: with a
// Content-Length, and chunked (where ending the handler normally would
// end the chunked body cleanly).
func TestForwardTornBody(t *testing.T) {
	for _, tc := range []struct{ name, answer string }{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"choices\":"},
		{"chunked", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nb\r\n{\"choices\":\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, n int) bool {
				if probeOK(w, req) {
					return true
				}
				w.WriteString(tc.answer)
				return false
			})
			h := startProxy(t, modelsYAML("", urlsModel(srv.URL())))
			res, err := postChat(h)
			if err != nil {
				return // the connection broke before the head: as good
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			if err == nil && !(res.StatusCode == http.StatusBadGateway && isOpenAIError(string(b))) {
				t.Fatalf("read a torn body as whole: %d %q", res.StatusCode, b)
			}
		})
	}
}
