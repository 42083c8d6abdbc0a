package traces

import "fmt"

// BailianBlockTokens is the block size of Alibaba Bailian's hash_ids.
const BailianBlockTokens = 16

// bailianRecord is one line of an Alibaba Bailian usage trace: the common fields (the
// timestamp in seconds) and the chat ids. Unknown keys are ignored; type and turn are read but
// not used (see bailian).
type bailianRecord struct {
	hashIDFields
	ChatID       *int64 `json:"chat_id"`
	ParentChatID *int64 `json:"parent_chat_id"` // -1 for a conversation's first request
	Type         string `json:"type"`
	Turn         int    `json:"turn"`
}

// bailian is the Bailian format (hashIDDecoder reads it). A session is the chain of chat ids
// from a root (parent_chat_id -1) and is named "b<root chat id>"; a request whose parent never
// appeared starts a session named after that parent (the conversation began before the
// trace). Turn counts the session's requests from 0 (the file's own turn field is not trusted
// to be gapless); ThinkMs is the time since the session's previous request (an upper bound).
// Hash ids are re-chained into blocks of the target size.
type bailian struct {
	rec   bailianRecord
	roots map[int64]int64 // chat id -> root chat id
	convs map[int64]*inferred
}

func newBailian() *bailian {
	return &bailian{roots: map[int64]int64{}, convs: map[int64]*inferred{}}
}

func (b *bailian) spec() hashIDSpec {
	return hashIDSpec{blockTokens: BailianBlockTokens, msPerUnit: 1000, unit: "seconds", maxTimestamp: 1e12}
}

func (b *bailian) next(lines *lineReader) (*hashIDFields, error) {
	b.rec = bailianRecord{hashIDFields: hashIDFields{HashIDs: b.rec.HashIDs[:0]}}
	return &b.rec.hashIDFields, lines.nextJSON(&b.rec)
}

func (b *bailian) required(lines *lineReader) error {
	switch {
	case b.rec.ChatID == nil:
		return lines.bad("chat_id", "required")
	case b.rec.ParentChatID == nil:
		return lines.bad("parent_chat_id", "required (-1 for a first request)")
	}
	return nil
}

func (b *bailian) ranges(lines *lineReader) error {
	if p := *b.rec.ParentChatID; p < -1 {
		return lines.bad("parent_chat_id", "must be -1 or a chat id >= 0, got %d", p)
	}
	return nil
}

func (b *bailian) sessions() int { return len(b.convs) }

// session follows the chat ids to the conversation's root.
func (b *bailian) session(req *Request) {
	rec := &b.rec
	root := *rec.ChatID
	if p := *rec.ParentChatID; p >= 0 {
		root = p
		if r, ok := b.roots[p]; ok {
			root = r
		}
	}
	b.roots[*rec.ChatID] = root
	c := b.convs[root]
	if c == nil {
		c = &inferred{id: fmt.Sprintf("b%d", root), turn: -1, lastMs: req.ArrivalMs}
		b.convs[root] = c
	}
	c.turn++
	req.Session, req.Turn, req.ThinkMs = c.id, c.turn, req.ArrivalMs-c.lastMs
	c.lastMs = req.ArrivalMs
}
