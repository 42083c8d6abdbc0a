package live

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"
)

// Request bodies are read whole (the model and the session are in them)
// into buffers recycled across requests: at 1,000 requests/s of 64-256 KB
// a fresh buffer per request is most of the proxy's allocation, and the
// garbage collector's work and the zeroing of large objects that come
// with it were a fifth of its CPU (BenchmarkProxyPath, issue 13 item 12).
//
// A buffer goes back to its pool when the call finishes. The proxy's own
// client (upstream.go) writes a body synchronously, under the body's lock,
// so it never reads one late; but an https replica goes through net/http's
// Transport, which writes the body from its own goroutine, one that can
// outlive the handler (ReverseProxy's note on issue 46866). So attempts
// never read the buffer without the lock: each reads through a bodyReader
// (or send) that holds it while it copies and finds the body released once
// the call is over. A late reader gets an error, never the bytes of the
// next request that took the buffer.

// Buffers come in size classes of powers of two from 4 KiB to 16 MiB (the
// default limits.max_body_bytes); a larger body gets a buffer of its own.
const (
	minBodyClassShift = 12
	numBodyClasses    = 13
)

// bodyClass is the smallest class whose buffers hold n bytes, or -1 when
// none does.
func bodyClass(n int) int {
	if n <= 1<<minBodyClassShift {
		return 0
	}
	k := bits.Len(uint(n-1)) - minBodyClassShift
	if k >= numBodyClasses {
		return -1
	}
	return k
}

// freeBodies keeps the buffers of finished calls for the next ones, up to
// maxFreeBody bytes in all. Not a sync.Pool: a pool is emptied at every
// other garbage collection, and with a small heap those come every few
// hundred milliseconds under load, so each one put every request back to
// fresh 64-256 KB allocations (zeroed, page-faulted in), which in turn
// brought the next collection sooner (issue 13, item 12).
var freeBodies struct {
	mu    sync.Mutex
	bufs  [numBodyClasses][]*[]byte
	bytes int
}

// maxFreeBody bounds the bytes kept idle in freeBodies.
const maxFreeBody = 32 << 20

// getBodyBuf returns an empty buffer with room for at least n bytes: a
// kept one of its class when there is one. The pointer is what goes back
// (putBodyBuf), so that giving it back allocates nothing.
func getBodyBuf(n int) *[]byte {
	k := bodyClass(n)
	if k < 0 {
		b := make([]byte, 0, n)
		return &b
	}
	f := &freeBodies
	f.mu.Lock()
	if l := len(f.bufs[k]); l > 0 {
		bp := f.bufs[k][l-1]
		f.bufs[k][l-1] = nil
		f.bufs[k] = f.bufs[k][:l-1]
		f.bytes -= cap(*bp)
		f.mu.Unlock()
		*bp = (*bp)[:0]
		return bp
	}
	f.mu.Unlock()
	b := make([]byte, 0, 1<<(k+minBodyClassShift))
	return &b
}

// putBodyBuf gives a buffer from getBodyBuf back, to be kept if there is
// room.
func putBodyBuf(bp *[]byte) {
	c := cap(*bp)
	k := bodyClass(c)
	if k < 0 || c != 1<<(k+minBodyClassShift) {
		return
	}
	*bp = (*bp)[:0]
	f := &freeBodies
	f.mu.Lock()
	if f.bytes+c <= maxFreeBody {
		f.bufs[k] = append(f.bufs[k], bp)
		f.bytes += c
	}
	f.mu.Unlock()
}

// initialBodyBuf is the most readBody takes before the bytes arrive.
const initialBodyBuf = 64 << 10

// bodyGrowth is the factor a full body buffer grows by. Each growth copies
// what has arrived: at 2 a 256 KiB body was copied 192 KiB over (64 and
// 128), at 4 it is 64 KiB, and a buffer is still never more than 4 times
// the bytes that have arrived (issue 13, items 5 and 12).
const bodyGrowth = 4

// headSlack is what net/http's server may hold of a body in its read
// buffer (4 KiB) beside what the socket reports queued.
const headSlack = 4 << 10

// arrivals reports how many bytes of a connection have arrived and wait
// in the kernel to be read (rawConn, by FIONREAD).
type arrivals interface{ queued() int }

// reqBody is a request body read whole. data is valid until release.
type reqBody struct {
	data []byte

	mu       sync.Mutex
	buf      *[]byte // the pooled buffer data lies in; nil once released or when not pooled
	released bool
}

// errBodyReleased is what a reader of a finished call's body gets.
var errBodyReleased = errors.New("request body read after its request finished")

// readBody reads a whole request body (net/http never returns more than
// Content-Length). It takes buffers as the bytes come, never the declared
// length up front: a client that declares 16 MiB and sends little costs
// little. A buffer holds at most what conn (nil: unknown) reports arrived
// and headSlack, or initialBodyBuf, and grows by bodyGrowth, or to what
// has arrived, when full. A body that has arrived whole before it is read
// (a client on a fast link sends it with its head) goes into one buffer
// of its size, read in one syscall, not copied over at a growth (issue
// 13, item 12). A body of unknown length (chunked) is read with io.ReadAll
// and not pooled.
func readBody(r io.Reader, length int64, conn arrivals) (*reqBody, error) {
	if length <= 0 {
		data, err := io.ReadAll(r)
		if err != nil {
			return nil, err
		}
		return &reqBody{data: data}, nil
	}
	arrived := func(have int) int64 {
		if conn == nil {
			return 0
		}
		return int64(have + conn.queued() + headSlack)
	}
	first := int64(initialBodyBuf)
	if length > first {
		first = max(first, arrived(0))
	}
	bp := getBodyBuf(int(min(length, first)))
	buf := *bp
	for int64(len(buf)) < length {
		if len(buf) == cap(buf) {
			next := max(bodyGrowth*int64(cap(buf)), arrived(len(buf)))
			nbp := getBodyBuf(int(min(next, length)))
			nb := append(*nbp, buf...)
			*bp = buf
			putBodyBuf(bp)
			bp, buf = nbp, nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			if err == io.ErrUnexpectedEOF {
				break
			}
			*bp = buf
			putBodyBuf(bp)
			return nil, err
		}
	}
	*bp = buf
	if int64(len(buf)) < length {
		putBodyBuf(bp)
		return nil, fmt.Errorf("body shorter than its Content-Length %d", length)
	}
	return &reqBody{data: buf, buf: bp}, nil
}

// reader returns a reader of the body for one attempt.
func (b *reqBody) reader() io.ReadCloser { return &bodyReader{b: b} }

// release gives the buffer back; readers find the body gone from now on.
// The caller must not use data after it.
func (b *reqBody) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.released {
		return
	}
	b.released = true
	if b.buf != nil {
		putBodyBuf(b.buf)
		b.buf = nil
	}
	b.data = nil
}

// bodyReader reads a reqBody from the start, under the body's lock.
type bodyReader struct {
	b   *reqBody
	off int
}

func (r *bodyReader) Read(p []byte) (int, error) {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if r.b.released {
		return 0, errBodyReleased
	}
	if r.off >= len(r.b.data) {
		return 0, io.EOF
	}
	n := copy(p, r.b.data[r.off:])
	r.off += n
	return n, nil
}

func (r *bodyReader) Close() error { return nil }
