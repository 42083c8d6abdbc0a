package sessionstore

import (
	"context"
	"fmt"
	"math"
	"net"
	"syscall"
)

// What one exchange with the session store may make the proxy hold.
//
// go-redis allocates what a reply's headers announce before the bytes
// arrive: "*50000000\r\n" is a 50-million-slot slice (800 MB) at once,
// "$1000000000\r\n" a gigabyte, and a status line without its CRLF grows
// until the connection ends (internal/proto/reader.go: readSlice,
// readStringReply, readLine). Options has no bound on any of it, so the
// store's connections are wrapped (replyGuard, under go-redis's buffered
// reader): each reply byte is read there first, and a header that would
// take one exchange past maxStoreReply fails the read before go-redis sees
// it. go-redis then drops the connection as bad and the exchange fails, as
// any broken exchange does. The store's own commands are bounded on the
// server's side (the scripts of store.go), so a well-behaved Redis never
// comes near it: the largest legitimate exchange, the read of the other
// proxies' counts, stops past maxPeerBytes (16 MiB) plus one hash of at
// most maxPeerFields fields, about a third of it.
const (
	// maxStoreReply bounds what the replies of one exchange (a command,
	// a pipeline or a transaction) may announce: every bulk string's
	// length, 16 bytes per array element and 32 per map entry (the
	// interface values go-redis makes of them), and every line's bytes.
	maxStoreReply = 64 << 20
	// maxStoreLine bounds one line of a reply (a status, an error, a
	// number or a header): Redis's are a few dozen bytes, a Lua error a
	// few hundred.
	maxStoreLine = 64 << 10
)

// replyGuard is a connection to the session store whose reads check what
// the replies announce (RESP2 and RESP3), see maxStoreReply. An exchange
// starts at the first write after a read (go-redis writes a whole command,
// pipeline or transaction, then reads its replies). Not safe for
// concurrent reads, as no net.Conn under a buffered reader is read
// concurrently.
type replyGuard struct {
	net.Conn
	budget int64 // maxStoreReply, lower in tests
	used   int64 // announced by this exchange's replies so far
	read   bool  // a read since the last write: the next write starts an exchange
	err    error // sticky: the connection is dropped after it

	// The scan of the reply stream, across reads.
	state byte  // guardType, guardLine or guardBody
	kind  byte  // the current line's type byte
	line  int64 // bytes of the current line so far (type byte included)
	num   int64 // a header line's number so far
	neg   bool  // it started with '-'
	digit bool  // it has a digit
	body  int64 // bytes of a bulk string (and its CRLF) still to pass
}

const (
	guardType byte = iota // at the type byte of a reply
	guardLine             // in a line, after its type byte
	guardBody             // in a bulk string's bytes
)

// guardReplies wraps a connection dialed to the store. A connection that
// exposes its socket keeps it exposed: go-redis's pool checks an idle
// connection's socket (MSG_PEEK, without reading) before reusing it.
func guardReplies(c net.Conn, budget int64) net.Conn {
	g := &replyGuard{Conn: c, budget: budget}
	if sc, ok := c.(syscall.Conn); ok {
		return &sysReplyGuard{replyGuard: g, sc: sc}
	}
	return g
}

type sysReplyGuard struct {
	*replyGuard
	sc syscall.Conn
}

func (g *sysReplyGuard) SyscallConn() (syscall.RawConn, error) { return g.sc.SyscallConn() }

// guardDialer wraps dial's connections in replyGuard.
func guardDialer(dial func(context.Context, string, string) (net.Conn, error), budget int64) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return guardReplies(c, budget), nil
	}
}

func (g *replyGuard) Write(p []byte) (int, error) {
	if g.read {
		g.used, g.read = 0, false
	}
	return g.Conn.Write(p)
}

// Read passes on what the store sent once it is checked; at a header over
// the budget, or bytes that are not RESP, it returns the error instead, and
// every later read returns it too.
func (g *replyGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if n > 0 {
		g.read = true
		if serr := g.scan(p[:n]); serr != nil {
			g.err = serr
			return 0, serr
		}
	}
	return n, err
}

// scan follows the reply stream through b.
func (g *replyGuard) scan(b []byte) error {
	for len(b) > 0 {
		switch g.state {
		case guardBody:
			k := min(int64(len(b)), g.body)
			g.body -= k
			b = b[k:]
			if g.body == 0 {
				g.state = guardType
			}
		case guardType:
			g.kind, g.line, g.num, g.neg, g.digit = b[0], 1, 0, false, false
			switch g.kind {
			case '+', '-', ':', ',', '#', '(', '_', '$', '=', '!', '*', '~', '>', '%', '|':
			default:
				return fmt.Errorf("session store: a reply starts with %q, not a RESP type", g.kind)
			}
			g.state = guardLine
			b = b[1:]
		case guardLine:
			c := b[0]
			b = b[1:]
			g.line++
			if g.line > maxStoreLine {
				return fmt.Errorf("session store: a reply line runs past %d bytes", maxStoreLine)
			}
			if c == '\n' {
				if err := g.endLine(); err != nil {
					return err
				}
				continue
			}
			if !isHeader(g.kind) || c == '\r' {
				continue
			}
			switch {
			case c == '-' && g.line == 2:
				g.neg = true
			case c >= '0' && c <= '9' && g.num <= (math.MaxInt64-9)/10:
				g.num = 10*g.num + int64(c-'0')
				g.digit = true
			default:
				return fmt.Errorf("session store: a %q reply header holds %q, not a length", g.kind, c)
			}
		}
	}
	return nil
}

// isHeader reports whether a line of type kind announces a length or a
// count.
func isHeader(kind byte) bool {
	switch kind {
	case '$', '=', '!', '*', '~', '>', '%', '|':
		return true
	}
	return false
}

// endLine accounts for a whole line: its bytes, and for a header what it
// announces.
func (g *replyGuard) endLine() error {
	g.state = guardType
	if err := g.announce(g.line); err != nil {
		return err
	}
	if !isHeader(g.kind) {
		return nil
	}
	if !g.digit {
		return fmt.Errorf("session store: a %q reply header has no length", g.kind)
	}
	if g.neg {
		if g.num != 1 {
			return fmt.Errorf("session store: a %q reply header announces -%d", g.kind, g.num)
		}
		return nil // a null
	}
	n := g.num
	switch g.kind {
	case '$', '=', '!':
		if err := g.announce(n); err != nil {
			return err
		}
		g.body, g.state = n+2, guardBody
		return nil
	case '%', '|':
		return g.announceItems(n, 32)
	}
	return g.announceItems(n, 16)
}

// announceItems accounts for n elements of size bytes each.
func (g *replyGuard) announceItems(n, size int64) error {
	if n > (g.budget-g.used)/size {
		return fmt.Errorf("session store: a reply announces %d elements after %d bytes in one exchange, past the %d bytes one may hold", n, g.used, g.budget)
	}
	g.used += n * size
	return nil
}

func (g *replyGuard) announce(n int64) error {
	if n > g.budget-g.used {
		return fmt.Errorf("session store: a reply announces %d bytes after %d in one exchange, past the %d bytes one may hold", n, g.used, g.budget)
	}
	g.used += n
	return nil
}
