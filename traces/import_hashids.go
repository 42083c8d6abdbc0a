package traces

import (
	"bufio"
	"errors"
	"math"
	"strconv"
	"strings"
)

// hashIDFields are the fields every hash-id trace's line carries (Mooncake, Alibaba Bailian):
// when the request arrived, its prompt and output lengths, and one id per block of the prompt,
// chained. A format's record embeds them beside its own.
type hashIDFields struct {
	Timestamp    *float64 `json:"timestamp"` // in the format's unit (hashIDSpec)
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"` // one per block of hashIDSpec.blockTokens
}

// hashIDSpec is how the common fields of one hash-id format read.
type hashIDSpec struct {
	blockTokens  int     // tokens per hash id
	msPerUnit    float64 // the timestamp's unit, in ms
	unit         string  // the timestamp's unit in errors: "seconds"
	maxTimestamp float64 // the largest timestamp accepted
}

// hashIDFormat is one hash-id format's own part: its record, the fields only it has, and its
// sessions.
type hashIDFormat interface {
	spec() hashIDSpec
	// next decodes the next line into the format's record (its hash ids' storage reused) and
	// returns the record's common fields.
	next(lines *lineReader) (*hashIDFields, error)
	// required refuses a line without one of the format's own required fields, before the
	// common fields are checked; ranges refuses one of them out of range, after the
	// timestamp's range is checked.
	required(lines *lineReader) error
	ranges(lines *lineReader) error
	// session sets the request's session, turn and think time; its arrival, lengths and
	// block ids are set.
	session(req *Request)
	sessions() int
}

// hashIDDecoder is the importer of a hash-id JSONL trace: it reads the lines, checks the
// common fields (present, in range, lines in arrival order, one hash id per block of the
// prompt), counts arrivals in ms from the first line's and re-chains the ids into blocks of the
// target size (reblock); the format adds its own fields and the sessions.
type hashIDDecoder struct {
	lines   lineReader
	opts    ImportOptions
	format  hashIDFormat
	spec    hashIDSpec
	req     Request
	first   float64
	prev    float64
	started bool
}

func newHashIDDecoder(br *bufio.Reader, name string, opts ImportOptions, f hashIDFormat) (*hashIDDecoder, error) {
	spec := f.spec()
	if err := checkBlockSizes(spec.blockTokens, opts.BlockSize); err != nil {
		return nil, err
	}
	return &hashIDDecoder{lines: lineReader{name: name, br: br}, opts: opts, format: f, spec: spec}, nil
}

func (d *hashIDDecoder) sessions() int { return d.format.sessions() }

func (d *hashIDDecoder) next() (*Request, error) {
	rec, err := d.format.next(&d.lines)
	if err != nil {
		if le, ok := errors.AsType[*LineError](err); ok {
			// encoding/json names a field of the embedded hashIDFields by its Go path,
			// "hashIDFields.input_length": the line's key is the last part.
			le.Field = strings.TrimPrefix(le.Field, "hashIDFields.")
		}
		return nil, err
	}
	return d.convert(rec)
}

func (d *hashIDDecoder) convert(rec *hashIDFields) (*Request, error) {
	if err := d.format.required(&d.lines); err != nil {
		return nil, err
	}
	bad, spec := d.lines.bad, d.spec
	switch {
	case rec.Timestamp == nil:
		return nil, bad("timestamp", "required")
	case rec.InputLength == nil:
		return nil, bad("input_length", "required")
	case rec.OutputLength == nil:
		return nil, bad("output_length", "required")
	case math.IsNaN(*rec.Timestamp) || *rec.Timestamp < 0 || *rec.Timestamp > spec.maxTimestamp:
		limit := strings.Replace(strconv.FormatFloat(spec.maxTimestamp, 'g', -1, 64), "e+", "e", 1) // "1e12"
		return nil, bad("timestamp", "must be %s in [0, %s], got %v", spec.unit, limit, *rec.Timestamp)
	}
	if err := d.format.ranges(&d.lines); err != nil {
		return nil, err
	}
	switch {
	case *rec.InputLength < 1 || *rec.InputLength > 1<<30:
		return nil, bad("input_length", "must be in [1, 2^30], got %d", *rec.InputLength)
	case *rec.OutputLength < 0 || *rec.OutputLength > 1<<30:
		return nil, bad("output_length", "must be in [0, 2^30], got %d", *rec.OutputLength)
	case d.started && *rec.Timestamp < d.prev:
		return nil, bad("timestamp", "%v is before the previous line's %v (requests must be in arrival order)", *rec.Timestamp, d.prev)
	}
	in, per := *rec.InputLength, spec.blockTokens
	if want := ceilDiv(in, per); len(rec.HashIDs) != want {
		return nil, bad("hash_ids", "expected ceil(input_length/%d) = ceil(%d/%d) = %d ids, got %d", per, in, per, want, len(rec.HashIDs))
	}
	if !d.started {
		d.started, d.first = true, *rec.Timestamp
	}
	d.prev = *rec.Timestamp
	d.req = Request{
		ArrivalMs:    int64(math.Round((*rec.Timestamp - d.first) * spec.msPerUnit)),
		PromptTokens: in,
		OutputTokens: *rec.OutputLength,
		CachedTokens: -1,
		Replica:      -1,
		HashIDs:      reblock(d.req.HashIDs[:0], rec.HashIDs, in, per, d.opts.BlockSize),
	}
	d.format.session(&d.req)
	return &d.req, nil
}
