package rawbackend

// A backend that writes raw bytes lets a test of the proxy (package live)
// or of its replica client (live/upstream) send what net/http's server
// would not: a torn body, an early close, hop-by-hop headers, a trailer.

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// Server answers each request on a connection with its Serve function.
// It counts the connections it accepted and those that ended.
type Server struct {
	ln     net.Listener
	conns  atomic.Int64
	closed atomic.Int64 // connections ended (the peer closed, or a failure)
	wg     sync.WaitGroup
	mu     sync.Mutex
	open   []net.Conn
}

// Serve answers req, the n-th request (from 0) on its connection, whose
// body is body; false closes the connection.
type Serve func(w *bufio.Writer, req *http.Request, body []byte, n int) bool

// OK is the body WriteOK sends.
const OK = `{"ok":true}`

// WriteOK writes a 200 JSON answer of OK, with the header lines extra
// (each ending in "\r\n") added.
func WriteOK(w *bufio.Writer, extra string) {
	w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n" + extra + "\r\n" + OK)
}

// Start listens on 127.0.0.1 and serves until the test ends, when it
// closes every connection and waits for their goroutines.
func Start(t testing.TB, serve Serve) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			s.mu.Lock()
			s.open = append(s.open, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer s.closed.Add(1)
				defer c.Close()
				br, bw := bufio.NewReader(c), bufio.NewWriter(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					body, err := io.ReadAll(req.Body)
					if err != nil {
						return
					}
					keep := serve(bw, req, body, n)
					if bw.Flush() != nil || !keep {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.open {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

// URL is the server's http:// base URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Addr is the address it listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Conns is how many connections it accepted.
func (s *Server) Conns() int64 { return s.conns.Load() }

// Closed is how many of them ended.
func (s *Server) Closed() int64 { return s.closed.Load() }
