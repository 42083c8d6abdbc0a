package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lm-warden/warden/traces"
)

func execWarden(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestSimJSONDeterministic(t *testing.T) {
	args := []string{"sim", "--sessions", "4,8", "--duration", "30s", "--seed", "7", "--json"}
	first, err := execWarden(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	second, err := execWarden(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Fatal("two runs with the same seed printed different JSON")
	}
	var rep struct {
		Farm string `json:"farm"`
		Rows []struct {
			Strategy   string             `json:"strategy"`
			Sessions   int                `json:"sessions"`
			MissTokens map[string]float64 `json:"miss_tokens"`
			Replicas   []map[string]any   `json:"replicas"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(first), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Farm == "" || len(rep.Rows) != 4 || rep.Rows[0].Strategy != "least-loaded" || rep.Rows[1].Strategy != "affinity" {
		t.Fatalf("report = %+v", rep)
	}
	if len(rep.Rows[0].Replicas) != 4 || len(rep.Rows[0].MissTokens) != 4 {
		t.Errorf("row 0 = %+v", rep.Rows[0])
	}
	// The field order of the issue: strategy, sessions, the columns,
	// miss_tokens, replicas.
	keys := []string{`"strategy"`, `"sessions"`, `"sessions_per_hour"`, `"output_tokens_per_min"`, `"ttfb_p50_s"`,
		`"ttfb_p95_s"`, `"replicas_busy"`, `"prefix_hit_pct"`, `"stayed_pct"`, `"miss_tokens"`, `"replicas"`}
	last := -1
	for _, k := range keys {
		i := strings.Index(first, k)
		if i <= last {
			t.Errorf("key %s out of order in:\n%.400s", k, first)
		}
		last = i
	}
}

func TestSimText(t *testing.T) {
	out, err := execWarden(t, "sim", "--sessions", "4", "--duration", "20s", "--strategies", "hash,affinity", "--replicas", "2", "--spill-threshold", "2")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 replicas x 1 x RTX A4000", "hash -> affinity", "prefix hit %", " -> "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestSimErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "farm.yaml")
	if err := os.WriteFile(bad, []byte("model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX A4000\nvllm:\n  max_num_seqs: -2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"sim", "--strategies", "random"}, `unknown strategy "random"`},
		{[]string{"sim", "--spill-threshold", "lots"}, "--spill-threshold"},
		{[]string{"sim", "--speed", "2"}, "need --trace"},
		{[]string{"sim", "--replicas", "-1"}, "--replicas -1"},
		{[]string{"sim", "--gpu", "RTX 9999"}, "unknown GPU"},
		{[]string{"sim", "--farm", filepath.Join(dir, "missing.yaml")}, "missing.yaml"},
		{[]string{"sim", "--farm", bad}, bad + ":4: vllm.max_num_seqs"},
		{[]string{"sim", "--sessions", "0"}, "sessions 0"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := execWarden(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestSimTraceReplay(t *testing.T) {
	g := traces.NewGenerator(traces.DefaultWorkload(), 16, 3)
	path := filepath.Join(t.TempDir(), "t.jsonl")
	w, err := traces.Create(path, traces.Header{BlockSize: 16, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	var sessions []traces.Session
	for range 3 {
		s, _ := g.NextSession()
		sessions = append(sessions, s)
	}
	// Three sessions of two turns: first turns 2 s apart, second turns 20 s later.
	for i := range 2 {
		for k, s := range sessions {
			req := s.Turns[i]
			req.ArrivalMs = int64(k*2000 + i*20000)
			if err := w.Write(&req); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"sim", "--trace", path, "--json"},
		{"sim", "--trace", path, "--closed-loop", "--json"},
		{"sim", "--trace", path, "--speed", "4", "--strategies", "affinity", "--json"},
	} {
		out, err := execWarden(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.Contains(out, `"finished": 6`) {
			t.Errorf("%v: not every request finished:\n%s", args, out)
		}
	}
}
