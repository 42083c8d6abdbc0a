package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
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

// TestSimPeersGolden: --strategies peers runs the head-to-head
// (placement.HeadToHead: warden's best routings, vLLM's own balancer,
// every peer) side by side, one line per strategy and step with each
// step's best marked; the same seed prints the same bytes (golden:
// testdata/sim_peers.txt, -update rewrites it). A routing change that
// moves a figure shows here.
func TestSimPeersGolden(t *testing.T) {
	args := []string{"sim", "--strategies", "affinity,peers", "--sessions", "4,8", "--duration", "2m", "--seed", "3", "--quiet"}
	out, err := execWarden(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range placement.HeadToHead() {
		if !strings.Contains(out, "\n8          "+placement.SpecLabel(s)+" ") {
			t.Errorf("no line of %s at 8 sessions", placement.SpecLabel(s))
		}
	}
	if n := len(regexp.MustCompile(`(?m)^8 +affinity {2,}`).FindAllString(strings.Split(out, "\n\n")[1], -1)); n != 1 {
		t.Errorf("affinity, given by name and in peers, has %d lines at 8 sessions, want 1", n)
	}
	golden(t, "sim_peers.txt", out)
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
		not  string // a string the error must not contain
	}{
		{[]string{"sim", "--strategies", "random"}, `unknown strategy "random"`, ""},
		{[]string{"sim", "--spill-threshold", "lots"}, "--spill-threshold", ""},
		{[]string{"sim", "--spill-threshold", "0"}, "--spill-threshold: " + placement.SpillThresholdError("0"), ""},
		{[]string{"sim", "--speed", "2"}, "need --trace", ""},
		{[]string{"sim", "--session-replay"}, "--session-replay need --trace", ""},
		{[]string{"sim", "--trace", filepath.Join(dir, "t.jsonl"), "--session-replay", "--closed-loop"}, "--closed-loop and --session-replay: give one", ""},
		{[]string{"sim", "--replicas", "-1"}, "--replicas -1", ""},
		// A flag given as 0 is not "no override": the farm's value is what
		// leaving the flag out means.
		{[]string{"sim", "--replicas", "0"}, "--replicas 0: want >= 1", ""},
		{[]string{"sim", "--kv-scale", "0"}, "--kv-scale 0: want a factor in [0.1, 10]", ""},
		// --duration 0 ran 3 minutes under a "0s per step" header; only a
		// replay reads it as "to the end of the trace".
		{[]string{"sim", "--duration", "0"}, `--duration 0: want the simulated time of each step, at least 1s (0 means "to the end of the trace" only with --trace)`, ""},
		{[]string{"sim", "--duration", "0s", "--sessions", "4"}, "--duration 0", ""},
		{[]string{"sim", "--trace", filepath.Join(dir, "t.jsonl"), "--speed", "0"}, "--speed 0: want a speed-up > 0", ""},
		// An unknown --gpu is the flag's error, not the built-in example's
		// (or the --farm file's) line.
		{[]string{"sim", "--gpu", "RTX 9999"}, `--gpu: unknown GPU "RTX 9999"`, ".yaml"},
		{[]string{"sim", "--gpu", "X", "--farm", "../../examples/a4000-qwen3-4b.yaml"}, `--gpu: unknown GPU "X"`, ".yaml"},
		{[]string{"sim", "--farm", filepath.Join(dir, "missing.yaml")}, "missing.yaml", ""},
		{[]string{"sim", "--farm", bad}, bad + ":4: vllm.max_num_seqs", ""},
		{[]string{"sim", "--sessions", "0"}, "sessions 0", ""},
		{[]string{"sim", "--timeline", "100ms"}, "--timeline 100ms: want a resolution of at least the farm's scrape interval (1s)", ""},
		{[]string{"sim", "--workload", "gemini"}, `no workload preset "gemini" (the presets: 5090-farm, bench, claude-code, codex)`, ""},
		{[]string{"sim", "--workload", filepath.Join(dir, "w.yaml")}, "w.yaml: no such file", ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := execWarden(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) || (tt.not != "" && strings.Contains(err.Error(), tt.not)) {
				t.Errorf("error = %v, want it to contain %q (and not %q)", err, tt.want, tt.not)
			}
		})
	}
}

// TestSimFlagsGiven: the flags that override the farm take effect when
// given, and only then; the header says what ran.
func TestSimFlagsGiven(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"sim", "--sessions", "2", "--duration", "10s", "--strategies", "affinity"}, "4 replicas x 1 x RTX A4000, Qwen/Qwen3-4B-Instruct-2507, vLLM 0.26: "},
		{[]string{"sim", "--sessions", "2", "--duration", "10s", "--strategies", "affinity", "--replicas", "1"}, "1 replica x 1 x RTX A4000"},
		{[]string{"sim", "--sessions", "2", "--duration", "10s", "--strategies", "affinity", "--gpu", "rtx-4090"}, "4 replicas x 1 x RTX 4090"},
		{[]string{"sim", "--sessions", "2", "--duration", "10s", "--strategies", "affinity"}, "10s per step"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, err := execWarden(t, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if head, _, _ := strings.Cut(out, "\n"); !strings.Contains(head, tt.want) {
				t.Errorf("header %q lacks %q", head, tt.want)
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
		{"sim", "--trace", path, "--session-replay", "--json"},
		{"sim", "--trace", path, "--speed", "4", "--strategies", "affinity", "--json"},
		{"sim", "--trace", path, "--duration", "0", "--json"}, // a replay's 0: to the end of the trace
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

// TestSimRefusesPastMaxSimTime: sim --duration 1000h used to run until the
// machine ran out of memory (1.76 GB after 6 s of a 200h step); past
// --max-sim-time it is refused at once, saying why, and a bound of 0 lifts
// the check.
func TestSimRefusesPastMaxSimTime(t *testing.T) {
	o := &simOptions{Sessions: []int{4, 8}, Duration: 1000 * time.Hour, MaxSimTime: defaultMaxSimTime, Strategies: []string{"affinity"}}
	_, err := o.experiment()
	if err == nil || !strings.Contains(err.Error(), "--max-sim-time") || !strings.Contains(err.Error(), "2000h0m0s") {
		t.Errorf("1000h x 2 steps: err = %v, want a refusal naming --max-sim-time and the total", err)
	}
	o.Duration = 12 * time.Hour
	if _, err := o.experiment(); err != nil {
		t.Errorf("12h x 2 steps under a 24h bound: %v", err)
	}
	o.Duration, o.MaxSimTime = 1000*time.Hour, 0
	if _, err := o.experiment(); err != nil {
		t.Errorf("no bound: %v", err)
	}
}

// TestSimPresetTimeline: a preset by name, and --timeline follows each
// strategy's run from its cold start in the text and the JSON.
func TestSimPresetTimeline(t *testing.T) {
	out, err := execWarden(t, "sim", "--farm", "../../examples/h100-llama31-70b-tp4.yaml", "--workload", "codex", "--sessions", "6",
		"--strategies", "hash,affinity", "--duration", "2m", "--timeline", "30s")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"prefix hit % over time, from cold caches (vLLM's counters; each point covers the 30s before it):",
		"   time   hash   affinity", "KV-cache usage per replica, % (hash; mean over each interval):", "share of the sessions' time paused between turns"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	js, err := execWarden(t, "sim", "--farm", "../../examples/h100-llama31-70b-tp4.yaml", "--workload", "codex", "--sessions", "6",
		"--strategies", "hash,affinity", "--duration", "2m", "--timeline", "30s", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rep sim.Report
	if err := json.Unmarshal([]byte(js), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Timelines) != 2 || len(rep.Timelines[1].TimesS) != 4 || len(rep.Timelines[1].KVUsagePct) != 2 || len(rep.Timelines[0].Queries) != 3 {
		t.Fatalf("timelines %+v", rep.Timelines)
	}
}
