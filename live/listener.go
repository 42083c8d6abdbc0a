package live

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/lm-warden/warden/live/upstream"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// clientListener is the clients' listener as the proxy serves it (issue
// 35, item 4), and, in the admin role (listenerRole, adminListener), the
// admin address's:
//
//   - at most limits.max_connections connections are served at once, idle
//     keep-alive ones included; at the bound the proxy's HTTP listener
//     (refuseHTTP) refuses a new connection at once (refuse: 429
//     rate_limit_error or, for an Anthropic request, 529
//     overloaded_error, with Retry-After and Connection: close; issue 46
//     item 8: new connections waited in the kernel's backlog until one
//     closed, 30 s during a flood of idle ones), and another (warden
//     epp's gRPC, which has no such answer before its own handshake)
//     stops accepting until one closes; either is logged at ERROR (at most
//     every capLogEvery), counted (warden_connections_refused_total,
//     warden_connection_limit_waits_total) and makes /healthz answer 503
//     while the bound is reached;
//   - an Accept that fails for want of a resource (EMFILE, ENFILE,
//     ENOBUFS, ENOMEM) is retried with a back-off of 5 ms doubling to 1 s,
//     logged at ERROR once per episode (net/http logs it through the
//     server's ErrorLog, which the proxy logs at DEBUG), counted
//     (warden_accept_errors_total), and /healthz answers 503 until an
//     Accept succeeds again;
//   - each connection is wrapped by upstream.WrapClient (a rawConn on
//     Linux) so that it gives its slot back when closed and cuts a write
//     that makes no progress for timeouts.client_write (see upstream's
//     rawConn.writev).
type clientListener struct {
	net.Listener
	log  *slog.Logger
	obs  *observer
	wto  *atomic.Int64 // timeouts.client_write in ns (Server.clientWrite); 0: none
	role *listenerRole

	max        int
	refuseHTTP bool          // at the bound, answer a new connection (refuse) rather than wait: role.over is set
	sem        chan struct{} // a token per open connection
	open       atomic.Int64
	refusing   chan struct{} // a token per connection being refused (refuse)
	refusals   sync.WaitGroup
	done       chan struct{} // closed by Close
	once       sync.Once

	acceptErr atomic.Pointer[string] // the failure of the last Accept; nil: it succeeded
	capLogged time.Time              // the last ERROR about the bound (Accept's goroutine)
}

// capLogEvery spaces the ERROR lines of a listener held at its bound.
const capLogEvery = 10 * time.Second

// listenerRole is what tells the listeners the proxy bounds apart: the
// clients' (limits.max_connections) and the admin address's
// (adminMaxConns). The bound, the refusals and the write timeout work
// alike on both.
type listenerRole struct {
	conns   string             // what its connections are called in logs: "client connections"
	bound   string             // the setting that bounds them: "limits.max_connections"
	refused prometheus.Counter // connections over the bound, answered or closed
	// over answers the request of a connection over the bound (refuse),
	// max the bound; nil: the listener does not serve HTTP, and a
	// connection over the bound waits for a free slot instead.
	over func(req *http.Request, max int) overAnswer
}

// overAnswer is what a connection over its listener's bound is answered.
type overAnswer struct {
	code  int
	ctype string
	body  []byte
	retry bool // Retry-After: 1
	// reason is the warden_rejected_total reason it is counted under once
	// written; "": none (not a client's request).
	reason string
}

// clientRole is the clients' listener's: a request over
// limits.max_connections is answered in its API's shape, as
// limits.max_in_flight is (429 rate_limit_error or 529 overloaded_error,
// Retry-After), when http is set; warden epp's gRPC listener (!http)
// waits for a free slot.
func clientRole(obs *observer, http bool) *listenerRole {
	r := &listenerRole{conns: "client connections", bound: "limits.max_connections", refused: obs.connRefused}
	if http {
		r.over = overClients
	}
	return r
}

func overClients(req *http.Request, max int) overAnswer {
	api, _ := apiOf(req.URL.Path, req.Header)
	msg := fmt.Sprintf("the proxy serves %d client connections, its limit (limits.max_connections); retry shortly", max)
	return overAnswer{code: errOverloaded.status(api), ctype: "application/json", body: errorBody(api, errOverloaded, msg),
		retry: true, reason: "max_connections"}
}

// newClientListener bounds ln's connections at max, in role.
func newClientListener(ln net.Listener, max int, role *listenerRole, wto *atomic.Int64, log *slog.Logger, obs *observer) *clientListener {
	return &clientListener{Listener: ln, log: log, obs: obs, wto: wto, role: role, max: max, refuseHTTP: role.over != nil,
		sem: make(chan struct{}, max), refusing: make(chan struct{}, maxRefusing), done: make(chan struct{})}
}

// Accept returns the next connection to serve. A connection that comes
// while limits.max_connections are open is refused (refuse) by an HTTP
// listener, not returned; any other waits for a free slot first.
func (l *clientListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		if !l.refuseHTTP && !l.slot() {
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err == nil {
			if l.acceptErr.Load() != nil {
				l.acceptErr.Store(nil)
				l.log.Info("accepting " + l.role.conns + " again")
			}
			if l.refuseHTTP {
				select {
				case l.sem <- struct{}{}:
				default:
					l.refuse(c)
					continue
				}
			}
			l.open.Add(1)
			return l.wrap(c), nil
		}
		if !l.refuseHTTP {
			<-l.sem // taken for a connection that did not come
		}
		if !resourceError(err) {
			return nil, err
		}
		l.obs.acceptErrors.Inc()
		if l.acceptErr.Load() == nil {
			l.log.Error("accepting "+l.role.conns+" fails; retrying with back-off", "err", err, "open_connections", l.open.Load())
		}
		msg := err.Error()
		l.acceptErr.Store(&msg)
		delay = min(max(2*delay, 5*time.Millisecond), time.Second)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

// slot waits for a free slot (a listener that does not refuse), false
// when the listener was closed meanwhile. A wait is logged at ERROR (at
// most every capLogEvery) and counted.
func (l *clientListener) slot() bool {
	select {
	case l.sem <- struct{}{}:
		return true
	default:
	}
	l.obs.connWaits.Inc()
	l.capLogged = l.logCap(l.capLogged, l.role.conns+" at "+l.role.bound+": new connections wait until one closes")
	select {
	case l.sem <- struct{}{}:
		return true
	case <-l.done:
		return false
	}
}

// logCap logs msg at ERROR unless it was logged less than capLogEvery
// after last, and returns when it was last logged.
func (l *clientListener) logCap(last time.Time, msg string) time.Time {
	now := time.Now()
	if now.Sub(last) < capLogEvery {
		return last
	}
	l.log.Error(msg, "bound", l.max)
	return now
}

// maxRefusing bounds the connections being refused at once (each holds a
// file descriptor and a goroutine for at most refuseWait); beyond, a
// connection over the bound is closed at once.
const maxRefusing = 64

// refuseWait bounds a refusal: the wait for the request's head, then for
// the client to finish sending what it had begun.
const refuseWait = 2 * time.Second

// maxRefusedHead bounds the bytes of a refused request's head that are
// read to find its API (limits.max_header_bytes' default).
const maxRefusedHead = DefaultMaxHeaderBytes

// refuse answers a connection that came while its listener's bound
// were open: it reads the request's head (within refuseWait and
// maxRefusedHead) to answer it as the role says (role.over) with
// Connection: close, then closes the connection once the client has sent
// what it had begun (a close with unread bytes would reset it, and a
// client still sending would lose the answer). The clients' listener
// answers in the request's API shape, as limits.max_in_flight is
// answered: 429 rate_limit_error (OpenAI shapes) or 529 overloaded_error
// (Anthropic), with Retry-After: 1. That is what the clients retry best:
// the OpenAI and Anthropic SDKs retry 429 and 529 after Retry-After, and
// a generic HTTP client is told the request was not served, where a
// connection closed without an answer leaves a POST's fate unknown (Go's
// http.Transport, for one, does not retry it). When maxRefusing
// connections are being refused already, c is closed at once (the SDKs
// retry that as a connection error, with back-off).
func (l *clientListener) refuse(c net.Conn) {
	l.role.refused.Inc()
	l.capLogged = l.logCap(l.capLogged, l.role.conns+" at "+l.role.bound+": new ones are refused until one closes")
	select {
	case l.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	l.refusals.Go(func() {
		defer func() { <-l.refusing }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(refuseWait))
		req, err := http.ReadRequest(bufio.NewReader(io.LimitReader(c, maxRefusedHead)))
		if err != nil {
			return // no request (an idle connection, a head too long): nothing to answer
		}
		a := l.role.over(req, l.max)
		text := http.StatusText(a.code)
		if text == "" {
			text = "status code " + strconv.Itoa(a.code) // as net/http writes one it has no text for
		}
		retry := ""
		if a.retry {
			retry = "Retry-After: 1\r\n"
		}
		head := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%sConnection: close\r\nX-Content-Type-Options: nosniff\r\n\r\n", a.code, text, a.ctype, len(a.body), retry)
		if _, err := c.Write(append([]byte(head), a.body...)); err != nil {
			return
		}
		if a.reason != "" {
			l.obs.rejected.WithLabelValues(a.reason).Inc()
		}
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, c) // until the client closes, or refuseWait
	})
}

// resourceError reports an Accept failure that passes once the process or
// the machine has a resource back: a file descriptor, buffer memory.
func resourceError(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return true
		}
	}
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary() && !errors.Is(err, net.ErrClosed)
}

// Close stops accepting; connections already open stay, and refusals
// under way end within refuseWait.
func (l *clientListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// wait returns once the refusals under way have ended.
func (l *clientListener) wait() { l.refusals.Wait() }

// Release gives a closed connection's slot back.
func (l *clientListener) Release() {
	l.open.Add(-1)
	<-l.sem
}

// WriteTimeout is timeouts.client_write, 0 for none.
func (l *clientListener) WriteTimeout() time.Duration { return time.Duration(l.wto.Load()) }

// WriteTimedOut counts a write cut by timeouts.client_write.
func (l *clientListener) WriteTimedOut() { l.obs.clientWriteTimeouts.Inc() }

// trouble says why the listener cannot take a new client now ("" when it
// can), for /healthz.
func (l *clientListener) trouble() string {
	if e := l.acceptErr.Load(); e != nil {
		return "accepting " + l.role.conns + " fails: " + *e
	}
	if n := l.open.Load(); n >= int64(l.max) {
		if l.refuseHTTP {
			return fmt.Sprintf("%d %s open: at %s, new connections are refused", n, l.role.conns, l.role.bound)
		}
		return fmt.Sprintf("%d %s open: at %s, new connections wait", n, l.role.conns, l.role.bound)
	}
	return ""
}

// wrap makes c a client connection of l: a rawConn where it can be one
// (upstream.WrapClient).
func (l *clientListener) wrap(c net.Conn) net.Conn { return upstream.WrapClient(c, l) }
