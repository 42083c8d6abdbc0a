package traces

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// azureDecoder imports the Azure LLM inference traces (2023/2024): CSV with
// a header row naming TIMESTAMP, ContextTokens and GeneratedTokens (any
// order, any case, other columns ignored). Timestamps are
// "2023-11-16 18:15:46.6805900" (or RFC 3339, or seconds as a number).
// The trace has no prefix information: every prompt is unique (its blocks
// chain from a root of its own), so every request is a session of one turn,
// named "z" + a 7-digit number; that is what SessionInferrer would conclude,
// without the memory of its set.
type azureDecoder struct {
	name    string
	csv     *csv.Reader
	opts    ImportOptions
	cols    [3]int // TIMESTAMP, ContextTokens, GeneratedTokens
	req     Request
	n       int
	first   time.Time
	prev    time.Time
	started bool
	line    int
}

var azureColumns = [3]string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}

func newAzureDecoder(br *bufio.Reader, name string, opts ImportOptions) (*azureDecoder, error) {
	if opts.BlockSize < 1 {
		return nil, fmt.Errorf("import: block size %d < 1", opts.BlockSize)
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	d := &azureDecoder{name: name, csv: cr, opts: opts}
	head, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &LineError{File: name, Line: 1, Reason: "missing the header row TIMESTAMP,ContextTokens,GeneratedTokens (empty file)"}
		}
		return nil, &LineError{File: name, Line: 1, Reason: "header row: " + err.Error()}
	}
	for i, want := range azureColumns {
		d.cols[i] = -1
		for j, h := range head {
			if strings.EqualFold(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")), want) {
				d.cols[i] = j
			}
		}
		if d.cols[i] < 0 {
			return nil, &LineError{File: name, Line: 1, Field: want, Reason: fmt.Sprintf("missing column in the header row %q", strings.Join(head, ","))}
		}
	}
	return d, nil
}

func (d *azureDecoder) sessions() int { return d.n }

func (d *azureDecoder) bad(field, format string, args ...any) error {
	return &LineError{File: d.name, Line: d.line, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func parseAzureTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	for _, layout := range []string{"2006-01-02 15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00", time.RFC3339Nano} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= 0 && f < 1e12 {
		return time.Unix(0, 0).Add(time.Duration(f * float64(time.Second))), nil
	}
	return time.Time{}, fmt.Errorf("expected a time like 2023-11-16 18:15:46.6805900, got %q", s)
}

func (d *azureDecoder) next() (*Request, error) {
	rec, err := d.csv.Read()
	if err == nil {
		d.line, _ = d.csv.FieldPos(0)
	} else {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			d.line = pe.Line
			return nil, d.bad("", "CSV: %v", pe.Err)
		}
		return nil, err
	}
	if len(rec) <= max(d.cols[0], d.cols[1], d.cols[2]) {
		return nil, d.bad("", "expected at least %d fields, got %d", max(d.cols[0], d.cols[1], d.cols[2])+1, len(rec))
	}
	ts, err := parseAzureTime(rec[d.cols[0]])
	if err != nil {
		return nil, d.bad("TIMESTAMP", "%v", err)
	}
	ctx, err := strconv.Atoi(strings.TrimSpace(rec[d.cols[1]]))
	if err != nil || ctx < 1 || ctx > 1<<30 {
		return nil, d.bad("ContextTokens", "expected an integer in [1, 2^30], got %q", rec[d.cols[1]])
	}
	gen, err := strconv.Atoi(strings.TrimSpace(rec[d.cols[2]]))
	if err != nil || gen < 0 || gen > 1<<30 {
		return nil, d.bad("GeneratedTokens", "expected an integer in [0, 2^30], got %q", rec[d.cols[2]])
	}
	if d.started && ts.Before(d.prev) {
		return nil, d.bad("TIMESTAMP", "%s is before the previous row's %s (rows must be in arrival order)", ts.Format(time.RFC3339Nano), d.prev.Format(time.RFC3339Nano))
	}
	if !d.started {
		d.started, d.first = true, ts
	}
	if ms := ts.Sub(d.first).Milliseconds(); ms < 0 || ms > math.MaxInt64/2 {
		return nil, d.bad("TIMESTAMP", "out of range")
	}
	d.prev = ts
	// A unique chain: the root hashes the request's index.
	ids := d.req.HashIDs[:0]
	parent := hashWords(0x617a757265, uint64(d.n)) // "azure"
	for k := range ceilDiv(ctx, d.opts.BlockSize) {
		h := newHasher(parent)
		h.add(uint64(k))
		parent = h.sum()
		ids = append(ids, parent)
	}
	d.req = Request{
		ArrivalMs:    ts.Sub(d.first).Milliseconds(),
		Session:      fmt.Sprintf("z%07d", d.n),
		PromptTokens: ctx,
		OutputTokens: gen,
		CachedTokens: -1,
		Replica:      -1,
		HashIDs:      ids,
	}
	d.n++
	return &d.req, nil
}
