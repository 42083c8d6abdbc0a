package kvevents

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
)

// The subscriber speaks ZMTP 3.0 (rfc.zeromq.org/spec/23) itself, over
// zmq4's Conn (zmq4.Open: greeting, NULL handshake, RecvMsg), rather than
// through a zmq4 socket: a socket reads each connection on a goroutine of
// its own into a queue of ten whole messages, and zmq4 v0.17.0's
// Conn.read allocates each frame at the size its header declares (up to
// MaxInt64) and gathers frames until one comes without the MORE flag,
// without a count. Here each connection is read by the goroutine that
// handles it, one message at a time, through a limitedConn that follows
// the ZMTP byte stream (a 64-byte greeting, then frames: a flags byte, a
// 1- or 8-byte size, the body) and fails the connection before zmq4 sees
// a header past the limits:
//
//   - a frame larger than Limits.MaxMessage, and a message whose frames
//     add up to more (one message of 80 frames of 15 MiB took the proxy to
//     1.27 GB when only frames were bounded);
//   - a message of more than maxFrames frames (vLLM's are three: topic,
//     sequence, payload; ten million empty frames cost 450 MB and 22 s of
//     CPU in zmq4's [][]byte);
//   - a greeting and handshake not done within Limits.Handshake of the
//     connection, and a message not whole within Limits.Message of its
//     first byte (half a greeting or half a frame left the subscription
//     stuck, shown as connected). Between messages nothing is timed: a
//     quiet engine publishes nothing, and TCP keep-alive (Go's dialer and
//     listener enable it) finds a vanished peer.

// maxFrames bounds the frames of one message: vLLM's PUB messages and
// its replay answers (after the DEALER's empty delimiter) have three.
const maxFrames = 4

// Limits bound what one publisher's connection can make warden hold and
// wait for. Zero fields take the defaults.
type Limits struct {
	// MaxPayload bounds one batch's payload; a larger one is refused with
	// the connection. Default 16 MiB.
	MaxPayload int
	// Handshake bounds the ZMTP greeting and handshake; default 5s.
	Handshake time.Duration
	// Message bounds the reading of one message from its first byte;
	// default 10s.
	Message time.Duration
	// BatchesPerSecond and HashesPerSecond bound the work one publisher
	// can cause (a token bucket each, a second's worth of burst): a batch
	// beyond either is dropped undecoded or before the ledger, counted
	// (Handler.Dropped) and, being a gap, lost. Defaults 2,000 and
	// 1,000,000; a negative value: no bound.
	BatchesPerSecond float64
	HashesPerSecond  float64
}

// Default limits.
const (
	DefaultMaxPayload       = 16 << 20
	DefaultHandshake        = 5 * time.Second
	DefaultMessage          = 10 * time.Second
	DefaultBatchesPerSecond = 2000
	DefaultHashesPerSecond  = 1_000_000
)

func (l Limits) withDefaults() Limits {
	if l.MaxPayload <= 0 {
		l.MaxPayload = DefaultMaxPayload
	}
	if l.Handshake <= 0 {
		l.Handshake = DefaultHandshake
	}
	if l.Message <= 0 {
		l.Message = DefaultMessage
	}
	if l.BatchesPerSecond == 0 {
		l.BatchesPerSecond = DefaultBatchesPerSecond
	}
	if l.HashesPerSecond == 0 {
		l.HashesPerSecond = DefaultHashesPerSecond
	}
	return l
}

// maxMessage is the most bytes one message may hold: a payload of
// MaxPayload plus room for the topic and sequence frames.
func (l Limits) maxMessage() uint64 { return uint64(l.MaxPayload) + 4096 }

// zconn is one ZMTP connection: zmq4's Conn over a limitedConn.
type zconn struct {
	*zmq4.Conn
	lim *limitedConn
}

// openZMTP runs the greeting and the NULL handshake on c as a socket of
// type typ (server: the side that accepted), within lim.Handshake, and
// returns the connection, read through the limits. It closes c on error.
func openZMTP(c net.Conn, typ zmq4.SocketType, server bool, lim Limits) (*zconn, error) {
	lc := &limitedConn{Conn: c, br: bufio.NewReaderSize(c, 32<<10), max: lim.maxMessage(), greet: 64, handshake: true,
		handshakeBy: time.Now().Add(lim.Handshake), msgTimeout: lim.Message}
	// Writes during the handshake (our greeting and READY) are timed too:
	// a peer that reads nothing fills the socket buffer at most.
	_ = c.SetWriteDeadline(lc.handshakeBy)
	zc, err := zmq4.Open(lc, nullMechanism{}, typ, zmq4.SocketIdentity(nil), server, nil)
	if err != nil {
		c.Close()
		if lc.err != nil {
			return nil, lc.err
		}
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Time{})
	lc.handshake = false
	return &zconn{Conn: zc, lim: lc}, nil
}

// recv reads one message; it skips commands (zmq4 answers a PING).
func (z *zconn) recv() (zmq4.Msg, error) {
	for {
		msg, err := z.RecvMsg()
		if err != nil {
			if z.lim.err != nil {
				return msg, z.lim.err
			}
			return msg, err
		}
		if msg.Type != zmq4.CmdMsg {
			return msg, nil
		}
	}
}

// nullMechanism is ZMTP's NULL security mechanism (rfc.zeromq.org/spec/23,
// "The NULL Security Mechanism"): each side sends READY with its
// metadata (Socket-Type, Identity) and reads the peer's. zmq4 keeps its
// own unexported; zmq4.Open takes any Security.
type nullMechanism struct{}

func (nullMechanism) Type() zmq4.SecurityType { return zmq4.NullSecurity }

func (nullMechanism) Handshake(c *zmq4.Conn, _ bool) error {
	raw, err := c.Meta.MarshalZMTP()
	if err != nil {
		return err
	}
	if err := c.SendCmd(zmq4.CmdReady, raw); err != nil {
		return fmt.Errorf("sending READY: %w", err)
	}
	cmd, err := c.RecvCmd()
	if err != nil {
		return fmt.Errorf("reading READY: %w", err)
	}
	if cmd.Name != zmq4.CmdReady {
		return fmt.Errorf("peer sent %q, want READY", cmd.Name)
	}
	return c.Peer.Meta.UnmarshalZMTP(cmd.Body)
}

func (nullMechanism) Encrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }
func (nullMechanism) Decrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }

// limitedConn checks the ZMTP byte stream read through it against the
// limits and sets a read deadline for the phase the stream is in. It
// reads through a buffer: zmq4 reads each frame's flags, size and body
// apart, a system call each without one (half the CPU time of a flood).
type limitedConn struct {
	net.Conn
	br          *bufio.Reader
	max         uint64 // bytes per message
	msgTimeout  time.Duration
	handshakeBy time.Time
	handshake   bool // until openZMTP returns

	greet    int    // greeting bytes still to pass
	need     int    // size bytes still to read
	size     uint64 // the size read so far
	body     uint64 // body bytes still to pass
	more     bool   // the frame being read has the MORE flag
	frames   int    // frames of the message so far
	bytes    uint64 // bytes of the message so far
	inMsg    bool
	msgStart time.Time
	deadline time.Time // the read deadline set
	err      error
}

// errPhase names what a timed-out read was waiting for.
func (c *limitedConn) phase() string {
	switch {
	case c.greet > 0:
		return fmt.Sprintf("the ZMTP greeting (%d of 64 bytes came)", 64-c.greet)
	case c.handshake:
		return "the ZMTP handshake"
	}
	return fmt.Sprintf("the rest of a message (%d frames, %d bytes came)", c.frames, c.bytes)
}

func (c *limitedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	var by time.Time
	switch {
	case c.handshake || c.greet > 0:
		by = c.handshakeBy
	case c.inMsg:
		by = c.msgStart.Add(c.msgTimeout)
	}
	if !by.Equal(c.deadline) {
		if err := c.Conn.SetReadDeadline(by); err != nil {
			return 0, err
		}
		c.deadline = by
	}
	n, err := c.br.Read(p)
	if serr := c.scan(p[:n]); serr != nil {
		c.err = serr
		c.Conn.Close()
		return 0, serr
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// A clear error that is not a net.Error timeout: zmq4 then takes
		// the connection as closed.
		c.err = fmt.Errorf("kv events: %s: nothing for too long, reconnecting", c.phase())
		c.Conn.Close()
		return n, c.err
	}
	return n, err
}

// Write bounds each write after the handshake (zmq4 answers a PING with
// a PONG): a peer that sends and never reads would otherwise hold the
// connection in a write once the socket's buffer is full.
func (c *limitedConn) Write(p []byte) (int, error) {
	if !c.handshake {
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.msgTimeout)); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Write(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = errors.New("kv events: the publisher reads nothing (a write stalled), reconnecting")
		c.Conn.Close()
	}
	return n, err
}

func (c *limitedConn) scan(b []byte) error {
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
			if c.body == 0 {
				c.endFrame()
			}
		case c.need > 0:
			c.size = c.size<<8 | uint64(b[0])
			c.need--
			b = b[1:]
			if c.need == 0 {
				if c.size > c.max {
					return fmt.Errorf("kv events: a frame of %d bytes, more than %d", c.size, c.max)
				}
				if c.bytes += c.size; c.bytes > c.max {
					return fmt.Errorf("kv events: a message of more than %d bytes", c.max)
				}
				c.body = c.size
				if c.body == 0 {
					c.endFrame()
				}
			}
		default: // a frame's flags: bit 0 MORE, bit 1 an 8-byte size
			if !c.inMsg {
				c.inMsg, c.msgStart, c.frames, c.bytes = true, time.Now(), 0, 0
			}
			if c.frames++; c.frames > maxFrames {
				return fmt.Errorf("kv events: a message of more than %d frames", maxFrames)
			}
			c.more = b[0]&0x01 != 0
			c.need, c.size = 1, 0
			if b[0]&0x02 != 0 {
				c.need = 8
			}
			b = b[1:]
		}
	}
	return nil
}

// endFrame closes the message when its last frame is read.
func (c *limitedConn) endFrame() {
	if !c.more {
		c.inMsg = false
	}
}

// dialZMTP connects to ep (tcp://host:port) and opens a ZMTP connection of
// socket type typ; ctx done closes it (and ends a dial or handshake).
func dialZMTP(ctx context.Context, ep string, typ zmq4.SocketType, lim Limits) (*zconn, func(), error) {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return nil, nil, fmt.Errorf("%q: want tcp://host:port", ep)
	}
	d := net.Dialer{Timeout: lim.Handshake}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	zc, err := openZMTP(c, typ, false, lim)
	if err != nil {
		stop()
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, err
	}
	return zc, func() { stop(); zc.Close() }, nil
}
