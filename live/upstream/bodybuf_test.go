package upstream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
)

func TestBodyClass(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{0, 0}, {1, 0}, {4096, 0}, {4097, 1}, {8192, 1}, {64 << 10, 4}, {64<<10 + 1, 5},
		{16 << 20, 12}, {16<<20 + 1, -1},
	} {
		if got := bodyClass(tc.n); got != tc.want {
			t.Errorf("bodyClass(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

func TestReadBody(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 40000) // 640,000 bytes: grows past initialBodyBuf
	for _, tc := range []struct {
		name    string
		r       io.Reader
		length  int64
		want    []byte
		wantErr string
	}{
		{"exact", strings.NewReader(`{"a":1}`), 7, []byte(`{"a":1}`), ""},
		{"grows", bytes.NewReader(big), int64(len(big)), big, ""},
		{"grows in small reads", iotest.OneByteReader(bytes.NewReader(big[:70000])), 70000, big[:70000], ""},
		{"unknown length", strings.NewReader(`{"b":2}`), -1, []byte(`{"b":2}`), ""},
		{"short", strings.NewReader(`{"a"`), 7, nil, "body shorter than its Content-Length 7"},
		{"short after growing", bytes.NewReader(big[:100000]), 200000, nil, "body shorter than its Content-Length 200000"},
		{"read error", iotest.TimeoutReader(strings.NewReader(`{"a":1}`)), 100, nil, "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rb, err := ReadBody(tc.r, tc.length, nil, BodyLimits{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(rb.data, tc.want) {
				t.Fatalf("read %d bytes, want %d", len(rb.data), len(tc.want))
			}
			got, err := io.ReadAll(rb.Reader())
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("reader: %d bytes, %v", len(got), err)
			}
			rb.Release()
			rb.Release() // twice is harmless
		})
	}
}

// A reader of a body whose call finished gets an error, never the bytes
// of the request that took the buffer next.
func TestBodyReaderAfterRelease(t *testing.T) {
	a := bytes.Repeat([]byte("A"), 100<<10)
	rb, err := ReadBody(bytes.NewReader(a), int64(len(a)), nil, BodyLimits{})
	if err != nil {
		t.Fatal(err)
	}
	r := rb.Reader()
	p := make([]byte, 4096)
	if n, err := r.Read(p); n != len(p) || err != nil {
		t.Fatalf("first read: %d, %v", n, err)
	}
	rb.Release()
	b := bytes.Repeat([]byte("B"), 100<<10)
	next, err := ReadBody(bytes.NewReader(b), int64(len(b)), nil, BodyLimits{}) // likely the same buffer, from the pool
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release()
	for range 3 {
		n, err := r.Read(p)
		if n != 0 || !errors.Is(err, errBodyReleased) {
			t.Fatalf("read after release: %d bytes (%q...), %v; want 0, errBodyReleased", n, p[:min(n, 8)], err)
		}
	}
	if !bytes.Equal(next.data, b) {
		t.Fatal("the next body was changed")
	}
}

// Readers racing a release (run with -race): each read sees the body or
// the error, and the buffer is never written while a read copies it.
func TestBodyReleaseRacesReaders(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 300<<10)
	for range 50 {
		rb, err := ReadBody(bytes.NewReader(data), int64(len(data)), nil, BodyLimits{})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				r, p := rb.Reader(), make([]byte, 32<<10)
				for {
					n, err := r.Read(p)
					if bytes.ContainsFunc(p[:n], func(c rune) bool { return c != 'x' }) {
						t.Error("read a byte that is not the body's")
					}
					if err != nil {
						return
					}
				}
			})
		}
		rb.Release()
		wg.Wait()
		// The next body takes the buffer and overwrites it.
		other, _ := ReadBody(bytes.NewReader(bytes.Repeat([]byte("y"), len(data))), int64(len(data)), nil, BodyLimits{})
		other.Release()
	}
}

// TestFreeBodies: a buffer given back is the next one of its class taken,
// even after garbage collections (a sync.Pool would have dropped it), and
// no more than MaxFreeBody bytes are kept idle.
func TestFreeBodies(t *testing.T) {
	const n = 256 << 10
	bp := GetBuf(n)
	*bp = append(*bp, "x"...)
	PutBuf(bp)
	runtime.GC()
	runtime.GC()
	if got := GetBuf(n); got != bp || len(*got) != 0 {
		t.Fatalf("after two collections: a fresh buffer (%p, len %d), want the kept %p, empty", got, len(*got), bp)
	}
	var held []*[]byte
	for range 2 * MaxFreeBody / n {
		held = append(held, GetBuf(n))
	}
	for _, b := range held {
		PutBuf(b)
	}
	freeBodies.mu.Lock()
	kept := freeBodies.bytes
	freeBodies.mu.Unlock()
	if kept > MaxFreeBody || kept < MaxFreeBody-n {
		t.Errorf("%d bytes kept, want at most %d and near it", kept, MaxFreeBody)
	}
	// A buffer of no class, or of a size not its class's, is not kept.
	odd := make([]byte, 0, 5000)
	PutBuf(&odd)
	freeBodies.mu.Lock()
	for _, b := range freeBodies.bufs[1] {
		if b == &odd {
			t.Error("kept a buffer of 5000 bytes in the 8 KiB class")
		}
	}
	freeBodies.mu.Unlock()
}

// boundReader gives n bytes in pieces of at most piece, then EOF, and
// checks that the space ReadBody offers never makes its buffer more than
// bodyGrowth times the bytes that have arrived (or initialBodyBuf), or
// what has arrived and waits (ahead bytes past those read, reported as
// queued: Arrivals) rounded up to its buffer class.
type boundReader struct {
	t             *testing.T
	n, piece, got int
	ahead         int
	buffers       int
	last          *byte
}

func (r *boundReader) Queued() int { return min(r.ahead, r.n-r.got) }

func (r *boundReader) Read(p []byte) (int, error) {
	arrived := r.got + r.Queued() + HeadSlack
	bound := max(bodyGrowth*max(r.got, initialBodyBuf), 1<<(bodyClass(arrived)+minBodyClassShift))
	if total := r.got + len(p); total > bound {
		r.t.Fatalf("after %d bytes (%d more arrived) the buffer holds %d", r.got, r.Queued(), total)
	}
	if len(p) > 0 && &p[0] != r.last {
		r.buffers++ // a new buffer, not the rest of the last one
	}
	k := min(len(p), r.piece, r.n-r.got)
	if k == 0 {
		return 0, io.EOF
	}
	r.got += k
	if k < len(p) {
		r.last = &p[k]
	} else {
		r.last = nil
	}
	return k, nil
}

func TestReadBodyGrowth(t *testing.T) {
	for _, tc := range []struct {
		name              string
		declared, sent    int64
		piece, maxBuffers int
		ahead             int  // bytes arrived ahead of the reads (Arrivals)
		noConn            bool // the connection cannot tell (ReadBody's conn nil)
	}{
		{"256 KiB in one read after the first: one growth", 256 << 10, 256 << 10, 256 << 10, 2, 0, true},
		{"1 MiB in 32 KiB pieces", 1 << 20, 1 << 20, 32 << 10, 3, 0, true},
		{"declares 16 MiB, sends 1 MiB", 16 << 20, 1 << 20, 32 << 10, 4, 0, true},
		// A body that has arrived whole takes one buffer, read at once,
		// never copied over at a growth (two buffers before).
		{"256 KiB arrived: one buffer", 256 << 10, 256 << 10, 256 << 10, 1, 256 << 10, false},
		{"1 MiB arrived: one buffer", 1 << 20, 1 << 20, 1 << 20, 1, 1 << 20, false},
		{"1 MiB, 300 KiB ahead of the reads", 1 << 20, 1 << 20, 64 << 10, 3, 300 << 10, false},
		{"declares 16 MiB, 1 MiB arrives, nothing ahead", 16 << 20, 1 << 20, 32 << 10, 4, 0, false},
		{"declares 16 MiB, 100 KiB arrives", 16 << 20, 100 << 10, 100 << 10, 1, 100 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &boundReader{t: t, n: int(tc.sent), piece: tc.piece, ahead: tc.ahead}
			var conn Arrivals = r
			if tc.noConn {
				conn = nil
			}
			rb, err := ReadBody(r, tc.declared, conn, BodyLimits{})
			if tc.sent < tc.declared {
				if err == nil {
					t.Fatal("a short body was read without error")
				}
			} else if err != nil || len(rb.data) != int(tc.sent) {
				t.Fatalf("read %d bytes, %v; want %d", len(rb.data), err, tc.sent)
			}
			if r.buffers > tc.maxBuffers {
				t.Errorf("%d buffers, want at most %d", r.buffers, tc.maxBuffers)
			}
		})
	}
}

// TestReadBodyBudget: ReadBody counts each body's buffer against its
// budget from the first byte (a growth counting the larger buffer only),
// release gives it back, a body with no room is refused (Alone: larger
// than the whole limit), and a chunked body past lim.Max fails with
// http.MaxBytesError, as the front end's reader would.
func TestReadBodyBudget(t *testing.T) {
	var b Budget
	lim := BodyLimits{Budget: &b, InFlight: 1 << 20, Max: 700 << 10}
	small := bytes.Repeat([]byte("a"), 200<<10)
	rb, err := ReadBody(bytes.NewReader(small[:100<<10]), 100<<10, nil, lim)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.held.Load(); got != int64(cap(rb.data)) || got != 128<<10 {
		t.Errorf("held %d after a 100 KiB body, want its 128 KiB buffer", got)
	}
	// Chunked (unknown length), grown 64 KiB -> 256 KiB: the larger counts.
	rb2, err := ReadBody(bytes.NewReader(small[:200<<10]), -1, nil, lim)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.held.Load(); got != (128+256)<<10 {
		t.Errorf("held %d KiB with two bodies, want 384", got>>10)
	}
	// 1.5 MiB would need more than the whole limit.
	big := bytes.Repeat([]byte("b"), 1536<<10)
	if _, err := ReadBody(bytes.NewReader(big), int64(len(big)), nil, lim); !isOverBudget(err, true) {
		t.Errorf("a 1.5 MiB body under a 1 MiB budget: %v, want over the budget alone", err)
	}
	// 600 KiB needs a 1 MiB buffer: with 384 KiB held there is no room.
	if _, err := ReadBody(bytes.NewReader(big[:600<<10]), 600<<10, nil, lim); !isOverBudget(err, false) {
		t.Errorf("a 600 KiB body with 640 KiB free: %v, want over the budget, not alone", err)
	}
	if got := b.held.Load(); got != (128+256)<<10 {
		t.Errorf("held %d KiB after refusals, want 384: a refused body's buffers are given back", got>>10)
	}
	rb.Release()
	rb2.Release()
	rb2.Release()
	if got := b.held.Load(); got != 0 {
		t.Errorf("held %d after every body was released, want 0", got)
	}
	// A body whose size class is over the limit but which is not goes
	// into a buffer of its own size.
	var b2 Budget
	rb3, err := ReadBody(bytes.NewReader(big[:700<<10]), 700<<10, nil, BodyLimits{Budget: &b2, InFlight: 800 << 10})
	if err != nil || cap(rb3.data) != 700<<10 || b2.held.Load() != 700<<10 {
		t.Errorf("a 700 KiB body under an 800 KiB budget: %v, buffer %d, held %d; want one exact 700 KiB buffer", err, cap(rb3.data), b2.held.Load())
	}
	// Chunked past lim.Max.
	_, err = ReadBody(bytes.NewReader(bytes.Repeat([]byte("c"), 800<<10)), -1, nil, BodyLimits{Max: 700 << 10})
	var mbe *http.MaxBytesError
	if !errors.As(err, &mbe) {
		t.Errorf("a chunked body past max: %v, want *http.MaxBytesError", err)
	}
	// ... and one exactly at it is whole.
	if rb, err := ReadBody(bytes.NewReader(big), -1, nil, BodyLimits{Max: int64(len(big))}); err != nil || len(rb.data) != len(big) {
		t.Errorf("a chunked body of exactly max: %v", err)
	}
}

// isOverBudget reports an *OverBudgetError with the given alone.
func isOverBudget(err error, alone bool) bool {
	var ob *OverBudgetError
	return errors.As(err, &ob) && ob.Alone == alone
}

// BenchmarkReadBody reads a body that has arrived whole into a pooled
// buffer and gives it back, counted against a budget as admit does
// (limits.max_body_bytes_in_flight): the request path's share of item 5
// of issue 46.
func BenchmarkReadBody(b *testing.B) {
	for _, size := range []int{64 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("%dK", size>>10), func(b *testing.B) {
			data := bytes.Repeat([]byte("x"), size)
			var budget Budget
			lim := BodyLimits{Budget: &budget, InFlight: 1 << 30, Max: 16 << 20}
			r := bytes.NewReader(data)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(data)
				rb, err := ReadBody(r, int64(size), nil, lim)
				if err != nil {
					b.Fatal(err)
				}
				rb.Release()
			}
		})
	}
}
