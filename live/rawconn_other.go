//go:build !linux

package live

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
