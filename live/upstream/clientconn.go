package upstream

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// clientConn is a client's connection that is not a rawConn (another
// kind of listener, another OS): it gives its slot back when closed, and
// bounds each write by timeouts.client_write with a deadline.
type clientConn struct {
	net.Conn
	cl     Owner
	closed atomic.Bool
}

func (c *clientConn) Write(b []byte) (int, error) {
	d := c.cl.WriteTimeout()
	if d > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(d))
	}
	n, err := c.Conn.Write(b)
	if err != nil && d > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		c.cl.WriteTimedOut()
	}
	return n, err
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.cl.Release()
	}
	return err
}

// Owner is what a client's connection answers to: the listener that
// counted it (live's clientListener), which takes its slot back once,
// when it closes, bounds each write that makes no progress
// (timeouts.client_write, 0 for none) and counts the writes it cut.
type Owner interface {
	Release()
	WriteTimeout() time.Duration
	WriteTimedOut()
}
