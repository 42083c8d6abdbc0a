package live

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// clientListener is the clients' listener as the proxy serves it (issue
// 35, item 4):
//
//   - at most limits.max_connections connections are open at once, idle
//     keep-alive ones included: at the bound Accept waits for one to close
//     (new connections wait in the kernel's backlog, as behind HAProxy's
//     maxconn), which is logged at ERROR (at most every capLogEvery),
//     counted (warden_connection_limit_waits_total) and makes /healthz
//     answer 503 while it lasts;
//   - an Accept that fails for want of a resource (EMFILE, ENFILE,
//     ENOBUFS, ENOMEM) is retried with a back-off of 5 ms doubling to 1 s,
//     logged at ERROR once per episode (net/http logs it through the
//     server's ErrorLog, which the proxy logs at DEBUG), counted
//     (warden_accept_errors_total), and /healthz answers 503 until an
//     Accept succeeds again;
//   - each connection is a rawConn (rawconn_linux.go) that gives its slot
//     back when closed and cuts a write that makes no progress for
//     timeouts.client_write (see rawConn.writev).
type clientListener struct {
	net.Listener
	log *slog.Logger
	obs *observer
	wto *atomic.Int64 // timeouts.client_write in ns (Server.clientWrite); 0: none

	max  int
	sem  chan struct{} // a token per open connection
	open atomic.Int64
	done chan struct{} // closed by Close: a waiting Accept returns
	once sync.Once

	atCap     atomic.Bool            // an Accept waits for a connection to close
	acceptErr atomic.Pointer[string] // the failure of the last Accept; nil: it succeeded
	capLogged time.Time              // the last ERROR about the bound (Accept's goroutine)
}

// capLogEvery spaces the ERROR lines of a listener held at its bound.
const capLogEvery = 10 * time.Second

func newClientListener(ln net.Listener, max int, wto *atomic.Int64, log *slog.Logger, obs *observer) *clientListener {
	return &clientListener{Listener: ln, log: log, obs: obs, wto: wto, max: max,
		sem: make(chan struct{}, max), done: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *clientListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	default:
		l.atCap.Store(true)
		l.obs.connWaits.Inc()
		if now := time.Now(); now.Sub(l.capLogged) >= capLogEvery {
			l.capLogged = now
			l.log.Error("client connections at limits.max_connections: new connections wait until one closes", "max_connections", l.max)
		}
		select {
		case l.sem <- struct{}{}:
			l.atCap.Store(false)
		case <-l.done:
			l.atCap.Store(false)
			return nil, net.ErrClosed
		}
	}
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if l.acceptErr.Load() != nil {
				l.acceptErr.Store(nil)
				l.log.Info("accepting client connections again")
			}
			l.open.Add(1)
			return l.wrap(c), nil
		}
		if !resourceError(err) {
			<-l.sem
			return nil, err
		}
		l.obs.acceptErrors.Inc()
		if l.acceptErr.Load() == nil {
			l.log.Error("accepting client connections fails; retrying with back-off", "err", err, "open_connections", l.open.Load())
		}
		msg := err.Error()
		l.acceptErr.Store(&msg)
		delay = min(max(2*delay, 5*time.Millisecond), time.Second)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			<-l.sem
			return nil, net.ErrClosed
		}
	}
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

// Close stops accepting; connections already open stay.
func (l *clientListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// release gives a closed connection's slot back.
func (l *clientListener) release() {
	l.open.Add(-1)
	<-l.sem
}

// writeTimeout is timeouts.client_write, 0 for none.
func (l *clientListener) writeTimeout() time.Duration { return time.Duration(l.wto.Load()) }

// writeTimedOut counts a write cut by timeouts.client_write.
func (l *clientListener) writeTimedOut() { l.obs.clientWriteTimeouts.Inc() }

// trouble says why the listener cannot take a new client now ("" when it
// can), for /healthz.
func (l *clientListener) trouble() string {
	if e := l.acceptErr.Load(); e != nil {
		return "accepting client connections fails: " + *e
	}
	if l.atCap.Load() {
		return fmt.Sprintf("%d client connections open: at limits.max_connections, new connections wait", l.open.Load())
	}
	return ""
}

// wrap makes c a client connection of l: a rawConn where it can be one
// (wrapClient).
func (l *clientListener) wrap(c net.Conn) net.Conn { return wrapClient(c, l) }

// clientConn is a client's connection that is not a rawConn (another
// kind of listener, another OS): it gives its slot back when closed, and
// bounds each write by timeouts.client_write with a deadline.
type clientConn struct {
	net.Conn
	cl     *clientListener
	closed atomic.Bool
}

func (c *clientConn) Write(b []byte) (int, error) {
	d := c.cl.writeTimeout()
	if d > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(d))
	}
	n, err := c.Conn.Write(b)
	if err != nil && d > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		c.cl.writeTimedOut()
	}
	return n, err
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.cl.release()
	}
	return err
}
