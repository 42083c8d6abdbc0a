package live

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
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
type rawConn struct {
	*net.TCPConn
	rc syscall.RawConn
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
	return &rawConn{TCPConn: tc, rc: rc}
}

func (c *rawConn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}

// Read reads as net.TCPConn.Read does: io.EOF at the peer's end.
func (c *rawConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait in the netpoller
			}
			n, errno = int(r), e
			return true
		}
	})
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
	var iov [4]syscall.Iovec
	vec := iov[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		v := syscall.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		vec = append(vec, v)
	}
	if len(vec) == 0 {
		return 0, nil
	}
	total := 0
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for len(vec) > 0 {
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&vec[0])), uintptr(len(vec)))
			switch e {
			case 0:
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // the send buffer is full: wait in the netpoller
			default:
				errno = e
				return true
			}
			n := int(r)
			total += n
			for len(vec) > 0 && n >= int(vec[0].Len) {
				n -= int(vec[0].Len)
				vec = vec[1:]
			}
			if n > 0 {
				vec[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(vec[0].Base), n))
				vec[0].SetLen(int(vec[0].Len) - n)
			}
		}
		return true
	})
	switch {
	case err != nil:
		return total, err
	case errno != 0:
		return total, c.opError("write", errno)
	}
	return total, nil
}
