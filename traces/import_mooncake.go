package traces

// MooncakeBlockTokens is the block size of Mooncake's hash_ids.
const MooncakeBlockTokens = 512

// mooncakeRecord is one line of a Mooncake (FAST'25) trace: the common fields alone, all
// required, the timestamp in ms from the start. Unknown keys are ignored (upstream variants add
// fields).
type mooncakeRecord struct {
	hashIDFields
}

// mooncake is the Mooncake format (hashIDDecoder reads it): each 512-token id expands into
// 512/BlockSize chained child blocks (the last id only into the blocks its remainder fills),
// sessions are inferred (SessionInferrer, prefix "m"), and the arrival is the timestamp minus
// the first one.
type mooncake struct {
	rec       mooncakeRecord
	infer     *SessionInferrer
	blockSize int
}

func newMooncake(opts ImportOptions) *mooncake {
	return &mooncake{infer: NewSessionInferrer("m"), blockSize: opts.BlockSize}
}

func (m *mooncake) spec() hashIDSpec {
	return hashIDSpec{blockTokens: MooncakeBlockTokens, msPerUnit: 1, unit: "ms", maxTimestamp: 1e15}
}

func (m *mooncake) next(lines *lineReader) (*hashIDFields, error) {
	m.rec = mooncakeRecord{hashIDFields{HashIDs: m.rec.HashIDs[:0]}}
	return &m.rec.hashIDFields, lines.nextJSON(&m.rec)
}

func (m *mooncake) required(*lineReader) error { return nil }
func (m *mooncake) ranges(*lineReader) error   { return nil }
func (m *mooncake) sessions() int              { return m.infer.Sessions() }

// session infers the request's session from its prefix: only the blocks of full 512-token ids
// repeat in a continuation.
func (m *mooncake) session(req *Request) {
	m.infer.Assign(req, stableBlocks(req.PromptTokens, MooncakeBlockTokens, m.blockSize))
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
