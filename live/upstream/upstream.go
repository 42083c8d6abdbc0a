package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
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
//
// What a replica can make it hold is bounded (issue 35): a reply head by
// MaxReplyHeadBytes and maxInformational, and idle connections by
// idleTimeout, closed by a reaper even when no request comes.
type Client struct {
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	fallback http.RoundTripper

	maxIdlePerHost int
	idleTimeout    time.Duration

	mu     sync.Mutex
	idle   map[string][]*upConn // by host:port, the most recently used last
	closed bool
	// reaper closes the connections idle past idleTimeout when no request
	// comes to take or give back one (issue 35: 261 stayed open a minute
	// after traffic stopped). It is armed while any connection is idle.
	reaper  *time.Timer
	reaping bool
}

// upConn is one connection to a replica.
type upConn struct {
	nc     net.Conn
	br     *bufio.Reader // reads lim
	lim    headLimit
	host   string
	idleAt time.Time
	reused bool
}

// Bounds on what a replica's reply head may make the proxy hold (issue
// 35). net/http's client allows 10 MB of headers and 5 informational
// replies; a replica answers vLLM's APIs with a few hundred bytes of
// headers, so the proxy allows 64 KiB, Envoy's default
// (max_response_headers_kb 60), for a reply's status lines and headers
// together, informational replies included, and 5 informational replies.
// Beyond either, or with a status outside 100-599, the reply is a bad
// reply (ErrBadReply): the connection is closed at once, the attempt is
// retried once on another replica as a 502 is, and the replica takes a
// strike towards ejection.
const (
	MaxReplyHeadBytes = 64 << 10
	maxInformational  = 5
)

// ErrBadReply is a reply head the proxy does not take from a replica:
// over MaxReplyHeadBytes, over maxInformational informational replies,
// malformed, or with a status outside 100-599.
var ErrBadReply = errors.New("bad reply from the replica")

// headLimit is what an upstream connection's bufio.Reader reads from: the
// connection, bounded to n more bytes while a reply head is read (the
// reader's own read-ahead counts, as in net/http's client), unbounded
// while a body is (n = math.MaxInt64).
type headLimit struct {
	nc net.Conn
	n  int64
}

func (l *headLimit) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("%w: reply head over %d bytes", ErrBadReply, MaxReplyHeadBytes)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.nc.Read(p)
	l.n -= int64(n)
	return n, err
}

func New(dial func(ctx context.Context, network, addr string) (net.Conn, error), fallback http.RoundTripper) *Client {
	return &Client{
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
func (u *Client) get(ctx context.Context, host string) (*upConn, error) {
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

func (u *Client) dialConn(ctx context.Context, host string) (*upConn, error) {
	nc, err := u.dial(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	nc = wrapRaw(nc)
	pc := &upConn{nc: nc, lim: headLimit{nc: nc, n: math.MaxInt64}, host: host}
	pc.br = bufio.NewReaderSize(&pc.lim, 4<<10)
	return pc, nil
}

// put gives a connection whose last response was read whole back to the
// pool.
func (u *Client) put(pc *upConn) {
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
	if !u.reaping {
		u.reaping = true
		if u.reaper == nil {
			u.reaper = time.AfterFunc(u.idleTimeout, u.reap)
		} else {
			u.reaper.Reset(u.idleTimeout)
		}
	}
	u.mu.Unlock()
}

// reap closes the connections idle past idleTimeout, and arms the reaper
// again for the oldest left, if any.
func (u *Client) reap() {
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	u.reaping = false
	if u.closed {
		return
	}
	next := time.Duration(-1)
	for h, list := range u.idle {
		stale := 0
		for stale < len(list) && now.Sub(list[stale].idleAt) >= u.idleTimeout {
			_ = list[stale].nc.Close()
			stale++
		}
		if stale == len(list) {
			delete(u.idle, h)
			continue
		}
		if stale > 0 {
			n := copy(list, list[stale:])
			clear(list[n:])
			u.idle[h] = list[:n]
			list = list[:n]
		}
		if d := u.idleTimeout - now.Sub(list[0].idleAt); next < 0 || d < next {
			next = d
		}
	}
	if next >= 0 {
		u.reaping = true
		u.reaper.Reset(max(next, time.Millisecond))
	}
}

// Close closes the idle connections, and every one given back later.
func (u *Client) Close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	if u.reaper != nil {
		u.reaper.Stop()
	}
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
func (u *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	br, ok := req.Body.(*bodyReader)
	if req.Body != nil && req.Body != http.NoBody && !ok {
		return u.fallback.RoundTrip(req)
	}
	var rb *Body
	if ok {
		rb = br.b
	}
	return u.Do(req, rb)
}

// Do sends req with the body rb (nil: none), which req.Body reads too
// (for the fallback).
func (u *Client) Do(req *http.Request, rb *Body) (*http.Response, error) {
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
func send(nc net.Conn, head []byte, rb *Body) error {
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

// exchange writes one request on pc and reads its response head, within
// MaxReplyHeadBytes and maxInformational.
func (u *Client) exchange(ctx context.Context, pc *upConn, req *http.Request, head []byte, rb *Body) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { _ = pc.nc.SetDeadline(aLongTimeAgo) })
	fail := func(err error) (*http.Response, error) {
		cancelled := !stop()
		_ = pc.nc.Close()
		if cancelled {
			return nil, fmt.Errorf("upstream request: %w (%v)", ctx.Err(), err)
		}
		return nil, err
	}
	pc.lim.n = MaxReplyHeadBytes
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
		pc.lim.n = math.MaxInt64
		return u.response(ctx, pc, res, stop, false), nil
	}
	for informational := 0; ; informational++ {
		if _, err := pc.br.Peek(1); err != nil {
			if pc.reused && informational == 0 && (err == io.EOF || errors.Is(err, net.ErrClosed) || isReset(err)) {
				err = fmt.Errorf("%w: %w", errNothingRead, err)
			}
			return fail(err)
		}
		res, err := http.ReadResponse(pc.br, req)
		if err != nil {
			return fail(headError(err))
		}
		if res.StatusCode >= 100 && res.StatusCode < 200 && res.StatusCode != http.StatusSwitchingProtocols {
			// 100 Continue or 103 Early Hints: the answer follows.
			if informational == maxInformational {
				return fail(fmt.Errorf("%w: more than %d informational (1xx) replies", ErrBadReply, maxInformational))
			}
			continue
		}
		pc.lim.n = math.MaxInt64
		return u.response(ctx, pc, res, stop, !res.Close && !req.Close), nil
	}
}

// headError classifies a failure to read a reply head: the connection's
// own failures (a reset, an end midway: the replica may have restarted)
// stay as they are; anything else is a head the replica got wrong
// (ErrBadReply: over MaxReplyHeadBytes, or malformed).
func headError(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, ErrBadReply):
		return err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.As(err, &ne), errors.Is(err, net.ErrClosed):
		return fmt.Errorf("reading the response head: %w", err)
	}
	return fmt.Errorf("%w: malformed reply head: %v", ErrBadReply, err)
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "read"
}

// response makes res's body give pc back (reusable) or close it.
func (u *Client) response(ctx context.Context, pc *upConn, res *http.Response, stop func() bool, reusable bool) *http.Response {
	res.Body = &upBody{u: u, pc: pc, rc: res.Body, stop: stop, reusable: reusable, ctx: ctx}
	return res
}

// upBody is a response body on an upstream connection.
type upBody struct {
	u        *Client
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
