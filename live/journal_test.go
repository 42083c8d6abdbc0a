package live

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/lm-warden/warden/internal/fakevllm"
	"github.com/lm-warden/warden/live/upstream"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

func TestJournalRecordsTraces(t *testing.T) {
	a := fakevllm.New(t, 1)
	path := filepath.Join(t.TempDir(), "journal.jsonl")
	h := startProxy(t, modelsYAML("journal: {path: "+path+"}\n", urlsModel(a.URL())))
	for turn := range 3 {
		if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "secret-session", turn, turn%2 == 0), sessionHdr("secret-session")); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	h.do("POST", "/v1/messages/count_tokens", anthropicBody(testModel, "x", 0, false), nil) // not journaled
	h.do("POST", "/v1/messages", anthropicBody(testModel, "other", 0, false), nil)
	// A request is journaled just after its response went out.
	// count_tokens takes no place in the journal's order.
	h.waitFor("4 requests journaled", func(StatusReport) bool {
		h.srv.journal.mu.Lock()
		defer h.srv.journal.mu.Unlock()
		return h.srv.journal.flushAt == 4
	})
	for _, series := range []string{seriesJournalErrors + " 0", seriesJournalDropped + " 0", seriesJournalLate + " 0"} {
		if !strings.Contains(h.metrics(), "\n"+series+"\n") {
			t.Errorf("/metrics lacks %q", series)
		}
	}
	if err := h.srv.journal.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "secret-session") || strings.Contains(string(data), "careful coding agent") {
		t.Fatal("the journal holds a raw session id or prompt text")
	}
	sessions, hdr, err := traces.LoadSessions(path)
	if err != nil {
		t.Fatalf("journal does not read back as a trace: %v", err)
	}
	if hdr.BlockSize != journalBlockSize || hdr.Source != "proxy" {
		t.Errorf("header %+v", hdr)
	}
	if len(sessions) != 2 {
		t.Fatalf("%d sessions, want 2:\n%s", len(sessions), data)
	}
	var s traces.Session
	for _, x := range sessions {
		if len(x.Turns) == 3 {
			s = x
		}
	}
	if len(s.Turns) != 3 {
		t.Fatalf("no session with 3 turns: %+v", sessions)
	}
	for i, r := range s.Turns {
		if r.Turn != i || r.Replica != 0 || r.OutputTokens != 4 || r.PromptTokens < 100 {
			t.Errorf("turn %d: %+v", i, r)
		}
	}
	// Later turns extend the conversation: their blocks start with the
	// earlier turn's full blocks.
	t0, t1 := s.Turns[0].HashIDs, s.Turns[1].HashIDs
	full := s.Turns[0].PromptTokens / journalBlockSize
	if full < 2 || !slices.Equal(t0[:full], t1[:full]) {
		t.Errorf("turn 1 does not share turn 0's %d full blocks", full)
	}
}

func TestJournalRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "j.jsonl")
	j, err := openJournal(JournalCfg{Path: path, MaxBytes: 4096, Keep: 2}, journalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := &model{cfg: ModelCfg{Name: "m"}}
	rep := &replica{id: 1}
	for i := range 40 {
		c := &call{m: m, api: APIOpenAI, rb: upstream.BodyOf([]byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("w", 400) + `"}]}`)),
			req: placementReq("s"), usage: Usage{PromptTokens: 100, OutputTokens: 5, CachedTokens: -1}, cur: &attempt{rep: rep}}
		c.jt = j.begin()
		if i%2 == 1 {
			j.record(c, 0)
		} else {
			j.skip(c.jt)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(path + "*")
	if len(files) != 3 {
		t.Fatalf("files %v, want the journal and 2 rotated ones", files)
	}
	for _, f := range files {
		fi, _ := os.Stat(f)
		if fi.Size() > 4096 {
			t.Errorf("%s is %d bytes, over max_bytes", f, fi.Size())
		}
		if _, _, err := traces.LoadSessions(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestBlockIDs(t *testing.T) {
	var key [32]byte
	text := []byte(strings.Repeat("abcdefgh", 40)) // 320 bytes: 5 full blocks
	ids := blockIDs(key, text, 90)                 // 90 tokens: 6 ids, the last partial
	if len(ids) != 6 {
		t.Fatalf("%d ids, want ceil(90/16) = 6", len(ids))
	}
	longer := blockIDs(key, append(text, "more text"...), 96)
	if !slices.Equal(ids[:5], longer[:5]) || ids[5] == longer[5] {
		t.Errorf("a longer prompt must share the full blocks and not the partial one")
	}
	other := [32]byte{1}
	if blockIDs(other, text, 90)[0] == ids[0] {
		t.Error("ids must depend on the key")
	}
}

func placementReq(session string) placement.Request {
	return placement.Request{Session: session, Model: "m", Pinned: placement.NoPin}
}

// fakeClock is a hand-written clock for the journal: a wall clock that the
// test steps (forwards or back, as NTP does). Its readings carry no
// monotonic reading, so the journal sees every step.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testJournal opens a journal at path on clk with a private observer.
func testJournal(t *testing.T, cfg JournalCfg, clk *fakeClock, log *slog.Logger) (*Journal, *observer) {
	t.Helper()
	o := newObserver(func() *routing { return nil })
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = 256 << 20
	}
	if cfg.Keep == 0 {
		cfg.Keep = 5
	}
	j, err := openJournal(cfg, journalOptions{now: clk.Now, log: log, obs: o})
	if err != nil {
		t.Fatal(err)
	}
	return j, o
}

// journalCall is a finished call of session with a prompt of n bytes.
func journalCall(session string, n int) *call {
	return &call{m: &model{cfg: ModelCfg{Name: "m"}}, api: APIOpenAI,
		rb:    upstream.BodyOf([]byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("w", n) + `"}]}`)),
		req:   placementReq(session),
		usage: Usage{PromptTokens: max(1, n/4), OutputTokens: 5, CachedTokens: -1}, cur: &attempt{rep: &replica{id: 0}}}
}

// readJournal reads every request of the trace file at path, failing the
// test when it does not parse.
func readJournal(t *testing.T, path string) []traces.Request {
	t.Helper()
	rd, err := traces.Open(path, traces.ReaderOptions{})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer rd.Close()
	var out []traces.Request
	for {
		r, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s does not parse: %v", path, err)
		}
		out = append(out, r.Clone())
	}
}

// A wall clock stepped back (NTP) must not make the journal reject a record
// and drop every later one: arrival offsets never run backwards.
func TestJournalClockStepBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.jsonl")
	clk := newFakeClock()
	j, o := testJournal(t, JournalCfg{Path: path}, clk, nil)
	for i := range 6 {
		if i == 3 {
			clk.Step(-time.Hour) // NTP steps the wall clock back
		}
		c := journalCall(fmt.Sprintf("s%d", i), 100)
		c.jt = j.begin()
		clk.Step(250 * time.Millisecond)
		j.record(c, 0)
	}
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	reqs := readJournal(t, path)
	if len(reqs) != 6 {
		t.Fatalf("%d records in the journal, want all 6", len(reqs))
	}
	for i := 1; i < len(reqs); i++ {
		if reqs[i].ArrivalMs < reqs[i-1].ArrivalMs {
			t.Errorf("t_ms runs backwards at record %d: %d after %d", i, reqs[i].ArrivalMs, reqs[i-1].ArrivalMs)
		}
	}
	if got := counterValue(o.journalErrors); got != 0 {
		t.Errorf("%v write errors, want 0", got)
	}
}

// The journal's own clock is the monotonic one: its start instant carries
// a monotonic reading, so that offsets from it ignore wall-clock steps.
func TestJournalStartIsMonotonic(t *testing.T) {
	j, err := openJournal(JournalCfg{Path: filepath.Join(t.TempDir(), "j.jsonl"), MaxBytes: 1 << 20, Keep: 1}, journalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if s := j.origin.String(); !strings.Contains(s, " m=") {
		t.Errorf("the journal's origin %s has no monotonic reading", s)
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

func TestJournalRotationClosesFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.jsonl")
	before := openFDs(t)
	j, _ := testJournal(t, JournalCfg{Path: path, MaxBytes: 4096, Keep: 2}, newFakeClock(), nil)
	for range 200 { // 9 records a file: over 20 rotations
		c := journalCall("s", 400)
		c.jt = j.begin()
		j.record(c, 0)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if after := openFDs(t); after > before {
		t.Errorf("%d file descriptors open after the rotations and Close, %d before: rotation leaks them", after, before)
	}
}

// A restart must keep the previous journal (it used to be truncated).
func TestJournalRestartKeepsPrevious(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.jsonl")
	clk := newFakeClock()
	for _, session := range []string{"first-run", "second-run"} {
		j, _ := testJournal(t, JournalCfg{Path: path, Keep: 3}, clk, nil)
		c := journalCall(session, 100)
		c.jt = j.begin()
		j.record(c, 0)
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, f := range []string{path + ".1", path} {
		for _, r := range readJournal(t, f) {
			got = append(got, r.Session)
		}
	}
	if want := []string{"first-run", "second-run"}; !slices.Equal(got, want) {
		t.Errorf("sessions in %s.1 then %s: %v, want %v", path, path, got, want)
	}
}

// One long stream must not hold every later record in memory: past the
// bound the journal writes what is ready and the long one comes later.
func TestJournalPendingBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.jsonl")
	clk := newFakeClock()
	j, o := testJournal(t, JournalCfg{Path: path}, clk, nil)
	j.maxPending = 64 << 10
	long := journalCall("long-stream", 100)
	long.jt = j.begin()
	const n = 2000
	for i := range n {
		c := journalCall(fmt.Sprintf("s%d", i), 400)
		clk.Step(time.Millisecond)
		c.jt = j.begin()
		j.record(c, 0)
		// Every record is estimated at 256 bytes or more.
		if held := len(j.pending); int64(held) > j.maxPending/256 {
			t.Fatalf("after %d records %d are held in memory, over the bound of %d bytes", i+1, held, j.maxPending)
		}
	}
	clk.Step(time.Minute)
	j.record(long, 0) // the long stream ends
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	reqs := readJournal(t, path)
	if len(reqs) != n+1 {
		t.Fatalf("%d records, want %d", len(reqs), n+1)
	}
	if reqs[len(reqs)-1].Session != "long-stream" {
		t.Errorf("last record is %q, want the long stream, written once it ended", reqs[len(reqs)-1].Session)
	}
	if got := counterValue(o.journalLate); got != 1 {
		t.Errorf("%s = %v, want 1", seriesJournalLate, got)
	}
	if len(j.pending) != 0 {
		t.Errorf("%d records still pending after Close", len(j.pending))
	}
}

// syncBuffer is a log sink safe for concurrent writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A full disk is reported when it happens (log line and counter), not only
// at Close; once the disk has room again the journal writes again.
func TestJournalReportsWriteErrors(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "j.jsonl")
	if err := os.Symlink("/dev/full", path); err != nil { // every write: ENOSPC
		t.Fatal(err)
	}
	var logs syncBuffer
	clk := newFakeClock()
	j, o := testJournal(t, JournalCfg{Path: path}, clk, slog.New(slog.NewTextHandler(&logs, nil)))
	add := func(session string) {
		c := journalCall(session, 100)
		c.jt = j.begin()
		j.record(c, 0)
	}
	add("a")
	clk.Step(2 * time.Second) // the journal flushes at least every second
	add("b")
	if got := counterValue(o.journalErrors); got < 1 {
		t.Fatalf("%s = %v after a failed write, want >= 1", seriesJournalErrors, got)
	}
	if !strings.Contains(logs.String(), "no space left on device") {
		t.Errorf("no log line names the error:\n%s", logs.String())
	}
	if got := counterValue(o.journalDropped); got < 1 {
		t.Errorf("%s = %v, want >= 1", seriesJournalDropped, got)
	}
	// The disk has room again: the path now leads to a regular file.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "real.jsonl"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "real.jsonl"), path); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	add("c")
	if err := j.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	reqs := readJournal(t, path)
	if len(reqs) != 1 || reqs[0].Session != "c" {
		t.Fatalf("after recovery the journal holds %+v, want the one record written since", reqs)
	}
	if !strings.Contains(logs.String(), "journal writing again") {
		t.Errorf("no log line says the journal recovered:\n%s", logs.String())
	}
}

// counterValue reads a counter's value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// skip gives back a ticket that records nothing.
func (j *Journal) skip(t journalTicket) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if t.n < j.flushAt { // given up on: nothing waits for it
		return
	}
	j.pending[t.n] = nil
	j.pendingBytes += journalHeldNil
	j.flush(j.since())
}

// TestJournalFlushesWhenQuiet: a record written while traffic is quiet
// reaches the file within about journalFlushEvery, with no later request
// to push it out (it used to wait in the buffer for the next one), and
// Flush puts it there at once (the proxy calls it when SIGTERM starts the
// drain). Close ends the flush loop.
func TestJournalFlushesWhenQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "j.jsonl")
		j, err := openJournal(JournalCfg{Path: path, MaxBytes: 1 << 20, Keep: 1}, journalOptions{log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		onDisk := func() int {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			return strings.Count(string(data), "\n") - 1 // less the header
		}
		record := func(session string) {
			c := journalCall(session, 200)
			c.jt = j.begin()
			j.record(c, 0)
		}
		time.Sleep(3 * time.Second) // the first record comes after a second: flushed as it is written
		record("a")
		record("b") // within the second: held in the buffer
		synctest.Wait()
		held := onDisk()
		time.Sleep(journalFlushEvery + 10*time.Millisecond)
		synctest.Wait()
		if got := onDisk(); held >= 2 || got != 2 {
			t.Errorf("records on disk: %d right after the writes, %d a flush interval later; want fewer than 2, then 2", held, got)
		}
		record("c")
		if err := j.Flush(); err != nil {
			t.Fatal(err)
		}
		if got := onDisk(); got != 3 {
			t.Errorf("after Flush %d records on disk, want 3", got)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	})
}
