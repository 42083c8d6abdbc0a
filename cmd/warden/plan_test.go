package main

import (
	"bytes"
	"context"
	"encoding/json"
	"html"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/planner"
)

func TestPlanBuiltInExample(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "plan.html")
	stdout, err := runWarden(t, "plan", "--out", out)
	if err != nil {
		t.Fatal(err)
	}
	answer, _, _ := strings.Cut(stdout, "\n")
	if !strings.HasPrefix(answer, "For 16 concurrent agent sessions, ") || !strings.Contains(stdout, "report: "+out) {
		t.Errorf("stdout does not start with the answer and end with the report:\n%s", stdout)
	}
	for _, want := range []string{"2 x RTX A4000", "3 x RTX A4000", "4 x RTX A4000", "sessions x context / KV", "verdict", "[band]",
		"cheapest by card count",
		// One KV figure (blocks x block size, as warden kv prints it) and the sentence that reconciles the rule with the simulation.
		"By the rule of thumb 16 sessions x 12,696 tokens are 112 % of the farm's KV cache of 181,312 tokens (4 x 2,833 blocks x 16)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte(html.EscapeString(answer))) {
		t.Errorf("report lacks the answer %q", answer)
	}
}

// TestPlanJSONRoundTrip: what --json prints, report --from renders into the very report that
// plan --out wrote.
func TestPlanJSONRoundTrip(t *testing.T) {
	dir := t.TempDir()
	a, b, js := filepath.Join(dir, "a.html"), filepath.Join(dir, "b.html"), filepath.Join(dir, "result.json")
	stdout, err := runWarden(t, "plan", "--json", "--out", a, "--sessions", "4,8", "--duration", "20s")
	if err != nil {
		t.Fatal(err)
	}
	var res planner.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || res.Kind != planner.Kind {
		t.Fatalf("--json printed no plan result (%v):\n%.300s", err, stdout)
	}
	if res.Concurrency != 16 || len(res.Sessions) != 3 {
		t.Errorf("--sessions 4,8 over the built-in plan: concurrency %d, levels %v; want 16 added to 4, 8", res.Concurrency, res.Sessions)
	}
	if err := os.WriteFile(js, []byte(stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := runWarden(t, "report", "--from", js, "--out", b)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, res.Answer+"\n") {
		t.Errorf("report printed %q, want the answer first", got)
	}
	ha, _ := os.ReadFile(a)
	hb, _ := os.ReadFile(b)
	if len(ha) == 0 || !bytes.Equal(ha, hb) {
		t.Error("the report of the saved JSON differs from the one plan wrote")
	}
}

func TestPlanFromFlags(t *testing.T) {
	stdout, err := runWarden(t, "plan", "--gpu", "H100 SXM,RTX A4000", "--replicas", "1", "--model", "Qwen/Qwen3-4B-Instruct-2507",
		"--sessions", "2", "--duration", "10s", "--strategies", "affinity", "--target-ttfb-p95", "30s", "--target-hit-pct", "0", "--out", "")
	if err != nil {
		t.Fatal(err)
	}
	// Both meet a lax TTFB target; with no prices the cheaper is the one with fewer cards, then more headroom, then lower TTFB.
	if !strings.HasPrefix(stdout, "For 2 concurrent agent sessions, 1 x H100 SXM with affinity (spill auto) is the cheapest farm by card count that meets TTFB p95 <= 30 s at the band's pessimistic edge") {
		t.Errorf("stdout:\n%s", stdout)
	}
	if strings.Contains(stdout, "report:") {
		t.Error(`--out "" wrote a report`)
	}
}

// TestPlanVariants: --strategies takes affinity's variants; each is a
// routing of every candidate, named as warden sim names it with its spill
// threshold, in the JSON and the HTML report's tables.
func TestPlanVariants(t *testing.T) {
	out := filepath.Join(t.TempDir(), "plan.html")
	stdout, err := runWarden(t, "plan", "--gpu", "RTX A4000", "--replicas", "4", "--model", "Qwen/Qwen3-4B-Instruct-2507",
		"--sessions", "8", "--duration", "20s", "--strategies", "least-loaded,affinity+kv+admit=30s,affinity+kv+priced+admit",
		"--json", "--out", out)
	if err != nil {
		t.Fatal(err)
	}
	var res planner.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatal(err)
	}
	var labels, rows []string
	for _, c := range res.Candidates[0].Configs {
		labels = append(labels, c.Label())
		rows = append(rows, c.Rows[0].Strategy)
	}
	wantLabels := []string{"least-loaded", "affinity (kv, admit 30s, spill auto)", "affinity (kv, priced, admit)"}
	wantRows := []string{"least-loaded", "affinity (kv, admit 30s)", "affinity (kv, priced, admit)"}
	if !slices.Equal(labels, wantLabels) || !slices.Equal(rows, wantRows) {
		t.Errorf("routings %q simulated as %q; want %q as %q", labels, rows, wantLabels, wantRows)
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range wantLabels {
		if !bytes.Contains(page, []byte(html.EscapeString(l))) {
			t.Errorf("the report does not name %q", l)
		}
	}
}

func TestPlanFile(t *testing.T) {
	dir := t.TempDir()
	plan := filepath.Join(dir, "plan.yaml")
	body := `farms:
  - gpus: [RTX A4000]
    replicas: [1]
    model: meta-llama/Llama-3.1-70B-Instruct
  - gpus: [H100 SXM]
    replicas: [1]
    model: Qwen/Qwen3-4B-Instruct-2507
prices: {RTX A4000: 0.2, h100: 2.5}
sessions: [2]
duration: 10s
targets: {ttfb_p95_s_max: 30}
`
	if err := os.WriteFile(plan, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, err := runWarden(t, "plan", "--plan", plan, "--out", "", "--strategies", "least-loaded")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"1 x H100 SXM, Qwen/Qwen3-4B-Instruct-2507 with least-loaded is the cheapest farm by price (2.50 per hour, ",
		"does not fit", "cost/h", "per 1k turns",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
}

func TestPlanErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("farms:\n  - gpus: [RTX A4000]\n    replicas: [0]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--replicas", "2"}, "--replicas needs --gpu"},
		{[]string{"plan", "--gpu", "h100"}, "--gpu needs --model"},
		{[]string{"plan", "--gpu", "bogus-gpu", "--model", "qwen3-4b"}, "--gpu: "},
		{[]string{"plan", "--gpu", "a4000", "--model", "bogus-model"}, "--model: "},
		{[]string{"plan", "--duration", "0"}, "--duration 0s: want at least 1s"},
		{[]string{"plan", "--gpu", "a4000", "--model", "qwen3-4b", "--replicas", "0"}, "--replicas: want replica counts from 1 to 4096, got 0"},
		{[]string{"plan", "--sessions", "0,4"}, "--sessions: want levels of at least 1"},
		{[]string{"plan", "--price", "RTX A9999=1"}, "--price: "},
		{[]string{"plan", "--price", "RTX A4000"}, `--price: "RTX A4000": want GPU=price`},
		{[]string{"plan", "--price", "RTX A4000=-1"}, "--price: "},
		{[]string{"plan", "--gpu", "a4000,h100", "--model", "qwen3-4b", "--price", "RTX A4000=0.25"}, "--price: H100 SXM has no price"},
		{[]string{"plan", "--prometheus", "http://127.0.0.1:1", "--model", "qwen3-4b", "--current-gpu", "bogus-gpu"}, "--current-gpu: "},
		{[]string{"plan", "--gpu", "h100", "--plan", bad}, "none of the others can be"},
		{[]string{"plan", "--plan", bad}, bad + ":3: farms[0].replicas[0]: want 1 to 4096, got 0"},
		{[]string{"plan", "--strategies", "random", "--out", ""}, `strategies[0]: unknown strategy "random"`},
		{[]string{"plan", "--strategies", "affinity+admit=never", "--out", ""}, `strategies[0]: strategy "affinity+admit=never": admit=never: want an admission timeout > 0`},
		{[]string{"report", "--out", "x.html"}, `required flag(s) "from" not set`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := runWarden(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestPlanProgressOnlyOnATerminal(t *testing.T) {
	for _, term := range []bool{false, true} {
		var stderr, stdout bytes.Buffer
		o := &planOptions{
			Sessions: []int{2}, Duration: 10 * time.Second, Progress: true,
			stderr: &stderr, isTerminal: func() bool { return term },
			changed: func(name string) bool { return name == "sessions" || name == "duration" },
		}
		if err := runPlan(context.Background(), o, &stdout); err != nil {
			t.Fatal(err)
		}
		if got := stderr.Len() > 0; got != term {
			t.Errorf("terminal %v: wrote %d bytes of progress to stderr", term, stderr.Len())
		}
	}
}

func TestReportFromSimJSON(t *testing.T) {
	dir := t.TempDir()
	js, out := filepath.Join(dir, "sim.json"), filepath.Join(dir, "sim.html")
	sim := `{"farm":"4x RTX A4000, Qwen3-4B","rows":[
{"strategy":"least-loaded","sessions":4,"sessions_per_hour":100,"output_tokens_per_min":5000,"ttfb_p50_s":1,"ttfb_p95_s":null,
 "replicas_busy":2,"prefix_hit_pct":50,"stayed_pct":30,"miss_tokens":{"cold":1,"evicted":2,"elsewhere":3,"partial":4},
 "replicas":[{"replica":0,"requests":5,"sticky":0,"spilled_in":0,"kv_usage_mean":0.5,"kv_usage_max":0.9,"hit_pct":50,"preemptions":0}],
 "duration_s":60,"finished":10,"unfinished":0,"preemptions":0},
{"strategy":"affinity","sessions":4,"sessions_per_hour":110,"output_tokens_per_min":5500,"ttfb_p50_s":0.8,"ttfb_p95_s":2,
 "replicas_busy":2,"prefix_hit_pct":80,"stayed_pct":95,"miss_tokens":{"cold":1,"evicted":0,"elsewhere":0,"partial":4},
 "replicas":[{"replica":0,"requests":5,"sticky":4,"spilled_in":0,"kv_usage_mean":0.5,"kv_usage_max":0.9,"hit_pct":80,"preemptions":0}],
 "duration_s":60,"finished":11,"unfinished":0,"preemptions":0}]}`
	if err := os.WriteFile(js, []byte(sim), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, err := runWarden(t, "report", "--from", js, "--out", out)
	if err != nil {
		t.Fatal(err)
	}
	// least-loaded's null TTFB p95 reads back as "no value", not as 0 s (which would win).
	if !strings.HasPrefix(stdout, "At 4 sessions on 4x RTX A4000, Qwen3-4B, affinity routing gives the lowest TTFB p95") {
		t.Errorf("stdout: %s", stdout)
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Errorf("no report written: %v", err)
	}
	if err := os.WriteFile(js, []byte(`{"kind":"something-else"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runWarden(t, "report", "--from", js, "--out", out); err == nil || !strings.Contains(err.Error(), `kind "something-else"`) {
		t.Errorf("unknown kind: error %v", err)
	}
}

// TestPlanPriceChangesAnswer: by card count the faster 4090 wins (one card
// each, the same headroom, lower TTFB); priced, the cheaper A4000 does.
func TestPlanPriceChangesAnswer(t *testing.T) {
	args := []string{"plan", "--gpu", "RTX A4000,RTX 4090", "--replicas", "1", "--model", "qwen3-4b", "--sessions", "2", "--duration", "10s",
		"--strategies", "affinity", "--target-ttfb-p95", "30s", "--target-hit-pct", "0", "--out", ""}
	byCards, err := runWarden(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(byCards, "For 2 concurrent agent sessions, 1 x RTX 4090 with affinity (spill auto) is the cheapest farm by card count ") ||
		!strings.Contains(byCards, "cheapest by card count (give --price") {
		t.Errorf("without prices:\n%s", byCards)
	}
	priced, err := runWarden(t, append(args, "--price", "RTX A4000=0.25,RTX 4090=0.69", "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	var res planner.Result
	if err := json.Unmarshal([]byte(priced), &res); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Answer, "For 2 concurrent agent sessions, 1 x RTX A4000 with affinity (spill auto) is the cheapest farm by price (0.25 per hour") {
		t.Errorf("with prices: %s", res.Answer)
	}
	if res.CostUnit != "per hour" || res.Candidates[1].CostPerHour == nil || *res.Candidates[1].CostPerHour != 0.69 || res.Candidates[1].CostPer1kTurns == nil {
		t.Errorf("cost unit %q, 4090's cost per hour %v and per 1,000 turns %v; want per hour, 0.69 and a figure", res.CostUnit, res.Candidates[1].CostPerHour, res.Candidates[1].CostPer1kTurns)
	}
}

// TestPlanModelDoesNotFit: a model that fits on no candidate is an error,
// said once, and nothing is printed.
func TestPlanModelDoesNotFit(t *testing.T) {
	stdout, err := runWarden(t, "plan", "--gpu", "a4000", "--replicas", "1", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--sessions", "2", "--duration", "10s", "--out", "")
	if err == nil || !strings.Contains(err.Error(), "no candidate can run the model") {
		t.Fatalf("error %v, want no candidate can run the model", err)
	}
	if stdout != "" {
		t.Errorf("printed %q besides the error", stdout)
	}
}

// TestPlanHelpDefaults: the flags' defaults are the built-in plan's values.
func TestPlanHelpDefaults(t *testing.T) {
	def := builtInPlan()
	f := newPlanCmd().Flags()
	for name, want := range map[string]string{
		"sessions":         "[4,8,16]",
		"duration":         time.Duration(def.Duration).String(),
		"strategies":       "[least-loaded,affinity]",
		"spill-thresholds": "[auto]",
		"seed":             "1",
		"target-ttfb-p95":  "10s",
		"target-hit-pct":   "75",
		"replicas":         "[2,3,4]",
	} {
		if got := f.Lookup(name).DefValue; got != want {
			t.Errorf("--%s default %s, want the built-in plan's %s", name, got, want)
		}
	}
	if def.Targets.PrefixHitPctMin != 75 || def.Targets.TTFBP95MaxS != 10 || !slices.Equal(def.Farms[0].Replicas, []int{2, 3, 4}) {
		t.Errorf("built-in plan changed: %+v", def)
	}
}

// TestPlanPrometheusFlags: with --prometheus, --replicas and --model are
// the current farm's, not "--gpu" flags (README: plan --prometheus URL
// --model M --current-gpu G --replicas 3,4,6).
func TestPlanPrometheusFlags(t *testing.T) {
	for _, given := range [][]string{{"model"}, {"model", "replicas"}} {
		o := &planOptions{Model: "qwen3-4b", Replicas: []int{3, 4, 6}, Duration: time.Minute, prom: planPromOptions{Prometheus: "http://x"},
			changed: func(name string) bool { return slices.Contains(given, name) }}
		if _, err := o.buildPlan(); err != nil {
			t.Errorf("flags %v: %v", given, err)
		}
	}
	o := &planOptions{Replicas: []int{0}, prom: planPromOptions{Prometheus: "http://x"}, changed: func(name string) bool { return name == "replicas" }}
	if _, err := o.buildPlan(); err == nil || !strings.Contains(err.Error(), "--replicas: want") {
		t.Errorf("--replicas 0 with --prometheus: %v", err)
	}
}
