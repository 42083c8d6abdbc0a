package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/lm-warden/warden/traces"
)

func runTraceCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	err := root.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

func TestTraceSynthRoundTrip(t *testing.T) {
	dir := t.TempDir()
	wl := filepath.Join(dir, "w.yaml")
	os.WriteFile(wl, []byte("turns: 3\nthink_time: 1s\nsubagent_probability: 0.3\nsubagent_turns: 2\n"), 0o644)
	path := filepath.Join(dir, "s.jsonl.gz")
	if _, _, err := runTraceCLI(t, "trace", "synth", "--sessions", "4", "--duration", "30s", "--workload", wl, "--seed", "5", path); err != nil {
		t.Fatal(err)
	}
	got, h, err := traces.LoadSessions(path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Concurrency != 4 || h.BlockSize != 16 || !strings.Contains(h.Source, "seed=5") {
		t.Fatalf("header %+v", h)
	}
	// Turns of 1s + 1s think: a slot runs at most 30s / 6s = 5 sessions; one
	// round more: 6 rounds of 4 top-level sessions.
	top := 0
	for _, s := range got {
		if s.Parent == "" {
			top++
		}
	}
	if top != 24 {
		t.Fatalf("%d top-level sessions, want 24", top)
	}
	// The file holds exactly the generator's sessions (a subagent first
	// appears when the request it follows is answered, among the others).
	w, _ := traces.LoadWorkload(wl)
	gen := traces.NewGenerator(w, 16, 5)
	want := make([]traces.Session, len(got))
	for i := range want {
		want[i], _ = gen.NextSession()
		want[i].ParentTurn, want[i].SharedTokens = -1, 0
	}
	byID := func(a, b traces.Session) int { return strings.Compare(a.ID, b.ID) }
	slices.SortFunc(want, byID)
	byArrival := slices.Clone(got)
	slices.SortFunc(got, byID)
	if d := cmp.Diff(want, got, cmpopts.IgnoreFields(traces.Request{}, "ArrivalMs")); d != "" {
		t.Fatalf("synth file differs from the generator (-want +got):\n%s", d)
	}
	// Turns 1 s apart plus their pause; a subagent starts when the turn
	// it follows is answered, and its parent's next turn waits for it.
	arrival := map[string][]int64{}
	for _, s := range byArrival {
		for _, r := range s.Turns {
			arrival[s.ID] = append(arrival[s.ID], r.ArrivalMs)
		}
	}
	for _, s := range got {
		for i := 1; i < len(s.Turns); i++ {
			d := s.Turns[i].ArrivalMs - s.Turns[i-1].ArrivalMs
			if s.Turns[i].ThinkMs != 0 && d != 2000 {
				t.Fatalf("%s: turns %d ms apart, want 2000 (1s turn + 1s think)", s.ID, d)
			}
		}
		if s.Parent != "" {
			p := arrival[s.Parent]
			first := s.Turns[0].ArrivalMs
			k, _ := slices.BinarySearch(p, first) // the parent's next turn
			if k == 0 || first-p[k-1] != 1000 || (k < len(p) && p[k] < s.Turns[len(s.Turns)-1].ArrivalMs+1000) {
				t.Fatalf("%s starts at %d ms: parent's turns at %v", s.ID, first, p)
			}
		}
	}
}

func TestTraceImportAndStats(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.jsonl")
	_, log, err := runTraceCLI(t, "trace", "import", "--from", "mooncake", "--block-size", "256", "../../traces/testdata/mooncake_small.jsonl", out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log, "imported 6 requests in 4 sessions") {
		t.Fatalf("summary %q", log)
	}
	js, _, err := runTraceCLI(t, "trace", "stats", "--json", out)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"requests", "sessions", "reuse_upper_bound_pct", "working_set_tokens_p50", "working_set_tokens_max", "fitted_workload"} {
		if _, ok := st[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	// The Mooncake trace's inferred sessions fit a workload: 4 sessions of
	// 1.5 requests, a shared prefix of two 512-token blocks (four of 256).
	fw := st["fitted_workload"].(map[string]any)
	if w := fw["workload"].(map[string]any); fw["sessions"] != 4.0 || w["SystemPromptTokens"] != 1024.0 || w["Turns"] != 2.0 {
		t.Errorf("fitted workload %v", fw)
	}
	if st["requests"] != 6.0 || st["sessions"] != 4.0 {
		t.Fatalf("requests %v sessions %v", st["requests"], st["sessions"])
	}
	text, _, err := runTraceCLI(t, "trace", "stats", out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requests", "reuse upper bound", "working set", "fitted workload (4 sessions, 0 subagents)"} {
		if !strings.Contains(text, want) {
			t.Fatalf("text output lacks %q:\n%s", want, text)
		}
	}
	// A Bailian trace's chat chains are sessions of their own: they fit too.
	bl := filepath.Join(dir, "b.jsonl")
	if _, _, err := runTraceCLI(t, "trace", "import", "--from", "bailian", "../../traces/testdata/bailian_small.jsonl", bl); err != nil {
		t.Fatal(err)
	}
	if text, _, err := runTraceCLI(t, "trace", "stats", bl, "--workload-out", filepath.Join(dir, "b.yaml")); err != nil || !strings.Contains(text, "fitted workload (3 sessions, 0 subagents)") {
		t.Fatalf("bailian stats: %v\n%s", err, text)
	}
	if _, err := traces.LoadWorkload(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
}

func TestTraceImportToStdout(t *testing.T) {
	var out, log bytes.Buffer
	err := runTraceImport(context.Background(), traceImportOptions{
		From: "azure", BlockSize: 16, In: "../../traces/testdata/azure_small.csv", Out: "-", Log: &log,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := traces.NewReader(&out, "stdout", traces.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := traces.Stats(rd); err != nil || st.Requests != 3 || st.ReuseUpperBoundPct != 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
}

func TestTraceErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"format":"warden-trace","version":1,"block_size":16}`+"\n"+`{"t_ms":-1}`+"\n"), 0o644)
	tests := []struct {
		args []string
		err  string
	}{
		{[]string{"trace", "import", "--from", "parquet", "a", "b"}, `--from "parquet": want one of mooncake, bailian, azure`},
		{[]string{"trace", "import", "a", "b"}, `required flag(s) "from" not set`},
		{[]string{"trace", "stats", bad}, bad + ":2: t_ms: must be >= 0, got -1"},
		{[]string{"trace", "synth", "--sessions", "0", filepath.Join(dir, "x")}, "--sessions 0: must be >= 1"},
		{[]string{"trace", "synth", "--workload", filepath.Join(dir, "none.yaml"), filepath.Join(dir, "x")}, "none.yaml"},
	}
	for _, tc := range tests {
		_, _, err := runTraceCLI(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
		}
	}
}

// With a TTL of a few turns, the working set of a synthetic trace holds
// about the closed loop's N sessions (up to 2N where rounds overlap).
func TestTraceSynthWorkingSet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.jsonl")
	if _, _, err := runTraceCLI(t, "trace", "synth", "--sessions", "4", "--duration", "2m", path); err != nil {
		t.Fatal(err)
	}
	js, _, err := runTraceCLI(t, "trace", "stats", "--json", "--session-ttl", "1500ms", path)
	if err != nil {
		t.Fatal(err)
	}
	var st traces.TraceStats
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	if st.ActiveSessionsP50 < 4 || st.ActiveSessionsMax > 8 || st.TurnsPerSessionP50 != 6 {
		t.Fatalf("active sessions p50 %d max %d, turns p50 %d; want >= 4, <= 8 and 6", st.ActiveSessionsP50, st.ActiveSessionsMax, st.TurnsPerSessionP50)
	}
}

// TestTraceStatsFitsWorkload: a trace of agent sessions (tool results and
// a person's messages, heavy tails, subagents) fits back into a workload
// file, by warden trace stats --workload-out and by warden workload
// --journal alike, which warden sim then runs.
func TestTraceStatsFitsWorkload(t *testing.T) {
	dir := t.TempDir()
	wl := filepath.Join(dir, "w.yaml")
	os.WriteFile(wl, []byte(`system_prompt_tokens: 2048
first_message_tokens: 500
turns: 20
turns_sigma: 0.8
turns_max: 200
output_tokens: lognormal
output_tokens_mean: 200
max_output_tokens: 4000
output_tokens_sigma: 1
additions:
  - {kind: tool, weight: 0.8, tokens: {mean: 600, sigma: 1.5, max: 8000}, think: {mean: 3s, sigma: 1.5, max: 29s}}
  - {kind: user, weight: 0.2, tokens: {mean: 300, sigma: 0.8, max: 4000}, think: {mean: 2m, sigma: 1, max: 20m}}
subagent_probability: 0.05
subagent_parallel: {dist: uniform, min: 1, max: 3}
subagent_turns: 5
`), 0o644)
	trace := filepath.Join(dir, "t.jsonl")
	if _, _, err := runTraceCLI(t, "trace", "synth", "--sessions", "6", "--duration", "20m", "--workload", wl, trace); err != nil {
		t.Fatal(err)
	}
	fitted := filepath.Join(dir, "fit.yaml")
	text, _, err := runTraceCLI(t, "trace", "stats", trace, "--workload-out", fitted)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fitted workload (", "tool ", "user ", "subagents after", "workload: " + fitted} {
		if !strings.Contains(text, want) {
			t.Errorf("trace stats lacks %q:\n%s", want, text)
		}
	}
	journal := filepath.Join(dir, "journal.yaml")
	if _, _, err := runTraceCLI(t, "workload", "--journal", trace, "--out", journal); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fitted, journal} {
		w, err := traces.LoadWorkload(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(w.Additions) != 2 || w.TurnsSigma == 0 || w.SubagentProbability == 0 || w.SystemPromptTokens != 2048 || w.OutputTokens != traces.OutputLognormal {
			t.Errorf("%s: %+v", path, w)
		}
		if _, _, err := runTraceCLI(t, "sim", "--workload", path, "--sessions", "2", "--duration", "20s", "--strategies", "affinity"); err != nil {
			t.Errorf("sim --workload %s: %v", path, err)
		}
	}
}

// TestTraceImportFailureLeavesNoFile: an import that fails (a bad line, no
// --skip-bad) leaves no file at OUT, where it used to leave a header-only
// one that passes for an empty trace, and an OUT that existed is kept as
// it was; nothing partial is left beside it.
func TestTraceImportFailureLeavesNoFile(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(in, []byte(`{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}`+"\n"+"not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{filepath.Join(dir, "m.jsonl"), filepath.Join(dir, "m.jsonl.gz")} {
		if _, _, err := runTraceCLI(t, "trace", "import", "--from", "mooncake", in, out); err == nil {
			t.Fatalf("%s: a bad line imported without an error", out)
		}
		if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after a failed import: %v, want no file", out, err)
		}
	}
	kept := filepath.Join(dir, "kept.jsonl")
	if err := os.WriteFile(kept, []byte("before\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runTraceCLI(t, "trace", "import", "--from", "mooncake", in, kept); err == nil {
		t.Fatal("no error")
	}
	if b, _ := os.ReadFile(kept); string(b) != "before\n" {
		t.Errorf("existing OUT became %q", b)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*partial*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
