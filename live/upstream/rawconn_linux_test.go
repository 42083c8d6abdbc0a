package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"github.com/lm-warden/warden/live/internal/rawbackend"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// rawPair returns a rawConn and the plain TCP connection at its other end,
// both on 127.0.0.1, closed at the test's end.
func rawPair(t *testing.T) (*rawConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := rawListener{ln}.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	rc, ok := c.(*rawConn)
	if !ok {
		t.Fatalf("rawListener gave a %T, want *rawConn", c)
	}
	t.Cleanup(func() { rc.Close(); peer.Close() })
	return rc, peer.(*net.TCPConn)
}

// pattern is n bytes that differ from one offset to the next, so that a
// lost, repeated or reordered piece shows.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7+i/251)
	}
	return b
}

func TestRawConnWritev(t *testing.T) {
	// Larger than the socket buffers, so that writes are partial and wait
	// in the netpoller; the empty buffer and the split points check the
	// iovec bookkeeping.
	for _, sizes := range [][]int{
		{0},
		{1},
		{100, 0, 3},
		{512, 1 << 20},
		{3, 1 << 20, 0, 1 << 20, 7, 5, 9},
	} {
		rc, peer := rawPair(t)
		if err := rc.SetWriteBuffer(16 << 10); err != nil {
			t.Fatal(err)
		}
		var bufs [][]byte
		var want []byte
		for i, n := range sizes {
			b := pattern(n, byte(i))
			bufs = append(bufs, b)
			want = append(want, b...)
		}
		got := make(chan []byte)
		go func() {
			b, _ := io.ReadAll(peer)
			got <- b
		}()
		if err := writeBufs(rc, bufs...); err != nil {
			t.Fatalf("%v: %v", sizes, err)
		}
		_ = rc.CloseWrite()
		if b := <-got; !bytes.Equal(b, want) {
			t.Errorf("%v: the peer read %d bytes, want %d, or they differ", sizes, len(b), len(want))
		}
	}
}

func TestRawConnRead(t *testing.T) {
	rc, peer := rawPair(t)
	want := pattern(3<<20, 1)
	go func() {
		_, _ = peer.Write(want)
		_ = peer.CloseWrite()
	}()
	if n, err := rc.Read(nil); n != 0 || err != nil {
		t.Errorf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
	got, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d, or they differ", len(got), len(want))
	}
	if n, err := rc.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Errorf("Read after the peer's end = %d, %v; want 0, io.EOF", n, err)
	}
}

// TestRawConnErrors: deadlines, Close and a reset peer give the errors that
// net/http and the proxy test for, as net.TCPConn's do.
func TestRawConnErrors(t *testing.T) {
	t.Run("read deadline", func(t *testing.T) {
		rc, _ := rawPair(t)
		_ = rc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := rc.Read(make([]byte, 8))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("err = %v, want a net.Error that is a timeout", err)
		}
	})
	t.Run("write deadline", func(t *testing.T) {
		rc, _ := rawPair(t) // the peer never reads
		big := make([]byte, 64<<20)
		_ = rc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := rc.Write(big)
		if !errors.Is(err, os.ErrDeadlineExceeded) || n <= 0 || n >= 64<<20 {
			t.Errorf("Write = %d, %v; want part of it and a timeout", n, err)
		}
	})
	t.Run("close during read", func(t *testing.T) {
		rc, _ := rawPair(t)
		done := make(chan error)
		go func() {
			_, err := rc.Read(make([]byte, 8))
			done <- err
		}()
		time.Sleep(10 * time.Millisecond) // let it wait in the netpoller; either order passes
		_ = rc.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("err = %v, want net.ErrClosed", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		rc, peer := rawPair(t)
		_ = peer.SetLinger(0) // close sends RST
		_ = peer.Close()
		var err error
		for range 100 { // the RST arrives after a moment
			if _, err = rc.Write([]byte("x")); err != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "write" || !(errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
			t.Errorf("err = %v, want a write *net.OpError with EPIPE or ECONNRESET", err)
		}
		if op != nil && (op.Source == nil || op.Addr == nil) {
			t.Errorf("the error names no addresses: %+v", op)
		}
	})
}

// TestRawConnUsed: the proxy's clients and its replica connections are
// rawConns (a refactor that lost them would cost a context switch a
// request, which only `make speed` would show).
func TestRawConnUsed(t *testing.T) {
	srv := rawbackend.Start(t, func(w *bufio.Writer, _ *http.Request, _ []byte, _ int) bool {
		rawbackend.WriteOK(w, "")
		return true
	})
	u := testUpstream(t)
	pc, err := u.get(t.Context(), srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.nc.Close()
	if _, ok := pc.nc.(*rawConn); !ok {
		t.Errorf("a replica connection is a %T, want *rawConn", pc.nc)
	}
}

// TestRawConnConcurrent: Writes from several goroutines each go out whole,
// never interleaved, and concurrent Reads share the bytes without loss, as
// on a net.TCPConn (the race detector watches the per-direction state).
func TestRawConnConcurrent(t *testing.T) {
	rc, peer := rawPair(t)
	const writers, each, size = 4, 200, 3000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			msg := bytes.Repeat([]byte{byte('a' + w)}, size)
			for range each {
				if _, err := rc.Write(msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); _ = rc.CloseWrite() }()
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != writers*each*size {
		t.Fatalf("read %d bytes, want %d", len(got), writers*each*size)
	}
	for i := 0; i < len(got); i += size {
		if m := got[i : i+size]; !bytes.Equal(m, bytes.Repeat(m[:1], size)) {
			t.Fatalf("message at %d is interleaved with another", i)
		}
	}

	// Readers the other way.
	want := pattern(1<<20, 3)
	go func() { _, _ = peer.Write(want); _ = peer.CloseWrite() }()
	var mu sync.Mutex
	total := 0
	var rg sync.WaitGroup
	for range 3 {
		rg.Go(func() {
			buf := make([]byte, 4096)
			for {
				n, err := rc.Read(buf)
				mu.Lock()
				total += n
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	rg.Wait()
	if total != len(want) {
		t.Errorf("the readers got %d bytes, want %d", total, len(want))
	}
}

// TestRawConnQueued: queued reports what has arrived and is not read yet,
// as the bytes come and as they are read.
func TestRawConnQueued(t *testing.T) {
	rc, peer := rawPair(t)
	if n := rc.Queued(); n != 0 {
		t.Fatalf("nothing sent, queued %d", n)
	}
	data := pattern(100<<10, 3) // within a fresh socket's receive buffer (128 KiB)
	go func() { _, _ = peer.Write(data) }()
	deadline := time.Now().Add(10 * time.Second)
	for rc.Queued() < len(data) {
		if time.Now().After(deadline) {
			t.Fatalf("queued %d of %d bytes sent", rc.Queued(), len(data))
		}
		time.Sleep(time.Millisecond)
	}
	buf := make([]byte, 30<<10)
	if _, err := io.ReadFull(rc, buf); err != nil {
		t.Fatal(err)
	}
	if n := rc.Queued(); n != len(data)-len(buf) {
		t.Errorf("after reading %d of %d bytes, queued %d", len(buf), len(data), n)
	}
	rc.Close()
	if n := rc.Queued(); n != 0 {
		t.Errorf("closed, queued %d", n)
	}
}

// rawListener gives a listener's connections as rawConns, as the
// proxy's listener does (listener.go).
type rawListener struct{ net.Listener }

func (l rawListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return wrapRaw(c), nil
}
