package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/traces"
)

// The journal of these tests, testdata/tune/journal/journal.jsonl*, is a
// real proxy's: warden proxy (journal max_bytes 24KiB, so it rotated three
// times) in front of `warden emulate --farm testdata/tune/farm.yaml` at
// speed 1, loaded by `warden bench --workload testdata/tune/workload.yaml
// --sessions 6 --step 40s` for 40 s of wall time: 86 requests of 24
// sessions. The proxy config:
//
//	listen: 127.0.0.1:18480
//	admin: 127.0.0.1:18481
//	auth: passthrough
//	journal: {path: journal.jsonl, max_bytes: 24KiB, keep: 5}
//	models:
//	  - name: Qwen/Qwen3-4B-Instruct-2507
//	    replicas: [http://127.0.0.1:18470, http://127.0.0.1:18471]
//	    max_num_seqs: 16
const (
	tuneJournalDir = "testdata/tune/journal"
	tuneFarmFile   = "testdata/tune/farm.yaml"
)

// TestTuneGolden: the table, rule, recommendation and routing block of the
// test journal, as text and JSON.
func TestTuneGolden(t *testing.T) {
	text, err := runWarden(t, "tune", "--journal", tuneJournalDir, "--farm", tuneFarmFile)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "tune/tune.txt", text)
	js, err := runWarden(t, "tune", "--journal", tuneJournalDir, "--farm", tuneFarmFile, "--json")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "tune/tune.json", js)
	var res planner.TuneResult
	if err := json.Unmarshal([]byte(js), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Journal.Files) != 4 || res.Journal.Files[0] != filepath.Join(tuneJournalDir, "journal.jsonl.3") ||
		res.Journal.Files[3] != filepath.Join(tuneJournalDir, "journal.jsonl") || res.Journal.Requests != 86 {
		t.Errorf("journal %+v: want the 4 files oldest first, 86 requests", res.Journal)
	}
	if len(res.Variants) != len(defaultTuneVariants) {
		t.Fatalf("%d variants, want the %d of the default list", len(res.Variants), len(defaultTuneVariants))
	}
	// The recommendation follows the rule, checked here from the rows.
	best := res.Variants[res.Recommended]
	if float64(best.TTFBP95) > float64(res.Reference) {
		t.Errorf("recommended %s: TTFB p95 %v against the reference %v", best.Name, best.TTFBP95, res.Reference)
	}
	for _, v := range res.Variants {
		if float64(v.TTFBP95) <= float64(res.Reference) && float64(v.OutputTokensPerMin) > float64(best.OutputTokensPerMin)*(1+planner.TuneTie) {
			t.Errorf("%s has more output tokens/min (%v) than the recommended %s (%v) within the TTFB reference", v.Name, v.OutputTokensPerMin, best.Name, best.OutputTokensPerMin)
		}
	}
	// Refused first turns are sent again, twice each at most, as the SDKs
	// do: a turn given up (unfinished) was refused three times.
	retried := false
	for _, v := range res.Variants {
		gaveUp := v.AdmissionRefused - v.AdmissionRetries
		if v.AdmissionRetries < 0 || gaveUp < 0 || gaveUp > v.Unfinished || 3*gaveUp > v.AdmissionRefused {
			t.Errorf("%s: waited %d, refused %d, retried %d, unfinished %d: not an SDK's retries", v.Name, v.AdmissionWaits, v.AdmissionRefused, v.AdmissionRetries, v.Unfinished)
		}
		retried = retried || v.AdmissionRetries > 0
	}
	if !retried {
		t.Error("no variant retried a refused first turn on the test journal")
	}
	if !strings.Contains(text, res.Routing) || !strings.HasSuffix(text, res.Routing) {
		t.Errorf("the text does not end with the routing block:\n%s", text)
	}
}

// TestTuneDeterministic: the same seed gives byte-identical output.
func TestTuneDeterministic(t *testing.T) {
	for _, args := range [][]string{
		{"tune", "--journal", tuneJournalDir, "--farm", tuneFarmFile, "--seed", "3"},
		{"tune", "--journal", tuneJournalDir, "--farm", tuneFarmFile, "--seed", "3", "--json"},
	} {
		a, err := runWarden(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		b, err := runWarden(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Errorf("%v: two runs differ", args)
		}
	}
}

// printedRouting is the routing block at the end of tune's text output.
func printedRouting(t *testing.T, text string) string {
	t.Helper()
	i := strings.Index(text, "\nmodels:\n")
	if i < 0 {
		t.Fatalf("no routing block in\n%s", text)
	}
	return text[i+1:]
}

// loadRouting loads a printed routing block as the proxy does, in a
// config that adds what the block leaves to the operator: listen, auth and
// the model's replicas.
func loadRouting(t *testing.T, block string) (*live.ModelCfg, error) {
	t.Helper()
	cfg := "listen: 127.0.0.1:8080\nauth: passthrough\n" + strings.TrimRight(block, "\n") +
		"\n    replicas: [http://10.0.0.1:8000, http://10.0.0.2:8000]\n"
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := live.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	return &c.Models[0], nil
}

// TestTuneRoutingLoadsInProxy: the block tune prints loads with the
// proxy's own config loader and sets what the variant says; for every
// variant the proxy runs, and for the one recommended on the test journal.
// A priced variant's block sets the proxy's measured prefill rate.
func TestTuneRoutingLoadsInProxy(t *testing.T) {
	text, err := runWarden(t, "tune", "--journal", tuneJournalDir, "--farm", tuneFarmFile, "--variants", "least-loaded,affinity+kv+admit=20s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadRouting(t, printedRouting(t, text)); err != nil {
		t.Fatalf("the printed block does not load in the proxy: %v\n%s", err, text)
	}
	for _, tt := range []struct {
		variant  string
		spill    string
		strategy string
		balance  string
		admit    string
		timeout  time.Duration
		err      string
	}{
		{variant: "hash", strategy: "hash"},
		{variant: "least-loaded", strategy: "least-loaded"},
		{variant: "affinity", spill: "auto", strategy: "affinity", balance: "sessions", admit: "off"},
		{variant: "affinity", spill: "6", strategy: "affinity", balance: "sessions", admit: "off"},
		{variant: "affinity+kv", spill: "auto", strategy: "affinity", balance: "kv", admit: "off"},
		{variant: "affinity+admit", spill: "auto", strategy: "affinity", balance: "sessions", admit: "kv", timeout: live.DefaultAdmissionTimeout},
		{variant: "affinity+kv+admit=10s", spill: "auto", strategy: "affinity", balance: "kv", admit: "kv", timeout: 10 * time.Second},
		{variant: "affinity+kv+admit=1m30s", spill: "auto", strategy: "affinity", balance: "kv", admit: "kv", timeout: 90 * time.Second},
		{variant: "affinity+priced", spill: "auto", strategy: "affinity", balance: "sessions", admit: "off"},
		{variant: "affinity+kv+priced+admit=30s", spill: "auto", strategy: "affinity", balance: "kv", admit: "kv", timeout: 30 * time.Second},
		{variant: "affinity+rehome", spill: "auto", strategy: "affinity", balance: "sessions", admit: "off"},
		{variant: "affinity+kv+rehome", spill: "auto", strategy: "affinity", balance: "kv", admit: "off"},
		// The held prefix reads the replicas' KV events: the block says so
		// and loads once the operator names them (checkRoutingYAML does).
		{variant: "affinity+prefix", spill: "auto", err: "held reads what each replica holds from its KV events: set models[0].kv_events"},
	} {
		t.Run(tt.variant+"/"+tt.spill, func(t *testing.T) {
			v, err := placement.ParseSpec(tt.variant)
			if err != nil {
				t.Fatal(err)
			}
			spill := placement.SpillThreshold{}
			if tt.spill != "" {
				if spill, err = placement.ParseSpillThreshold(tt.spill); err != nil {
					t.Fatal(err)
				}
			}
			if v.Priced {
				spill = placement.SpillPriced()
			}
			block := routingYAML("Qwen/Qwen3-4B-Instruct-2507", v, farmRouting{spill: spill, ttl: 10 * time.Minute, window: 45 * time.Second})
			if err := checkRoutingYAML(block, 2); err != nil {
				t.Fatalf("tune's own check refuses its block: %v\n%s", err, block)
			}
			m, err := loadRouting(t, block)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, block)
			}
			if m.Name != "Qwen/Qwen3-4B-Instruct-2507" || m.EffectiveStrategy() != tt.strategy {
				t.Errorf("model %q strategy %q, want %q", m.Name, m.EffectiveStrategy(), tt.strategy)
			}
			if tt.strategy != "affinity" {
				return
			}
			b, _ := placement.ParseBalance(m.Balance)
			a, _ := placement.ParseAdmission(m.Admission)
			if b.String() != tt.balance || a.String() != tt.admit {
				t.Errorf("balance %s admission %s, want %s %s\n%s", b, a, tt.balance, tt.admit, block)
			}
			if tt.admit == "kv" && m.AdmissionTimeout.D() != tt.timeout {
				t.Errorf("admission_timeout %s, want %s", m.AdmissionTimeout.D(), tt.timeout)
			}
			wantSpill := live.Spill{Auto: tt.spill == "auto", Priced: v.Priced}
			if !wantSpill.Auto {
				wantSpill.N = 6
			}
			if v.Priced && !m.PrefillTokensPerS.Metrics {
				t.Errorf("a priced block must measure the prefill rate (prefill_tokens_per_s: metrics):\n%s", block)
			}
			if m.SpillThreshold != wantSpill {
				t.Errorf("spill %+v, want %+v", m.SpillThreshold, wantSpill)
			}
			if r, _ := placement.ParseRehome(m.Rehome); (r == placement.RehomeCold) != v.Rehome {
				t.Errorf("rehome %q for variant %s\n%s", m.Rehome, tt.variant, block)
			}
			if m.SessionTTL.D() != 10*time.Minute || m.ActiveWindow.D() != 45*time.Second {
				t.Errorf("session_ttl %s active_window %s, want the farm's 10m0s and 45s", m.SessionTTL.D(), m.ActiveWindow.D())
			}
		})
	}
	// A model name that YAML would misread is quoted.
	if m, err := loadRouting(t, routingYAML("coder: fast", placement.Spec{Strategy: placement.StrategyHash}, farmRouting{})); err != nil || m.Name != "coder: fast" {
		t.Errorf("a model named %q: %v, %+v", "coder: fast", err, m)
	}
}

// writeJournal writes a trace of reqs (t_ms, model) with one-block prompts.
func writeJournal(t *testing.T, path string, blockSize int, reqs ...traces.Request) {
	t.Helper()
	w, err := traces.Create(path, traces.Header{BlockSize: blockSize, Source: "proxy"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		r := reqs[i]
		if r.PromptTokens == 0 {
			r.PromptTokens = blockSize
		}
		r.HashIDs = make([]uint64, (r.PromptTokens+blockSize-1)/blockSize)
		for k := range r.HashIDs {
			r.HashIDs[k] = uint64(i+1)<<20 | uint64(k)
		}
		r.CachedTokens, r.Replica = -1, -1
		if err := w.Write(&r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestTuneErrors(t *testing.T) {
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	const qwen = "Qwen/Qwen3-4B-Instruct-2507"
	writeJournal(t, p("llama.jsonl"), 16, traces.Request{Session: "a", Model: "meta-llama/Llama-3.1-8B-Instruct"})
	writeJournal(t, p("two.jsonl"), 16, traces.Request{Session: "a", Model: qwen}, traces.Request{Session: "b", Model: "coder", ArrivalMs: 5})
	writeJournal(t, p("empty.jsonl"), 16)
	writeJournal(t, p("bs8.jsonl"), 8, traces.Request{Session: "a", Model: qwen})
	writeJournal(t, p("ok.jsonl"), 16, traces.Request{Session: "a", Model: qwen})
	if err := os.WriteFile(p("bad.jsonl"), []byte(`{"format":"warden-trace","version":1,"block_size":16}`+"\n"+
		`{"t_ms":0,"session":"a","turn":0,"prompt_tokens":"many"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p("farm-bad.yaml"), []byte("model: "+qwen+"\ngpu: RTX A4000\nvllm:\n  max_num_seqs: -2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p("nothing"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Two files of one journal whose block sizes differ.
	if err := os.Mkdir(p("mixed"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeJournal(t, filepath.Join(dir, "mixed", "j.jsonl.1"), 16, traces.Request{Session: "a", Model: qwen})
	writeJournal(t, filepath.Join(dir, "mixed", "j.jsonl"), 8, traces.Request{Session: "a", Model: qwen})

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no journal flag", []string{"--farm", tuneFarmFile}, `required flag(s) "journal" not set`},
		{"no farm flag", []string{"--journal", p("ok.jsonl")}, `required flag(s) "farm" not set`},
		{"missing journal", []string{"--journal", p("missing.jsonl"), "--farm", tuneFarmFile}, "--journal: stat " + p("missing.jsonl") + ": no such file or directory"},
		{"malformed journal", []string{"--journal", p("bad.jsonl"), "--farm", tuneFarmFile}, p("bad.jsonl") + ":2: prompt_tokens: expected int, got JSON string"},
		{"not a trace", []string{"--journal", tuneFarmFile, "--farm", tuneFarmFile}, tuneFarmFile + ":1: header: "},
		{"empty journal", []string{"--journal", p("empty.jsonl"), "--farm", tuneFarmFile}, "journal " + p("empty.jsonl") + ": no request (the proxy writes a line when a request finishes)"},
		{"empty directory", []string{"--journal", p("nothing"), "--farm", tuneFarmFile}, "--journal " + p("nothing") + ": the directory has no file"},
		{"glob without match", []string{"--journal", p("nope*.jsonl"), "--farm", tuneFarmFile}, "--journal " + p("nope*.jsonl") + ": no file matches"},
		{"another model", []string{"--journal", p("llama.jsonl"), "--farm", tuneFarmFile}, "the journal's model meta-llama/Llama-3.1-8B-Instruct is not the farm's Qwen/Qwen3-4B-Instruct-2507 (2x RTX A4000, Qwen3-4B, 48 KV blocks): replay it on a farm of that model, or pick another model's requests with --model"},
		{"two models", []string{"--journal", p("two.jsonl"), "--farm", tuneFarmFile}, "the journal has requests for 2 models, " + qwen + " (1 requests), coder (1 requests): pick one with --model"},
		{"model not in journal", []string{"--journal", p("ok.jsonl"), "--farm", tuneFarmFile, "--model", "gemma"}, "--model gemma: the journal has no request for it (it has " + qwen + " (1 requests))"},
		{"block size", []string{"--journal", p("bs8.jsonl"), "--farm", tuneFarmFile}, "has block_size 8, the farm's vllm.block_size is 16"},
		{"files of two journals", []string{"--journal", p("mixed"), "--farm", tuneFarmFile}, filepath.Join(dir, "mixed", "j.jsonl") + ":1: block_size: 8, but " + filepath.Join(dir, "mixed", "j.jsonl.1") + " has 16"},
		{"bad variant", []string{"--journal", p("ok.jsonl"), "--farm", tuneFarmFile, "--variants", "affinity+cheap"}, `--variants: strategy "affinity+cheap": unknown option "cheap"`},
		{"bad timeout", []string{"--journal", p("ok.jsonl"), "--farm", tuneFarmFile, "--variants", "affinity+admit=0s"}, "want an admission timeout > 0"},
		{"missing farm", []string{"--journal", p("ok.jsonl"), "--farm", p("farm.yaml")}, "--farm: open " + p("farm.yaml")},
		{"bad farm", []string{"--journal", p("ok.jsonl"), "--farm", p("farm-bad.yaml")}, p("farm-bad.yaml") + ":4: vllm.max_num_seqs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := runWarden(t, append([]string{"tune"}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v\nwant one containing %q", err, tt.want)
			}
		})
	}

	// A journal without a model is replayed as the farm's model, named so
	// in the block.
	writeJournal(t, p("nomodel.jsonl"), 16, traces.Request{Session: "a"})
	out, err := runWarden(t, "tune", "--journal", p("nomodel.jsonl"), "--farm", tuneFarmFile, "--variants", "affinity,affinity+kv")
	if err != nil {
		t.Fatal(err)
	}
	if want := "note: the journal names no model: replayed as the farm's " + qwen + ", which the routing block names"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	if m, err := loadRouting(t, printedRouting(t, out)); err != nil || m.Name != qwen {
		t.Errorf("block of a journal without a model: %v, %+v", err, m)
	}

	// A model the catalogue does not know (a served alias) is replayed as
	// the farm's, and tune says so; --model picks one model's requests.
	out, err = runWarden(t, "tune", "--journal", p("two.jsonl"), "--farm", tuneFarmFile, "--model", "coder", "--variants", "affinity")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`note: the journal's model "coder" is not in the hardware catalogue: replayed as the farm's Qwen/Qwen3-4B-Instruct-2507`,
		"1 requests of 1 sessions", "(1 requests of other models left out)", "  - name: coder\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestLoadJournalStitches: each file's times follow on from the previous
// file's last arrival; an empty file (a proxy killed before its first
// flush) is skipped and named.
func TestLoadJournalStitches(t *testing.T) {
	dir := t.TempDir()
	const qwen = "Qwen/Qwen3-4B-Instruct-2507"
	writeJournal(t, filepath.Join(dir, "j.jsonl.2"), 16, traces.Request{Session: "a", Model: qwen}, traces.Request{Session: "b", Model: qwen, ArrivalMs: 700})
	writeJournal(t, filepath.Join(dir, "j.jsonl.1"), 16, traces.Request{Session: "a", Turn: 1, Model: qwen, ArrivalMs: 0}, traces.Request{Session: "c", Model: qwen, ArrivalMs: 300})
	if err := os.WriteFile(filepath.Join(dir, "j.jsonl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := planner.JournalFiles([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	tr, jr, err := planner.LoadJournal(files, "")
	if err != nil {
		t.Fatal(err)
	}
	var at []int64
	for _, r := range tr.Requests {
		at = append(at, r.ArrivalMs)
	}
	if !slices.Equal(at, []int64{0, 700, 700, 1000}) {
		t.Errorf("arrivals %v, want [0 700 700 1000]", at)
	}
	if jr.Requests != 4 || jr.Sessions != 3 || math.Abs(float64(jr.DurationS)-1) > 1e-9 || !slices.Equal(jr.Empty, []string{filepath.Join(dir, "j.jsonl")}) {
		t.Errorf("journal %+v", jr)
	}
}
