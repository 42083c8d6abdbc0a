package traces

import (
	"bufio"
	"fmt"
	"math"
)

// BailianBlockTokens is the block size of Alibaba Bailian's hash_ids.
const BailianBlockTokens = 16

// bailianRecord is one line of an Alibaba Bailian usage trace. Unknown keys
// are ignored; type and turn are read but not used (see bailianDecoder).
type bailianRecord struct {
	ChatID       *int64   `json:"chat_id"`
	ParentChatID *int64   `json:"parent_chat_id"` // -1 for a conversation's first request
	Timestamp    *float64 `json:"timestamp"`      // seconds
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	Type         string   `json:"type"`
	Turn         int      `json:"turn"`
	HashIDs      []uint64 `json:"hash_ids"` // one per 16-token block
}

// bailianDecoder imports Bailian JSONL. A session is the chain of chat ids
// from a root (parent_chat_id -1) and is named "b<root chat id>"; a request
// whose parent never appeared starts a session named after that parent (the
// conversation began before the trace). Turn counts the session's requests
// from 0 (the file's own turn field is not trusted to be gapless); ThinkMs
// is the time since the session's previous request (an upper bound).
// Hash ids are re-chained into blocks of the target size.
type bailianDecoder struct {
	lines   lineReader
	opts    ImportOptions
	roots   map[int64]int64 // chat id -> root chat id
	convs   map[int64]*inferred
	rec     bailianRecord
	req     Request
	first   float64
	prev    float64
	started bool
}

func newBailianDecoder(br *bufio.Reader, name string, opts ImportOptions) (*bailianDecoder, error) {
	if err := checkBlockSizes(BailianBlockTokens, opts.BlockSize); err != nil {
		return nil, err
	}
	return &bailianDecoder{lines: lineReader{name: name, br: br}, opts: opts,
		roots: map[int64]int64{}, convs: map[int64]*inferred{}}, nil
}

func (d *bailianDecoder) sessions() int { return len(d.convs) }

func (d *bailianDecoder) bad(field, format string, args ...any) error {
	return d.lines.bad(field, format, args...)
}

func (d *bailianDecoder) next() (*Request, error) {
	d.rec = bailianRecord{HashIDs: d.rec.HashIDs[:0]}
	if err := d.lines.nextJSON(&d.rec); err != nil {
		return nil, err
	}
	return d.convert()
}

func (d *bailianDecoder) convert() (*Request, error) {
	rec := &d.rec
	switch {
	case rec.ChatID == nil:
		return nil, d.bad("chat_id", "required")
	case rec.ParentChatID == nil:
		return nil, d.bad("parent_chat_id", "required (-1 for a first request)")
	case rec.Timestamp == nil:
		return nil, d.bad("timestamp", "required")
	case rec.InputLength == nil:
		return nil, d.bad("input_length", "required")
	case rec.OutputLength == nil:
		return nil, d.bad("output_length", "required")
	case math.IsNaN(*rec.Timestamp) || *rec.Timestamp < 0 || *rec.Timestamp > 1e12:
		return nil, d.bad("timestamp", "must be seconds in [0, 1e12], got %v", *rec.Timestamp)
	case *rec.ParentChatID < -1:
		return nil, d.bad("parent_chat_id", "must be -1 or a chat id >= 0, got %d", *rec.ParentChatID)
	case *rec.InputLength < 1 || *rec.InputLength > 1<<30:
		return nil, d.bad("input_length", "must be in [1, 2^30], got %d", *rec.InputLength)
	case *rec.OutputLength < 0 || *rec.OutputLength > 1<<30:
		return nil, d.bad("output_length", "must be in [0, 2^30], got %d", *rec.OutputLength)
	case d.started && *rec.Timestamp < d.prev:
		return nil, d.bad("timestamp", "%v is before the previous line's %v (requests must be in arrival order)", *rec.Timestamp, d.prev)
	}
	in := *rec.InputLength
	if want := ceilDiv(in, BailianBlockTokens); len(rec.HashIDs) != want {
		return nil, d.bad("hash_ids", "expected ceil(input_length/16) = ceil(%d/16) = %d ids, got %d", in, want, len(rec.HashIDs))
	}
	if !d.started {
		d.started, d.first = true, *rec.Timestamp
	}
	d.prev = *rec.Timestamp
	arrival := int64(math.Round((*rec.Timestamp - d.first) * 1000))

	root := *rec.ChatID
	if p := *rec.ParentChatID; p >= 0 {
		root = p
		if r, ok := d.roots[p]; ok {
			root = r
		}
	}
	d.roots[*rec.ChatID] = root
	c := d.convs[root]
	if c == nil {
		c = &inferred{id: fmt.Sprintf("b%d", root), turn: -1, lastMs: arrival}
		d.convs[root] = c
	}
	c.turn++
	d.req = Request{
		ArrivalMs:    arrival,
		Session:      c.id,
		Turn:         c.turn,
		PromptTokens: in,
		OutputTokens: *rec.OutputLength,
		CachedTokens: -1,
		Replica:      -1,
		ThinkMs:      arrival - c.lastMs,
		HashIDs:      reblock(d.req.HashIDs[:0], rec.HashIDs, in, BailianBlockTokens, d.opts.BlockSize),
	}
	c.lastMs = arrival
	return &d.req, nil
}
