package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"github.com/lm-warden/warden/live/internal/rawbackend"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func testUpstream(t *testing.T) *Client {
	t.Helper()
	d := net.Dialer{Timeout: time.Second}
	u := New(d.DialContext, http.DefaultTransport)
	t.Cleanup(u.Close)
	return u
}

// upReq is a POST of body to base+"/v1/chat/completions", its body read
// through a Body as the proxy's calls are.
func upReq(t *testing.T, ctx context.Context, base, body string) *http.Request {
	t.Helper()
	rb, err := ReadBody(strings.NewReader(body), int64(len(body)), nil, BodyLimits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rb.Release)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", rb.Reader())
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "") // as ReverseProxy leaves it for a client that sent none
	return req
}

func roundTripBody(t *testing.T, u *Client, req *http.Request) (*http.Response, string, error) {
	t.Helper()
	res, err := u.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b), err
}

// TestUpstreamExchange: what a replica sees of a request, and the answers
// the client reads, for the response framings a replica may use.
func TestUpstreamExchange(t *testing.T) {
	tests := []struct {
		name     string
		answer   string
		want     string
		reusable bool
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n" + rawbackend.OK, rawbackend.OK, true},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"ok\"\r\n6\r\n:true}\r\n0\r\n\r\n", rawbackend.OK, true},
		{"until close", "HTTP/1.1 200 OK\r\n\r\n" + rawbackend.OK, rawbackend.OK, false},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 11\r\n\r\n" + rawbackend.OK, rawbackend.OK, false},
		{"100 continue first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n" + rawbackend.OK, rawbackend.OK, true},
		{"no body", "HTTP/1.1 204 No Content\r\n\r\n", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got struct {
				sync.Mutex
				req  *http.Request
				body []byte
			}
			srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, n int) bool {
				got.Lock()
				got.req, got.body = req, body
				got.Unlock()
				w.WriteString(tt.answer)
				return tt.reusable
			})
			u := testUpstream(t)
			for i := range 2 {
				req := upReq(t, context.Background(), srv.URL(), `{"model":"m"}`)
				req.Header.Set("Expect", "100-continue") // the proxy read the body: none is waited for
				req.Header.Set("X-Claude-Code-Session-Id", "s1")
				_, body, err := roundTripBody(t, u, req)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if body != tt.want {
					t.Fatalf("request %d: body %q, want %q", i, body, tt.want)
				}
			}
			got.Lock()
			defer got.Unlock()
			if string(got.body) != `{"model":"m"}` || got.req.ContentLength != 13 {
				t.Errorf("replica got body %q (Content-Length %d)", got.body, got.req.ContentLength)
			}
			if h := got.req.Header; h.Get("X-Claude-Code-Session-Id") != "s1" || h.Get("Expect") != "" || h.Get("User-Agent") != "" {
				t.Errorf("replica got headers %v", h)
			}
			if got.req.Host != srv.Addr().String() || got.req.URL.Path != "/v1/chat/completions" {
				t.Errorf("replica got Host %q path %q", got.req.Host, got.req.URL.Path)
			}
			wantConns := int64(2)
			if tt.reusable {
				wantConns = 1
			}
			if n := srv.Conns(); n != wantConns {
				t.Errorf("%d connections for 2 requests, want %d", n, wantConns)
			}
		})
	}
}

// TestUpstreamStaleIdle: a replica that closes an idle connection (uvicorn
// does after 5 s) costs the next request nothing: it goes out again on a
// new connection.
func TestUpstreamStaleIdle(t *testing.T) {
	srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, n int) bool {
		rawbackend.WriteOK(w, "")
		return false // closes after answering, without Connection: close
	})
	u := testUpstream(t)
	for i := range 3 {
		if _, body, err := roundTripBody(t, u, upReq(t, context.Background(), srv.URL(), `{}`)); err != nil || body != rawbackend.OK {
			t.Fatalf("request %d: %q, %v", i, body, err)
		}
		time.Sleep(20 * time.Millisecond) // the close reaches this side
	}
	if n := srv.Conns(); n != 3 {
		t.Errorf("%d connections, want 3", n)
	}
}

// TestUpstreamBrokenBody: a replica that dies mid-body gives the reader an
// error, not a short body read as whole, and its connection is not reused;
// a body closed before its end does not leave its rest to the next
// request.
func TestUpstreamBrokenBody(t *testing.T) {
	srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, n int) bool {
		if string(body) == "torn" {
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial\":")
			return false
		}
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 20000\r\n\r\n" + strings.Repeat("x", 20000))
		return true
	})
	u := testUpstream(t)
	if _, _, err := roundTripBody(t, u, upReq(t, context.Background(), srv.URL(), "torn")); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("torn body: err %v, want unexpected EOF", err)
	}
	res, err := u.RoundTrip(upReq(t, context.Background(), srv.URL(), "big"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.Body.Read(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	res.Body.Close() // 19,900 bytes unread
	_, body, err := roundTripBody(t, u, upReq(t, context.Background(), srv.URL(), "big"))
	if err != nil || len(body) != 20000 {
		t.Fatalf("after a closed body: %d bytes, %v", len(body), err)
	}
	if n := srv.Conns(); n != 3 {
		t.Errorf("%d connections, want 3 (none reused after a torn or unread body)", n)
	}
}

// TestUpstreamCancel: cancelling the request's context ends a wait for the
// headers and a read of the body at once, with an error that says so.
func TestUpstreamCancel(t *testing.T) {
	release := make(chan struct{})
	srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, n int) bool {
		if string(body) == "body" {
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nstart")
			w.Flush()
		}
		<-release
		return false
	})
	defer close(release)
	u := testUpstream(t)

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := u.RoundTrip(upReq(t, ctx, srv.URL(), "headers")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled before the headers: %v", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	res, err := u.RoundTrip(upReq(t, ctx, srv.URL(), "body"))
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = io.ReadAll(res.Body)
	res.Body.Close()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled mid-body: %v", err)
	}
}

// TestUpstreamEarlyAnswer: a replica that answers (413) before it reads a
// large body, and closes, is heard, not reported as a failed write.
func TestUpstreamEarlyAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		c.Write([]byte("HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno"))
		c.(*net.TCPConn).CloseWrite()
		time.Sleep(100 * time.Millisecond)
	}()
	u := testUpstream(t)
	res, body, err := roundTripBody(t, u, upReq(t, context.Background(), "http://"+ln.Addr().String(), strings.Repeat("a", 32<<20)))
	if err != nil || res.StatusCode != 413 || body != "no" {
		t.Fatalf("got %v %q, %v; want 413 \"no\"", res, body, err)
	}
	<-done
}

// TestUpstreamHeaderInjection: a header value that would end the head is
// refused, not sent.
func TestUpstreamHeaderInjection(t *testing.T) {
	srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, n int) bool {
		rawbackend.WriteOK(w, "")
		return true
	})
	u := testUpstream(t)
	for _, h := range []http.Header{
		{"X-Data-Parallel-Rank": {"0\r\nX-Evil: 1"}},
		{"Bad Name": {"v"}},
		{"X-Nul": {"a\x00b"}},
	} {
		req := upReq(t, context.Background(), srv.URL(), "{}")
		for k, v := range h {
			req.Header[k] = v
		}
		if _, err := u.RoundTrip(req); !errors.Is(err, errBadHeader) {
			t.Errorf("%v: err %v, want errBadHeader", h, err)
		}
	}
	if n := srv.Conns(); n != 0 {
		t.Errorf("%d connections made for refused heads", n)
	}
}

// TestUpstreamClose: Close closes the idle connections (the replica sees
// them end), and a connection given back after it is closed too.
func TestUpstreamClose(t *testing.T) {
	ended := make(chan struct{}, 4)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br, bw := bufio.NewReader(c), bufio.NewWriter(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						ended <- struct{}{}
						return
					}
					io.Copy(io.Discard, req.Body)
					rawbackend.WriteOK(bw, "")
					bw.Flush()
				}
			}()
		}
	}()
	u := testUpstream(t)
	base := "http://" + ln.Addr().String()
	if _, _, err := roundTripBody(t, u, upReq(t, context.Background(), base, "{}")); err != nil {
		t.Fatal(err)
	}
	res, err := u.RoundTrip(upReq(t, context.Background(), base, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	u.Close() // the one connection is in use

	select {
	case <-ended:
		t.Fatal("the connection in use was closed")
	case <-time.After(50 * time.Millisecond):
	}
	io.ReadAll(res.Body)
	res.Body.Close() // given back after Close: closed
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("a connection given back after Close stayed open")
	}
}

// TestUpstreamFallback: what it does not handle itself (https, a body not
// in memory) goes to the fallback.
func TestUpstreamFallback(t *testing.T) {
	var n atomic.Int64
	u := New(nil, roundTripFunc(func(r *http.Request) (*http.Response, error) {
		n.Add(1)
		return nil, errors.New("fallback")
	}))
	for _, req := range []*http.Request{
		{Method: "POST", URL: &url.URL{Scheme: "https", Host: "a:1", Path: "/"}, Header: http.Header{}},
		{Method: "POST", URL: &url.URL{Scheme: "http", Host: "a:1", Path: "/"}, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(nil))},
	} {
		if _, err := u.RoundTrip(req); err == nil || err.Error() != "fallback" {
			t.Errorf("%s: err %v", req.URL, err)
		}
	}
	if n.Load() != 2 {
		t.Errorf("fallback took %d requests, want 2", n.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// FuzzRequestHead: whatever the headers, the head written either is
// refused or reads back as one request with the same headers, whose body
// is exactly the one sent.
func FuzzRequestHead(f *testing.F) {
	f.Add("X-Session", "abc", "/v1/chat/completions")
	f.Add("X-Data-Parallel-Rank", "1\r\nX-Evil: 1", "/v1/messages")
	f.Add("Bad Name", "v", "/")
	f.Add("X", "a\nb", "/?q=1")
	f.Add("Content-Length", "5", "/")
	f.Fuzz(func(t *testing.T, k, v, path string) {
		u, err := url.Parse("http://127.0.0.1:1" + path)
		if err != nil || u.Host != "127.0.0.1:1" {
			return
		}
		req := &http.Request{Method: "POST", URL: u, Header: http.Header{k: {v}}}
		head, err := appendRequestHead(nil, req, 4)
		if err != nil {
			return
		}
		got, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(append(head, "body"...))))
		if err != nil {
			t.Fatalf("head %q does not parse: %v", head, err)
		}
		body, _ := io.ReadAll(got.Body)
		if string(body) != "body" {
			t.Fatalf("head %q: body %q", head, body)
		}
		if connHeader(k) {
			return
		}
		if http.CanonicalHeaderKey(k) == k && strings.TrimSpace(v) == v && got.Header.Get(k) != v {
			t.Fatalf("head %q: %s = %q, want %q", head, k, got.Header.Get(k), v)
		}
	})
}

// TestUpstreamPrunesIdle: connections idle past the timeout are closed
// when another is given back, not kept open until the next request.
func TestUpstreamPrunesIdle(t *testing.T) {
	srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, n int) bool {
		rawbackend.WriteOK(w, "")
		return true
	})
	u := testUpstream(t)
	u.idleTimeout = 50 * time.Millisecond
	host := srv.Addr().String()
	// Two connections at once, both given back.
	r1, err := u.RoundTrip(upReq(t, context.Background(), srv.URL(), "{}"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := u.RoundTrip(upReq(t, context.Background(), srv.URL(), "{}"))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(r1.Body)
	r1.Body.Close()
	time.Sleep(80 * time.Millisecond)
	io.ReadAll(r2.Body)
	r2.Body.Close() // r1's connection is past the timeout now
	u.mu.Lock()
	n := len(u.idle[host])
	u.mu.Unlock()
	if n != 1 {
		t.Errorf("%d idle connections, want 1 (the stale one closed)", n)
	}
}

// TestUpstreamReapsIdle (issue 35, item 8): connections left idle when
// traffic stops are closed once past the idle timeout, without another
// request to prune them. Before: they stayed open until the next request
// to that replica (261 a minute after traffic stopped).
func TestUpstreamReapsIdle(t *testing.T) {
	const n = 8
	var arrived sync.WaitGroup
	arrived.Add(n)
	srv := rawbackend.Start(t, func(w *bufio.Writer, req *http.Request, body []byte, _ int) bool {
		arrived.Done()
		arrived.Wait() // n requests at once: n connections
		rawbackend.WriteOK(w, "")
		return true
	})
	u := testUpstream(t)
	u.idleTimeout = 50 * time.Millisecond
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, _, err := roundTripBody(t, u, upReq(t, context.Background(), srv.URL(), "{}")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := srv.Conns(); got != n {
		t.Fatalf("%d connections, want %d", got, n)
	}
	deadline := time.Now().Add(20 * time.Second)
	for srv.Closed() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d idle connections still open long after the idle timeout", n-srv.Closed(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	u.mu.Lock()
	left := len(u.idle)
	u.mu.Unlock()
	if left != 0 {
		t.Errorf("the pool still lists %d replicas", left)
	}
}
