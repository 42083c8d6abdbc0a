package live

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
)

// Issue 35: the proxy survives clients that misbehave, or too many of
// them.

// floodReplica streams events of 32 KiB to every inference request until
// a write fails (the proxy closed the connection); ended receives then.
func floodReplica(t testing.TB) (url string, ended chan struct{}) {
	event := []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("x", 32<<10) + "\"}}]}\n\n")
	ended = make(chan struct{}, 8)
	srv := startBadReplica(t, func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
		for {
			if _, err := c.Write(event); err != nil {
				ended <- struct{}{}
				return
			}
		}
	})
	return srv.URL(), ended
}

// dialSmallWindow connects to addr with a 4 KiB receive buffer, so that a
// client that does not read fills it at once.
func dialSmallWindow(t testing.TB, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawPost is a POST of body to path as an HTTP/1.1 request's bytes.
func rawPost(path, body string, extra ...string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer " + testKey +
		"\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n" +
		strings.Join(extra, "") + "\r\n" + body
}

// TestClientThatStopsReadingIsCut (issue 35, item 3): a client whose
// receive window is zero (a suspended agent) no longer holds a proxy slot
// and a vLLM sequence forever: once a write to it makes no progress for
// timeouts.client_write the exchange ends, the replica's request is
// cancelled (its connection closed), and the cut is counted. Before: the
// replica's stream, and the slot, were held until the client went away.
func TestClientThatStopsReadingIsCut(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		body       func() string
	}{
		{"openai stream", "/v1/chat/completions", func() string { return chatBody(testModel, "s", 0, true) }},
		{"anthropic stream", "/v1/messages", func() string { return anthropicBody(testModel, "s", 0, true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, ended := floodReplica(t)
			h := startProxy(t, timedYAML("client_write: 200ms", urlsModel(url)))
			h.scraped()
			c := dialSmallWindow(t, strings.TrimPrefix(h.url, "http://"))
			if _, err := io.WriteString(c, rawPost(tc.path, tc.body())); err != nil {
				t.Fatal(err)
			}
			// The client reads nothing from here on.
			select {
			case <-ended:
			case <-time.After(60 * time.Second):
				t.Fatal("the replica still streams to a client that stopped reading")
			}
			h.waitMetrics("warden_client_write_timeouts_total 1")
			h.waitFor("the slot given back", func(st StatusReport) bool { return st.Models[0].Replicas[0].InFlight == 0 })
		})
	}
}

// pacedReplica streams a chat event of about 500 bytes every millisecond
// (a fast vLLM's pace with a long event) to every inference request,
// counting the bytes it wrote, until a write fails (the proxy closed the
// connection: ended receives the count) or it has written overrun bytes
// (ended receives -1).
func pacedReplica(t testing.TB, overrun int) (url string, ended chan int) {
	event := []byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" +
		strings.Repeat("y", 400) + "\"}}]}\n\n")
	ended = make(chan int, 8)
	srv := startBadReplica(t, func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
		for sent := 0; ; sent += len(event) {
			if sent > overrun {
				ended <- -1
				hold(c)
				return
			}
			if _, err := c.Write(event); err != nil {
				ended <- sent
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	return srv.URL(), ended
}

// TestClientThatStopsReadingAtTokenPaceIsCut (issue 46, item 2): a client
// that stops reading a stream that comes at a token's pace is cut once
// the proxy's writes make no progress for client_write, not once the
// kernel's send buffer, which grows to megabytes (net.ipv4.tcp_wmem), is
// full: the unsent bytes in the client's socket are bounded
// (TCP_NOTSENT_LOWAT, upstream/rawconn_linux.go), so the proxy takes little more
// than that from the replica before the cut. The client's receive buffer
// is 4 KiB, so what it absorbs does not count. Before: the proxy passed
// on megabytes (118 s of a stream at 2 ms a token) before client_write
// began to count.
func TestClientThatStopsReadingAtTokenPaceIsCut(t *testing.T) {
	const overrun = 2 << 20
	url, ended := pacedReplica(t, overrun)
	h := startProxy(t, timedYAML("client_write: 300ms", urlsModel(url)))
	h.scraped()
	c := dialSmallWindow(t, strings.TrimPrefix(h.url, "http://"))
	if _, err := io.WriteString(c, rawPost("/v1/chat/completions", chatBody(testModel, "s", 0, true))); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing from here on.
	sent := <-ended
	if sent < 0 {
		t.Fatalf("the replica wrote %d MiB for a client that reads nothing and was not cut: the kernel's send buffer took them", overrun>>20)
	}
	t.Logf("the replica wrote %d KiB before the proxy cut the exchange", sent>>10)
	h.waitMetrics("warden_client_write_timeouts_total 1")
	h.waitFor("the slot given back", func(st StatusReport) bool { return st.Models[0].Replicas[0].InFlight == 0 })
}

// TestConnectionsCapped (issue 35, item 4; issue 46, item 8):
// limits.max_connections bounds the client connections served at once,
// idle ones included: at the bound a new connection is answered at once
// in its request's API shape, 429 rate_limit_error (OpenAI) or 529
// overloaded_error (Anthropic), with Retry-After: 1 and Connection:
// close, even while it is still sending its body; /healthz says so with
// 503 and the refusals are counted; once a connection closes the next
// one is served. Before issue 35: no bound, and /healthz answered 200
// while file descriptors ran out; before issue 46: a new connection
// waited in the kernel's backlog until one closed (30 s during a flood of
// idle connections), unanswered.
func TestConnectionsCapped(t *testing.T) {
	good := fakevllm.New(t, 1)
	// read_header far above the test's length: the idle connections stay.
	h := startProxy(t, "limits: {max_connections: 2}\n"+timedYAML("read_header: 5m", urlsModel(good.URL())))
	h.scraped()
	addr := strings.TrimPrefix(h.url, "http://")
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	h.waitMetrics("warden_client_connections 2")
	waitHealthz(t, h, http.StatusServiceUnavailable, "max_connections")
	big := strings.Repeat("x", 1<<20) // still being sent when the answer comes
	for _, tc := range []struct {
		name, request string
		status        int
		shaped        func(string) bool
	}{
		{"models", "GET /v1/models HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer " + testKey + "\r\n\r\n",
			http.StatusTooManyRequests, func(b string) bool { return isOpenAIError(b) && strings.Contains(b, "rate_limit_error") }},
		{"anthropic", rawPost("/v1/messages", anthropicBody(testModel, "s", 0, false), "anthropic-version: 2023-06-01\r\n"),
			529, func(b string) bool { return anthropicErrorType(b) == "overloaded_error" }},
		{"openai with a 1 MiB body", rawPost("/v1/chat/completions", `{"model":"qwen","messages":[{"role":"user","content":"`+big+`"}]}`),
			http.StatusTooManyRequests, func(b string) bool { return isOpenAIError(b) && strings.Contains(b, "max_connections") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			go io.WriteString(c, tc.request) // the answer may come before all of it is sent
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("a client over max_connections got no answer: %v", err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.status || !tc.shaped(string(b)) || res.Header.Get("Retry-After") != "1" || !res.Close {
				t.Errorf("%d (Retry-After %q, close %v) %s: want %d in its shape with Retry-After: 1 and Connection: close",
					res.StatusCode, res.Header.Get("Retry-After"), res.Close, b, tc.status)
			}
		})
	}
	h.waitMetrics("warden_connections_refused_total 3", `warden_rejected_total{reason="max_connections"} 3`)
	idle[0].Close() // a slot frees: the next client is served
	h.waitMetrics("warden_client_connections 1")
	if r := h.do("GET", "/v1/models", "", nil); r.status != http.StatusOK {
		t.Errorf("a client once a slot freed got %d %s", r.status, r.body)
	}
	idle[1].Close()
	h.client.CloseIdleConnections()
	waitHealthz(t, h, http.StatusOK, "ok")
}

// TestConnectionFloodOverTheCap (issue 46, item 8): a flood of idle
// connections over limits.max_connections holds at most maxRefusing of
// them, each for at most refuseWait; the rest are closed at once, so the
// flood fills no backlog and a client that comes after it is answered.
func TestConnectionFloodOverTheCap(t *testing.T) {
	good := fakevllm.New(t, 1)
	h := startProxy(t, "limits: {max_connections: 1}\n"+timedYAML("read_header: 5m", urlsModel(good.URL())))
	h.scraped()
	addr := strings.TrimPrefix(h.url, "http://")
	held, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	h.waitMetrics("warden_client_connections 1")
	const flood = maxRefusing + 36
	closedAtOnce := make(chan bool, flood)
	for range flood {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			c.SetReadDeadline(time.Now().Add(refuseWait / 2))
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			closedAtOnce <- !(errors.As(err, &ne) && ne.Timeout())
		}()
	}
	n := 0
	for range flood {
		if <-closedAtOnce {
			n++
		}
	}
	if n != flood-maxRefusing {
		t.Errorf("%d of %d idle connections over the cap were closed at once, want %d (the rest, at most %d, wait for their request)", n, flood, flood-maxRefusing, maxRefusing)
	}
	h.waitMetrics(fmt.Sprintf("warden_connections_refused_total %d", flood))
	// Once the refusals waited refuseWait, a client is answered.
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: proxy\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err == nil && res.StatusCode == http.StatusTooManyRequests {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a client after the flood: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitHealthz polls the admin /healthz until it answers status with want
// in its body.
func waitHealthz(t *testing.T, h *harness, status int, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := h.client.Get(h.admin + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == status && strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz answers %d %q, want %d with %q", res.StatusCode, b, status, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// emfileListener is a listener that fails as a process out of file
// descriptors does while fail is set (a hand-written fault injector: a
// test cannot exhaust the descriptors of its own process safely).
type emfileListener struct {
	net.Listener
	fail  atomic.Bool
	fails atomic.Int64
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.fail.Load() {
		l.fails.Add(1)
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestAcceptFailuresAreLoudAndHealthzTellsTheTruth (issue 35, item 4): an
// Accept that fails with "too many open files" is logged at ERROR (not
// DEBUG), counted, retried with a back-off, and /healthz answers 503
// until accepting works again. Before: DEBUG only, /healthz 200.
func TestAcceptFailuresAreLoudAndHealthzTellsTheTruth(t *testing.T) {
	good := fakevllm.New(t, 1)
	cfg, err := ParseConfig("test.yaml", []byte("listen: 127.0.0.1:0\n"+modelsYAML("", urlsModel(good.URL()))))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	srv, err := NewServer(cfg, WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &emfileListener{Listener: ln}
	fl.fail.Store(true)
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, fl, aln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	h := &harness{t: t, srv: srv, url: "http://" + ln.Addr().String(), admin: "http://" + aln.Addr().String(), client: &http.Client{Timeout: 20 * time.Second}}
	defer h.client.CloseIdleConnections()
	waitHealthz(t, h, http.StatusServiceUnavailable, "too many open files")
	h.waitMetrics("warden_accept_errors_total")
	if m := h.metrics(); strings.Contains(m, "warden_accept_errors_total 0\n") {
		t.Error("accept errors not counted")
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "too many open files") {
		t.Errorf("no ERROR line about the failing accept; log:\n%s", l)
	}
	fl.fail.Store(false)
	if r := h.do("GET", "/v1/models", "", nil); r.status != http.StatusOK {
		t.Fatalf("after accepting recovered: %d %s", r.status, r.body)
	}
	waitHealthz(t, h, http.StatusOK, "ok")
}

// TestBothContentLengthAndChunkedClosesTheConnection (issue 35, item 8):
// after a request with both Content-Length and Transfer-Encoding the
// connection is closed (RFC 9112 6.1), so that the bytes a front proxy
// took for the rest of its body are not served as a request of their own.
// Before: the smuggled request was answered.
func TestBothContentLengthAndChunkedClosesTheConnection(t *testing.T) {
	good := fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(good.URL())))
	h.scraped()
	body := chatBody(testModel, "s", 0, false)
	smuggled := "GET /v1/models HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer " + testKey + "\r\n\r\n"
	for _, tc := range []struct{ name, req string }{
		{"content-length and chunked", "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer " + testKey +
			"\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body) + smuggled},
		{"chunked alone", "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer " + testKey +
			"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body) + smuggled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK || !res.Close {
				t.Errorf("first answer: %d, Connection: close %v; want 200 and close", res.StatusCode, res.Close)
			}
			if res2, err := http.ReadResponse(br, nil); err == nil {
				res2.Body.Close()
				t.Errorf("the bytes after the body were served as a request: %d", res2.StatusCode)
			}
		})
	}
}

// TestAdminChecksHost (issue 35, item 8): the admin address answers only
// requests whose Host names it (an IP address, localhost, the admin's
// host, this machine's name, admin_hosts), so that a page in a browser
// cannot read /api/status through DNS rebinding. Before: every Host was
// served.
func TestAdminChecksHost(t *testing.T) {
	good := fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("admin_hosts: [warden.internal, Metrics.Example.]\n", urlsModel(good.URL())))
	hostname, _ := os.Hostname()
	port := h.admin[strings.LastIndex(h.admin, ":"):]
	for _, tc := range []struct {
		host string
		want int
	}{
		{"127.0.0.1" + port, 200},
		{"[::1]" + port, 200},
		{"localhost" + port, 200},
		{"LOCALHOST", 200},
		{"dash.localhost" + port, 200},
		{"warden.internal" + port, 200},
		{"metrics.example", 200},
		{hostname + port, 200},
		{"rebind.attacker.example" + port, 403},
		{"warden.internal.attacker.example", 403},
		{"localhost.attacker.example", 403},
	} {
		for _, path := range []string{"/api/status", "/healthz", "/metrics"} {
			req, _ := http.NewRequest("GET", h.admin+path, nil)
			req.Host = tc.host
			res, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.want {
				t.Errorf("GET %s with Host %q: %d, want %d", path, tc.host, res.StatusCode, tc.want)
			}
			if tc.want == 403 && bytes.Contains(b, []byte("models")) {
				t.Errorf("GET %s with Host %q leaked the status", path, tc.host)
			}
		}
	}
}
