//go:build !linux

package upstream

import "net"

// wrapRaw returns c: raw syscalls are used on Linux only
// (rawconn_linux.go says why).
func wrapRaw(c net.Conn) net.Conn { return c }

// writeBufs writes the buffers to c in order, with one writev where the
// socket takes them at once.
func writeBufs(c net.Conn, bufs ...[]byte) error {
	nb := net.Buffers(bufs)
	_, err := nb.WriteTo(c)
	return err
}

// FDLimit returns 0: the file descriptor limit is read on Linux only
// (DefaultMaxConnections falls back to a fixed default elsewhere).
func FDLimit() int64 { return 0 }

// WrapClient makes c a client connection of l (a clientConn: raw
// syscalls are used on Linux only).
func WrapClient(c net.Conn, o Owner) net.Conn { return &clientConn{Conn: c, cl: o} }
