// Command speedraw is TestSpeed's second floor: the least a Go proxy that
// routes by the body can do. It reads each request's head and whole body
// (as warden must, and HAProxy need not), picks a backend by the session
// header's hash, sends head and body in one writev on a kept-alive
// connection, and relays the response (Content-Length only), all on the
// client connection's goroutine: no net/http, no parsing of the body, no
// goroutine hand-off a request. What it adds beyond HAProxy is what Go's
// runtime and a store-and-forward cost on this machine, whatever the
// proxy on top; what warden adds beyond it is warden's HTTP server and
// its work.
//
// With -http, net/http's server reads the requests and writes the
// answers instead (the relay to the backends is the same): what
// net/http's server adds to a relay that does nothing else.
//
// With -cut, the relay does not wait for the body: it picks the backend
// by the header and sends the body on as it comes, in reads of up to 64
// KiB, as HAProxy does in its 16 KiB buffers: what streaming would give a
// Go proxy that could route before the body is whole. (Not what it
// adds to warden: a server of warden's own in its place, tried, measured
// no faster in paired runs; warden pays most of the same costs, a parsed
// http.Request and the rest, in its own work. Nor does an event-loop
// server: lesismal/nbio's nbhttp in net/http's place, tried on
// 2026-12-05, its handlers run in its pool or inline in its one poller,
// was +0.13 and +0.12 ms p50 over HAProxy at 256 KiB where go-http was
// +0.12 and go-raw +0.04, in the same six runs.)
//
//	speedraw [-http | -cut] LISTEN BACKEND...
package main

import (
	"bufio"
	"bytes"
	"errors"
	"hash/fnv"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
)

type backend struct {
	addr string
	mu   sync.Mutex
	idle []*bconn
}

type bconn struct {
	c  net.Conn
	br *bufio.Reader
}

func (b *backend) get() (*bconn, error) {
	b.mu.Lock()
	if n := len(b.idle); n > 0 {
		c := b.idle[n-1]
		b.idle = b.idle[:n-1]
		b.mu.Unlock()
		return c, nil
	}
	b.mu.Unlock()
	c, err := net.Dial("tcp", b.addr)
	if err != nil {
		return nil, err
	}
	return &bconn{c: c, br: bufio.NewReaderSize(c, 16<<10)}, nil
}

func (b *backend) put(c *bconn) {
	b.mu.Lock()
	b.idle = append(b.idle, c)
	b.mu.Unlock()
}

// cutThrough: -cut.
var cutThrough bool

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

func main() {
	args := os.Args[1:]
	useHTTP := len(args) > 0 && args[0] == "-http"
	if useHTTP {
		args = args[1:]
	}
	cutThrough = len(args) > 0 && args[0] == "-cut"
	if cutThrough {
		args = args[1:]
	}
	if len(args) < 2 {
		log.Fatal("usage: speedraw [-http | -cut] LISTEN BACKEND...")
	}
	var backends []*backend
	for _, b := range args[1:] {
		backends = append(backends, &backend{addr: strings.TrimPrefix(b, "http://")})
	}
	ln, err := net.Listen("tcp", args[0])
	if err != nil {
		log.Fatal(err)
	}
	if useHTTP {
		log.Fatal(http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := relayHTTP(w, r, backends); err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
			}
		})))
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go serve(c, backends)
	}
}

// head reads a message head from br into buf: the start line and the
// headers, up to the blank line.
func head(br *bufio.Reader, buf []byte) ([]byte, error) {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return buf, err
		}
		buf = append(buf, line...)
		if len(line) <= 2 {
			return buf, nil
		}
	}
}

// field returns the value of header name (lower case) in a head.
func field(h []byte, name string) string {
	for line := range bytes.Lines(h) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if ok && strings.EqualFold(string(k), name) {
			return string(bytes.TrimSpace(v))
		}
	}
	return ""
}

func serve(c net.Conn, backends []*backend) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 16<<10)
	for {
		bp := bufs.Get().(*[]byte)
		err := relay(c, br, backends, bp)
		bufs.Put(bp)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				log.Print(err)
			}
			return
		}
	}
}

func relay(c net.Conn, br *bufio.Reader, backends []*backend, bp *[]byte) error {
	h, err := head(br, (*bp)[:0])
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(field(h, "content-length"))
	if err != nil {
		return errors.New("no content-length")
	}
	b := pick(backends, field(h, "x-claude-code-session-id"))
	var out []byte
	if cutThrough {
		out, _, err = b.stream(h, br, n)
	} else {
		buf, rerr := readBody(h, n, br)
		*bp = buf
		if rerr != nil {
			return rerr
		}
		out, _, err = b.exchange(buf)
	}
	if err != nil {
		return err
	}
	_, err = c.Write(out)
	return err
}

// relayHTTP is relay with net/http's server on the client's side: the
// body read whole, the same head and body sent in one write, the answer
// copied back.
func relayHTTP(w http.ResponseWriter, r *http.Request, backends []*backend) error {
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	buf := append((*bp)[:0], r.Method+" "+r.RequestURI+" HTTP/1.1\r\nHost: "+r.Host+"\r\n"...)
	for k, vv := range r.Header {
		for _, v := range vv {
			buf = append(buf, k+": "+v+"\r\n"...)
		}
	}
	buf, err := readBody(append(buf, "\r\n"...), int(r.ContentLength), r.Body)
	*bp = buf
	if err != nil {
		return err
	}
	out, hn, err := pick(backends, r.Header.Get("X-Claude-Code-Session-Id")).exchange(buf)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", field(out[:hn], "content-type"))
	if v := field(out[:hn], "x-warden-speed-answered"); v != "" { // TestSpeed's WARDEN_SPEED_SPLIT
		w.Header().Set("X-Warden-Speed-Answered", v)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(out)-hn))
	_, err = w.Write(out[hn:])
	return err
}

// readBody appends n bytes of body from r to the request head h.
func readBody(h []byte, n int, r io.Reader) ([]byte, error) {
	hn := len(h)
	buf := h
	if cap(buf)-hn < n {
		buf = append(make([]byte, 0, hn+n), h...)
	}
	buf = buf[:hn+n]
	_, err := io.ReadFull(r, buf[hn:])
	return buf, err
}

// pick is the backend of a session: its id's hash.
func pick(backends []*backend, session string) *backend {
	f := fnv.New32a()
	_, _ = f.Write([]byte(session))
	return backends[f.Sum32()%uint32(len(backends))]
}

// exchange sends a whole request (head and body) on a kept-alive
// connection and reads the answer (Content-Length only): out is its head
// and body, hn the head's length.
func (b *backend) exchange(req []byte) (out []byte, hn int, err error) {
	return b.stream(req, nil, 0)
}

// stream is exchange with the request's last n bytes not yet read: they
// are sent on from r as they come, in reads of up to 64 KiB (-cut).
func (b *backend) stream(first []byte, r io.Reader, n int) (out []byte, hn int, err error) {
	bc, err := b.get()
	if err != nil {
		return nil, 0, err
	}
	fail := func(err error) ([]byte, int, error) {
		bc.c.Close()
		return nil, 0, err
	}
	if _, err := bc.c.Write(first); err != nil {
		return fail(err)
	}
	if n > 0 {
		bp := bufs.Get().(*[]byte)
		defer bufs.Put(bp)
		buf := (*bp)[:cap(*bp)]
		for n > 0 {
			k, rerr := r.Read(buf[:min(n, len(buf))])
			if k > 0 {
				if _, err := bc.c.Write(buf[:k]); err != nil {
					return fail(err)
				}
				n -= k
			}
			if rerr != nil && n > 0 {
				return fail(rerr)
			}
		}
	}
	rh, err := head(bc.br, make([]byte, 0, 512))
	if err != nil {
		return fail(err)
	}
	m, err := strconv.Atoi(field(rh, "content-length"))
	if err != nil {
		return fail(errors.New("response without content-length"))
	}
	out = append(rh, make([]byte, m)...)
	if _, err := io.ReadFull(bc.br, out[len(rh):]); err != nil {
		return fail(err)
	}
	b.put(bc)
	return out, len(rh), nil
}
