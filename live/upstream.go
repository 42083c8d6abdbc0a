package live

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// upstream is the proxy's HTTP/1.1 client for the replicas. A request
// body is already whole in memory when a call is sent (the model and the
// session are in it), so an attempt is synchronous: the request head and
// body go out in one writev from the handler's goroutine, and the response
// head is read there too. net/http's Transport hands each request to a
// connection's write goroutine and each response from its read goroutine
// (two goroutine switches a request, which at 1,000 requests/s on two
// cores were a tenth of the proxy's CPU), and writes a body through 32 KiB
// copies; this does neither (issue 13, item 12).
//
// What it keeps of net/http: the response parser (http.ReadResponse), the
// dialer (Server's, with timeouts.connect and the drain), HTTP/1.1
// keep-alive with an idle pool per replica, no proxy from the environment,
// no transparent gzip. A connection taken from the pool may have been
// closed by the replica meanwhile (uvicorn, which vLLM serves with, closes
// idle ones after 5 s): an attempt that fails on a reused connection
// before any response byte is sent again, once, on a new one, as net/http
// does for a request it can replay. Anything it does not handle (https, a
// body not in memory) goes to fallback, net/http's Transport.
type upstream struct {
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	fallback http.RoundTripper

	maxIdlePerHost int
	idleTimeout    time.Duration

	mu     sync.Mutex
	idle   map[string][]*upConn // by host:port, the most recently used last
	closed bool
}

// upConn is one connection to a replica.
type upConn struct {
	nc     net.Conn
	br     *bufio.Reader
	host   string
	idleAt time.Time
	reused bool
}

func newUpstream(dial func(ctx context.Context, network, addr string) (net.Conn, error), fallback http.RoundTripper) *upstream {
	return &upstream{
		dial:           dial,
		fallback:       fallback,
		maxIdlePerHost: 256,
		// Under uvicorn's 5 s keep-alive: a connection the replica is
		// about to close is not taken.
		idleTimeout: 4 * time.Second,
		idle:        map[string][]*upConn{},
	}
}

// get returns an idle connection to host, or dials one.
func (u *upstream) get(ctx context.Context, host string) (*upConn, error) {
	now := time.Now()
	u.mu.Lock()
	list := u.idle[host]
	for len(list) > 0 {
		pc := list[len(list)-1]
		list[len(list)-1] = nil
		list = list[:len(list)-1]
		if now.Sub(pc.idleAt) < u.idleTimeout {
			u.idle[host] = list
			u.mu.Unlock()
			pc.reused = true
			return pc, nil
		}
		// The most recent is too old: so are all before it.
		for _, old := range list {
			_ = old.nc.Close()
		}
		_ = pc.nc.Close()
		list = list[:0]
	}
	u.idle[host] = list
	u.mu.Unlock()
	return u.dialConn(ctx, host)
}

func (u *upstream) dialConn(ctx context.Context, host string) (*upConn, error) {
	nc, err := u.dial(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	nc = wrapRaw(nc)
	return &upConn{nc: nc, br: bufio.NewReaderSize(nc, 4<<10), host: host}, nil
}

// put gives a connection whose last response was read whole back to the
// pool.
func (u *upstream) put(pc *upConn) {
	pc.idleAt = time.Now()
	u.mu.Lock()
	if u.closed || len(u.idle[pc.host]) >= u.maxIdlePerHost {
		u.mu.Unlock()
		_ = pc.nc.Close()
		return
	}
	list := u.idle[pc.host]
	// The oldest are first: those past the idle timeout go now, not at
	// the next get (the replica has closed them, or soon will).
	stale := 0
	for stale < len(list) && pc.idleAt.Sub(list[stale].idleAt) >= u.idleTimeout {
		_ = list[stale].nc.Close()
		stale++
	}
	if stale > 0 {
		list = append(list[:0], list[stale:]...)
	}
	u.idle[pc.host] = append(list, pc)
	u.mu.Unlock()
}

// Close closes the idle connections, and every one given back later.
func (u *upstream) Close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	for h, list := range u.idle {
		for _, pc := range list {
			_ = pc.nc.Close()
		}
		delete(u.idle, h)
	}
}

// aLongTimeAgo is a deadline in the past: it makes a blocked read or write
// of a connection return at once.
var aLongTimeAgo = time.Unix(1, 0)

// errBadHeader is a header that cannot be sent as it is.
var errBadHeader = errors.New("invalid header")

// headBufs recycles the buffers request heads are written into.
var headBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}

// RoundTrip sends req and reads the response head. The response body
// gives the connection back to the pool once it is read to its end.
func (u *upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	br, ok := req.Body.(*bodyReader)
	if req.Body != nil && req.Body != http.NoBody && !ok {
		return u.fallback.RoundTrip(req)
	}
	var rb *reqBody
	if ok {
		rb = br.b
	}
	return u.do(req, rb)
}

// do sends req with the body rb (nil: none), which req.Body reads too
// (for the fallback).
func (u *upstream) do(req *http.Request, rb *reqBody) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		return u.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	hp := headBufs.Get().(*[]byte)
	defer headBufs.Put(hp)
	n := 0
	if rb != nil {
		rb.mu.Lock()
		n = len(rb.data)
		rb.mu.Unlock()
	}
	head, err := appendRequestHead((*hp)[:0], req, n)
	*hp = head
	if err != nil {
		return nil, err
	}
	host := req.URL.Host
	if req.URL.Port() == "" {
		host = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	pc, err := u.get(ctx, host)
	if err != nil {
		return nil, err
	}
	res, err := u.exchange(ctx, pc, req, head, rb)
	if err != nil && pc.reused && ctx.Err() == nil && errors.Is(err, errNothingRead) {
		// The replica closed the idle connection before it read this
		// request: send it again on a new one.
		if pc, err = u.dialConn(ctx, host); err != nil {
			return nil, err
		}
		res, err = u.exchange(ctx, pc, req, head, rb)
	}
	return res, err
}

// send writes head and the body in one writev. The body's lock is held
// while it is written, so that the call cannot give its buffer to another
// request meanwhile.
func send(nc net.Conn, head []byte, rb *reqBody) error {
	if rb == nil {
		_, err := nc.Write(head)
		return err
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.released {
		return errBodyReleased
	}
	return writeBufs(nc, head, rb.data)
}

// errNothingRead marks a failure on a connection before any byte of the
// response came: on a reused connection, the request may be sent again.
var errNothingRead = errors.New("connection closed before any response byte")

// exchange writes one request on pc and reads its response head.
func (u *upstream) exchange(ctx context.Context, pc *upConn, req *http.Request, head []byte, rb *reqBody) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { _ = pc.nc.SetDeadline(aLongTimeAgo) })
	fail := func(err error) (*http.Response, error) {
		cancelled := !stop()
		_ = pc.nc.Close()
		if cancelled {
			return nil, fmt.Errorf("upstream request: %w (%v)", ctx.Err(), err)
		}
		return nil, err
	}
	if werr := send(pc.nc, head, rb); errors.Is(werr, errBodyReleased) {
		return fail(werr)
	} else if werr != nil {
		// A replica may answer before it reads the whole body (a 413)
		// and close: read what it sent, if anything.
		_ = pc.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		res, rerr := http.ReadResponse(pc.br, req)
		if rerr != nil {
			if pc.reused {
				werr = fmt.Errorf("%w: %w", errNothingRead, werr)
			}
			return fail(werr)
		}
		_ = pc.nc.SetReadDeadline(time.Time{})
		return u.response(ctx, pc, res, stop, false), nil
	}
	for {
		if _, err := pc.br.Peek(1); err != nil {
			if pc.reused && (err == io.EOF || errors.Is(err, net.ErrClosed) || isReset(err)) {
				err = fmt.Errorf("%w: %w", errNothingRead, err)
			}
			return fail(err)
		}
		res, err := http.ReadResponse(pc.br, req)
		if err != nil {
			return fail(fmt.Errorf("reading the response head: %w", err))
		}
		if res.StatusCode >= 100 && res.StatusCode < 200 && res.StatusCode != http.StatusSwitchingProtocols {
			continue // 100 Continue or 103 Early Hints: the answer follows
		}
		return u.response(ctx, pc, res, stop, !res.Close && !req.Close), nil
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "read"
}

// response makes res's body give pc back (reusable) or close it.
func (u *upstream) response(ctx context.Context, pc *upConn, res *http.Response, stop func() bool, reusable bool) *http.Response {
	res.Body = &upBody{u: u, pc: pc, rc: res.Body, stop: stop, reusable: reusable, ctx: ctx}
	return res
}

// upBody is a response body on an upstream connection.
type upBody struct {
	u        *upstream
	pc       *upConn
	rc       io.ReadCloser
	ctx      context.Context
	stop     func() bool
	reusable bool
	done     atomic.Bool
}

func (b *upBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.finish(true)
	case err != nil:
		if b.ctx.Err() != nil {
			err = fmt.Errorf("upstream response: %w (%v)", b.ctx.Err(), err)
		}
		b.finish(false)
	}
	return n, err
}

// Close ends the body: a body not read to its end takes its connection
// with it.
func (b *upBody) Close() error {
	b.finish(false)
	return nil
}

func (b *upBody) finish(whole bool) {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	if b.stop() && whole && b.reusable && b.pc.br.Buffered() == 0 {
		b.u.put(b.pc)
		return
	}
	_ = b.pc.nc.Close()
}

// appendRequestHead appends the HTTP/1.1 request line and headers of req,
// with a Content-Length of n (a request body is always whole in memory).
// The headers the connection owns (Host, Content-Length, Connection,
// Transfer-Encoding, Expect: the body is sent at once) are written by it,
// not copied; an empty User-Agent is left out, as net/http does.
func appendRequestHead(b []byte, req *http.Request, n int) ([]byte, error) {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, req.URL.RequestURI()...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !validHeaderValue(host) {
		return nil, fmt.Errorf("%w: host %q", errBadHeader, host)
	}
	b = append(b, host...)
	b = append(b, "\r\n"...)
	for k, vs := range req.Header {
		if connHeader(k) {
			continue
		}
		if !validHeaderName(k) {
			return nil, fmt.Errorf("%w: field name %q", errBadHeader, k)
		}
		for _, v := range vs {
			if k == "User-Agent" && v == "" {
				continue
			}
			if !validHeaderValue(v) {
				return nil, fmt.Errorf("%w: value of %s", errBadHeader, k)
			}
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	if n > 0 || req.Method == http.MethodPost || req.Method == http.MethodPut || req.Method == http.MethodPatch {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, "\r\n"...)
	}
	if req.Close {
		b = append(b, "Connection: close\r\n"...)
	}
	return append(b, "\r\n"...), nil
}

// connHeader reports a header the connection owns, in any case.
func connHeader(k string) bool {
	for _, h := range [...]string{"Host", "Content-Length", "Connection", "Transfer-Encoding", "Expect", "Trailer"} {
		if len(k) == len(h) && strings.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// validHeaderName reports a token (RFC 9110 5.6.2).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == ':' || c == '(' || c == ')' || c == '<' || c == '>' || c == '@' ||
			c == ',' || c == ';' || c == '\\' || c == '"' || c == '/' || c == '[' || c == ']' || c == '?' ||
			c == '=' || c == '{' || c == '}' {
			return false
		}
	}
	return true
}

// validHeaderValue reports a value with no CR, LF or NUL (the bytes that
// would end or corrupt the head).
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}
