package upstream

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawConn is a TCP connection whose reads and writes are made with
// syscall.RawSyscall instead of syscall.Syscall (issue 13, item 12).
//
// Why: every syscall.Syscall goes through the runtime's entersyscall,
// which wakes the sysmon thread from its deep sleep whenever all Ps were
// idle (runtime/proc.go: reentersyscall -> entersyscall_sysmon); once
// woken, sysmon polls every 20 µs (sysmon's usleep(delay)) until the Ps
// are idle again. A proxy at a thousand requests a second goes idle and
// busy again several times per request, so sysmon's wake-ups and sleeps
// were most of its context switches (perf sched:sched_switch: 57 % in
// runtime.sysmon), and on a paravirtualised VM each switch is dear. A
// socket the runtime's netpoller owns is non-blocking, so a read or write
// on it returns at once (with EAGAIN when it would block); entersyscall's
// other job, handing the P to another thread while a syscall blocks, has
// nothing to do for it. The waiting is done as net does it, by the
// netpoller, through syscall.RawConn: deadlines and Close work unchanged.
//
// A client's connection (cl set by clientListener) also gives its slot
// back when closed, and bounds a write that makes no progress by
// timeouts.client_write: when the socket's send buffer is full, a write
// deadline is set that far ahead, moved at each progress and cleared once
// the write is done, so that the common write, which the socket takes at
// once, costs nothing more.
type rawConn struct {
	*net.TCPConn
	rc     syscall.RawConn
	rd, wr rawOp
	inq    inqOp

	cl     Owner // nil: a connection to a replica
	closed atomic.Bool
}

// inqOp is the state of queued, bound once as rawOp is.
type inqOp struct {
	mu sync.Mutex
	fn func(fd uintptr)
	n  int32
	ok bool
}

// rawOp is the state of the connection's read, or of its write: one at a
// time each, as on a net.Conn (mu), through a function bound once, since a
// closure made at each call, with the variables it captures, was eight
// allocations a request.
type rawOp struct {
	mu    sync.Mutex
	fn    func(fd uintptr) bool
	buf   []byte          // a read's buffer
	vec   []syscall.Iovec // a write's buffers still to go (in iov when they fit)
	iov   [4]syscall.Iovec
	n     int
	errno syscall.Errno
	armed int // a write: bytes written when its deadline was last set, + 1; 0: none set
}

// wrapRaw returns c as a rawConn when it is a TCP connection, else c.
func wrapRaw(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	r := &rawConn{TCPConn: tc, rc: rc}
	r.rd.fn, r.wr.fn, r.inq.fn = r.readFD, r.writeFD, r.inqFD
	return r
}

// Close closes the connection and gives a client's slot back.
func (c *rawConn) Close() error {
	err := c.TCPConn.Close()
	if c.cl != nil && c.closed.CompareAndSwap(false, true) {
		c.cl.Release()
	}
	return err
}

// queued reports the bytes that have arrived on the socket and wait to be
// read (ioctl SIOCINQ, as FIONREAD), 0 when that cannot be told.
func (c *rawConn) Queued() int {
	op := &c.inq
	op.mu.Lock()
	defer op.mu.Unlock()
	op.n, op.ok = 0, false
	if err := c.rc.Control(op.fn); err != nil || !op.ok {
		return 0
	}
	return int(op.n)
}

func (c *rawConn) inqFD(fd uintptr) {
	op := &c.inq
	_, _, e := syscall.RawSyscall(syscall.SYS_IOCTL, fd, unix.SIOCINQ, uintptr(unsafe.Pointer(&op.n)))
	op.ok = e == 0
}

func (c *rawConn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}

// Read reads as net.TCPConn.Read does: io.EOF at the peer's end.
func (c *rawConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	op := &c.rd
	op.mu.Lock()
	op.buf, op.n, op.errno = b, 0, 0
	err := c.rc.Read(op.fn)
	n, errno := op.n, op.errno
	op.buf = nil
	op.mu.Unlock()
	switch {
	case err != nil: // deadline or close, already a *net.OpError
		return 0, err
	case errno != 0:
		return 0, c.opError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// readFD is one try of Read on the socket: false to wait in the netpoller.
func (c *rawConn) readFD(fd uintptr) bool {
	op := &c.rd
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&op.buf[0])), uintptr(len(op.buf)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		op.n, op.errno = int(r), e
		return true
	}
}

// writeBufs writes the buffers to c in order, with one writev where the
// socket takes them at once.
func writeBufs(c net.Conn, bufs ...[]byte) error {
	if rc, ok := c.(*rawConn); ok {
		_, err := rc.writev(bufs...)
		return err
	}
	nb := net.Buffers(bufs)
	_, err := nb.WriteTo(c)
	return err
}

// Write writes all of b, or fails, as net.TCPConn.Write does.
func (c *rawConn) Write(b []byte) (int, error) {
	return c.writev(b)
}

// writev writes the buffers in order, all of them or an error, with one
// writev syscall when the socket takes them at once.
func (c *rawConn) writev(bufs ...[]byte) (int, error) {
	op := &c.wr
	op.mu.Lock()
	defer op.mu.Unlock()
	op.vec = op.iov[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		v := syscall.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		op.vec = append(op.vec, v)
	}
	if len(op.vec) == 0 {
		return 0, nil
	}
	op.n, op.errno, op.armed = 0, 0, 0
	err := c.rc.Write(op.fn)
	n, errno := op.n, op.errno
	clear(op.iov[:])
	op.vec = nil
	if op.armed > 0 {
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			c.cl.WriteTimedOut()
		} else {
			_ = c.TCPConn.SetWriteDeadline(time.Time{})
		}
	}
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, c.opError("write", errno)
	}
	return n, nil
}

// writeFD is one try of writev on the socket: false to wait in the
// netpoller for room.
func (c *rawConn) writeFD(fd uintptr) bool {
	op := &c.wr
	for len(op.vec) > 0 {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&op.vec[0])), uintptr(len(op.vec)))
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			// The send buffer is full: wait for room, for a client at
			// most timeouts.client_write since the last progress.
			if c.cl != nil && op.armed != op.n+1 {
				if d := c.cl.WriteTimeout(); d > 0 {
					_ = c.TCPConn.SetWriteDeadline(time.Now().Add(d))
					op.armed = op.n + 1
				}
			}
			return false
		default:
			op.errno = e
			return true
		}
		n := int(r)
		op.n += n
		for len(op.vec) > 0 && n >= int(op.vec[0].Len) {
			n -= int(op.vec[0].Len)
			op.vec = op.vec[1:]
		}
		if n > 0 {
			op.vec[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(op.vec[0].Base), n))
			op.vec[0].SetLen(int(op.vec[0].Len) - n)
		}
	}
	return true
}

// FDLimit returns the file descriptors the process may open
// (RLIMIT_NOFILE's soft limit, which Go's os package raises to the hard
// limit at start), or 0 when it cannot be read.
func FDLimit() int64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return 0
	}
	return int64(min(r.Cur, 1<<40))
}

// WrapClient makes c a client connection of l: a rawConn with l's slot
// and write timeout when it is a TCP connection, with its unsent bytes
// bounded (clientNotSentLowat), else a clientConn.
func WrapClient(c net.Conn, o Owner) net.Conn {
	if rc, ok := wrapRaw(c).(*rawConn); ok {
		rc.cl = o
		_ = rc.rc.Control(setNotSentLowat)
		return rc
	}
	return &clientConn{Conn: c, cl: o}
}

// clientNotSentLowat bounds the bytes a client's socket holds that the
// client has not taken yet (TCP_NOTSENT_LOWAT), so that
// timeouts.client_write measures the client's progress, not the kernel's
// (issue 46, item 2). Without it the send buffer, which Linux grows up to
// net.ipv4.tcp_wmem's maximum (4 MiB by default), took a client that
// stopped reading megabytes of a stream before a write would wait: at a
// token every 2 ms, 118 s before client_write began to count. With it a
// write waits (EAGAIN, then the netpoller) as soon as the unsent bytes
// reach it, so the wait that client_write bounds begins once the
// client's own receive window is full and this much more is queued. The
// bytes the network has in flight are not unsent: a client on a long,
// fast path still gets a full window. One copy buffer: a whole one can
// always be queued behind what the client is reading.
const clientNotSentLowat = CopyBufferSize

// setNotSentLowat sets TCP_NOTSENT_LOWAT on a client's socket (a failure,
// a kernel before 3.12, leaves the send buffer as the kernel sizes it).
func setNotSentLowat(fd uintptr) {
	_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, clientNotSentLowat)
}
