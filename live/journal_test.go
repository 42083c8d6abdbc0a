package live

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

func TestJournalRecordsTraces(t *testing.T) {
	a := newFakeVLLM(t, 1)
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
	h.waitFor("5 requests journaled", func(StatusReport) bool {
		h.srv.journal.mu.Lock()
		defer h.srv.journal.mu.Unlock()
		return h.srv.journal.flushAt == 5
	})
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
	j, err := OpenJournal(JournalCfg{Path: path, MaxBytes: 4096, Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	m := &model{cfg: ModelCfg{Name: "m"}}
	rep := &replica{id: 1}
	for i := range 40 {
		c := &call{m: m, api: APIOpenAI, body: []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("w", 400) + `"}]}`),
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
