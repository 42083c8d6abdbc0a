package live

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
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
//
// Time: arrival times are offsets from the journal's origin, the instant it
// opened, taken with time.Now, whose reading carries the monotonic clock:
// Time.Sub then uses the monotonic readings, so a wall-clock step (NTP)
// cannot move them. A file's t_ms counts from its first record's arrival,
// and never runs backwards whatever the clock does: a record that would
// arrive before the previous one in its file is written at the previous
// one's t_ms.
//
// Memory: a finished request waits for the requests that arrived before it
// (one long stream holds back every later record). The records held are
// bounded by maxPending bytes of their estimated size on disk
// (journalMaxPending). Past the bound the journal stops waiting for the
// oldest unfinished requests and writes what is ready; a request given up
// on is written when it ends, out of arrival order, at the t_ms of the
// record before it (the format has a single arrival order and no flag), and
// counted in warden_journal_late_total. It is not dropped: long requests
// are the ones that load a farm, and a trace without them would
// under-report the load that warden sim, plan and workload read from it.
// Its arrival is late by at most the time the bound took to fill; its
// tokens, hash ids and think time are exact.
//
// Flushing: a loop started with the journal flushes the file every
// journalFlushEvery while it holds unflushed records, whether or not more
// arrive (a quiet proxy used to keep its last records in memory until the
// next request), and Flush flushes at once (the proxy calls it when it
// starts draining on SIGTERM, before the streams it waits for, which a
// supervisor's kill may cut short). Close stops the loop.
//
// Errors: the file is flushed at least every journalFlushEvery, so a
// failed write surfaces within about a second. It is
// logged when it happens and counted in warden_journal_write_errors_total;
// the records it lost (those written since the last flush) and those that
// arrive while the journal cannot write are counted in
// warden_journal_dropped_total. The failed file is closed, and a fresh one
// is tried after a back-off (journalRetryMin doubling to journalRetryMax);
// every later record is written again once it opens.
//
// Files: a journal left by an earlier run is rotated (path to path.1, and
// so on), never truncated; each file is a whole trace with one header,
// read by traces.Open (warden workload --journal, calibrate). A path that
// is not a regular file (a FIFO, /dev/stdout) is never renamed: the journal
// appends to it and does not rotate it.
type Journal struct {
	cfg        JournalCfg
	now        func() time.Time // the clock: time.Now, or a test's
	origin     time.Time        // now() when the journal opened: arrival offset 0
	log        *slog.Logger
	obs        *observer // nil: not counted
	maxPending int64     // bytes of records held back, at most

	mu           sync.Mutex
	key          [32]byte
	w            *traces.Writer // nil: no file open (closed, or after a failed write)
	f            *os.File
	regular      bool  // f is a regular file: rotated by size
	fileStartMs  int64 // arrival of the current file's first record (ms from origin)
	started      bool  // fileStartMs is set
	lastMs       int64 // t_ms of the last record written to the current file
	size         int64 // upper-bound estimate of the current file's bytes
	unflushed    int   // records written since the last flush
	flushedAt    time.Duration
	retryAt      time.Duration // after a failed write: when to open a fresh file
	retryDelay   time.Duration
	failing      bool // a write failed and no flush has succeeded since
	closed       bool
	next         uint64 // next ticket
	flushAt      uint64 // next ticket to write; those before it are written or given up on
	pending      map[uint64]*traces.Request
	pendingBytes int64
	sessions     map[string]*journalSession // by keyed session hash
	err          error                      // the last write error while failing, reported by Close

	stopOnce  sync.Once
	stopFlush chan struct{} // closed by Close: the flush loop ends
	flushDone chan struct{} // closed when the flush loop has ended
}

const (
	// journalMaxPending bounds the records held back behind an unfinished
	// request: about 30,000 records of a few blocks, or 400 of 100k tokens.
	journalMaxPending = 8 << 20
	// journalHeldNil is what a ticket that records nothing counts while held.
	journalHeldNil    = 32
	journalFlushEvery = time.Second
	journalRetryMin   = time.Second
	journalRetryMax   = time.Minute
)

type journalSession struct {
	turns int
	last  time.Duration // end of the previous turn, from the origin
}

// journalTicket is a request's place in arrival order.
type journalTicket struct {
	n  uint64
	at time.Duration // arrival, from the journal's origin
}

// journalOptions are the journal's collaborators; zero fields take their
// defaults (time.Now, slog.Default, no metrics, journalMaxPending).
type journalOptions struct {
	now        func() time.Time
	log        *slog.Logger
	obs        *observer
	maxPending int64
}

func openJournal(cfg JournalCfg, o journalOptions) (*Journal, error) {
	if o.now == nil {
		o.now = time.Now
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.maxPending <= 0 {
		o.maxPending = journalMaxPending
	}
	j := &Journal{cfg: cfg, now: o.now, log: o.log, obs: o.obs, maxPending: o.maxPending,
		pending: map[uint64]*traces.Request{}, sessions: map[string]*journalSession{}, retryDelay: journalRetryMin}
	j.origin = j.now()
	j.key = sha256.Sum256([]byte("warden-journal:" + cfg.Path + ":" + strconv.FormatInt(time.Now().UnixNano(), 10)))
	if err := j.open(); err != nil {
		return nil, err
	}
	j.stopFlush, j.flushDone = make(chan struct{}), make(chan struct{})
	go j.flushLoop()
	return j, nil
}

// flushLoop flushes the file every journalFlushEvery while records wait in
// its buffer, until Close.
func (j *Journal) flushLoop() {
	defer close(j.flushDone)
	tick := time.NewTicker(journalFlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-j.stopFlush:
			return
		case <-tick.C:
			j.mu.Lock()
			if !j.closed {
				j.maybeFlush(j.since())
			}
			j.mu.Unlock()
		}
	}
}

// Flush writes the records that are ready and flushes the file now. It
// reports the write error the journal has not recovered from, if any.
func (j *Journal) Flush() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	now := j.since()
	j.flush(now)
	if j.w != nil && j.unflushed > 0 {
		if err := j.w.Flush(); err != nil {
			j.fail(fmt.Errorf("journal: %w", err), now, j.unflushed)
		} else {
			j.flushed(now)
		}
	}
	return j.err
}

// SetKey sets the key of the block hashes (by default random per process).
func (j *Journal) SetKey(key []byte) {
	j.mu.Lock()
	j.key = sha256.Sum256(key)
	j.mu.Unlock()
}

// since is the time from the origin to now.
func (j *Journal) since() time.Duration { return j.now().Sub(j.origin) }

// open opens a fresh file at the path, rotating away a non-empty regular
// file found there.
func (j *Journal) open() error {
	if fi, err := os.Stat(j.cfg.Path); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		if err := j.shift(); err != nil {
			return fmt.Errorf("journal: rotating the previous %s: %w", j.cfg.Path, err)
		}
	}
	f, err := os.OpenFile(j.cfg.Path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("journal: %w", err)
	}
	j.f, j.regular = f, fi.Mode().IsRegular()
	j.w = traces.NewWriter(f, traces.Header{BlockSize: journalBlockSize, Source: "proxy", CreatedBy: "warden proxy"})
	j.started, j.lastMs, j.size, j.unflushed = false, 0, 256, 0
	return nil
}

// shift renames path.1..path.keep-1 up by one and the path to path.1.
func (j *Journal) shift() error {
	for i := j.cfg.Keep - 1; i >= 1; i-- {
		_ = os.Rename(j.cfg.Path+"."+strconv.Itoa(i), j.cfg.Path+"."+strconv.Itoa(i+1))
	}
	return os.Rename(j.cfg.Path, j.cfg.Path+".1")
}

// closeFile flushes and closes the current file.
func (j *Journal) closeFile() error {
	err := errors.Join(j.w.Close(), j.f.Close())
	j.w, j.f = nil, nil
	return err
}

// rotate closes the current file and opens a new one.
func (j *Journal) rotate(now time.Duration) error {
	if err := j.closeFile(); err != nil {
		return err
	}
	j.flushed(now)
	return j.open()
}

// begin gives a request its place in arrival order.
func (j *Journal) begin() journalTicket {
	j.mu.Lock()
	defer j.mu.Unlock()
	t := journalTicket{n: j.next, at: j.since()}
	j.next++
	return t
}

// record journals a finished call.
func (j *Journal) record(c *call, _ time.Duration) {
	text := promptText(c.rb.Bytes(), c.api)
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
	now := j.since()
	if s := j.sessions[r.Session]; s != nil {
		r.Turn = s.turns
		r.ThinkMs = max(0, (c.jt.at - s.last).Milliseconds())
		s.turns++
		s.last = now
	} else {
		j.sessions[r.Session] = &journalSession{turns: 1, last: now}
		j.trimSessions(now)
	}
	r.ArrivalMs = c.jt.at.Milliseconds() // made relative to the file when written
	if j.closed {
		j.dropped(1)
		return
	}
	if c.jt.n < j.flushAt {
		// Given up on while it ran (the pending bound): written now,
		// behind later upstream.Arrivals.
		if j.obs != nil {
			j.obs.journalLate.Inc()
		}
		j.write(r, now)
		j.maybeFlush(now)
		return
	}
	j.pending[c.jt.n] = r
	j.pendingBytes += recordBytes(r)
	j.flush(now)
}

// recordBytes estimates the bytes of r's line, an upper bound.
func recordBytes(r *traces.Request) int64 {
	return int64(256 + 21*len(r.HashIDs) + len(r.Session) + len(r.Parent) + len(r.Model))
}

// trimSessions forgets sessions idle for an hour once the map is large.
func (j *Journal) trimSessions(now time.Duration) {
	if len(j.sessions) < 1<<16 || len(j.sessions)&0xfff != 0 {
		return
	}
	for k, s := range j.sessions {
		if now-s.last > time.Hour {
			delete(j.sessions, k)
		}
	}
}

// flush writes every record whose predecessors have all finished; over the
// pending bound it gives up on the oldest unfinished ones.
func (j *Journal) flush(now time.Duration) {
	for len(j.pending) > 0 {
		r, ok := j.pending[j.flushAt]
		if !ok {
			if j.pendingBytes <= j.maxPending {
				break
			}
			j.flushAt++ // stop waiting for this one: it is written when it ends
			continue
		}
		delete(j.pending, j.flushAt)
		j.flushAt++
		if r == nil {
			j.pendingBytes -= journalHeldNil
			continue
		}
		j.pendingBytes -= recordBytes(r)
		j.write(r, now)
	}
	j.maybeFlush(now)
}

// write appends r to the current file (opening a fresh one after a failure
// once the back-off has passed, rotating by size).
func (j *Journal) write(r *traces.Request, now time.Duration) {
	if j.w == nil {
		if j.closed || now < j.retryAt {
			j.dropped(1)
			return
		}
		if err := j.open(); err != nil {
			j.fail(err, now, 1)
			return
		}
	}
	est := recordBytes(r)
	if j.regular && j.size+est > int64(j.cfg.MaxBytes) && j.size > 256 {
		if err := j.rotate(now); err != nil {
			j.fail(fmt.Errorf("journal: rotate: %w", err), now, 1)
			return
		}
	}
	if !j.started {
		j.fileStartMs, j.started = r.ArrivalMs, true
	}
	r.ArrivalMs = max(j.lastMs, r.ArrivalMs-j.fileStartMs)
	if err := j.w.Write(r); err != nil {
		if j.w.Err() == nil { // this record only; the file is fine
			j.log.Error("journal: record not written", "path", j.cfg.Path, "err", err)
			if j.obs != nil {
				j.obs.journalErrors.Inc()
			}
			j.dropped(1)
			return
		}
		j.fail(fmt.Errorf("journal: %w", err), now, j.unflushed+1)
		return
	}
	j.lastMs = r.ArrivalMs
	j.size += est
	j.unflushed++
}

// maybeFlush flushes the file when the last flush is journalFlushEvery old.
func (j *Journal) maybeFlush(now time.Duration) {
	if j.w == nil || j.unflushed == 0 || now-j.flushedAt < journalFlushEvery {
		return
	}
	if err := j.w.Flush(); err != nil {
		j.fail(fmt.Errorf("journal: %w", err), now, j.unflushed)
		return
	}
	j.flushed(now)
}

// flushed notes a successful flush: what was written is on disk.
func (j *Journal) flushed(now time.Duration) {
	j.flushedAt, j.unflushed = now, 0
	if j.failing {
		j.failing, j.err, j.retryDelay = false, nil, journalRetryMin
		j.log.Info("journal writing again", "path", j.cfg.Path)
	}
}

// fail handles a failed write: the file is closed, lost records are
// counted, and a fresh file is tried after the back-off.
func (j *Journal) fail(err error, now time.Duration, lost int) {
	if j.obs != nil {
		j.obs.journalErrors.Inc()
	}
	j.dropped(lost)
	if j.f != nil {
		_ = j.f.Close() // the writer's buffer is lost with the error
	}
	j.w, j.f = nil, nil
	j.retryAt = now + j.retryDelay
	j.log.Error("journal: write failed; requests are not journaled until a fresh file opens",
		"path", j.cfg.Path, "err", err, "lost", lost, "retry_in", j.retryDelay)
	j.retryDelay = min(2*j.retryDelay, journalRetryMax)
	j.failing, j.err, j.unflushed = true, err, 0
}

func (j *Journal) dropped(n int) {
	if j.obs != nil && n > 0 {
		j.obs.journalDropped.Add(float64(n))
	}
}

// Close writes the records still held (the requests before them will not
// be journaled in order: any that ends later is dropped), flushes and
// closes the file. It reports the error of that last flush, or the write
// error the journal has not recovered from.
func (j *Journal) Close() error {
	j.stopOnce.Do(func() { // before the lock: the loop may be waiting for it
		if j.stopFlush != nil {
			close(j.stopFlush)
			<-j.flushDone
		}
	})
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	now := j.since()
	keys := slices.Sorted(maps.Keys(j.pending))
	for _, k := range keys {
		if r := j.pending[k]; r != nil {
			j.write(r, now)
		}
	}
	clear(j.pending)
	j.pendingBytes = 0
	if len(keys) > 0 {
		j.flushAt = keys[len(keys)-1] + 1
	}
	j.flushAt = max(j.flushAt, j.next)
	j.closed = true
	if j.w == nil {
		return j.err
	}
	if err := j.closeFile(); err != nil {
		j.fail(fmt.Errorf("journal: %w", err), now, j.unflushed)
		return j.err
	}
	j.flushed(now)
	return nil
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
