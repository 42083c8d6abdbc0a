package traces

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func takeSessions(src SessionSource, n int) []Session {
	var out []Session
	for range n {
		s, ok := src.NextSession()
		if !ok {
			break
		}
		out = append(out, s)
	}
	return out
}

func TestGeneratorDeterministic(t *testing.T) {
	w := DefaultWorkload()
	w.SubagentProbability = 0.3
	a := takeSessions(NewGenerator(w, 16, 7), 30)
	b := takeSessions(NewGenerator(w, 16, 7), 30)
	if d := cmp.Diff(a, b); d != "" {
		t.Fatalf("same seed, different sessions (-a +b):\n%s", d)
	}
	c := takeSessions(NewGenerator(w, 16, 8), 30)
	if a[0].Turns[0].HashIDs[len(a[0].Turns[0].HashIDs)-1] == c[0].Turns[0].HashIDs[len(c[0].Turns[0].HashIDs)-1] {
		t.Fatal("different seeds gave the same first-message blocks")
	}
}

// naiveIDs hashes a whole prompt from scratch: the reference for the
// incremental blockChain.
func naiveIDs(segs []piece, B int) []uint64 {
	var ids []uint64
	var pend []piece
	fill, parent := 0, rootParent
	for _, s := range segs {
		off, n := 0, s.n
		for n > 0 {
			take := min(B-fill, n)
			pend = append(pend, piece{seg: s.seg, off: off, n: take})
			fill, off, n = fill+take, off+take, n-take
			if fill == B {
				parent = blockID(parent, pend)
				ids = append(ids, parent)
				pend, fill = nil, 0
			}
		}
	}
	if fill > 0 {
		ids = append(ids, blockID(parent, pend))
	}
	return ids
}

func TestGeneratorPromptStructure(t *testing.T) {
	for _, B := range []int{1, 7, 16, 64} {
		w := DefaultWorkload()
		w.SystemPromptTokens = 350
		w.FirstMessageTokens = 730
		w.NewTokensPerTurn = 40
		const seed = 3
		g := NewGenerator(w, B, seed)
		sessions := takeSessions(g, 5)
		sysSeg := hashWords(0x73797374656d, uint64(w.SystemPromptTokens))
		for k, s := range sessions {
			if want := "s00000" + string(rune('0'+k)); s.ID != want {
				t.Fatalf("B=%d: session %d id %q, want %q", B, k, s.ID, want)
			}
			if len(s.Turns) != w.Turns {
				t.Fatalf("B=%d: %d turns, want %d", B, len(s.Turns), w.Turns)
			}
			seg := func(i uint64) uint64 { return hashWords(seed, uint64(k), 0, i) }
			first := s.Turns[0].PromptTokens - w.SystemPromptTokens
			if first < 693 || first > 767 {
				t.Fatalf("first message %d outside 730±5%%", first)
			}
			segs := []piece{{seg: sysSeg, n: w.SystemPromptTokens}, {seg: seg(1), n: first}}
			for i, r := range s.Turns {
				if r.Turn != i || r.Session != s.ID || r.CachedTokens != -1 || r.Replica != -1 {
					t.Fatalf("turn %d: bad fields %+v", i, r)
				}
				if i > 0 {
					segs = append(segs, piece{seg: seg(uint64(2*i + 1)), n: w.NewTokensPerTurn})
				}
				P := 0
				for _, p := range segs {
					P += p.n
				}
				if r.PromptTokens != P {
					t.Fatalf("B=%d turn %d: prompt %d, want %d", B, i, r.PromptTokens, P)
				}
				if d := cmp.Diff(naiveIDs(segs, B), r.HashIDs); d != "" {
					t.Fatalf("B=%d turn %d: incremental ids differ from a full rehash:\n%s", B, i, d)
				}
				segs = append(segs, piece{seg: seg(uint64(2*i + 2)), n: r.OutputTokens})
				after := naiveIDs(segs, B)
				wantOut := after[P/B : (P+r.OutputTokens)/B]
				if len(wantOut) == 0 {
					wantOut = nil
				}
				if d := cmp.Diff(wantOut, r.OutputHashIDs); d != "" {
					t.Fatalf("B=%d turn %d: output ids:\n%s", B, i, d)
				}
				if i+1 < len(s.Turns) {
					next := s.Turns[i+1].HashIDs
					full := (P + r.OutputTokens) / B
					if !slices.Equal(next[:full], slices.Concat(r.HashIDs[:P/B], r.OutputHashIDs)) {
						t.Fatalf("B=%d turn %d: next turn does not repeat prompt + answer blocks", B, i)
					}
				}
			}
		}
		// The system prompt's full blocks are shared by every session; the
		// block straddling into the first message is each session's own.
		shared := w.SystemPromptTokens / B
		for _, s := range sessions[1:] {
			a, b := sessions[0].Turns[0].HashIDs, s.Turns[0].HashIDs
			if !slices.Equal(a[:shared], b[:shared]) {
				t.Fatalf("B=%d: system prompt blocks differ between sessions", B)
			}
			if a[shared] == b[shared] {
				t.Fatalf("B=%d: block %d straddling into the first message is shared", B, shared)
			}
		}
	}
}

func TestGeneratorOutputDistribution(t *testing.T) {
	w := DefaultWorkload()
	w.OutputTokens = OutputLognormal
	g := NewGenerator(w, 16, 1)
	var sum, n float64
	seen := map[int]bool{}
	for _, s := range takeSessions(g, 400) {
		for _, r := range s.Turns {
			if r.OutputTokens < 1 || r.OutputTokens > w.MaxOutputTokens {
				t.Fatalf("output %d outside [1, %d]", r.OutputTokens, w.MaxOutputTokens)
			}
			sum += float64(r.OutputTokens)
			n++
			seen[r.OutputTokens] = true
		}
	}
	mean := sum / n
	// The lognormal's mean is 153.6 before clipping at 256; clipping lowers it.
	if mean < 130 || mean > 160 {
		t.Fatalf("mean output %.1f, want about 0.6 x 256 minus clipping", mean)
	}
	if len(seen) < 50 {
		t.Fatalf("only %d distinct output lengths: not a distribution", len(seen))
	}
	// The default, "max": every answer runs to max_output_tokens, and the
	// prompts are those of the lognormal sessions but for the answers.
	w.OutputTokens = OutputMax
	for _, s := range takeSessions(NewGenerator(w, 16, 1), 50) {
		for _, r := range s.Turns {
			if r.OutputTokens != w.MaxOutputTokens {
				t.Fatalf("output_tokens max: answer of %d tokens, want %d", r.OutputTokens, w.MaxOutputTokens)
			}
		}
	}
}

func TestGeneratorSubagents(t *testing.T) {
	w := DefaultWorkload()
	w.SubagentProbability = 1
	w.SubagentTurns = 2
	w.ThinkTime = 1500 * time.Millisecond
	g := NewGenerator(w, 16, 1)
	got := takeSessions(g, 2*w.Turns)
	if got[0].Parent != "" || got[0].ParentTurn != -1 {
		t.Fatalf("root session has parent %q/%d", got[0].Parent, got[0].ParentTurn)
	}
	for i := 1; i < w.Turns; i++ {
		s := got[i]
		if s.Parent != "s000000" || s.ParentTurn != i-1 || len(s.Turns) != 2 {
			t.Fatalf("session %d: %s parent %q turn %d, %d turns", i, s.ID, s.Parent, s.ParentTurn, len(s.Turns))
		}
		if s.Turns[0].PromptTokens != w.SystemPromptTokens+w.SubagentTaskTokens || s.Turns[1].ThinkMs != 1500 || s.Turns[0].ThinkMs != 0 {
			t.Fatalf("subagent %s: prompt %d think %d", s.ID, s.Turns[0].PromptTokens, s.Turns[1].ThinkMs)
		}
		if s.Turns[0].HashIDs[0] != got[0].Turns[0].HashIDs[0] {
			t.Fatal("subagent does not share the system prompt")
		}
	}
	if got[w.Turns].ID != "s000001" {
		t.Fatalf("after the subagents came %s, want s000001", got[w.Turns].ID)
	}
	// A turn after a spawn adds the subagents' answers (the tool's result)
	// at once; the parent's other turns are those of a run without them.
	w0 := w
	w0.SubagentProbability = 0
	plain, _ := NewGenerator(w0, 16, 1).NextSession()
	if !slices.Equal(plain.Turns[0].HashIDs, got[0].Turns[0].HashIDs) {
		t.Fatal("the parent's first turn changed when subagents were spawned")
	}
	for i := 1; i < w.Turns; i++ {
		r, prev := got[0].Turns[i], got[0].Turns[i-1]
		sub := got[i] // the one subagent spawned after turn i-1
		if add := r.PromptTokens - prev.PromptTokens - prev.OutputTokens; add != sub.Turns[len(sub.Turns)-1].OutputTokens || r.ThinkMs != 0 {
			t.Fatalf("turn %d adds %d tokens after %d ms, want the subagent's answer (%d) at once", i, add, r.ThinkMs, sub.Turns[len(sub.Turns)-1].OutputTokens)
		}
	}
	fam, _ := NewGenerator(w, 16, 1).NextFamily()
	if len(fam.Subagents) != w.Turns-1 || fam.Subagents[2].ParentTurn != 2 || fam.Subagents[2].ID != "s000000.sub3" {
		t.Fatalf("NextFamily: %d subagents attached, want %d in spawn order", len(fam.Subagents), w.Turns-1)
	}
}

func TestSliceSource(t *testing.T) {
	s := NewSliceSource([]Session{{ID: "a"}, {ID: "b"}})
	got := takeSessions(s, 5)
	if len(got) != 2 || got[0].ID != "a" || got[1].ID != "b" {
		t.Fatalf("got %+v", got)
	}
}

func TestLoadWorkload(t *testing.T) {
	def := DefaultWorkload()
	tests := []struct {
		name, yaml string
		want       func(*Workload)
		err        string
	}{
		{name: "empty file keeps defaults", yaml: "", want: func(*Workload) {}},
		{name: "overrides", yaml: "turns: 4\nthink_time: 2s\nfirst_message_spread: 0\nmodel: m\n",
			want: func(w *Workload) { w.Turns = 4; w.ThinkTime = 2 * time.Second; w.FirstMessageSpread = 0; w.Model = "m" }},
		{name: "unknown key", yaml: "turns: 4\nturnz: 5\n", err: "w.yaml:2: turnz: unknown key"},
		{name: "bad type", yaml: "turns: 4\nmax_output_tokens: lots\n", err: "w.yaml:2: max_output_tokens: cannot unmarshal"},
		{name: "duration without unit", yaml: "think_time: 5\n", err: "w.yaml:1: think_time:"},
		{name: "bad value", yaml: "model: x\n\nturns: 0\n", err: "w.yaml:3: turns: must be >= 1, got 0"},
		{name: "negative duration", yaml: "think_time: -1s\n", err: "w.yaml:1: think_time: must be >= 0s"},
		{name: "bad output model", yaml: "turns: 3\noutput_tokens: poisson\n", err: `w.yaml:2: output_tokens: must be max or lognormal, got "poisson"`},
		{name: "bad connections", yaml: "connections: websocket\n", err: `w.yaml:1: connections: must be pool, session or request, got "websocket"`},
		{name: "negative rtt", yaml: "network_rtt: -1ms\n", err: "w.yaml:1: network_rtt: must be in [0s, 1m]"},
		{name: "huge api time", yaml: "api_server_per_1k_tokens: 2s\n", err: "w.yaml:1: api_server_per_1k_tokens: must be in [0s, 1s]"},
		{name: "negative turnaround", yaml: "client_turnaround: -5ms\n", err: "w.yaml:1: client_turnaround: must be in [0s, 1h]"},
		{name: "spread out of range", yaml: "first_message_spread: 1.5\n", err: "w.yaml:1: first_message_spread: must be in [0, 1)"},
		{name: "not a mapping", yaml: "- 1\n", err: "w.yaml:1:"},
		{name: "syntax", yaml: "turns: [\n", err: "w.yaml:1: did not find expected node content"},
	}
	dir := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadText(t, dir, tc.yaml)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := def
			tc.want(&want)
			if d := cmp.Diff(want, got); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
}

// FuzzParseWorkload checks that any input either gives a workload that
// validates or fails with an error naming the file.
func FuzzParseWorkload(f *testing.F) {
	f.Add([]byte("turns: 4\nthink_time: 2s\nfirst_message_spread: 0\nmodel: m\n"))
	f.Add([]byte("subagent_probability: 0.5\nsubagent_turns: 0\n"))
	f.Add([]byte("output_tokens_mean: .nan\nthink_time: 5\n"))
	f.Add([]byte("a: &x [1]\nturns: *x\n---\nturns: 0\n"))
	f.Add([]byte("- 1\n"))
	for _, name := range PresetNames() {
		data, err := PresetSource(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("additions:\n  - {kind: tool, weight: 1, tokens: {mean: 5, sigma: 2, max: 9}, think: {dist: uniform, min: 1s, max: 2s}}\n"))
	f.Add([]byte("agents:\n  - {workload: codex, weight: 1}\n  - {name: x, weight: 2, turns: 3}\n"))
	f.Add([]byte("context_limit: 20000\nsummary_tokens: {dist: exponential, mean: 900, max: 5000}\ncompact_at: 0.5\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := ParseWorkload(data, "fuzz.yaml")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not start with the file name: %v", err)
			}
			return
		}
		if err := w.Validate(); err != nil {
			t.Fatalf("accepted a workload that does not validate: %v", err)
		}
	})
}

// FuzzWorkloadSessions: any workload the parser accepts generates sessions
// that keep the invariants every driver relies on (sizes only, and
// workloads small enough to generate in a fuzz run).
func FuzzWorkloadSessions(f *testing.F) {
	for _, name := range PresetNames() {
		data, _ := PresetSource(name)
		f.Add(data, uint64(1))
	}
	f.Add([]byte("turns: 30\ncontext_limit: 9000\nsystem_prompt_tokens: 100\nfirst_message_tokens: 500\nsummary_tokens: {mean: 300, sigma: 1, max: 2000}\nnew_tokens_per_turn: 700\nsubagent_probability: 0.5\nsubagent_parallel: {dist: uniform, min: 1, max: 3}\nsubagent_session: parent\n"), uint64(2))
	f.Add([]byte("agents:\n  - {name: a, weight: 1, turns: 2}\n  - {name: b, weight: 1, additions: [{kind: user, weight: 1, tokens: 0}]}\n"), uint64(3))
	f.Fuzz(func(t *testing.T, data []byte, seed uint64) {
		w, err := ParseWorkload(data, "fuzz.yaml")
		if err != nil {
			return
		}
		shapes := []Workload{w}
		for _, a := range w.Agents {
			shapes = append(shapes, a.Shape)
		}
		for _, s := range shapes {
			turns := s.Turns
			if s.TurnsSigma > 0 {
				turns = s.TurnsMax
			}
			if turns > 300 || s.SubagentTurns > 300 || (s.SubagentProbability > 0 && (s.SubagentParallel.Max > 8 || s.SubagentParallel.Mean > 8)) {
				return // too large to generate here
			}
		}
		g := NewGenerator(w, 16, seed)
		g.noHash = true
		for range 3 {
			fam, _ := g.NextFamily()
			all := append([]Session{fam}, fam.Subagents...)
			for _, s := range all {
				if len(s.Turns) == 0 {
					t.Fatalf("%s: no request", s.ID)
				}
				for j, r := range s.Turns {
					if r.PromptTokens < 1 || r.OutputTokens < 1 || r.ThinkMs < 0 {
						t.Fatalf("%s request %d: prompt %d, output %d, think %d", s.ID, j, r.PromptTokens, r.OutputTokens, r.ThinkMs)
					}
					if j == 0 && r.ThinkMs != 0 {
						t.Fatalf("%s: a first request after a pause", s.ID)
					}
				}
			}
			for _, sub := range fam.Subagents {
				if sub.Parent != fam.ID || sub.ParentTurn < 0 || sub.ParentTurn >= len(fam.Turns)-1 {
					t.Fatalf("subagent %s of %s after request %d of %d", sub.ID, fam.ID, sub.ParentTurn, len(fam.Turns))
				}
			}
		}
	})
}

func TestWorkloadValidateDefaults(t *testing.T) {
	if err := DefaultWorkload().Validate(); err != nil {
		t.Fatal(err)
	}
	w := DefaultWorkload()
	w.OutputTokensMean = math.NaN()
	if err := w.Validate(); err == nil {
		t.Fatal("NaN mean accepted")
	}
}
