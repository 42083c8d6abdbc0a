package kvevents

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// zmq4 (v0.17.0, Conn.read) allocates each frame at the size its header
// declares, up to MaxInt64, before reading it: a peer could make the proxy
// allocate any amount. Subscribe therefore dials through boundedTCP, which
// follows the ZMTP 3 byte stream (a 64-byte greeting, then frames: a flags
// byte, a 1- or 8-byte size, the body) and fails the connection on a frame
// larger than its bound, before zmq4 sees the header.

// boundedScheme is the transport Subscribe dials ("tcp" is zmq4's own).
const boundedScheme = "kvtcp"

// frameLimit bounds one frame a subscriber accepts: a payload of
// MaxPayload plus room for the topic and sequence frames.
var frameLimit uint64 = 16<<20 + 4096

func init() {
	if err := zmq4.RegisterTransport(boundedScheme, boundedTCP{}); err != nil {
		panic(err)
	}
}

type boundedTCP struct{}

func (boundedTCP) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &boundedConn{Conn: c, max: frameLimit, greet: 64}, nil
}

func (boundedTCP) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return nil, fmt.Errorf("%s: dial only", boundedScheme)
}

func (boundedTCP) Addr(ep string) (string, error) { return ep, nil }

// dialEndpoint is ep (tcp://host:port) through the bounded transport.
func dialEndpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return boundedScheme + "://" + rest
	}
	return ep
}

// boundedConn checks the frame sizes of the bytes read through it.
type boundedConn struct {
	net.Conn
	max   uint64
	greet int    // greeting bytes still to pass
	need  int    // size bytes still to read
	size  uint64 // the size read so far
	body  uint64 // body bytes still to pass
	err   error
}

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if c.err = c.scan(p[:n]); c.err != nil {
		c.Conn.Close()
		return 0, c.err
	}
	return n, err
}

func (c *boundedConn) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case c.greet > 0:
			k := min(c.greet, len(b))
			c.greet -= k
			b = b[k:]
		case c.body > 0:
			k := min(c.body, uint64(len(b)))
			c.body -= k
			b = b[k:]
		case c.need > 0:
			c.size = c.size<<8 | uint64(b[0])
			c.need--
			b = b[1:]
			if c.need == 0 {
				if c.size > c.max {
					return fmt.Errorf("kv events: a frame of %d bytes, more than %d", c.size, c.max)
				}
				c.body = c.size
			}
		default: // a frame's flags: bit 1 says an 8-byte size
			c.need, c.size = 1, 0
			if b[0]&0x02 != 0 {
				c.need = 8
			}
			b = b[1:]
		}
	}
	return nil
}
