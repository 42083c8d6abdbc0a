package planner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lm-warden/warden/placement"
)

func TestParseDefaultPlan(t *testing.T) {
	p, err := ParsePlan(DefaultPlan, DefaultPlanName)
	if err != nil {
		t.Fatal(err)
	}
	if p.Concurrency != 16 || time.Duration(p.Duration) != time.Minute || len(p.Farms) != 1 {
		t.Errorf("default plan: concurrency %d, duration %v, %d farm sets; want 16, 1m, 1", p.Concurrency, time.Duration(p.Duration), len(p.Farms))
	}
	if !cmp.Equal(p.Farms[0].Replicas, []int{2, 4, 6, 8}) {
		t.Errorf("replicas %v, want [2 4 6 8]", p.Farms[0].Replicas)
	}
	if p.Headroom == nil || *p.Headroom != 0.2 {
		t.Errorf("headroom %v, want 20 %% (written out in the file)", p.Headroom)
	}
	// Keys left out keep the default workload's values.
	if p.Workload.OutputTokensSigma != 0.5 || p.Workload.FirstMessageSpread != 0.05 {
		t.Errorf("workload defaults lost: %+v", p.Workload.Workload)
	}
}

// minimal is a valid plan that the cases below break one line at a time.
const minimal = `farms:
  - gpus: [RTX A4000]
    replicas: [2, 3]
    model: Qwen/Qwen3-4B-Instruct-2507
targets:
  ttfb_p95_s_max: 10
`

func TestParsePlanErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"empty", ``, "plan.yaml: empty plan"},
		{"unknown top key", minimal + "sesions: [4]\n", "plan.yaml:7: sesions: unknown key"},
		{"unknown nested key", strings.Replace(minimal, "    model:", "    modle: x\n    model:", 1), "plan.yaml:4: farms[0].modle: unknown key"},
		{"wrong type", strings.Replace(minimal, "[2, 3]", "[2, three]", 1), "plan.yaml:3: farms[0].replicas: cannot unmarshal !!str `three` into int"},
		{"bad duration", minimal + "duration: soon\n", `plan.yaml:7: duration: "soon" is not a duration`},
		{"short duration", minimal + "duration: 10ms\n", "plan.yaml:7: duration: want at least 1s per step, got 10ms"},
		{"no farms", "targets: {ttfb_p95_s_max: 1}\n", "plan.yaml: farms: required"},
		{"no targets", strings.SplitAfter(minimal, "Instruct-2507\n")[0], "plan.yaml: targets: required"},
		{"zero replicas", strings.Replace(minimal, "[2, 3]", "[2, 0]", 1), "plan.yaml:3: farms[0].replicas[1]: want 1 to 4096, got 0"},
		{"unknown gpu", strings.Replace(minimal, "RTX A4000", "RTX A9999", 1), "plan.yaml:2: farms[0].gpus[0]: "},
		{"unknown model", strings.Replace(minimal, "Qwen/Qwen3-4B-Instruct-2507", "nobody/nothing", 1), "plan.yaml:4: farms[0].model: "},
		{"bad vllm arg", strings.Replace(minimal, "targets:", "  - gpus: [H100 SXM]\n    replicas: [1]\n    model: Qwen/Qwen3-8B\n    vllm: {max_num_seqs: -1}\ntargets:", 1),
			"plan.yaml:8: farms[1].vllm.max_num_seqs: must be >= 1, got -1"},
		{"bad strategy", minimal + "strategies: [affinity, random]\n", `plan.yaml:7: strategies[1]: unknown strategy "random"`},
		{"bad variant", minimal + "strategies: [affinity+fast]\n", `plan.yaml:7: strategies[0]: strategy "affinity+fast": unknown option "fast"`},
		{"variant of hash", minimal + "strategies: [hash+kv]\n", `plan.yaml:7: strategies[0]: strategy "hash+kv": only affinity takes options`},
		{"twice strategy", minimal + "strategies: [affinity, affinity]\n", `plan.yaml:7: strategies[1]: "affinity" listed twice`},
		{"bad spill", minimal + "spill_thresholds: [auto, -3]\n", `plan.yaml:7: spill_thresholds[1]: ` + placement.SpillThresholdError("-3")},
		{"zero spill", minimal + "spill_thresholds: [0]\n", `plan.yaml:7: spill_thresholds[0]: ` + placement.SpillThresholdError("0")},
		{"bad sessions", minimal + "sessions: [4, 0]\n", "plan.yaml:7: sessions[0]: want 1 to 100000 concurrent sessions, got 0"},
		{"hit over 100", minimal + "  prefix_hit_pct_min: 120\n", "plan.yaml:7: targets.prefix_hit_pct_min: want a number from 0 (no target) to 100, got 120"},
		{"headroom as a fraction", minimal + "headroom: 0.2\n", `plan.yaml:7: headroom: "0.2": want a percentage with its % sign, such as 20% (0% for none)`},
		{"headroom without %", minimal + "headroom: 20\n", `plan.yaml:7: headroom: "20": want a percentage with its % sign`},
		{"headroom not a number", minimal + "headroom: lots%\n", `plan.yaml:7: headroom: "lots%": want a percentage such as 20%`},
		{"headroom a list", minimal + "headroom: [20%]\n", `plan.yaml:7: headroom: want a percentage such as 20% (0% for none)`},
		{"negative headroom", minimal + "headroom: -5%\n", "plan.yaml:7: headroom: want a percentage from 0% (none) to 1000%, got -5%"},
		{"headroom past the last level", minimal + "concurrency: 90000\nheadroom: 20%\n", "plan.yaml:8: headroom: 20% over 90000 concurrent sessions is 108000, over the highest sessions level (100000)"},
		{"bad workload", minimal + "workload:\n  turns: 0\n", "plan.yaml:8: workload.turns: must be >= 1, got 0"},
		{"trace and synthetic", minimal + "workload:\n  trace: t.jsonl\n  turns: 3\n", "plan.yaml:9: workload.turns: a trace workload takes no synthetic keys"},
		{"unpriced gpu", minimal + "prices: {H100 SXM: 2.5}\n", "plan.yaml:2: farms[0].gpus[0]: RTX A4000 has no price"},
		{"bad price key", minimal + "prices: {nope: 2.5}\n", "plan.yaml:7: prices.nope: "},
		{"not a mapping", "- 1\n- 2\n", "plan.yaml:1: cannot unmarshal !!seq"},
		{"bad yaml", "farms: [\n", "plan.yaml:1: did not find expected node content"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePlan([]byte(tt.yaml), "plan.yaml")
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error\n%q\nwant it to start with\n%q", err, tt.want)
			}
		})
	}
}

func TestParsePlanDefaults(t *testing.T) {
	p, err := ParsePlan([]byte(minimal+"sessions: [8, 2]\nconcurrency: 5\n"), "plan.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := p.withDefaults()
	if !cmp.Equal(d.Sessions, []int{2, 5, 6, 8}) || d.Concurrency != 5 || d.Headroom == nil || *d.Headroom != DefaultHeadroom {
		t.Errorf("sessions %v concurrency %d headroom %v: want [2 5 6 8] (sorted, concurrency and its 20 %% headroom level added), 5 and 20 %%",
			d.Sessions, d.Concurrency, d.Headroom)
	}
	for _, tt := range []struct {
		yaml     string
		headroom float64
		sessions []int
	}{
		{"headroom: 0%\n", 0, []int{2, 5, 8}}, // none: no level added
		{"headroom: 50%\n", 0.5, []int{2, 5, 8}},
		{"headroom: 12.5 %\n", 0.125, []int{2, 5, 6, 8}},
		{"headroom: 100%\n", 1, []int{2, 5, 8, 10}},
	} {
		p, err := ParsePlan([]byte(minimal+"sessions: [8, 2]\nconcurrency: 5\n"+tt.yaml), "plan.yaml")
		if err != nil {
			t.Fatalf("%s: %v", tt.yaml, err)
		}
		d := p.withDefaults()
		if *d.Headroom != Percent(tt.headroom) || !cmp.Equal(d.Sessions, tt.sessions) {
			t.Errorf("%s: headroom %v, sessions %v; want %v, %v", tt.yaml, *d.Headroom, d.Sessions, tt.headroom, tt.sessions)
		}
	}
	if !cmp.Equal(d.Strategies, DefaultStrategies) || !cmp.Equal(d.SpillThresholds, []string{"auto"}) || !cmp.Equal(d.Farms[0].TensorParallelSizes, []int{1}) {
		t.Errorf("defaults: strategies %v spill %v tp %v", d.Strategies, d.SpillThresholds, d.Farms[0].TensorParallelSizes)
	}
}

func TestLoadPlanRelativePaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "plan.yaml")
	if err := os.WriteFile(path, []byte(minimal+"workload:\n  trace: traces/t.jsonl\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := LoadPlan(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "traces", "t.jsonl"); p.Workload.Trace != want {
		t.Errorf("trace %q, want %q (relative to the plan file)", p.Workload.Trace, want)
	}
}

func FuzzParsePlan(f *testing.F) {
	f.Add(DefaultPlan)
	f.Add([]byte(minimal))
	f.Add([]byte(minimal + "prices: {RTX A4000: 0.3}\nworkload: {trace: x}\n"))
	f.Add([]byte("farms: [{gpus: [h100], replicas: [1, 2], tensor_parallel_sizes: [2], model: qwen3-32b}]\ntargets: {sessions_per_hour_min: 3}\n"))
	f.Add([]byte("{]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePlan(data, "fuzz.yaml")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Errorf("error %q does not name the file", err)
			}
			return
		}
		// A plan that parses passes the check Solve makes.
		if err := p.withDefaults().check(true); err != nil {
			t.Errorf("parsed plan fails Solve's check: %v", err)
		}
	})
}

// TestPlanConfigsVariants: affinity's variants run once per spill threshold
// like affinity, a priced one once (its spill is priced), and each is named
// as the simulator's tables name it, with its threshold.
func TestPlanConfigsVariants(t *testing.T) {
	p := Plan{
		Strategies:      []string{"least-loaded", "affinity", "affinity+kv+admit=30s", "affinity+kv+priced+admit", "hash"},
		SpillThresholds: []string{"auto", "4"},
	}
	var got []string
	for _, c := range p.configs() {
		got = append(got, c.Label())
	}
	want := []string{
		"least-loaded",
		"affinity (spill auto)", "affinity (spill 4)",
		"affinity (kv, admit 30s, spill auto)", "affinity (kv, admit 30s, spill 4)",
		"affinity (kv, priced, admit)",
		"hash",
	}
	if !cmp.Equal(got, want) {
		t.Errorf("configs\n%q\nwant\n%q", got, want)
	}
	if _, err := ParsePlan([]byte(minimal+"strategies: [least-loaded, affinity+kv+admit]\n"), "plan.yaml"); err != nil {
		t.Errorf("a plan with a variant: %v", err)
	}
}
