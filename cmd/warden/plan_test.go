package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/internal/racetest"
	"github.com/lm-warden/warden/planner"
)

func TestPlanBuiltInExample(t *testing.T) {
	racetest.SimulationOnly(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "plan.html")
	stdout, err := runWarden(t, "plan", "--out", out)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(stdout, "\n\n")
	answer := unwrap(first) // the answer, wrapped at summaryWidth
	if !strings.HasPrefix(answer, "For 16 concurrent agent sessions on vLLM 0.26, ") || !strings.Contains(stdout, "report: "+out) {
		t.Errorf("stdout does not start with the answer and end with the report:\n%s", stdout)
	}
	text := unwrap(stdout)
	for _, want := range []string{"2 x RTX A4000", "4 x RTX A4000", "6 x RTX A4000", "8 x RTX A4000", "demand/KV", "verdict", "[band]",
		"cheapest by card count", "with 20 % headroom: at 16 and at 20 sessions",
		"Workload assumed: a 3,500-token system prompt shared by every session, a first message of 7,300 tokens (±5 %), " +
			"6 turns per conversation each adding 400 tokens, answers of 256 tokens and no think time between turns (typical context 12,696 tokens).",
		"its engine as estimated, 20 % slower and 20 % faster (not where step_time is calibrated"} {
		if !strings.Contains(text, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
	// One KV figure (blocks x block size, as warden kv prints it) and the sentence that reconciles the rule with the simulation.
	if rule := regexp.MustCompile(`By the rule of thumb 16 sessions x 12,696 tokens are \d+ % of the farm's KV cache of [\d,]+ tokens \(\d x [\d,]+ blocks x 16\)`); !rule.MatchString(text) {
		t.Errorf("summary lacks the rule of thumb with its KV figure (%s):\n%s", rule, stdout)
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
	racetest.SimulationOnly(t)
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
	if res.Concurrency != 16 || !slices.Equal(res.Sessions, []int{4, 8, 16, 20}) {
		t.Errorf("--sessions 4,8 over the built-in plan: concurrency %d, levels %v; want 16 and its 20 %% headroom level 20 added to 4, 8", res.Concurrency, res.Sessions)
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
		"--sessions", "2", "--duration", "10s", "--strategies", "affinity", "--target-ttfb-p95", "30s", "--target-hit-pct", "0", "--out", "",
		"--price", "RTX A4000=0.25")
	if err != nil {
		t.Fatal(err)
	}
	// Both meet a lax TTFB target; two kinds rank by money: the A4000 at
	// the price given, the H100 at the price list's, and the summary says
	// which was which (it used to rank them by card count, a tie).
	h100, _ := hardware.LookupPrice("H100 SXM")
	text := unwrap(stdout)
	if !strings.HasPrefix(text, "For 2 concurrent agent sessions on vLLM 0.26, 1 x RTX A4000 with affinity (spill auto) is the cheapest farm by price (0.25 per hour") ||
		!strings.Contains(text, fmt.Sprintf("Ranked by price per GPU-hour: H100 SXM %.2f USD (warden's price list: %s, as of %s) and RTX A4000 0.25 (--price).", h100.USDPerGPUHour, h100.Source, h100.AsOf)) {
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
	racetest.SimulationOnly(t)
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
	// --wide: the long names leave no room for the cost per 1,000 turns within 120 columns.
	stdout, err := runWarden(t, "plan", "--plan", plan, "--out", "", "--strategies", "least-loaded", "--wide")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"1 x H100 SXM, Qwen/Qwen3-4B-Instruct-2507 with least-loaded is the cheapest farm by price (2.50 per hour, ",
		"does not fit", "cost/h", "per 1k turns",
	} {
		if !strings.Contains(unwrap(stdout), want) {
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
		{[]string{"plan", "--headroom", "0.2"}, `--headroom "0.2": a percentage, e.g. 20 or 20% for a fifth more load (write 0.2% if you mean 0.2 %)`},
		{[]string{"plan", "--headroom", "-5"}, `--headroom "-5": want a percentage from 0 (none) to 1000`},
		{[]string{"plan", "--headroom", "lots"}, `--headroom "lots": want a percentage such as 20 or 20% (0: none)`},
		{[]string{"plan", "--price", "RTX A9999=1"}, "--price: "},
		{[]string{"plan", "--price", "RTX A4000"}, `--price: "RTX A4000": want GPU=price`},
		{[]string{"plan", "--price", "RTX A4000=-1"}, "--price: "},
		{[]string{"plan", "--gpu", "a4000,h100", "--model", "qwen3-4b", "--out", ""}, `farms[0].gpus[0]: RTX A4000 has no price: the candidates mix GPU kinds (RTX A4000, H100 SXM), so they are ranked by price, and warden's price list has none for it; give one (--price "RTX A4000=PER_GPU_HOUR"`},
		{[]string{"plan", "--vllm-version", "0.99"}, "--vllm-version: vLLM 0.99 is not a release the simulator's table knows (0.13 to 0.28: 0.13, 0.14,"},
		{[]string{"plan", "--weights-dtype", "fp16"}, `--weights-dtype "fp16": want bf16, fp8 or int4`},
		{[]string{"plan", "--kv-cache-dtype", "bf16"}, `--kv-cache-dtype "bf16": want auto or fp8`},
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

// TestPlanProgress checks where a plan's progress goes: a bar on a
// terminal; elsewhere lines naming the simulation that runs (here one at
// every update: progressEvery is tiny), none with --quiet or
// --progress=false.
func TestPlanProgress(t *testing.T) {
	racetest.SimulationOnly(t)
	line := regexp.MustCompile(`^simulating: \d+% \(\S+ of \S+ simulated\), \S+ elapsed(, about \S+ left)?; now \d+ x RTX A4000( \(bisection\))?, .*, KV x[\d.]+, speed x[\d.]+, seed \d+, [\d-]+ sessions$`)
	for _, tt := range []struct {
		name           string
		term, progress bool
		quiet          bool
		bar, wantLines bool
	}{
		{name: "terminal", term: true, progress: true, bar: true},
		{name: "not a terminal", progress: true, wantLines: true},
		{name: "not a terminal, --quiet", progress: true, quiet: true},
		{name: "not a terminal, --progress=false", progress: false},
		{name: "terminal, --quiet", term: true, progress: true, quiet: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stderr, stdout bytes.Buffer
			o := &planOptions{
				Sessions: []int{2}, Duration: 10 * time.Second, Progress: tt.progress, Quiet: tt.quiet,
				stderr: &stderr, isTerminal: func() bool { return tt.term }, progressEvery: time.Nanosecond,
				changed: func(name string) bool { return name == "sessions" || name == "duration" },
			}
			if err := runPlan(context.Background(), o, &stdout); err != nil {
				t.Fatal(err)
			}
			out := stderr.String()
			switch {
			case tt.bar:
				if !strings.Contains(out, "simulating") || !strings.Contains(out, "elapsed") {
					t.Errorf("no bar on the terminal: %q", out)
				}
			case tt.wantLines:
				lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
				if len(lines) < 3 {
					t.Fatalf("%d progress lines: %q", len(lines), out)
				}
				for _, l := range lines {
					if !line.MatchString(l) {
						t.Errorf("progress line %q", l)
					}
				}
			default:
				if out != "" {
					t.Errorf("wrote %d bytes of progress to stderr: %.200q", len(out), out)
				}
			}
		})
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

// TestPlanPriceChangesAnswer: two kinds rank by money, so without a price
// for the A4000 (the price list has none) the plan asks for one; priced,
// the cheaper A4000 wins (by card count the faster 4090 used to: one card
// each, the same headroom, lower TTFB).
func TestPlanPriceChangesAnswer(t *testing.T) {
	racetest.SimulationOnly(t)
	args := []string{"plan", "--gpu", "RTX A4000,RTX 4090", "--replicas", "1", "--model", "qwen3-4b", "--sessions", "2", "--duration", "10s",
		"--strategies", "affinity", "--target-ttfb-p95", "30s", "--target-hit-pct", "0", "--out", ""}
	// Two kinds mix: they rank by money, and the A4000 has no list price.
	if _, err := runWarden(t, args...); err == nil || !strings.Contains(err.Error(), "RTX A4000 has no price") {
		t.Errorf("without prices: error %v, want the A4000's price asked for", err)
	}
	priced, err := runWarden(t, append(args, "--price", "RTX A4000=0.25,RTX 4090=0.69", "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	var res planner.Result
	if err := json.Unmarshal([]byte(priced), &res); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Answer, "For 2 concurrent agent sessions on vLLM 0.26, 1 x RTX A4000 with affinity (spill auto) is the cheapest farm by price (0.25 per hour") {
		t.Errorf("with prices: %s", res.Answer)
	}
	// The 4090 costs more than the A4000, which meets: it is not simulated.
	if c := res.Candidates[1]; c.NotSimulated != "it costs more than 1 x RTX A4000, which meets the targets" || c.CostPer1kTurns != nil {
		t.Errorf("4090: not simulated %q, per 1,000 turns %v; want it left out for the A4000", c.NotSimulated, c.CostPer1kTurns)
	}
	every, err := runWarden(t, append(args, "--price", "RTX A4000=0.25,RTX 4090=0.69", "--json", "--every-candidate")...)
	if err != nil {
		t.Fatal(err)
	}
	res = planner.Result{}
	if err := json.Unmarshal([]byte(every), &res); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Answer, "For 2 concurrent agent sessions on vLLM 0.26, 1 x RTX A4000 with affinity (spill auto) is the cheapest farm by price (0.25 per hour") {
		t.Errorf("with prices and --every-candidate: %s", res.Answer)
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
		"replicas":         "[2,4,6,8]",
		"headroom":         "20%",
	} {
		if got := f.Lookup(name).DefValue; got != want {
			t.Errorf("--%s default %s, want the built-in plan's %s", name, got, want)
		}
	}
	if def.Targets.PrefixHitPctMin != 75 || def.Targets.TTFBP95MaxS != 10 || !slices.Equal(def.Farms[0].Replicas, []int{2, 4, 6, 8}) {
		t.Errorf("built-in plan changed: %+v", def)
	}
}

// TestPlanHeadroomFlag: --headroom is a percentage with or without its sign, as
// --target-hit-pct and --tolerance take one; it overrides the plan's, and 0 is none.
func TestPlanHeadroomFlag(t *testing.T) {
	tests := []struct {
		flag string
		want float64
	}{
		{"20", 0.2}, {"20%", 0.2}, {" 12.5 % ", 0.125}, {"0", 0}, {"0%", 0}, {"0.5%", 0.005}, {"150", 1.5},
	}
	for _, tt := range tests {
		got, err := parseHeadroom(tt.flag)
		if err != nil || math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("parseHeadroom(%q) = %g, %v; want %g", tt.flag, got, err, tt.want)
		}
	}
	for _, tt := range []struct {
		given bool
		flag  string
		want  float64
	}{{false, "", 0.2}, {true, "0", 0}, {true, "35%", 0.35}} {
		o := &planOptions{Headroom: tt.flag, changed: func(name string) bool { return tt.given && name == "headroom" }}
		p, err := o.buildPlan()
		if err != nil {
			t.Fatal(err)
		}
		if p.Headroom == nil || math.Abs(float64(*p.Headroom)-tt.want) > 1e-12 {
			t.Errorf("--headroom %q (given %v): plan headroom %v, want %g", tt.flag, tt.given, p.Headroom, tt.want)
		}
	}
}

// TestPlanFootnote: the [band] line names the band's parts in plain words, the axes a
// result has and no other; the verdict line names the headroom, or none.
func TestPlanFootnote(t *testing.T) {
	tests := []struct {
		name     string
		res      planner.Result
		band     string
		verdict  string
		notInAny string
	}{
		{
			name: "every axis, 20 % headroom",
			res: planner.Result{Concurrency: 16, Headroom: 0.2, HeadroomSessions: 20,
				Band: planner.BandInfo{KVScales: []float64{1, 0.85, 1.1}, SpeedScales: []float64{1, 0.8, 1.2}, Seeds: []uint64{1, 2, 3}}},
			band: "the KV cache and the engine's speed are estimates, so each farm is simulated with its KV cache as estimated, 15 % smaller " +
				"and 10 % larger (not where num_gpu_blocks is given: that is exact), its engine as estimated, 20 % slower and 20 % faster " +
				"(not where step_time is calibrated, as warden calibrate does) and 3 different sets of sessions (seeds 1, 2 and 3), " +
				"every combination (up to 27 runs per routing and level",
			verdict: "meets if the band's worst run meets every target at 16 and, with 20 % headroom, at 20 sessions; " +
				"marginal if only the nominal run does at 16, or the worst meets at 16 but not at 20",
		},
		{
			name: "calibrated and num_gpu_blocks given, no headroom",
			res: planner.Result{Concurrency: 8,
				Band: planner.BandInfo{KVScales: []float64{1}, SpeedScales: []float64{1}, Seeds: []uint64{7, 8, 9}}},
			band:     "each farm is simulated with 3 different sets of sessions (seeds 7, 8 and 9), every combination (up to 3 runs per routing and level",
			verdict:  "meets if the band's worst run meets every target, marginal if only the nominal run does",
			notInAny: "headroom",
		},
		{
			name: "a result from before the speed band",
			res: planner.Result{Concurrency: 8,
				Band: planner.BandInfo{KVScales: []float64{1, 0.85, 1.1}, Seeds: []uint64{1, 2, 3}}},
			band:     "the KV cache is an estimate, so each farm is simulated with its KV cache as estimated, 15 % smaller and 10 % larger (not where num_gpu_blocks is given: that is exact) and 3 different sets of sessions (seeds 1, 2 and 3), every combination (up to 9 runs",
			notInAny: "engine",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			band, verdict := tt.res.BandWords(), tt.res.VerdictRule()
			if !strings.HasPrefix(band, tt.band) {
				t.Errorf("band\n%q\nwant it to start with\n%q", band, tt.band)
			}
			if !strings.HasPrefix(verdict, tt.verdict) {
				t.Errorf("verdict\n%q\nwant it to start with\n%q", verdict, tt.verdict)
			}
			if tt.notInAny != "" && strings.Contains(band+verdict, tt.notInAny) {
				t.Errorf("%q in %q / %q", tt.notInAny, band, verdict)
			}
		})
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

// TestPlanVLLMVersionFlag: --vllm-version reaches every candidate farm,
// and a release that is not one is refused naming the flag.
func TestPlanVLLMVersionFlag(t *testing.T) {
	o := &planOptions{GPUs: []string{"RTX A4000"}, Replicas: []int{2}, Model: "qwen3-4b", VLLMVersion: "0.27", Duration: time.Minute, Sessions: []int{4}, Headroom: "20"}
	p, err := o.buildPlan()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range p.Farms {
		if f.VLLM.Version != "0.27" {
			t.Errorf("farm set %v runs vLLM %q, want 0.27", f.GPUs, f.VLLM.Version)
		}
	}
	o.VLLMVersion = "latest"
	if _, err := o.buildPlan(); err == nil || !strings.Contains(err.Error(), "--vllm-version") {
		t.Errorf("--vllm-version latest: err = %v, want one naming the flag", err)
	}
}

// unwrap undoes the summary's word wrap: its words joined by single spaces.
func unwrap(s string) string { return strings.Join(strings.Fields(s), " ") }

// TestPlanSummaryWidth: the summary keeps within 120 columns on the
// built-in plan, on a priced plan of two GPUs with a variant routing, and on
// a plan whose answer is over the rule of thumb; --wide keeps every column.
// The answer reconciles the rule of thumb when its farm is over it, the
// workload is said in one line, and the routing and the band are explained
// once, in plain words.
func TestPlanSummaryWidth(t *testing.T) {
	racetest.SimulationOnly(t)
	tests := []struct {
		name     string
		args     []string
		wideCols []string // --wide's header has each
		want     []string // the default summary, unwrapped, has each
		notWant  []string
	}{
		{
			name:     "built-in",
			wideCols: []string{"routing", "verdict", "TTFB p95 s [band]", "hit % [band]", "up to", "misses at", "demand/KV"},
			want: []string{"Workload assumed: a 3,500-token system prompt", "affinity (spill auto): each conversation stays on the replica",
				"more than a quarter of its max_num_seqs requests in flight (8 of 32)", "[band]: the KV cache and the engine's speed are estimates"},
			notWant: []string{"over the rule of thumb"}, // 8 x RTX A4000 is within it
		},
		{
			name: "priced, two GPUs, a variant",
			args: []string{"--gpu", "RTX A4000,RTX 4090", "--replicas", "2,4", "--model", "Qwen/Qwen3-4B-Instruct-2507", "--max-num-seqs", "32",
				"--sessions", "8,16", "--strategies", "least-loaded,affinity+kv+admit", "--price", "RTX A4000=0.25,RTX 4090=0.69", "--duration", "30s"},
			wideCols: []string{"cost/h", "per 1k turns", "routing", "TTFB p95 s [band]", "hit % [band]", "misses at", "demand/KV"},
			want:     []string{"affinity (kv, admit, spill auto): each conversation stays", "the least-loaded replica is judged by its KV cache fill too"},
		},
		{
			name:     "the answer over the rule of thumb",
			args:     []string{"--plan", filepath.Join("testdata", "plan-over-rule.yaml")},
			wideCols: []string{"routing", "misses at"},
			want: []string{"4 x RTX A4000 meets the targets at 16 sessions although 16 x 19,896 tokens of typical context (171 % of its KV cache " +
				"of 186,496 tokens) are over the rule of thumb: the 16,000-token system prompt is cached once, not 16 times",
				"the simulation, not the rule, decides.", "Workload assumed: a 16,000-token system prompt"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			js, err := runWarden(t, append([]string{"plan", "--json", "--out", "", "--quiet"}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			res, err := planner.ReadResult([]byte(js))
			if err != nil {
				t.Fatal(err)
			}
			var narrow, wide bytes.Buffer
			if err := res.WriteText(&narrow, planner.TextOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := res.WriteText(&wide, planner.TextOptions{Wide: true}); err != nil {
				t.Fatal(err)
			}
			for line := range strings.Lines(narrow.String()) {
				if n := utf8.RuneCountInString(strings.TrimSuffix(line, "\n")); n > 120 {
					t.Errorf("a line of %d columns, want at most 120 (--wide's help: \"keeps within about 120 columns\"):\n%s", n, line)
				}
			}
			header := ""
			for line := range strings.Lines(wide.String()) {
				if strings.HasPrefix(line, "candidate  ") {
					header = line
				}
			}
			for _, col := range tt.wideCols {
				if !strings.Contains(header, col) {
					t.Errorf("--wide's header %q lacks %q", header, col)
				}
			}
			text := unwrap(narrow.String())
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("summary lacks %q:\n%s", w, narrow.String())
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(text, w) {
					t.Errorf("summary has %q:\n%s", w, narrow.String())
				}
			}
			// The JSON's answer (warden report --from, scripts) carries the
			// reconciling sentence as the terminal does, and it is said once.
			if over := strings.Contains(text, "the simulation, not the rule, decides."); over != strings.Contains(res.Answer, "the simulation, not the rule, decides.") ||
				strings.Count(text, "the simulation, not the rule, decides.") > 1 {
				t.Errorf("the JSON answer %q and the summary disagree on the rule of thumb, or the summary repeats it", res.Answer)
			}
			// Each routing, the band and the workload are said once.
			for _, once := range []string{"spill auto): each conversation stays", "[band]:", "Workload assumed:"} {
				if n := strings.Count(text, once); n != 1 {
					t.Errorf("%q said %d times, want once", once, n)
				}
			}
		})
	}
}

// TestPlanFileTakesFlagTargets: a plan file that sets no targets takes the
// command line's (the flags have defaults: the built-in plan's), where it
// used to be refused ("targets: required"); one that sets targets keeps
// exactly its own; a flag given overrides either. --weights-dtype sets the
// format of every candidate, the key the "does not fit" advice names.
func TestPlanFileTakesFlagTargets(t *testing.T) {
	dir := t.TempDir()
	farm := "farms:\n  - {gpus: [RTX A4000], replicas: [1], model: Qwen/Qwen3-4B-Instruct-2507}\nsessions: [2]\nduration: 10s\nstrategies: [affinity]\nheadroom: 0%\n"
	none, own := filepath.Join(dir, "none.yaml"), filepath.Join(dir, "own.yaml")
	if err := os.WriteFile(none, []byte(farm), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(own, []byte(farm+"targets: {prefix_hit_pct_min: 10}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	def := builtInPlan().Targets
	for _, tt := range []struct {
		name string
		args []string
		want planner.Targets
	}{
		{"no targets: the flags' defaults", []string{"--plan", none}, def},
		{"no targets, one flag given", []string{"--plan", none, "--target-hit-pct", "50"}, planner.Targets{TTFBP95MaxS: def.TTFBP95MaxS, PrefixHitPctMin: 50}},
		{"its own targets", []string{"--plan", own}, planner.Targets{PrefixHitPctMin: 10}},
		{"its own, one flag given", []string{"--plan", own, "--target-ttfb-p95", "20s"}, planner.Targets{TTFBP95MaxS: 20, PrefixHitPctMin: 10}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stdout, err := runWarden(t, append([]string{"plan", "--json", "--out", "", "--weights-dtype", "fp8"}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			var res planner.Result
			if err := json.Unmarshal([]byte(stdout), &res); err != nil {
				t.Fatal(err)
			}
			if res.Targets != tt.want {
				t.Errorf("targets %+v, want %+v", res.Targets, tt.want)
			}
			// fp8 weights: the 4B model takes half its bf16 memory, so the
			// card holds more KV cache than with bf16.
			if c := res.Candidates[0]; !c.Fits || c.KVTokensPerReplica < 60000 {
				t.Errorf("--weights-dtype fp8: fits %v, %d KV tokens per replica; want the fp8 sizing (bf16 holds 46,624)", c.Fits, c.KVTokensPerReplica)
			}
		})
	}
}
