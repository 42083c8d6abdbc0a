package live

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Issue 35: the proxy survives a replica that misbehaves. badReplica is a
// hand-written replica on 127.0.0.1 that answers /health and /metrics as
// a healthy vLLM does and every inference request with misbehave, which
// writes raw bytes to the connection (what net/http's server would never
// send: an endless head, a status line without its end, a thousand 103s,
// a body trickled a byte at a time). misbehave returns when it is done or
// its connection fails; ended receives then.
type badReplica struct {
	ln    net.Listener
	wg    sync.WaitGroup
	ended chan struct{}

	mu    sync.Mutex
	conns []net.Conn
}

// misbehave answers one inference request on c (its body already read).
type misbehave func(c net.Conn)

func startBadReplica(t testing.TB, m misbehave) *badReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &badReplica{ln: ln, ended: make(chan struct{}, 64)}
	b.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			b.wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if _, err := io.Copy(io.Discard, req.Body); err != nil {
						return
					}
					switch req.URL.Path {
					case "/health":
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
						continue
					case "/metrics":
						page := "vllm:num_requests_running{engine=\"0\"} 0\n"
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(page), page)
						continue
					}
					m(c)
					b.ended <- struct{}{}
					return
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

// timedYAML is modelsYAML with more timeouts (e.g. "stream_idle: 300ms").
func timedYAML(timeouts, model string) string {
	return "client_api_keys: [" + testKey + "]\nscrape_interval: 50ms\ntimeouts: {drain: 5s, health: 1s, " + timeouts + "}\nmodels:\n" + model
}

func (b *badReplica) URL() string { return "http://" + b.ln.Addr().String() }

// waitEnded waits until the replica's answer to a request ended: it was
// done or the proxy closed its connection.
func (b *badReplica) waitEnded(t testing.TB) {
	t.Helper()
	select {
	case <-b.ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the replica's request was never ended: the proxy still holds it")
	}
}

// writeRepeated writes chunk to c until n bytes went out or a write
// fails (the proxy closed the connection); nothing is allocated per write.
func writeRepeated(c net.Conn, chunk []byte, n int) {
	for sent := 0; sent < n; sent += len(chunk) {
		if _, err := c.Write(chunk); err != nil {
			return
		}
	}
}

// hold blocks until the proxy closes c (or the test ends).
func hold(c net.Conn) { _, _ = io.Copy(io.Discard, c) }

// sendRaw sends a chat request through the proxy with a client that
// reads headers up to 64 MiB (more than net/http's 10 MB default, so that
// a relayed head is seen), and returns the answer or the failure.
func sendRaw(h *harness, path, body string) (resp, error) {
	req, err := http.NewRequest("POST", h.url+path, strings.NewReader(body))
	if err != nil {
		return resp{}, err
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	c := &http.Client{Timeout: 40 * time.Second, Transport: &http.Transport{MaxResponseHeaderBytes: 64 << 20, DisableKeepAlives: true}}
	defer c.CloseIdleConnections()
	res, err := c.Do(req)
	if err != nil {
		return resp{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: string(b)}, err
}

// allocated is the bytes allocated by the whole process so far.
func allocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// strikes is replica i's consecutive-failure count towards ejection.
func (h *harness) strikes(i int) int32 {
	return h.srv.state.Load().models[testModel].replicas[i].strikes.Load()
}

// TestReplyHeadBounded (issue 35, items 1 and 8): a replica whose reply
// head is endless, holds one 8 MiB header, has a status line that never
// ends, sends a flood of 103 Early Hints, or a status outside 100-599,
// gets the client a 502 in its API shape, takes a strike, and the proxy
// allocates a bounded amount whatever the replica sends (TotalAlloc of the
// whole process, the test's client included: a relayed 8 MiB header would
// be allocated by both). Before: memory grew with the head, the 8 MiB
// header and the 103s' final answer reached the client, the 600 too, and a
// 099 made the handler panic.
func TestReplyHeadBounded(t *testing.T) {
	big := bytes.Repeat([]byte("a"), 64<<10)
	headerLines := bytes.Repeat([]byte("X-Pad: 0123456789abcdef0123456789abcdef\r\n"), 1<<10)
	for _, tc := range []struct {
		name string
		m    misbehave
		api  string // "openai" or "anthropic"
	}{
		{"endless header block", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
			writeRepeated(c, headerLines, 32<<20)
			hold(c)
		}, "openai"},
		{"one 8 MiB header", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Big: ")
			writeRepeated(c, big, 8<<20)
			io.WriteString(c, "\r\nContent-Length: 2\r\n\r\n{}")
			hold(c)
		}, "anthropic"},
		{"status line without its end", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 ")
			writeRepeated(c, big, 32<<20)
			hold(c)
		}, "openai"},
		{"flood of 103 Early Hints", func(c net.Conn) {
			hints := []byte("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
			writeRepeated(c, hints, 1000*len(hints))
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			hold(c)
		}, "anthropic"},
		{"status 600", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 600 Beyond\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			hold(c)
		}, "openai"},
		{"status 099", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 099 Below\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			hold(c)
		}, "openai"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := startBadReplica(t, tc.m)
			h := startProxy(t, timedYAML("response_header: 30s", urlsModel(bad.URL())))
			h.scraped()
			path, body := "/v1/chat/completions", chatBody(testModel, "s", 0, false)
			if tc.api == "anthropic" {
				path, body = "/v1/messages", anthropicBody(testModel, "s", 0, false)
			}
			before := allocated()
			r, err := sendRaw(h, path, body)
			grew := allocated() - before
			if err != nil {
				t.Fatalf("the client got no answer: %v", err)
			}
			shaped := isOpenAIError(r.body)
			if tc.api == "anthropic" {
				shaped = anthropicErrorType(r.body) == "api_error"
			}
			if r.status != http.StatusBadGateway || !shaped {
				t.Errorf("status %d, body %.200q: want 502 in the %s shape", r.status, r.body, tc.api)
			}
			if n := len(r.header.Get("X-Big")) + len(r.header.Get("X-Pad")); n > 0 {
				t.Errorf("%d bytes of the replica's head reached the client", n)
			}
			t.Logf("the process allocated %d KiB during the request", grew>>10)
			if grew > 8<<20 {
				t.Errorf("the process allocated %d MiB for one request: the reply head is not bounded", grew>>20)
			}
			bad.waitEnded(t) // the proxy closed the connection
			if s := h.strikes(0); s != 1 {
				t.Errorf("replica strikes = %d, want 1", s)
			}
			h.waitMetrics(`warden_upstream_errors_total{kind="protocol",model="qwen",replica="0"} 1`)
		})
	}
}

// TestEveryReplyIsTimed (issue 35, item 2): a reply is timed after its
// headers whatever it is. A JSON answer that stalls, an event stream sent
// to a request that did not ask for one, a body trickled a byte at a time
// and a stream's JSON error that stalls all end within the timeouts, the
// replica's request ends (its connection is closed) and the replica takes
// a strike; the client gets 504 in its shape when nothing was sent yet,
// else the stream's error event or a cut connection (nothing is sent of
// a JSON answer before 32 KiB of it or its end: issue 46 item 8, where
// one that stalled midway ended with an empty reply). Before: the
// watchdog stopped at the headers unless the reply was the event stream
// a stream asked for, and each of these held its slot until the client
// gave up.
func TestEveryReplyIsTimed(t *testing.T) {
	jsonHead := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
	for _, tc := range []struct {
		name    string
		stream  bool
		m       misbehave
		status  int    // 0: the body must fail (the connection cut midway)
		want    string // in the body
		mustNot string
	}{
		{"json stalls after its headers", false, func(c net.Conn) {
			io.WriteString(c, jsonHead)
			hold(c)
		}, 504, `"code":"upstream_timeout"`, ""},
		// Issue 46 item 8: the client has had nothing of a JSON answer
		// that stalls within its first 32 KiB: 504, not an empty reply.
		{"json stalls midway", false, func(c net.Conn) {
			io.WriteString(c, jsonHead+`{"id":"x",`)
			hold(c)
		}, 504, `"code":"upstream_timeout"`, ""},
		{"json stalls after 40 KiB", false, func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"id\":\""+strings.Repeat("x", 40<<10))
			hold(c)
		}, 0, "", ""},
		{"event stream to stream:false", false, func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
			hold(c)
		}, 200, `data: {"error":{`, "[DONE]"},
		{"body trickled a byte at a time", false, func(c net.Conn) {
			io.WriteString(c, jsonHead)
			for range 1000 {
				if _, err := io.WriteString(c, " "); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}, 504, `"code":"upstream_timeout"`, ""},
		{"event stream trickled without ending an event", true, func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
			io.WriteString(c, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0\"}}]}\n\n")
			for range 1000 {
				if _, err := io.WriteString(c, "x"); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}, 200, `data: {"error":{`, "[DONE]"},
		{"a stream's json error stalls", true, func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
			hold(c)
		}, 504, `"code":"upstream_timeout"`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := startBadReplica(t, tc.m)
			h := startProxy(t, timedYAML("stream_idle: 300ms", urlsModel(bad.URL())))
			h.scraped()
			r, err := sendRaw(h, "/v1/chat/completions", chatBody(testModel, "s", 0, tc.stream))
			switch {
			case tc.status == 0:
				if err == nil {
					t.Errorf("status %d body %.100q: want the answer cut midway", r.status, r.body)
				}
			case err != nil:
				t.Fatalf("the client got no answer: %v", err)
			case r.status != tc.status || !strings.Contains(r.body, tc.want) || tc.mustNot != "" && strings.Contains(r.body, tc.mustNot):
				t.Errorf("status %d body %.300q, want %d with %s", r.status, r.body, tc.status, tc.want)
			}
			bad.waitEnded(t)
			if s := h.strikes(0); s != 1 {
				t.Errorf("replica strikes = %d, want 1", s)
			}
			h.waitMetrics(`warden_upstream_errors_total{kind="timeout",model="qwen",replica="0"} 1`)
		})
	}
}

// TestEncodedReplyPassesThrough (issue 35, item 5): whatever the replica
// encodes reaches the client untouched: a gzip event stream is neither
// read for its events nor ended with an error event, and a gzip JSON
// answer passes as it is. Before: the gzip stream was replaced by "ended
// the stream early".
func TestEncodedReplyPassesThrough(t *testing.T) {
	gz := func(s string) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		io.WriteString(w, s)
		w.Close()
		return b.Bytes()
	}
	events := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name, ctype string
		stream      bool
		body        []byte
	}{
		{"gzip event stream", "text/event-stream", true, gz(events)},
		{"gzip json", "application/json", false, gz(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)},
		{"br event stream", "text/event-stream", true, []byte("\x0b\x02\x80not really brotli, but opaque bytes")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc := "gzip"
			if strings.HasPrefix(tc.name, "br") {
				enc = "br"
			}
			bad := startBadReplica(t, func(c net.Conn) {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Encoding: %s\r\nTransfer-Encoding: chunked\r\n\r\n", tc.ctype, enc)
				for i := 0; i < len(tc.body); i += 7 { // in small chunks, as a stream comes
					chunk := tc.body[i:min(i+7, len(tc.body))]
					fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk)
				}
				io.WriteString(c, "0\r\n\r\n")
				hold(c)
			})
			h := startProxy(t, modelsYAML("", urlsModel(bad.URL())))
			h.scraped()
			req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(chatBody(testModel, "s", 0, tc.stream)))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Accept-Encoding", enc) // set by hand: the client does not decode it
			res, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil || res.StatusCode != 200 || res.Header.Get("Content-Encoding") != enc {
				t.Fatalf("status %d, Content-Encoding %q, err %v", res.StatusCode, res.Header.Get("Content-Encoding"), err)
			}
			if !bytes.Equal(got, tc.body) {
				t.Errorf("the client got %d bytes %.120q, want the replica's %d bytes untouched", len(got), got, len(tc.body))
			}
			if s := h.strikes(0); s != 0 {
				t.Errorf("replica strikes = %d after a good answer", s)
			}
		})
	}
}

// TestStallAfterFirstEvent (issue 46, item 1): vLLM sends a stream's
// first event only with the request's first output (the role chunk,
// message_start, a completion's first text; for the Responses API the
// events after response.created and response.in_progress), so a replica
// that sends it and then goes silent has stalled: it is cut after
// stream_idle, not first_token, with the stream's error event naming
// stream_idle, and takes a strike. A Responses stream that only opened
// (response.created, response.in_progress) is still in its prefill:
// first_token holds. Before: every stream below waited for first_token
// (5 min by default), and the replica took its strike only then.
func TestStallAfterFirstEvent(t *testing.T) {
	const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
	responsesOpen := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"status\":\"in_progress\"}}\n\n" +
		"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"status\":\"in_progress\"}}\n\n"
	for _, tc := range []struct {
		name, path, body, events string
		want                     string // the timeout the error event names
	}{
		{"chat role chunk", "/v1/chat/completions", chatBody(testModel, "s", 0, true),
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
			"timeouts.stream_idle"},
		{"completion first text", "/v1/completions", `{"model":"` + testModel + `","prompt":"hi","stream":true}`,
			"data: {\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n",
			"timeouts.stream_idle"},
		{"anthropic message_start", "/v1/messages", anthropicBody(testModel, "s", 0, true),
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\n",
			"timeouts.stream_idle"},
		{"responses output item", "/v1/responses", responsesBody(testModel, "s", true),
			responsesOpen + "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"type\":\"message\"}}\n\n",
			"timeouts.stream_idle"},
		{"responses opened only", "/v1/responses", responsesBody(testModel, "s", true), responsesOpen,
			"timeouts.first_token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := startBadReplica(t, func(c net.Conn) {
				io.WriteString(c, sseHead+tc.events)
				hold(c)
			})
			h := startProxy(t, timedYAML("stream_idle: 200ms, first_token: 1s", urlsModel(bad.URL())))
			h.scraped()
			r, err := sendRaw(h, tc.path, tc.body)
			if err != nil {
				t.Fatalf("the client got no answer: %v", err)
			}
			if r.status != http.StatusOK || !strings.HasPrefix(r.body, tc.events) || !strings.Contains(r.body, "error") {
				t.Errorf("status %d body %.400q: want the replica's events, then the stream's error event", r.status, r.body)
			}
			if !strings.Contains(r.body, tc.want) {
				t.Errorf("the stream ended with %q: want the error naming %s", r.body[min(len(tc.events), len(r.body)):], tc.want)
			}
			bad.waitEnded(t)
			if s := h.strikes(0); s != 1 {
				t.Errorf("replica strikes = %d, want 1", s)
			}
		})
	}
}

// TestResponsesErrorEventSequenced (issue 50, item 4): the error event
// that ends a Responses stream the replica broke carries every field the
// SDKs' ResponseErrorEvent requires, sequence_number included, numbered
// after the replica's last event (0 when it sent none). Before: no
// sequence_number, which the SDKs' types require.
func TestResponsesErrorEventSequenced(t *testing.T) {
	const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
	for _, tc := range []struct {
		name   string
		events string
		want   int64
	}{
		{"after three events", "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{}}\n\n" +
			"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{}}\n\n" +
			"event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{}}\n\n", 3},
		{"before any event", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := startBadReplica(t, func(c net.Conn) { io.WriteString(c, sseHead+tc.events) }) // then the connection closes
			h := startProxy(t, timedYAML("stream_idle: 200ms", urlsModel(bad.URL())))
			h.scraped()
			r, err := sendRaw(h, "/v1/responses", responsesBody(testModel, "s", true))
			if err != nil {
				t.Fatal(err)
			}
			rest, ok := strings.CutPrefix(r.body, tc.events)
			data, found := strings.CutPrefix(rest, "event: error\ndata: ")
			if !ok || !found {
				t.Fatalf("body %q: want the replica's events, then an error event", r.body)
			}
			var ev map[string]json.RawMessage
			if err := json.Unmarshal([]byte(strings.TrimSpace(data)), &ev); err != nil {
				t.Fatalf("error event %q: %v", data, err)
			}
			for _, k := range []string{"type", "code", "message", "param", "sequence_number"} {
				if _, ok := ev[k]; !ok {
					t.Errorf("error event %s lacks %s (required by the SDKs' ResponseErrorEvent)", data, k)
				}
			}
			if got := string(ev["sequence_number"]); got != strconv.FormatInt(tc.want, 10) {
				t.Errorf("sequence_number %s, want %d", got, tc.want)
			}
		})
	}
}

// TestAnthropicNotFoundInItsShape (issue 50, item 4): a replica without
// /v1/messages/count_tokens (vLLM before pull request 35588) answers 404
// in FastAPI's shape, {"detail":"Not Found"}; the client gets a 404 in
// the Anthropic shape (not_found_error) that says why. A 404 the replica
// gave in the Anthropic shape (an unknown model) passes as it came.
// Before: FastAPI's body reached the Anthropic client.
func TestAnthropicNotFoundInItsShape(t *testing.T) {
	anthropic404 := `{"type":"error","error":{"type":"not_found_error","message":"The model x does not exist."}}`
	for _, tc := range []struct {
		name, reply, want string
	}{
		{"no route", `{"detail":"Not Found"}`, "count_tokens"},
		{"anthropic shape", anthropic404, anthropic404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := startBadReplica(t, func(c net.Conn) {
				fmt.Fprintf(c, "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(tc.reply), tc.reply)
				hold(c)
			})
			h := startProxy(t, timedYAML("stream_idle: 5s", urlsModel(bad.URL())))
			h.scraped()
			r, err := sendRaw(h, "/v1/messages/count_tokens", `{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}]}`)
			if err != nil {
				t.Fatal(err)
			}
			if r.status != http.StatusNotFound || anthropicErrorType(r.body) != "not_found_error" || !strings.Contains(r.body, tc.want) {
				t.Errorf("%d %s: want 404 not_found_error with %q", r.status, r.body, tc.want)
			}
		})
	}
}
