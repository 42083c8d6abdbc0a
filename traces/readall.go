package traces

import (
	"bytes"
	"errors"
	"io"
	"math"
	"runtime"
	"sync"
)

// readAllBatchBytes is about how many bytes of lines ReadAll hands a
// parsing goroutine at once (tests make it small).
var readAllBatchBytes = 256 << 10

// lineBatch is a run of consecutive non-blank lines that ReadAll's reading
// goroutine cut, and what a parsing goroutine made of them.
type lineBatch struct {
	buf     []byte // the lines, end to end
	ends    []int  // where each line ends in buf
	nums    []int  // each line's number
	skipped int    // over-long lines skipped (SkipBad) among them
	err     error  // what ended the reading after the lines: io.EOF, an over-long line, a read error

	reqs []Request    // the parsed requests, by line
	res  []lineResult // what each line's checks found
	done chan struct{}
}

// lineResult is a line's error, if any, the order of arrivals aside, and
// whether it decoded (then its Request holds at least its arrival).
type lineResult struct {
	field, reason string
	decoded       bool
}

// ReadAll reads every request left in the trace, in file order, each a
// copy of its own (as Clone gives): exactly what calls of Next up to
// io.EOF would give, with the same first error (nil at io.EOF) and the
// same count of skipped lines, but on several goroutines: one reads
// lines, up to GOMAXPROCS parse batches of them, and the caller checks
// the arrival order and keeps the requests. The Reader is used up: Next
// must not be called after it.
func (r *Reader) ReadAll() ([]*Request, error) {
	workers := runtime.GOMAXPROCS(0)
	if workers < 2 {
		return r.readAllSerial()
	}
	work := make(chan *lineBatch, workers)
	ordered := make(chan *lineBatch, 2*workers)
	free := make(chan []byte, 2*workers+1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(work)
		defer close(ordered)
		r.cutBatches(free, stop, func(b *lineBatch) bool {
			select {
			case ordered <- b:
			case <-stop:
				return false
			}
			select {
			case work <- b:
				return true
			case <-stop:
				close(b.done) // never parsed: the caller has stopped
				return false
			}
		})
	})
	for range workers {
		wg.Go(func() {
			var scratch Request
			memo := new(idMemo)
			for b := range work {
				b.parse(&scratch, memo, r.hdr.BlockSize)
				close(b.done)
			}
		})
	}

	var out []*Request
	err := func() error {
		for b := range ordered {
			<-b.done
			for i := range b.ends {
				req, res := &b.reqs[i], b.res[i]
				if res.decoded && req.ArrivalMs >= 0 && req.ArrivalMs < r.prevMs {
					// checkRequest's order check, the only one that needs
					// the line before, and the first after t_ms >= 0.
					res.field, res.reason = checkRequest(req, r.hdr.BlockSize, r.prevMs)
				}
				if res.field != "" || res.reason != "" {
					if r.opts.SkipBad {
						r.skipped++
						continue
					}
					return &LineError{File: r.name, Line: b.nums[i], Field: res.field, Reason: res.reason}
				}
				r.prevMs = req.ArrivalMs
				out = append(out, req)
			}
			r.skipped += b.skipped
			select {
			case free <- b.buf[:0]:
			default:
			}
			if b.err != nil {
				if errors.Is(b.err, io.EOF) {
					return nil
				}
				return b.err
			}
		}
		return nil
	}()
	close(stop)
	for range ordered { // let the reading goroutine see stop
	}
	wg.Wait()
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readAllSerial is ReadAll on one goroutine: Next and Clone.
func (r *Reader) readAllSerial() ([]*Request, error) {
	var out []*Request
	for {
		req, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		c := req.Clone()
		out = append(out, &c)
	}
}

// cutBatches reads lines as Next does and hands them over in batches of
// about readAllBatchBytes, until the end, a read error that Next would
// return, or send reporting false. A batch's buffer comes from free when
// one is there.
func (r *Reader) cutBatches(free <-chan []byte, stop <-chan struct{}, send func(*lineBatch) bool) {
	for {
		b := &lineBatch{done: make(chan struct{})}
		select {
		case b.buf = <-free:
		case <-stop:
			return
		default:
			b.buf = make([]byte, 0, readAllBatchBytes+readAllBatchBytes/4)
		}
		for len(b.buf) < readAllBatchBytes && b.err == nil {
			line, err := r.readLine()
			if err != nil {
				var le *LineError
				if errors.As(err, &le) && r.opts.SkipBad {
					b.skipped++
					continue
				}
				b.err = err
				break
			}
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			b.buf = append(b.buf, line...)
			b.ends = append(b.ends, len(b.buf))
			b.nums = append(b.nums, r.line)
		}
		if !send(b) || b.err != nil {
			return
		}
	}
}

// parse parses every line of b as Reader.parse does, but for the order of
// arrivals, with scratch as the reused Request and memo as the parser's
// (its worker's); the hash ids of all of them share one array.
func (b *lineBatch) parse(scratch *Request, memo *idMemo, blockSize int) {
	b.reqs = make([]Request, len(b.ends))
	b.res = make([]lineResult, len(b.ends))
	// Every array of k ids holds k-1 commas; a line has two arrays.
	ids := make([]uint64, 0, bytes.Count(b.buf, []byte{','})+2*len(b.ends))
	start := 0
	for i, end := range b.ends {
		line := b.buf[start:end]
		start = end
		field, reason, decoded := parseRequest(line, scratch, memo, blockSize, math.MinInt64)
		b.res[i] = lineResult{field, reason, decoded}
		if !decoded {
			continue
		}
		c := *scratch
		c.HashIDs, ids = share(ids, scratch.HashIDs)
		c.OutputHashIDs, ids = share(ids, scratch.OutputHashIDs)
		b.reqs[i] = c
	}
}

// share appends s to ids and returns the copy (nil when s is empty, as
// Clone gives) and ids.
func share(ids, s []uint64) ([]uint64, []uint64) {
	if len(s) == 0 {
		return nil, ids
	}
	n := len(ids)
	ids = append(ids, s...)
	return ids[n:len(ids):len(ids)], ids
}
