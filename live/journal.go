package live

import (
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/lm-warden/warden/traces"
)

// Journal block model. The journal records no prompt text: a prompt is
// described by keyed hashes of its blocks, in the trace format of package
// traces (FORMAT.md). The proxy does not tokenize, so it applies the
// canonical-text rule of traces/text.go, shared with the emulator and the
// benchmark client: one token is 4 bytes of the prompt's canonical text
// (system prompt, then each message's role and text, in order; Claude
// Code's billing block skipped), and a block is 16 tokens, i.e. 64 bytes.
// Block j's id hashes the journal key, block j-1's id and the block's
// bytes, so equal ids mean an equal prefix, as in vLLM. The number of ids
// follows the format's rule, ceil(prompt_tokens/block_size), with
// prompt_tokens from the response's usage when it reports one (else the
// approximation): ids beyond the text are chained from the last one, and a
// final partial block gets an id of its own.
const journalBlockSize = traces.TextBlockTokens

// Journal writes one trace record per finished request, in arrival order,
// rotating files by size. It is safe for concurrent use.
type Journal struct {
	cfg JournalCfg
	key [32]byte

	mu       sync.Mutex
	w        *traces.Writer
	f        *os.File
	start    time.Time // arrival time 0 of the current file
	size     int64     // upper-bound estimate of the current file's bytes
	next     uint64    // next ticket
	flushAt  uint64    // next ticket to write
	pending  map[uint64]*traces.Request
	sessions map[string]*journalSession // by keyed session hash
	err      error                      // first write error, reported by Close
}

type journalSession struct {
	turns int
	last  time.Time // end of the previous turn
}

// journalTicket is a request's place in arrival order.
type journalTicket struct {
	n  uint64
	at time.Time
}

// OpenJournal opens (creates or truncates) the journal at cfg.Path.
func OpenJournal(cfg JournalCfg) (*Journal, error) {
	j := &Journal{cfg: cfg, pending: map[uint64]*traces.Request{}, sessions: map[string]*journalSession{}}
	j.key = sha256.Sum256([]byte("warden-journal:" + cfg.Path + ":" + strconv.FormatInt(time.Now().UnixNano(), 10)))
	if err := j.open(); err != nil {
		return nil, err
	}
	return j, nil
}

// SetKey sets the key of the block hashes (by default random per process).
func (j *Journal) SetKey(key []byte) {
	j.mu.Lock()
	j.key = sha256.Sum256(key)
	j.mu.Unlock()
}

func (j *Journal) open() error {
	f, err := os.OpenFile(j.cfg.Path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.f = f
	j.w = traces.NewWriter(f, traces.Header{BlockSize: journalBlockSize, Source: "proxy", CreatedBy: "warden proxy"})
	j.start = time.Time{}
	j.size = 256
	return nil
}

// rotate closes the current file, shifts path.1..path.keep-1 up by one,
// renames the file to path.1 and opens a new one.
func (j *Journal) rotate() error {
	if err := j.w.Close(); err != nil {
		return err
	}
	for i := j.cfg.Keep - 1; i >= 1; i-- {
		_ = os.Rename(j.cfg.Path+"."+strconv.Itoa(i), j.cfg.Path+"."+strconv.Itoa(i+1))
	}
	if err := os.Rename(j.cfg.Path, j.cfg.Path+".1"); err != nil {
		return err
	}
	return j.open()
}

// begin gives a request its place in arrival order.
func (j *Journal) begin() journalTicket {
	j.mu.Lock()
	defer j.mu.Unlock()
	t := journalTicket{n: j.next, at: time.Now()}
	j.next++
	return t
}

// skip gives back a ticket that records nothing.
func (j *Journal) skip(t journalTicket) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.pending[t.n] = nil
	j.flush()
}

// record journals a finished call.
func (j *Journal) record(c *call, _ time.Duration) {
	text := promptText(c.body, c.api)
	promptTokens := traces.TextTokens(text)
	if c.usage.PromptTokens > 0 {
		promptTokens = c.usage.PromptTokens
	}
	r := &traces.Request{
		Session:      c.req.Session,
		Parent:       c.req.Parent,
		Model:        c.req.Model,
		PromptTokens: promptTokens,
		OutputTokens: max(c.usage.OutputTokens, 0),
		CachedTokens: -1,
		Replica:      c.cur.rep.id,
	}
	if c.usage.CachedTokens >= 0 && c.usage.CachedTokens <= promptTokens {
		r.CachedTokens = c.usage.CachedTokens
	}
	if r.Session == "" {
		r.Session = "anonymous"
	}
	j.mu.Lock()
	key := j.key
	j.mu.Unlock()
	r.HashIDs = blockIDs(key, text, promptTokens)
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	if s := j.sessions[r.Session]; s != nil {
		r.Turn = s.turns
		r.ThinkMs = max(0, c.jt.at.Sub(s.last).Milliseconds())
		s.turns++
		s.last = now
	} else {
		j.sessions[r.Session] = &journalSession{turns: 1, last: now}
		j.trimSessions(now)
	}
	r.ArrivalMs = c.jt.at.UnixMilli() // made relative when written
	j.pending[c.jt.n] = r
	j.flush()
}

// trimSessions forgets sessions idle for an hour once the map is large.
func (j *Journal) trimSessions(now time.Time) {
	if len(j.sessions) < 1<<16 || len(j.sessions)&0xfff != 0 {
		return
	}
	for k, s := range j.sessions {
		if now.Sub(s.last) > time.Hour {
			delete(j.sessions, k)
		}
	}
}

// flush writes every record whose predecessors have all finished.
func (j *Journal) flush() {
	for {
		r, ok := j.pending[j.flushAt]
		if !ok {
			return
		}
		delete(j.pending, j.flushAt)
		j.flushAt++
		if r == nil || j.err != nil || j.w == nil { // nil w: closed
			continue
		}
		est := int64(256 + 21*len(r.HashIDs) + len(r.Session) + len(r.Parent) + len(r.Model))
		if j.size+est > int64(j.cfg.MaxBytes) && j.size > 256 {
			if err := j.rotate(); err != nil {
				j.err = fmt.Errorf("journal: rotate: %w", err)
				continue
			}
		}
		if j.start.IsZero() {
			j.start = time.UnixMilli(r.ArrivalMs)
		}
		r.ArrivalMs = max(0, r.ArrivalMs-j.start.UnixMilli())
		if err := j.w.Write(r); err != nil {
			j.err = fmt.Errorf("journal: %w", err)
			continue
		}
		j.size += est
	}
}

// Close flushes and closes the journal file.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.w == nil {
		return j.err
	}
	err := j.w.Close()
	j.w = nil
	if j.err != nil {
		return j.err
	}
	return err
}

// blockIDs returns the chained keyed ids of text's blocks, exactly
// ceil(tokens/journalBlockSize) of them (traces.TextBlockIDs).
func blockIDs(key [32]byte, text []byte, tokens int) []uint64 {
	return traces.TextBlockIDs(key[:], text, tokens)
}

// promptText is the canonical text of a request's prompt for the journal
// (traces.PromptText).
func promptText(raw []byte, api API) []byte {
	d := traces.DialectOpenAI
	switch api {
	case APIResponses:
		d = traces.DialectResponses
	case APIAnthropic:
		d = traces.DialectAnthropic
	}
	return traces.PromptText(raw, d)
}
