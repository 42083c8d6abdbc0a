package traces

import (
	"bufio"
	"math"
)

// MooncakeBlockTokens is the block size of Mooncake's hash_ids.
const MooncakeBlockTokens = 512

// mooncakeRecord is one line of a Mooncake (FAST'25) trace. Unknown keys are
// ignored (upstream variants add fields); the four below are required.
type mooncakeRecord struct {
	Timestamp    *float64 `json:"timestamp"` // ms from the start
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"` // one per 512-token block, chained
}

// mooncakeDecoder imports Mooncake JSONL: each 512-token id expands into
// 512/BlockSize chained child blocks (the last id only into the blocks its
// remainder fills), sessions are inferred (SessionInferrer, prefix "m"),
// and the arrival is the timestamp minus the first one.
type mooncakeDecoder struct {
	lines   lineReader
	opts    ImportOptions
	infer   *SessionInferrer
	rec     mooncakeRecord
	req     Request
	first   float64
	prev    float64
	started bool
}

func newMooncakeDecoder(br *bufio.Reader, name string, opts ImportOptions) (*mooncakeDecoder, error) {
	if err := checkBlockSizes(MooncakeBlockTokens, opts.BlockSize); err != nil {
		return nil, err
	}
	return &mooncakeDecoder{lines: lineReader{name: name, br: br}, opts: opts, infer: NewSessionInferrer("m")}, nil
}

func (d *mooncakeDecoder) sessions() int { return d.infer.Sessions() }

func (d *mooncakeDecoder) bad(field, format string, args ...any) error {
	return d.lines.bad(field, format, args...)
}

func (d *mooncakeDecoder) next() (*Request, error) {
	d.rec = mooncakeRecord{HashIDs: d.rec.HashIDs[:0]}
	if err := d.lines.nextJSON(&d.rec); err != nil {
		return nil, err
	}
	return d.convert()
}

func (d *mooncakeDecoder) convert() (*Request, error) {
	rec := &d.rec
	switch {
	case rec.Timestamp == nil:
		return nil, d.bad("timestamp", "required")
	case rec.InputLength == nil:
		return nil, d.bad("input_length", "required")
	case rec.OutputLength == nil:
		return nil, d.bad("output_length", "required")
	case math.IsNaN(*rec.Timestamp) || *rec.Timestamp < 0 || *rec.Timestamp > 1e15:
		return nil, d.bad("timestamp", "must be ms in [0, 1e15], got %v", *rec.Timestamp)
	case *rec.InputLength < 1 || *rec.InputLength > 1<<30:
		return nil, d.bad("input_length", "must be in [1, 2^30], got %d", *rec.InputLength)
	case *rec.OutputLength < 0 || *rec.OutputLength > 1<<30:
		return nil, d.bad("output_length", "must be in [0, 2^30], got %d", *rec.OutputLength)
	case d.started && *rec.Timestamp < d.prev:
		return nil, d.bad("timestamp", "%v is before the previous line's %v (requests must be in arrival order)", *rec.Timestamp, d.prev)
	}
	in := *rec.InputLength
	if want := ceilDiv(in, MooncakeBlockTokens); len(rec.HashIDs) != want {
		return nil, d.bad("hash_ids", "expected ceil(input_length/512) = ceil(%d/512) = %d ids, got %d", in, want, len(rec.HashIDs))
	}
	if !d.started {
		d.started, d.first = true, *rec.Timestamp
	}
	d.prev = *rec.Timestamp
	B := d.opts.BlockSize
	d.req = Request{
		ArrivalMs:    int64(math.Round(*rec.Timestamp - d.first)),
		PromptTokens: in,
		OutputTokens: *rec.OutputLength,
		CachedTokens: -1,
		Replica:      -1,
		HashIDs:      reblock(d.req.HashIDs[:0], rec.HashIDs, in, MooncakeBlockTokens, B),
	}
	// Only the blocks of full 512-token ids repeat in a continuation.
	d.infer.Assign(&d.req, stableBlocks(in, MooncakeBlockTokens, B))
	return &d.req, nil
}

// stableBlocks is the number of leading dst-token blocks of a prompt that
// lie in full src-token source blocks (and are full themselves).
func stableBlocks(tokens, src, dst int) int {
	fullSrc := tokens / src
	if src >= dst {
		return fullSrc * (src / dst)
	}
	return fullSrc / (dst / src)
}
