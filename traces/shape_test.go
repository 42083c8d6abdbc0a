package traces

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// The keys of issue 48, parsed and refused with the file, line and key.
func TestWorkloadShapeKeys(t *testing.T) {
	tests := []struct {
		name, yaml string
		check      func(t *testing.T, w Workload)
		err        string
	}{
		{name: "distributions", yaml: `turns: 40
turns_sigma: 1.2
turns_max: 500
additions:
  - {kind: tool, weight: 0.9, tokens: {mean: 1100, sigma: 1.7, max: 25000}, think: {mean: 16.8s, sigma: 2.9, max: 10m}}
  - kind: user
    weight: 0.1
    tokens: 700
    think: {dist: exponential, mean: 2m, max: 1h}
context_limit: 200000
compact_at: 0.83
summary_tokens: {mean: 12000, sigma: 0.5, max: 40000}
subagent_probability: 0.1
subagent_parallel: {dist: uniform, min: 1, max: 4}
subagent_session: parent
`, check: func(t *testing.T, w Workload) {
			want := []Addition{
				{Kind: AdditionTool, Weight: 0.9, Tokens: TokenDist{Mean: 1100, Sigma: 1.7, Max: 25000}, Think: TimeDist{Mean: 16.8, Sigma: 2.9, Max: 600}},
				{Kind: AdditionUser, Weight: 0.1, Tokens: TokenDist{Mean: 700}, Think: TimeDist{Shape: DistExponential, Mean: 120, Max: 3600}},
			}
			if d := cmp.Diff(want, w.Additions); d != "" {
				t.Errorf("additions (-want +got):\n%s", d)
			}
			if w.TurnsSigma != 1.2 || w.TurnsMax != 500 || w.ContextLimit != 200000 || w.CompactAt != 0.83 ||
				w.SummaryTokens != (TokenDist{Mean: 12000, Sigma: 0.5, Max: 40000}) ||
				w.SubagentParallel != (TokenDist{Shape: DistUniform, Min: 1, Max: 4}) || w.SubagentSession != SubagentParent {
				t.Errorf("parsed %+v", w)
			}
		}},
		{name: "unknown key in a distribution", yaml: "additions:\n  - kind: tool\n    weight: 1\n    tokens: {mean: 5, sd: 2}\n",
			err: "w.yaml:4: additions[0].tokens: sd: unknown key of a distribution"},
		{name: "bad duration", yaml: "additions:\n  - kind: tool\n    weight: 1\n    tokens: 5\n    think: soon\n",
			err: `w.yaml:5: additions[0].think: "soon" is not a duration`},
		{name: "bad kind", yaml: "additions:\n  - kind: robot\n    weight: 1\n    tokens: 5\n",
			err: `w.yaml:2: additions[0].kind: must be tool (a tool's result) or user (a person's message), got "robot"`},
		{name: "zero weight", yaml: "additions:\n  - kind: tool\n    weight: 0\n    tokens: 5\n",
			err: "w.yaml:3: additions[0].weight: must be a finite number > 0"},
		{name: "tail without a bound", yaml: "additions:\n  - kind: tool\n    weight: 1\n    tokens: {mean: 900, sigma: 1.5}\n",
			err: "w.yaml:4: additions[0].tokens: a lognormal has a tail: give its max"},
		{name: "pause of days", yaml: "additions:\n  - kind: user\n    weight: 1\n    tokens: 5\n    think: 48h\n",
			err: "w.yaml:5: additions[0].think: must stay within 24h0m0s"},
		{name: "sigma on an exponential", yaml: "summary_tokens: {dist: exponential, mean: 5, sigma: 1, max: 9}\ncontext_limit: 100000\n",
			err: "w.yaml:1: summary_tokens: sigma is for a lognormal, not a exponential"},
		{name: "compaction without a limit", yaml: "compact_at: 0.8\n", err: "w.yaml:1: compact_at: needs context_limit"},
		{name: "limit without a summary", yaml: "context_limit: 100000\n", err: "w.yaml:1: context_limit: needs summary_tokens"},
		{name: "limit below the system prompt", yaml: "context_limit: 3000\nsummary_tokens: 100\n",
			err: "w.yaml:1: context_limit: compact_at x context_limit = 2700 tokens leaves no room beyond the system prompt (3500)"},
		{name: "turns sigma without a bound", yaml: "turns_sigma: 1\n", err: "w.yaml: turns_max: required with turns_sigma"},
		{name: "bad session mode", yaml: "subagent_session: mine\n", err: `w.yaml:1: subagent_session: must be own, parent or none, got "mine"`},
		{name: "turns beyond the bound", yaml: "turns: 1000000\n", err: "w.yaml:1: turns: must be at most 100000"},
		{name: "agents from presets", yaml: "network_rtt: 5ms\nagents:\n  - {workload: claude-code, weight: 3}\n  - {workload: codex, weight: 1, system_prompt_tokens: 9000}\n",
			check: func(t *testing.T, w Workload) {
				cc, _ := Preset("claude-code")
				cx, _ := Preset("codex")
				cc.NetworkRTT, cx.NetworkRTT = 5*time.Millisecond, 5*time.Millisecond
				cx.SystemPromptTokens = 9000
				if len(w.Agents) != 2 || w.Agents[0].Name != "claude-code" || w.Agents[1].Name != "codex" || w.Agents[0].Weight != 3 {
					t.Fatalf("agents %+v", w.Agents)
				}
				if d := cmp.Diff(cc, w.Agents[0].Shape); d != "" {
					t.Errorf("claude-code kind (-want +got):\n%s", d)
				}
				if d := cmp.Diff(cx, w.Agents[1].Shape); d != "" {
					t.Errorf("codex kind (-want +got):\n%s", d)
				}
			}},
		{name: "agents inherit the top level", yaml: "turns: 9\nagents:\n  - {name: a, weight: 1, system_prompt_tokens: 100}\n  - {name: b, weight: 1}\n",
			check: func(t *testing.T, w Workload) {
				if a, b := w.Agents[0].Shape, w.Agents[1].Shape; a.Turns != 9 || b.Turns != 9 || a.SystemPromptTokens != 100 || b.SystemPromptTokens != 3500 {
					t.Errorf("kinds %+v, %+v", a, b)
				}
			}},
		{name: "agent sets the clients' side", yaml: "agents:\n  - {workload: bench, weight: 1, network_rtt: 9ms}\n",
			err: "w.yaml:2: agents[0].network_rtt: the clients' side is the farm's: set network_rtt once, at the top level"},
		{name: "agent of an unknown preset", yaml: "agents:\n  - {workload: cursor, weight: 1}\n",
			err: `w.yaml:2: agents[0].workload: no workload preset "cursor"`},
		{name: "two kinds of one name", yaml: "agents:\n  - {name: a, weight: 1}\n  - {name: a, weight: 2}\n",
			err: `w.yaml:3: agents[1].name: "a" names two agent kinds`},
		{name: "a kind's own bad value", yaml: "agents:\n  - {name: a, weight: 1}\n  - {name: b, weight: 1, turns: 0}\n",
			err: "w.yaml:3: agents[1].turns: must be >= 1, got 0"},
		{name: "nested kinds", yaml: "agents:\n  - name: a\n    weight: 1\n    agents: [{name: x, weight: 1}]\n",
			err: "w.yaml:4: agents[0].agents: an agent kind's workload cannot hold agent kinds of its own"},
	}
	dir := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := loadText(t, dir, tc.yaml)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.HasPrefix(err.Error(), dir) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, w)
		})
	}
}

// loadText writes text to dir/w.yaml and loads it as a workload.
func loadText(t *testing.T, dir, text string) (Workload, error) {
	t.Helper()
	path := filepath.Join(dir, "w.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return LoadWorkload(path)
}

// An agent kind's workload file is read relative to the file naming it.
func TestAgentWorkloadFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "kinds"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "kinds", "small.yaml"), []byte("turns: 2\nsystem_prompt_tokens: 64\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "mix.yaml"), []byte("agents:\n  - {workload: kinds/small.yaml, weight: 1}\n  - {workload: bench, weight: 1}\n"), 0o644)
	w, err := LoadWorkload(filepath.Join(dir, "mix.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if a := w.Agents[0]; a.Name != "kinds/small.yaml" || a.Shape.Turns != 2 || a.Shape.SystemPromptTokens != 64 {
		t.Fatalf("kind %+v", a)
	}
	os.WriteFile(filepath.Join(dir, "kinds", "nested.yaml"), []byte("agents:\n  - {workload: bench, weight: 1}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("agents:\n  - {workload: kinds/nested.yaml, weight: 1}\n"), 0o644)
	if _, err := LoadWorkload(filepath.Join(dir, "bad.yaml")); err == nil || !strings.Contains(err.Error(), "cannot hold agent kinds of its own") {
		t.Fatalf("nested kinds through a file: %v", err)
	}
}

// Every preset parses, bench is DefaultWorkload, and a name without a
// slash or an extension is a preset even beside a directory of that name.
func TestPresets(t *testing.T) {
	names := PresetNames()
	for _, want := range []string{"5090-farm", "bench", "claude-code", "codex"} {
		if !slices.Contains(names, want) {
			t.Errorf("presets %v lack %s", names, want)
		}
	}
	for _, n := range names {
		w, err := Preset(n)
		if err != nil {
			t.Fatalf("preset %s: %v", n, err)
		}
		if err := w.Validate(); err != nil {
			t.Fatalf("preset %s: %v", n, err)
		}
	}
	if w, _ := Preset(BenchPreset); !cmp.Equal(w, DefaultWorkload()) {
		t.Errorf("preset bench is not DefaultWorkload:\n%s", cmp.Diff(DefaultWorkload(), w))
	}
	t.Chdir(t.TempDir())
	if err := os.Mkdir("bench", 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile("codex", []byte("turns: 2\n"), 0o644)
	for _, tc := range []struct {
		ref    string
		preset bool
	}{{"bench", true}, {"codex", true}, {"./codex", false}, {"codex.yaml", false}, {"a/b", false}, {"", false}, {".", false}} {
		if got := IsPresetName(tc.ref); got != tc.preset {
			t.Errorf("IsPresetName(%q) = %v", tc.ref, got)
		}
	}
	if w, err := LoadWorkloadRef("bench"); err != nil || !cmp.Equal(w, DefaultWorkload()) {
		t.Errorf("bench beside a directory bench/: %v", err)
	}
	if w, err := LoadWorkloadRef("codex"); err != nil || w.ContextLimit != 272000 {
		t.Errorf("codex beside a file codex: %+v, %v", w.ContextLimit, err)
	}
	if w, err := LoadWorkloadRef("./codex"); err != nil || w.Turns != 2 {
		t.Errorf("./codex is the file: %+v, %v", w.Turns, err)
	}
	if _, err := LoadWorkloadRef("gemini"); err == nil || !strings.Contains(err.Error(), `no workload preset "gemini" (the presets: 5090-farm, bench, claude-code, codex`) {
		t.Errorf("unknown preset: %v", err)
	}
}

// A context limit: a compaction request extends the history with its
// instructions and is answered by the summary; the next request starts a
// new chain (the system prompt, then the summary): the old prefix is dead,
// the new one cold. No prompt passes the window.
func TestGeneratorCompaction(t *testing.T) {
	w := DefaultWorkload()
	w.SystemPromptTokens, w.FirstMessageTokens, w.Turns = 1000, 2000, 60
	w.NewTokensPerTurn, w.MaxOutputTokens = 900, 300
	w.ContextLimit, w.CompactAt, w.CompactPromptTokens = 20000, 0.8, 200
	w.SummaryTokens = TokenDist{Mean: 1500}
	const B = 16
	g := NewGenerator(w, B, 5)
	for range 3 {
		s, _ := g.NextSession()
		compactions := 0
		for j := 1; j < len(s.Turns); j++ {
			prev, r := s.Turns[j-1], s.Turns[j]
			if r.PromptTokens+r.OutputTokens > w.ContextLimit+w.CompactPromptTokens {
				t.Fatalf("%s request %d: %d + %d tokens pass the window", s.ID, j, r.PromptTokens, r.OutputTokens)
			}
			if r.PromptTokens >= prev.PromptTokens {
				// A turn (or a compaction) extends the history: the
				// previous prompt's full blocks are its prefix.
				if !slices.Equal(r.HashIDs[:prev.PromptTokens/B], prev.HashIDs[:prev.PromptTokens/B]) {
					t.Fatalf("%s request %d does not extend request %d", s.ID, j, j-1)
				}
				continue
			}
			// After a compaction: the system prompt, the summary (the
			// compaction's answer), the addition.
			compactions++
			if prev.OutputTokens != 1500 || r.PromptTokens != w.SystemPromptTokens+1500+w.NewTokensPerTurn || r.ThinkMs != 0 {
				t.Fatalf("%s request %d after a compaction: prompt %d (summary %d)", s.ID, j, r.PromptTokens, prev.OutputTokens)
			}
			if float64(prev.PromptTokens-w.CompactPromptTokens+w.NewTokensPerTurn) <= 0.8*float64(w.ContextLimit) {
				t.Fatalf("%s: compacted at %d tokens, before 80 %% of %d", s.ID, prev.PromptTokens, w.ContextLimit)
			}
			shared := w.SystemPromptTokens / B
			if !slices.Equal(r.HashIDs[:shared], prev.HashIDs[:shared]) || r.HashIDs[shared] == prev.HashIDs[shared] {
				t.Fatalf("%s request %d: the new context shares more or less than the system prompt", s.ID, j)
			}
			for _, h := range r.HashIDs[shared:] {
				for _, q := range s.Turns[:j] {
					if slices.Contains(q.HashIDs, h) {
						t.Fatalf("%s request %d: a block of the new context was in an earlier prompt: not cold", s.ID, j)
					}
				}
			}
		}
		// ~60 turns of ~1.2k tokens in a 16k trigger: a compaction every ~12.
		if compactions < 3 {
			t.Fatalf("%s: %d compactions in %d requests", s.ID, compactions, len(s.Turns))
		}
	}
}

// Agent kinds: every kind's sessions share its own system prompt and no
// other's; kinds come in proportion to their weights.
func TestGeneratorAgentKinds(t *testing.T) {
	small := DefaultWorkload()
	small.SystemPromptTokens, small.Turns = 320, 2
	w := DefaultWorkload()
	w.Agents = []Agent{{Name: "a", Weight: 3, Shape: small}, {Name: "b", Weight: 1, Shape: small}}
	const B = 16
	g := NewGenerator(w, B, 3)
	first := map[uint64]int{}
	for range 400 {
		s, _ := g.NextSession()
		first[s.Turns[0].HashIDs[0]]++
		if s.SharedTokens != 320 {
			t.Fatalf("%s: shared tokens %d", s.ID, s.SharedTokens)
		}
	}
	if len(first) != 2 {
		t.Fatalf("%d distinct system prompts for 2 kinds of equal size", len(first))
	}
	var counts []int
	for _, n := range first {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	if counts[1] < 260 || counts[1] > 340 {
		t.Fatalf("kinds %v of 400 sessions, want about 300/100", counts)
	}
}

// The session id subagents carry, in each mode.
func TestGeneratorSubagentSession(t *testing.T) {
	for _, mode := range []string{"", SubagentOwn, SubagentParent, SubagentNone} {
		w := DefaultWorkload()
		w.SubagentProbability, w.SubagentTurns = 1, 2
		w.SubagentParallel = TokenDist{Mean: 3}
		w.SubagentSystemPromptTokens = 1600
		w.SubagentSession = mode
		fam, _ := NewGenerator(w, 16, 1).NextFamily()
		if len(fam.Subagents) != 3*(w.Turns-1) {
			t.Fatalf("%q: %d subagents, want 3 after each turn but the last", mode, len(fam.Subagents))
		}
		for i, sub := range fam.Subagents {
			if sub.Parent != fam.ID || sub.ParentTurn != i/3 || sub.SharedTokens != 1600 || sub.Turns[0].PromptTokens != 1600+w.SubagentTaskTokens {
				t.Fatalf("%q: subagent %d %+v", mode, i, sub)
			}
			r := sub.Turns[1]
			switch mode {
			case "", SubagentOwn:
				if r.Session != sub.ID || r.Parent != fam.ID || r.Turn != 1 {
					t.Fatalf("%q: request %+v", mode, r)
				}
			case SubagentParent:
				if r.Session != fam.ID || r.Parent != "" || r.Turn != sub.ParentTurn+1 {
					t.Fatalf("%q: request %+v", mode, r)
				}
			case SubagentNone:
				if r.Session != sub.ID || r.Parent != "" {
					t.Fatalf("%q: request %+v", mode, r)
				}
			}
		}
		// Subagents of one kind share their own system prompt, not the
		// parent's.
		if a, b := fam.Subagents[0].Turns[0].HashIDs[0], fam.Subagents[1].Turns[0].HashIDs[0]; a != b || a == fam.Turns[0].HashIDs[0] {
			t.Fatalf("%q: subagent system prompts %x %x, parent's %x", mode, a, b, fam.Turns[0].HashIDs[0])
		}
	}
}

// A mixture's pauses and sizes follow their components.
func TestGeneratorAdditions(t *testing.T) {
	w := DefaultWorkload()
	w.Turns = 400
	w.Additions = []Addition{
		{Kind: AdditionTool, Weight: 3, Tokens: TokenDist{Mean: 100}, Think: TimeDist{Mean: 2}},
		{Kind: AdditionUser, Weight: 1, Tokens: TokenDist{Mean: 1000}, Think: TimeDist{Mean: 60}},
	}
	s, _ := NewGenerator(w, 16, 2).NextSession()
	counts := map[[2]int64]int{}
	for j := 1; j < len(s.Turns); j++ {
		add := s.Turns[j].PromptTokens - s.Turns[j-1].PromptTokens - s.Turns[j-1].OutputTokens
		counts[[2]int64{int64(add), s.Turns[j].ThinkMs}]++
	}
	if len(counts) != 2 || counts[[2]int64{100, 2000}] < 260 || counts[[2]int64{1000, 60000}] < 70 {
		t.Fatalf("additions and pauses %v, want ~300 of (100, 2s) and ~100 of (1000, 1m)", counts)
	}
	mean, tool := w.MeanPause()
	if mean != 16500*time.Millisecond || math.Abs(tool-6.0/66) > 1e-9 {
		t.Fatalf("MeanPause %v, tool share %g", mean, tool)
	}
}

// Dist draws: shapes, clipping, and the stream kept aligned.
func TestDistDraws(t *testing.T) {
	d := TokenDist{Mean: 1000, Sigma: 1.5, Max: 20000}
	var sum float64
	const n = 200000
	rng := newTestRand(4)
	for range n {
		v := d.draw(rng)
		if v <= 0 || v > 20000 {
			t.Fatalf("draw %g outside (0, 20000]", v)
		}
		sum += v
	}
	if got, want := sum/n, d.ClippedMean(); math.Abs(got-want)/want > 0.03 {
		t.Fatalf("mean %.0f, clipped mean %.0f", got, want)
	}
	if med := d.Median(); math.Abs(med-1000*math.Exp(-1.125)) > 1e-9 {
		t.Fatalf("median %g", med)
	}
	u := TokenDist{Shape: DistUniform, Min: 2, Max: 6}
	for range 1000 {
		if v := u.drawInt(rng, 1); v < 2 || v > 6 {
			t.Fatalf("uniform draw %d", v)
		}
	}
}

func newTestRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0)) }

// TestGeneratorDigest pins the sessions of the presets (and of the bench
// shape every earlier file means) to a digest: the same seed gives the
// same sessions on every machine and in every later version, unless a
// change means to alter them (then -update, and say so).
func TestGeneratorDigest(t *testing.T) {
	var lines []string
	for _, name := range PresetNames() {
		w, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		g := NewGenerator(w, 16, 7)
		h := sha256.New()
		var buf [8]byte
		n := 8
		if name == BenchPreset {
			n = 50
		}
		for range n {
			s, _ := g.NextSession()
			h.Write([]byte(s.ID + "|" + s.Parent))
			for _, r := range s.Turns {
				for _, v := range []uint64{uint64(r.Turn), uint64(r.PromptTokens), uint64(r.OutputTokens), uint64(r.ThinkMs), uint64(len(r.HashIDs))} {
					binary.LittleEndian.PutUint64(buf[:], v)
					h.Write(buf[:])
				}
				for _, id := range slices.Concat(r.HashIDs, r.OutputHashIDs) {
					binary.LittleEndian.PutUint64(buf[:], id)
					h.Write(buf[:])
				}
			}
		}
		lines = append(lines, name+" "+hex.EncodeToString(h.Sum(nil)))
	}
	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join("testdata", "generator_digest.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("generated sessions changed (-want +got):\n%s", cmp.Diff(string(want), got))
	}
}

// TestWorkloadDocListsEveryKey: WORKLOAD.md has a row for every key a
// workload file takes, and a column for every preset.
func TestWorkloadDocListsEveryKey(t *testing.T) {
	doc, err := os.ReadFile("WORKLOAD.md")
	if err != nil {
		t.Fatal(err)
	}
	for key := range yamlFields {
		if !strings.Contains(string(doc), "| `"+key+"` |") {
			t.Errorf("WORKLOAD.md has no row for key %s", key)
		}
	}
	for _, sub := range []string{"additions[].kind", "additions[].weight", "additions[].tokens", "additions[].think", "agents[].name", "agents[].weight", "agents[].workload"} {
		if !strings.Contains(string(doc), "| `"+sub+"` |") {
			t.Errorf("WORKLOAD.md has no row for %s", sub)
		}
	}
	header := "| key | " + strings.Join([]string{"bench", "claude-code", "codex", "5090-farm"}, " | ") + " | source |"
	if !strings.Contains(string(doc), header) || len(PresetNames()) != 4 {
		t.Errorf("WORKLOAD.md's preset table lacks the header %q for the presets %v", header, PresetNames())
	}
}

// TestWorkloadYAMLRoundTrip: a workload written as YAML (what warden
// workload and trace stats --workload-out write) reads back the same,
// distributions and agent kinds included.
func TestWorkloadYAMLRoundTrip(t *testing.T) {
	mixed, err := LoadWorkload(filepath.Join("..", "examples", "workloads", "mixed-agents.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	inline := DefaultWorkload()
	inline.Agents = []Agent{{Name: "a", Weight: 1, Shape: DefaultWorkload()}, {Name: "b", Weight: 2, Shape: mixed.Agents[1].Shape}}
	inline.Agents[1].Shape.NetworkRTT = inline.NetworkRTT
	ws := []Workload{mixed, inline}
	for _, n := range PresetNames() {
		w, _ := Preset(n)
		ws = append(ws, w)
	}
	for i, w := range ws {
		data, err := yaml.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseWorkload(data, "w.yaml")
		if err != nil {
			t.Fatalf("workload %d: %v\n%s", i, err, data)
		}
		if d := cmp.Diff(w, back); d != "" {
			t.Errorf("workload %d read back (-want +got):\n%s", i, d)
		}
	}
}
