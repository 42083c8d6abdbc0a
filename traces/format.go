package traces

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Format and Version identify the trace file format (FORMAT.md).
const (
	Format  = "warden-trace"
	Version = 1
)

// MaxLineBytes bounds one line of a trace file: a longer line is a bad line
// (about 3M hash ids: a 50M-token prompt at 16 tokens a block).
const MaxLineBytes = 64 << 20

// Header is the first line of a trace file.
type Header struct {
	Format    string `json:"format"`     // always "warden-trace"
	Version   int    `json:"version"`    // 1
	BlockSize int    `json:"block_size"` // tokens per hash id
	Source    string `json:"source,omitempty"`
	CreatedBy string `json:"created_by,omitempty"`
	// Concurrency is, for synthetic traces, the number of concurrent
	// closed-loop sessions the trace was written for; 0 if none.
	Concurrency int `json:"concurrency,omitempty"`
}

func (h Header) check() (field, reason string) {
	switch {
	case h.Format != Format:
		return "format", fmt.Sprintf("expected %q, got %q", Format, h.Format)
	case h.Version != Version:
		return "version", fmt.Sprintf("expected %d, got %d", Version, h.Version)
	case h.BlockSize < 1:
		return "block_size", fmt.Sprintf("must be >= 1, got %d", h.BlockSize)
	case h.Concurrency < 0:
		return "concurrency", fmt.Sprintf("must be >= 0, got %d", h.Concurrency)
	}
	return "", ""
}

// LineError is a bad line of a trace (or an imported file): it prints as
// "file:line: field: reason".
type LineError struct {
	File   string
	Line   int
	Field  string // the JSON key (or CSV column) at fault; "" for the line as a whole
	Reason string
}

func (e *LineError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Reason)
}

// checkRequest applies the format's rules to one request: see FORMAT.md.
func checkRequest(r *Request, blockSize int, prevMs int64) (field, reason string) {
	switch {
	case r.ArrivalMs < 0:
		return "t_ms", fmt.Sprintf("must be >= 0, got %d", r.ArrivalMs)
	case r.ArrivalMs < prevMs:
		return "t_ms", fmt.Sprintf("arrival %d is before the previous request's %d (requests must be in arrival order)", r.ArrivalMs, prevMs)
	case r.Session == "":
		return "session", "required, got an empty id"
	case r.Turn < 0:
		return "turn", fmt.Sprintf("must be >= 0, got %d", r.Turn)
	case r.PromptTokens < 1:
		return "prompt_tokens", fmt.Sprintf("must be >= 1, got %d", r.PromptTokens)
	case r.OutputTokens < 0:
		return "output_tokens", fmt.Sprintf("must be >= 0, got %d", r.OutputTokens)
	case r.CachedTokens < -1 || r.CachedTokens > r.PromptTokens:
		return "cached_tokens", fmt.Sprintf("must be -1 (unknown) or in [0, prompt_tokens=%d], got %d", r.PromptTokens, r.CachedTokens)
	case r.Replica < -1:
		return "replica", fmt.Sprintf("must be -1 (unknown) or >= 0, got %d", r.Replica)
	case r.ThinkMs < 0:
		return "think_ms", fmt.Sprintf("must be >= 0, got %d", r.ThinkMs)
	}
	if want := ceilDiv(r.PromptTokens, blockSize); len(r.HashIDs) != want {
		return "hash_ids", fmt.Sprintf("expected ceil(prompt_tokens/block_size) = ceil(%d/%d) = %d ids, got %d",
			r.PromptTokens, blockSize, want, len(r.HashIDs))
	}
	if n := len(r.OutputHashIDs); n > 0 {
		if want := (r.PromptTokens+r.OutputTokens)/blockSize - r.PromptTokens/blockSize; n != want {
			return "output_hash_ids", fmt.Sprintf("expected floor((prompt+output)/block_size) - floor(prompt/block_size) = %d ids (or none), got %d", want, n)
		}
	}
	return "", ""
}

// ReaderOptions tune a Reader.
type ReaderOptions struct {
	// SkipBad skips bad request lines (counting them in Skipped) instead of
	// stopping at the first. A bad header is always an error.
	SkipBad bool
}

// Reader streams the requests of a trace file in constant memory: one line
// buffer and one Request, both reused.
type Reader struct {
	lineReader
	closers []io.Closer
	opts    ReaderOptions
	hdr     Header
	prevMs  int64
	skipped int
	req     Request
	memo    idMemo
}

// NewReader reads the header of a trace from r (gzip-compressed or not: it
// looks at the magic bytes) and returns a Reader positioned on the first
// request. name is used in errors (a file name or "-").
func NewReader(r io.Reader, name string, opts ReaderOptions) (*Reader, error) {
	br, gz, err := maybeGzip(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	rd := &Reader{lineReader: lineReader{name: name, br: br}, opts: opts}
	if gz != nil {
		rd.closers = append(rd.closers, gz)
	}
	line, err := rd.readLine()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &LineError{File: name, Line: 1, Reason: `missing header line {"format":"warden-trace","version":1,...} (empty file)`}
		}
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rd.hdr); err != nil {
		field, reason := jsonErrorField(err)
		if reason == "unknown key" {
			reason = `unknown key in the header line (a trace starts with {"format":"warden-trace","version":1,"block_size":N})`
		}
		return nil, &LineError{File: name, Line: 1, Field: field, Reason: "header: " + reason}
	}
	if trailing(dec, line) {
		return nil, &LineError{File: name, Line: 1, Reason: "header: unexpected data after the JSON object"}
	}
	if field, reason := rd.hdr.check(); field != "" {
		return nil, &LineError{File: name, Line: 1, Field: field, Reason: "header: " + reason}
	}
	return rd, nil
}

// maybeGzip wraps r in a gzip reader when it starts with gzip's magic bytes.
func maybeGzip(r io.Reader) (*bufio.Reader, *gzip.Reader, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %w", err)
		}
		return bufio.NewReaderSize(gz, 256<<10), gz, nil
	}
	return br, nil, nil
}

// Open opens a trace file (plain or gzip-compressed); "-" is stdin.
// Close the Reader to close the file.
func Open(path string, opts ReaderOptions) (*Reader, error) {
	if path == "-" {
		return NewReader(os.Stdin, "-", opts)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r, err := NewReader(f, path, opts)
	if err != nil {
		f.Close()
		return nil, err
	}
	r.closers = append(r.closers, f)
	return r, nil
}

// Close closes what Open opened; it is a no-op for NewReader's readers
// (except for the gzip stream).
func (r *Reader) Close() error {
	var errs []error
	for _, c := range r.closers {
		errs = append(errs, c.Close())
	}
	r.closers = nil
	return errors.Join(errs...)
}

// Header returns the trace's header line.
func (r *Reader) Header() Header { return r.hdr }

// Skipped returns the number of bad lines skipped (with SkipBad).
func (r *Reader) Skipped() int { return r.skipped }

// Next returns the next request, or io.EOF after the last. The Request and
// its slices are reused by the following call: Clone what you keep.
// A bad line is a *LineError (unless SkipBad).
func (r *Reader) Next() (*Request, error) {
	for {
		line, err := r.readLine()
		if err != nil {
			var le *LineError
			if errors.As(err, &le) && r.opts.SkipBad {
				r.skipped++
				continue
			}
			return nil, err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if field, reason := r.parse(line); field != "" || reason != "" {
			if r.opts.SkipBad {
				r.skipped++
				continue
			}
			return nil, &LineError{File: r.name, Line: r.line, Field: field, Reason: reason}
		}
		r.prevMs = r.req.ArrivalMs
		return &r.req, nil
	}
}

func (r *Reader) parse(line []byte) (field, reason string) {
	field, reason, _ = parseRequest(line, &r.req, &r.memo, r.hdr.BlockSize, r.prevMs)
	return field, reason
}

// parseRequest decodes a request line into req, reusing its slices'
// memory (and memo: parseFast), and checks it (prevMs: the previous
// request's arrival). decoded
// reports whether the line was a request object at all: when only the
// checks failed, req holds what it said.
func parseRequest(line []byte, req *Request, memo *idMemo, blockSize int, prevMs int64) (field, reason string, decoded bool) {
	resetRequest(req)
	if parseFast(line, req, memo) {
		field, reason = checkRequest(req, blockSize, prevMs)
		return field, reason, true
	}
	resetRequest(req)
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		field, reason = jsonErrorField(err)
		return field, reason, false
	}
	if trailing(dec, line) {
		return "", "unexpected data after the JSON object (one request per line)", false
	}
	field, reason = checkRequest(req, blockSize, prevMs)
	return field, reason, true
}

// resetRequest empties req for the next line, keeping its slices' memory.
func resetRequest(req *Request) {
	*req = Request{
		CachedTokens:  -1,
		Replica:       -1,
		HashIDs:       req.HashIDs[:0],
		OutputHashIDs: req.OutputHashIDs[:0],
	}
}

// lineReader reads lines of at most MaxLineBytes, counting them, with one
// reused buffer.
type lineReader struct {
	name string
	br   *bufio.Reader
	line int
	buf  []byte
}

// nextJSON decodes the next non-blank line into v (lenient about unknown
// keys, as importers of other projects' formats are); a bad line is a
// *LineError naming the field. io.EOF at the end.
func (r *lineReader) nextJSON(v any) error {
	for {
		line, err := r.readLine()
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if err := json.Unmarshal(line, v); err != nil {
			field, reason := jsonErrorField(err)
			return r.bad(field, "%s", reason)
		}
		return nil
	}
}

// bad is a *LineError at the line last read.
func (r *lineReader) bad(field, format string, args ...any) error {
	return &LineError{File: r.name, Line: r.line, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// readLine returns the next line without its newline; io.EOF at the end.
// The slice is valid until the next call. A line that is too long is a
// *LineError (consumed).
func (r *lineReader) readLine() ([]byte, error) {
	r.buf = r.buf[:0]
	tooLong := false
	for {
		chunk, err := r.br.ReadSlice('\n')
		if !tooLong {
			if len(r.buf)+len(chunk) > MaxLineBytes {
				tooLong = true
				r.buf = r.buf[:0]
			} else if err == nil && len(r.buf) == 0 {
				r.line++
				return trimEOL(chunk), nil // fast path: the line fits the buffer
			} else {
				r.buf = append(r.buf, chunk...)
			}
		}
		switch {
		case err == nil:
			r.line++
			if tooLong {
				return nil, &LineError{File: r.name, Line: r.line, Reason: fmt.Sprintf("line longer than %d bytes", MaxLineBytes)}
			}
			return trimEOL(r.buf), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(r.buf) == 0 && !tooLong {
				return nil, io.EOF
			}
			r.line++
			if tooLong {
				return nil, &LineError{File: r.name, Line: r.line, Reason: fmt.Sprintf("line longer than %d bytes", MaxLineBytes)}
			}
			return trimEOL(r.buf), nil
		default:
			return nil, fmt.Errorf("%s:%d: %w", r.name, r.line+1, err)
		}
	}
}

// trailing reports whether line holds anything but white space after the
// value dec has decoded from it (dec reads line from its start). Unlike
// dec.More, it sees a stray closing bracket.
func trailing(dec *json.Decoder, line []byte) bool {
	return len(bytes.TrimSpace(line[dec.InputOffset():])) > 0
}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte{'\n'})
	return bytes.TrimSuffix(b, []byte{'\r'})
}

// jsonErrorField turns an encoding/json error into (field, reason).
func jsonErrorField(err error) (field, reason string) {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te):
		f := te.Field
		if f == "" {
			f = "(line)"
		}
		return f, fmt.Sprintf("expected %s, got JSON %s", te.Type, te.Value)
	case errors.As(err, &se):
		return "", fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "", "invalid JSON: unexpected end of line"
	}
	msg := err.Error()
	if k, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return strings.Trim(k, `"`), "unknown key"
	}
	return "", strings.TrimPrefix(msg, "json: ")
}

// Writer writes a trace file: the header line, then one request per line,
// each checked against the format's rules (so that what it writes reads
// back). Call Close to flush.
type Writer struct {
	bw      *bufio.Writer
	enc     *json.Encoder
	hdr     Header
	closers []io.Closer
	started bool
	prevMs  int64
	n       int
	err     error
}

// NewWriter returns a Writer to w. Format and Version are filled in if
// empty; the header is written with the first request (or by Close).
func NewWriter(w io.Writer, h Header) *Writer {
	if h.Format == "" {
		h.Format = Format
	}
	if h.Version == 0 {
		h.Version = Version
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	return &Writer{bw: bw, enc: enc, hdr: h}
}

// Create creates a trace file at path ("-" is stdout); a name ending in
// ".gz" is gzip-compressed.
func Create(path string, h Header) (*Writer, error) {
	if path == "-" {
		return NewWriter(os.Stdout, h), nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(path, ".gz") {
		gz := gzip.NewWriter(f)
		w := NewWriter(gz, h)
		w.closers = []io.Closer{gz, f}
		return w, nil
	}
	w := NewWriter(f, h)
	w.closers = []io.Closer{f}
	return w, nil
}

// Header returns the header the Writer writes.
func (w *Writer) Header() Header { return w.hdr }

// Count returns the number of requests written.
func (w *Writer) Count() int { return w.n }

func (w *Writer) start() error {
	if w.started {
		return w.err
	}
	w.started = true
	if field, reason := w.hdr.check(); field != "" {
		w.err = fmt.Errorf("trace header: %s: %s", field, reason)
		return w.err
	}
	w.err = w.enc.Encode(&w.hdr)
	return w.err
}

// Write appends one request. A request that breaks the format's rules is
// an error naming the request's index and field; nothing is written for it.
func (w *Writer) Write(r *Request) error {
	if err := w.start(); err != nil {
		return err
	}
	if field, reason := checkRequest(r, w.hdr.BlockSize, w.prevMs); field != "" {
		return fmt.Errorf("trace request %d (session %q turn %d): %s: %s", w.n, r.Session, r.Turn, field, reason)
	}
	if err := w.enc.Encode(r); err != nil {
		w.err = err
		return err
	}
	w.prevMs = r.ArrivalMs
	w.n++
	return nil
}

// Flush writes the header if nothing was written and flushes what is
// buffered to the underlying writer.
func (w *Writer) Flush() error {
	if err := w.start(); err != nil {
		return err
	}
	if err := w.bw.Flush(); err != nil {
		w.err = err
		return err
	}
	return nil
}

// Err returns the write error that stopped the Writer, if any: every later
// Write fails with it. A request refused by the format's rules is not one.
func (w *Writer) Err() error { return w.err }

// Close writes the header if nothing was written, flushes, and closes what
// Create opened.
func (w *Writer) Close() error {
	errs := []error{w.start()}
	errs = append(errs, w.bw.Flush())
	for _, c := range w.closers {
		errs = append(errs, c.Close())
	}
	w.closers = nil
	return errors.Join(errs...)
}
