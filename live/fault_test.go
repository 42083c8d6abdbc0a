package live

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/lm-warden/warden/internal/fakevllm"
	"github.com/lm-warden/warden/live/upstream"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStalledReplicaTimesOutAndIsEjected: a replica that sent its headers
// (and for stream_idle one token) then went silent, /health still OK. The
// client gets the API's error event and no normal end, the backend request
// is cancelled, and after ejectConsecutive timeouts the replica is ejected
// so that new sessions go to the good one.
func TestStalledReplicaTimesOutAndIsEjected(t *testing.T) {
	for _, tc := range []struct {
		name             string
		stall            fakevllm.Stall
		path             string
		body             func(s string) string
		wantErr, mustNot string
		wantStatus       int
	}{
		{"first_token/openai", fakevllm.StallAfterHeaders, "/v1/chat/completions", func(s string) string { return chatBody(testModel, s, 0, true) },
			`data: {"error":{`, "[DONE]", 200},
		{"stream_idle/openai", fakevllm.StallAfterToken, "/v1/chat/completions", func(s string) string { return chatBody(testModel, s, 0, true) },
			`data: {"error":{`, "[DONE]", 200},
		{"stream_idle/anthropic", fakevllm.StallAfterToken, "/v1/messages", func(s string) string { return anthropicBody(testModel, s, 0, true) },
			"event: error\ndata: {\"type\":\"error\"", "message_stop", 200},
		{"first_token/no-headers", fakevllm.StallNoHeaders, "/v1/chat/completions", func(s string) string { return chatBody(testModel, s, 0, true) },
			`"code":"upstream_timeout"`, "[DONE]", 504},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad, good := fakevllm.New(t, 1), fakevllm.New(t, 1)
			bad.Stall = tc.stall
			h := startProxy(t, "client_api_keys: ["+testKey+"]\nscrape_interval: 50ms\n"+
				"timeouts: {drain: 5s, health: 1s, first_token: 300ms, stream_idle: 300ms}\nmodels:\n"+urlsModel(bad.URL(), good.URL()))
			h.scraped()
			stalled := 0
			for i := 0; i < 40 && stalled < ejectConsecutive; i++ {
				s := fmt.Sprintf("s%d", i)
				r := h.do("POST", tc.path, tc.body(s), sessionHdr(s))
				if r.status == 200 && !strings.Contains(r.body, tc.wantErr) {
					continue // served by the good replica
				}
				stalled++
				if r.status != tc.wantStatus || !strings.Contains(r.body, tc.wantErr) || strings.Contains(r.body, tc.mustNot) {
					t.Fatalf("stalled request: status %d body %q, want %d, an error event and no %s", r.status, r.body, tc.wantStatus, tc.mustNot)
				}
				select {
				case <-bad.Canceled:
				case <-time.After(10 * time.Second):
					t.Fatal("the stalled backend request was not cancelled")
				}
			}
			if stalled < ejectConsecutive {
				t.Fatalf("only %d requests reached the stalled replica", stalled)
			}
			h.waitFor("the stalled replica ejected", func(st StatusReport) bool {
				return st.Models[0].Replicas[0].State == "ejected"
			})
			hits := bad.Hits.Load()
			for i := range 4 {
				s := fmt.Sprintf("after%d", i)
				if r := h.do("POST", tc.path, tc.body(s), sessionHdr(s)); r.status != 200 || strings.Contains(r.body, tc.wantErr) {
					t.Fatalf("after ejection: status %d body %q, want a good answer", r.status, r.body)
				}
			}
			if bad.Hits.Load() != hits {
				t.Errorf("new sessions still reach the ejected replica")
			}
			h.waitMetrics(`kind="timeout",model="qwen",replica="0"}`, `warden_ejections_total{model="qwen",replica="0"} 1`)
		})
	}
}

// TestHealthDownWhileWaitingForHeadersRetries: a request waits for headers
// on a replica that /health then marks down; no byte reached the client, so
// it is retried on the other replica and succeeds.
func TestHealthDownWhileWaitingForHeadersRetries(t *testing.T) {
	bad, good := fakevllm.New(t, 1), fakevllm.New(t, 1)
	bad.Stall = fakevllm.StallNoHeaders
	h := startProxy(t, "client_api_keys: ["+testKey+"]\nscrape_interval: 50ms\ntrusted_pin_header: X-Warden-Replica\n"+
		"timeouts: {drain: 5s, health: 1s}\nmodels:\n"+urlsModel(bad.URL(), good.URL()))
	h.scraped()
	hdr := sessionHdr("hd")
	hdr["X-Warden-Replica"] = "0"
	done := h.doAsync("/v1/chat/completions", chatBody(testModel, "hd", 0, true), hdr)
	deadline := time.Now().Add(10 * time.Second)
	for bad.Hits.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request never reached replica 0")
		}
		time.Sleep(5 * time.Millisecond)
	}
	bad.HealthDown.Store(true)
	var r resp
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the request still waits on the replica health marked down")
	}
	if r.status != 200 || !strings.Contains(r.body, "[DONE]") {
		t.Fatalf("status %d body %q, want success on the other replica", r.status, r.body)
	}
	if sum(good.Served()) != 1 {
		t.Errorf("good replica served %d, want 1", sum(good.Served()))
	}
	h.waitMetrics(`warden_requests_total{model="qwen",reason="retried",replica="1"} 1`)
}

// TestOverloadAnswersAtOnce: with limits.max_in_flight requests held, a
// burst more is answered at once, while those are still held, in each
// API's shape: 429 rate_limit_error (OpenAI) and 529 overloaded_error
// (Anthropic), with Retry-After (issue 13, fault 5).
func TestOverloadAnswersAtOnce(t *testing.T) {
	a := fakevllm.New(t, 1)
	a.Hold = make(chan struct{})
	h := startProxy(t, modelsYAML("limits: {max_in_flight: 2}\n", urlsModel(a.URL())))
	var held [2]<-chan resp
	for i := range held {
		s := fmt.Sprintf("held%d", i)
		held[i] = h.doAsync("/v1/chat/completions", chatBody(testModel, s, 0, true), sessionHdr(s))
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Hits.Load() < 2 {
		if time.Now().After(deadline) {
			close(a.Hold)
			t.Fatal("the held requests never reached the backend")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := range 6 {
		s := fmt.Sprintf("burst%d", i)
		if i%2 == 0 {
			r := h.do("POST", "/v1/chat/completions", chatBody(testModel, s, 0, true), sessionHdr(s))
			var v openAIError
			_ = json.Unmarshal([]byte(r.body), &v)
			if r.status != 429 || v.Error.Type != "rate_limit_error" || r.header.Get("Retry-After") == "" {
				t.Errorf("OpenAI over the limit: status %d Retry-After %q body %s, want 429 rate_limit_error with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
			}
		} else {
			r := h.do("POST", "/v1/messages", anthropicBody(testModel, s, 0, true), sessionHdr(s))
			if r.status != 529 || anthropicErrorType(r.body) != "overloaded_error" || r.header.Get("Retry-After") == "" {
				t.Errorf("Anthropic over the limit: status %d Retry-After %q body %s, want 529 overloaded_error with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
			}
		}
	}
	if n := a.Hits.Load(); n != 2 {
		t.Errorf("backend got %d requests, want only the 2 held", n)
	}
	close(a.Hold)
	for _, c := range held {
		if r := <-c; r.status != 200 || !strings.Contains(r.body, "[DONE]") {
			t.Errorf("held request: status %d body %q, want a whole stream", r.status, r.body)
		}
	}
	// Below the limit again: served.
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "later", 0, false), sessionHdr("later")); r.status != 200 {
		t.Errorf("after the burst: status %d, want 200", r.status)
	}
	h.waitMetrics(`warden_rejected_total{reason="overloaded"} 6`)
}

// TestDeclaredLengthIsNotAllocatedUpFront: a request that declares a
// 16 MiB body and sends 1 KiB must not make the proxy allocate 16 MiB.
func TestDeclaredLengthIsNotAllocatedUpFront(t *testing.T) {
	a := fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())))
	addr := strings.TrimPrefix(h.url, "http://")
	once := func() string {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", testKey, 16<<20)
		_, _ = conn.Write([]byte(`{"model":"qwen","messages":[` + strings.Repeat(" ", 1000)))
		_ = conn.(*net.TCPConn).CloseWrite()
		b, _ := io.ReadAll(conn)
		return string(b)
	}
	once() // warm up connections and pools
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	out := once()
	runtime.ReadMemStats(&after)
	if !strings.HasPrefix(out, "HTTP/1.1 400") {
		t.Fatalf("answer %q, want 400 (short body)", out)
	}
	d := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d bytes", d)
	if d > 8<<20 {
		t.Errorf("one request declaring 16 MiB and sending 1 KiB allocated %d bytes, want far less than 16 MiB", d)
	}
}

// doAsync sends a request from another goroutine (where t.Fatal must not
// be called): a transport error comes back as status -1 and its text.
func (h *harness) doAsync(path, body string, hdr map[string]string) <-chan resp {
	out := make(chan resp, 1)
	go func() {
		req, err := http.NewRequest("POST", h.url+path, strings.NewReader(body))
		if err != nil {
			out <- resp{status: -1, body: err.Error()}
			return
		}
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := h.client.Do(req)
		if err != nil {
			out <- resp{status: -1, body: err.Error()}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			out <- resp{status: -1, body: err.Error()}
			return
		}
		out <- resp{status: res.StatusCode, header: res.Header, body: string(b)}
	}()
	return out
}

// TestDrainDeadlineEndsStreamsWithErrorEvent: a stream still running at the
// drain deadline ends with the API's error event and a proper end of the
// chunked body, not a torn connection (issue 13, fault 4).
func TestDrainDeadlineEndsStreamsWithErrorEvent(t *testing.T) {
	for _, tc := range []struct{ path, body, wantErr, mustNot string }{
		{"/v1/chat/completions", chatBody(testModel, "dd", 0, true), `data: {"error":{`, "[DONE]"},
		{"/v1/messages", anthropicBody(testModel, "dd", 0, true), "event: error\ndata: {\"type\":\"error\"", "message_stop"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			a := fakevllm.New(t, 1)
			a.Hold = make(chan struct{})
			defer close(a.Hold)
			h := startProxy(t, "client_api_keys: ["+testKey+"]\nscrape_interval: 50ms\ntimeouts: {drain: 200ms, health: 1s}\nmodels:\n"+urlsModel(a.URL()))
			got := h.doAsync(tc.path, tc.body, sessionHdr("dd"))
			h.waitFor("a stream at the backend", func(StatusReport) bool { return a.Hits.Load() == 1 })
			if err := h.stop(); err != nil {
				t.Logf("Serve: %v", err)
			}
			var r resp
			select {
			case r = <-got:
			case <-time.After(15 * time.Second):
				t.Fatal("the stream did not end at the drain deadline")
			}
			if r.status != 200 || !strings.Contains(r.body, tc.wantErr) || strings.Contains(r.body, tc.mustNot) || !strings.HasSuffix(r.body, "\n\n") {
				t.Fatalf("stream at the drain deadline: status %d body %q, want whole events ending in an error event, no %s", r.status, r.body, tc.mustNot)
			}
		})
	}
}

// TestBodiesInFlightBounded (issue 46, item 5): limits.max_body_bytes_in_flight
// bounds the request bodies the whole proxy holds. 24 clients send a
// body of 16 MiB minus one byte at once to a replica that takes them and
// never answers, so that every body admitted stays held; with a budget of
// 48 MiB (two 16 MiB buffers and the room to grow a third) the heap the
// proxy holds stays within it and the client's memory-pool slack, and the
// other clients are answered at once in their API's shape: 429
// rate_limit_error (OpenAI) or 529 overloaded_error (Anthropic), with
// Retry-After. A body larger than the budget alone gets 413. Before: every
// body was admitted (24 held, the heap 414 MiB larger; 40 took the proxy
// from 47 MB to 707 MB in the issue).
func TestBodiesInFlightBounded(t *testing.T) {
	const clients, size, budget = 24, 16<<20 - 1, 48 << 20
	held := make(chan struct{}, clients)
	bad := startBadReplica(t, func(c net.Conn) {
		held <- struct{}{}
		hold(c)
	})
	// Scrapes far apart: a probe that the flood delays past 50 ms would
	// mark the replica down, and least-loaded: placement would refuse
	// the fourth 4M-token conversation on its footprint. Neither is what
	// is tested here.
	h := startProxy(t, "limits: {max_body_bytes_in_flight: 48MiB}\n"+strings.Replace(
		timedYAML("read: 30s", urlsModel(bad.URL())+"    strategy: least-loaded\n"), "scrape_interval: 50ms", "scrape_interval: 5s", 1))
	h.scraped()
	body := sizedChat(`{"model":"`+testModel+`","messages":[{"role":"user","content":"`, size)
	anthropic := sizedChat(`{"model":"`+testModel+`","max_tokens":1,"messages":[{"role":"user","content":"`, size)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	type answer struct {
		status     int
		retryAfter string
		body       string
		anthropic  bool
	}
	answers := make(chan answer, clients)
	client := &http.Client{Timeout: 60 * time.Second}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			b, path := body, "/v1/chat/completions"
			if i%2 == 1 {
				b, path = anthropic, "/v1/messages"
			}
			req, _ := http.NewRequest("POST", h.url+path, bytes.NewReader(b))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/json")
			res, err := client.Do(req)
			if err != nil {
				answers <- answer{status: -1, body: err.Error(), anthropic: i%2 == 1}
				return
			}
			rb, _ := io.ReadAll(res.Body)
			res.Body.Close()
			answers <- answer{res.StatusCode, res.Header.Get("Retry-After"), string(rb), i%2 == 1}
		})
	}
	// Every client is either held at the replica or answered.
	var got []answer
	nHeld := 0
	deadline := time.After(60 * time.Second)
	for nHeld+len(got) < clients {
		select {
		case <-held:
			nHeld++
		case a := <-answers:
			got = append(got, a)
		case <-deadline:
			t.Fatalf("%d clients held, %d answered of %d: the rest hang", nHeld, len(got), clients)
		}
	}
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	grew := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d bodies held at the replica, %d clients answered; heap grew by %d MiB", nHeld, len(got), grew>>20)
	if grew > budget+upstream.MaxFreeBody+8<<20 {
		t.Errorf("the heap grew by %d MiB with %d bodies held: want at most the budget, 48 MiB, and the free buffers' 32 MiB", grew>>20, nHeld)
	}
	if nHeld == 0 || nHeld > 3 {
		t.Errorf("%d bodies of 16 MiB admitted with a 48 MiB budget", nHeld)
	}
	for _, a := range got {
		want, shaped := http.StatusTooManyRequests, isOpenAIError(a.body) && strings.Contains(a.body, "rate_limit_error")
		if a.anthropic {
			want, shaped = 529, anthropicErrorType(a.body) == "overloaded_error"
		}
		if a.status != want || !shaped || a.retryAfter != "1" || !strings.Contains(a.body, "max_body_bytes_in_flight") {
			t.Errorf("a client over the budget got %d (Retry-After %q) %.200q: want %d in its shape with Retry-After: 1", a.status, a.retryAfter, a.body, want)
		}
	}
	bad.ln.Close()
	bad.mu.Lock()
	for _, c := range bad.conns {
		c.Close()
	}
	bad.mu.Unlock()
	wg.Wait()
}

// sizedChat is a chat request of size bytes: prefix, then one long
// message.
func sizedChat(prefix string, size int) []byte {
	return []byte(prefix + strings.Repeat("x", size-len(prefix)-4) + `"}]}`)
}

// TestBodyAloneOverBudget (issue 46, item 5): a body larger than
// limits.max_body_bytes_in_flight by itself can never be held: 413 in the
// client's shape, whether its Content-Length says so (before it is read)
// or it is chunked and grows past the budget. Before: no budget.
func TestBodyAloneOverBudget(t *testing.T) {
	good := fakevllm.New(t, 1)
	h := startProxy(t, "limits: {max_body_bytes_in_flight: 1MiB}\n"+modelsYAML("", urlsModel(good.URL())))
	body := sizedChat(`{"model":"`+testModel+`","messages":[{"role":"user","content":"`, 2<<20)
	for _, chunked := range []bool{false, true} {
		req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", bytes.NewReader(body))
		if chunked {
			req, _ = http.NewRequest("POST", h.url+"/v1/chat/completions", io.MultiReader(bytes.NewReader(body))) // no length: chunked
		}
		req.Header.Set("Authorization", "Bearer "+testKey)
		res, err := h.client.Do(req)
		if err != nil {
			t.Fatalf("chunked %v: %v", chunked, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusRequestEntityTooLarge || !isOpenAIError(string(b)) || !strings.Contains(string(b), "max_body_bytes_in_flight") {
			t.Errorf("chunked %v: %d %.200q, want 413 naming limits.max_body_bytes_in_flight", chunked, res.StatusCode, b)
		}
	}
	// A body that fits is served.
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "s", 0, false), nil); r.status != http.StatusOK {
		t.Errorf("a small body: %d %s", r.status, r.body)
	}
}

// TestBodyGivenBackOnceAnswered (issue 46, item 5): a body counts against
// limits.max_body_bytes_in_flight until the replica answers, not until
// the answer ends: eight streams of 16 MiB requests run at once under a
// 48 MiB budget (three such bodies), and the proxy holds no body while
// they stream. Before: each body was held until its stream ended, and the
// fourth client got 429.
func TestBodyGivenBackOnceAnswered(t *testing.T) {
	const streams = 8
	bad := startBadReplica(t, func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		hold(c)
	})
	h := startProxy(t, "limits: {max_body_bytes_in_flight: 48MiB}\n"+strings.Replace(
		timedYAML("read: 30s", urlsModel(bad.URL())+"    strategy: least-loaded\n"), "scrape_interval: 50ms", "scrape_interval: 5s", 1))
	h.scraped()
	body := sizedChat(`{"model":"`+testModel+`","stream":true,"messages":[{"role":"user","content":"`, 16<<20-1)
	client := &http.Client{Timeout: 60 * time.Second}
	defer client.CloseIdleConnections()
	for i := range streams {
		req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("X-Claude-Code-Session-Id", fmt.Sprint("s", i))
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close() // the stream stays open until the test ends
		if res.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(res.Body)
			t.Fatalf("stream %d of %d: %d %s", i+1, streams, res.StatusCode, b)
		}
	}
	h.waitMetrics("warden_request_body_bytes 0")
	bad.ln.Close()
	bad.mu.Lock()
	for _, c := range bad.conns {
		c.Close()
	}
	bad.mu.Unlock()
}
