package upstream

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net/http"
	"sync"
	"sync/atomic"
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
// MaxFreeBody bytes in all. Not a sync.Pool: a pool is emptied at every
// other garbage collection, and with a small heap those come every few
// hundred milliseconds under load, so each one put every request back to
// fresh 64-256 KB allocations (zeroed, page-faulted in), which in turn
// brought the next collection sooner (issue 13, item 12).
var freeBodies struct {
	mu    sync.Mutex
	bufs  [numBodyClasses][]*[]byte
	bytes int
}

// MaxFreeBody bounds the bytes kept idle in freeBodies.
const MaxFreeBody = 32 << 20

// GetBuf returns an empty buffer with room for at least n bytes: a
// kept one of its class when there is one. The pointer is what goes back
// (PutBuf), so that giving it back allocates nothing.
func GetBuf(n int) *[]byte {
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

// PutBuf gives a buffer from GetBuf back, to be kept if there is
// room.
func PutBuf(bp *[]byte) {
	c := cap(*bp)
	k := bodyClass(c)
	if k < 0 || c != 1<<(k+minBodyClassShift) {
		return
	}
	*bp = (*bp)[:0]
	f := &freeBodies
	f.mu.Lock()
	if f.bytes+c <= MaxFreeBody {
		f.bufs[k] = append(f.bufs[k], bp)
		f.bytes += c
	}
	f.mu.Unlock()
}

// initialBodyBuf is the most ReadBody takes before the bytes arrive.
const initialBodyBuf = 64 << 10

// bodyGrowth is the factor a full body buffer grows by. Each growth copies
// what has arrived: at 2 a 256 KiB body was copied 192 KiB over (64 and
// 128), at 4 it is 64 KiB, and a buffer is still never more than 4 times
// the bytes that have arrived (issue 13, items 5 and 12).
const bodyGrowth = 4

// HeadSlack is what net/http's server may hold of a body in its read
// buffer (4 KiB) beside what the socket reports queued.
const HeadSlack = 4 << 10

// Arrivals reports how many bytes of a connection have arrived and wait
// in the kernel to be read (rawConn, by FIONREAD).
type Arrivals interface{ Queued() int }

// Body is a request body read whole. data is valid until release.
type Body struct {
	data []byte

	mu       sync.Mutex
	buf      *[]byte // the pooled buffer data lies in; nil once released or when not pooled
	budget   *Budget // what the buffer is counted against; nil: none
	held     int64   // the buffer's bytes counted in budget
	released bool
}

// BodyOf is a Body over data that its caller owns (a body another front
// end read): nothing pooled, nothing counted.
func BodyOf(data []byte) *Body { return &Body{data: data} }

// Bytes is the body; valid until Release.
func (b *Body) Bytes() []byte { return b.data }

// errBodyReleased is what a reader of a finished call's body gets.
var errBodyReleased = errors.New("request body read after its request finished")

// Budget is limits.max_body_bytes_in_flight: the bytes of request
// body buffers the proxy holds at once (issue 46, item 5: 40 clients each
// sending 16 MiB took the proxy from 47 MB to 707 MB). A body counts its
// buffer's capacity from the moment it is taken until the call gives it
// back (Body.release): once the replica has answered (forward), or
// when the call ends for an https replica or with the journal on; a
// growth counts the larger buffer only (both are held for the copy
// between them). A request whose buffer would take
// the bodies held past the limit is refused at once (OverBudgetError):
// 429/529 with Retry-After while other bodies hold the room, 413 when
// its body alone is larger than the limit. The zero value holds nothing.
type Budget struct{ held atomic.Int64 }

// take counts n more bytes if the bodies held stay within limit.
func (b *Budget) Take(n, limit int64) bool {
	for {
		cur := b.held.Load()
		if cur+n > limit {
			return false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// give uncounts n bytes.
func (b *Budget) Give(n int64) { b.held.Add(-n) }

// Held is the bytes counted now.
func (b *Budget) Held() int64 { return b.held.Load() }

// BodyLimits is what ReadBody may take: buffers counted against budget
// (nil: none) within inFlight bytes, and for a body of unknown length at
// most max bytes (limits.max_body_bytes, which the front end's
// http.MaxBytesReader enforces; 0: unbounded).
type BodyLimits struct {
	Budget   *Budget
	InFlight int64
	Max      int64
}

// OverBudgetError is a body that limits.max_body_bytes_in_flight has no
// room for: alone, it is larger than the limit itself.
type OverBudgetError struct {
	Alone bool  // the body alone is larger than the limit
	Limit int64 // limits.max_body_bytes_in_flight
}

func (e *OverBudgetError) Error() string {
	if e.Alone {
		return fmt.Sprintf("request body is larger than the %d bytes the proxy holds of all bodies at once (limits.max_body_bytes_in_flight)", e.Limit)
	}
	return fmt.Sprintf("the proxy holds %d bytes of request bodies, its limit (limits.max_body_bytes_in_flight); retry shortly", e.Limit)
}

// bodyBufs is the buffer of the body ReadBody is reading and what it
// counts in the budget.
type bodyBufs struct {
	lim  BodyLimits
	bp   *[]byte
	held int64
}

// grow replaces the buffer (nil at first) with one of room for n bytes,
// holding what it has read, counted in the budget first: a buffer of
// the class of n, or of exactly n (not pooled) when the class alone is
// over the limit and n is not.
func (b *bodyBufs) grow(n int64) error {
	c, exact := bodyClassCap(n), false
	if b.lim.Budget != nil {
		if n > b.lim.InFlight {
			return &OverBudgetError{Alone: true, Limit: b.lim.InFlight}
		}
		if c > b.lim.InFlight {
			c, exact = n, true
		}
		if c > b.held && !b.lim.Budget.Take(c-b.held, b.lim.InFlight) {
			return &OverBudgetError{Limit: b.lim.InFlight}
		}
	}
	var nbp *[]byte
	if exact {
		nb := make([]byte, 0, n)
		nbp = &nb
	} else {
		nbp = GetBuf(int(n))
	}
	if b.bp != nil {
		*nbp = append(*nbp, *b.bp...)
		PutBuf(b.bp)
	}
	b.bp = nbp
	if b.lim.Budget != nil {
		if c < b.held {
			b.lim.Budget.Give(b.held - c)
		}
		b.held = c
	}
	return nil
}

// drop gives the buffer and its count back (a body that failed).
func (b *bodyBufs) drop() {
	if b.bp != nil {
		PutBuf(b.bp)
		b.bp = nil
	}
	if b.lim.Budget != nil && b.held > 0 {
		b.lim.Budget.Give(b.held)
		b.held = 0
	}
}

// bodyClassCap is the capacity GetBuf gives for n bytes.
func bodyClassCap(n int64) int64 {
	if n > 1<<(minBodyClassShift+numBodyClasses-1) {
		return n
	}
	return 1 << (bodyClass(int(n)) + minBodyClassShift)
}

// ReadBody reads a whole request body (net/http never returns more than
// Content-Length). It takes buffers as the bytes come, never the declared
// length up front: a client that declares 16 MiB and sends little costs
// little. A buffer holds at most what conn (nil: unknown) reports arrived
// and HeadSlack, or initialBodyBuf, and grows by bodyGrowth, or to what
// has arrived, when full. A body that has arrived whole before it is read
// (a client on a fast link sends it with its head) goes into one buffer
// of its size, read in one syscall, not copied over at a growth (issue
// 13, item 12). A body of unknown length (chunked) grows the same way up
// to lim.Max. Every buffer is counted against lim's budget before it is
// taken (OverBudgetError when there is no room).
func ReadBody(r io.Reader, length int64, conn Arrivals, lim BodyLimits) (*Body, error) {
	arrived := func(have int) int64 {
		if conn == nil {
			return 0
		}
		return int64(have + conn.Queued() + HeadSlack)
	}
	// most is the size the buffer need not outgrow.
	most := length
	if length <= 0 {
		most = lim.Max
		if most <= 0 {
			most = math.MaxInt64
		}
	}
	first := int64(initialBodyBuf)
	if length > first {
		first = max(first, arrived(0))
	}
	if lim.Budget != nil && length > lim.InFlight {
		return nil, &OverBudgetError{Alone: true, Limit: lim.InFlight}
	}
	b := bodyBufs{lim: lim}
	if err := b.grow(min(most, first)); err != nil {
		return nil, err
	}
	buf := *b.bp
	for length <= 0 || int64(len(buf)) < length {
		if room := int64(cap(buf)); int64(len(buf)) == min(room, most) {
			if room >= most { // unknown length, at lim.Max
				if err := atEnd(r); err != nil {
					*b.bp = buf
					b.drop()
					return nil, err
				}
				break
			}
			next := max(bodyGrowth*int64(cap(buf)), arrived(len(buf)))
			*b.bp = buf
			if err := b.grow(min(next, most)); err != nil {
				b.drop()
				return nil, err
			}
			buf = *b.bp
		}
		n, err := r.Read(buf[len(buf):min(int64(cap(buf)), most)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			if err == io.ErrUnexpectedEOF {
				break
			}
			*b.bp = buf
			b.drop()
			return nil, err
		}
	}
	*b.bp = buf
	if length > 0 && int64(len(buf)) < length {
		b.drop()
		return nil, fmt.Errorf("body shorter than its Content-Length %d", length)
	}
	return &Body{data: buf, buf: b.bp, budget: lim.Budget, held: b.held}, nil
}

// atEnd reads what follows a body of unknown length that filled lim.Max:
// nil at its end, else the error (http.MaxBytesReader's, past its limit).
func atEnd(r io.Reader) error {
	var one [1]byte
	for {
		n, err := r.Read(one[:])
		switch {
		case n > 0:
			return &http.MaxBytesError{}
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
}

// reader returns a reader of the body for one attempt.
func (b *Body) Reader() io.ReadCloser { return &bodyReader{b: b} }

// release gives the buffer back; readers find the body gone from now on.
// The caller must not use data after it.
func (b *Body) Release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.released {
		return
	}
	b.released = true
	if b.buf != nil {
		PutBuf(b.buf)
		b.buf = nil
	}
	if b.budget != nil {
		b.budget.Give(b.held)
		b.held = 0
	}
	b.data = nil
}

// bodyReader reads a Body from the start, under the body's lock.
type bodyReader struct {
	b   *Body
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

// CopyBufferSize is the size of the buffers that carry response bodies:
// live's copy to the client and a stream's reads.
const CopyBufferSize = 32 << 10

// BufferPool hands out the copy buffers (32 KB a response otherwise),
// kept with the request bodies' (freeBodies).
type BufferPool struct{}

func (BufferPool) Get() []byte {
	bp := GetBuf(CopyBufferSize)
	return (*bp)[:CopyBufferSize]
}

func (BufferPool) Put(buf []byte) {
	if cap(buf) == CopyBufferSize {
		buf = buf[:0]
		PutBuf(&buf)
	}
}

// CopyBuffers is the pool of copy buffers.
var CopyBuffers BufferPool
