package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/calibrate"
	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
	"github.com/lm-warden/warden/web"
)

// planOptions are the flags of `warden plan`.
type planOptions struct {
	PlanFile string
	Workload string // a preset or a workload file, replacing the plan's workload

	GPUs               []string
	Replicas           []int
	TensorParallelSize []int
	Model              string
	MaxNumSeqs         int
	VLLMVersion        string
	WeightsDType       string // --weights-dtype: every candidate's weights format
	KVCacheDType       string // --kv-cache-dtype

	Sessions    []int
	Concurrency int
	Headroom    string // --headroom 20 or 20%
	Duration    time.Duration
	Strategies  []string
	Spills      []string
	Seed        uint64

	TargetTTFBP95         time.Duration
	TargetHitPct          float64
	TargetOutputTokensMin float64
	TargetSessionsPerHour float64

	Prices string // --price "RTX A4000=0.25,RTX 4090=0.69"

	EveryCandidate bool // simulate the candidates dearer than one that meets

	Out         string
	JSON        bool
	Progress    bool
	Quiet       bool // no progress on stderr, bar or lines
	Parallelism int
	Wide        bool // every column of the summary's table, however wide

	prom planPromOptions // --prometheus mode (plan_observed.go)

	// changed reports whether a flag was given on the command line (flags
	// given override a plan file's values).
	changed func(name string) bool
	// stderr receives the progress bar; isTerminal, when set, says whether
	// it is a terminal (tests).
	stderr     io.Writer
	isTerminal func() bool
	// progressEvery, when set, is the wall time between two progress
	// lines (tests); 0: every few seconds.
	progressEvery time.Duration
}

// builtInPlan is the built-in plan as parsed: the flags' defaults are its
// values, so that `plan --help` says what `plan` runs.
func builtInPlan() planner.Plan {
	p, err := planner.ParsePlan(planner.DefaultPlan, planner.DefaultPlanName)
	if err != nil {
		panic(err) // tested: the embedded plan parses
	}
	return p
}

func newPlanCmd() *cobra.Command {
	opts := &planOptions{}
	def := builtInPlan()
	defFarm := def.Farms[0]
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Find the cheapest farm and routing that meet service targets (writes an HTML report)",
		Long: `Answer "how many cards, of which kind, and which routing, for N agent sessions?"

plan simulates every candidate farm (GPU kinds x replica counts x tensor parallel
sizes) with every strategy and spill threshold at every sessions level, checks the
service targets on each step, and prints the cheapest farm that meets them at the
wanted concurrency (--concurrency, default the highest --sessions level), with the
routing to run it with. Cost is the sum of per-GPU hourly prices (--price, or
prices: in a plan file; the table then also gives the cost per 1,000 session-turns),
else the card count; ties go to the farm with more headroom, then fewer cards.

Every candidate, routing and level runs as a band: the KV cache estimated x0.85,
x1 and x1.10 (none for a farm whose num_gpu_blocks is given) by the engine at
x0.8, x1 and x1.2 the roofline's speed (none for a farm whose step_time gives
both efficiencies, as warden calibrate writes them) by 3 seeds, every
combination (where the nominal run already misses a target, it alone: the band
cannot change that verdict). A farm "meets" when the band's pessimistic edge
(the lowest hit %, the highest TTFB) meets every target at the wanted
concurrency and, with --headroom (default 20%, 0 for none), at that many more
sessions too (for 16 sessions, 20: added to the levels); it is "marginal" when only
the nominal run does, or when the pessimistic edge meets at the concurrency
but not with the headroom (the answer then says where its cliff is), and
"misses" otherwise. "Meets up to" is found by bisection between the last
level that meets and the first that misses (or upwards, to one more step of
the levels), with what fails there. Each candidate's rule-of-thumb check
(sessions x typical context against the farm's KV cache) comes with one
sentence that reconciles it with the simulation. When no candidate meets the
targets, it names the closest one. A model that does not fit on a candidate is
reported, not dropped; when it fits on none, plan fails. Candidates are
simulated by cost, cheapest first: once a farm meets the targets, the dearer
ones cannot be the answer and are not simulated (the table says so, the report
says why); --every-candidate simulates them too. A plan with --prometheus
simulates every candidate.

Beyond the three strategies, --strategies (or strategies: in a plan file)
takes affinity's variants as warden sim does (affinity+kv, affinity+priced,
affinity+admit, affinity+admit=30s, combined as affinity+kv+priced+admit),
named in the table as the simulator names them, with the spill threshold:
"affinity (kv, admit, spill auto)". They are opt-in: each variant is one more
routing per spill threshold (a priced one runs once), simulated on every
candidate at every level of the band, so the built-in plan does not try them.

Candidates come from a YAML plan file (--plan; see planner/examples/default.yaml)
or from --gpu, --replicas and --model. With neither, plan runs the built-in
example: RTX A4000 farms of 2, 4, 6 and 8 cards for 16 Qwen3-4B agent sessions
(planner/examples/default.yaml); the defaults below are its values, and --gpu
plans take them too, except the model (--model is required with --gpu) and
max_num_seqs (the built-in plan sets 32 and max_model_len 32768; --gpu plans use
vLLM's defaults unless --max-num-seqs is given). Flags given with --plan override
the file's values.

The self-contained HTML report goes to --out; --json prints the result as JSON,
which 'warden report --from' renders again. Progress goes to stderr: a bar on a
terminal, else (a log, a pipe) a line every few seconds naming the simulation
that runs; --quiet silences both.`,
		Example: `  warden plan                                   # the built-in example; writes plan-report.html
  warden plan --headroom 0 --out ""              # the wanted concurrency alone decides (no headroom level)
  warden plan --gpu "RTX A4000,RTX 4090" --replicas 2,3,4 --model Qwen/Qwen3-4B-Instruct-2507 \
      --sessions 4,8,16 --target-ttfb-p95 10s --target-hit-pct 80
  warden plan --gpu h100 --replicas 1,2 --tensor-parallel-size 4 --model llama-3.1-70b --sessions 32,64
  warden plan --gpu "H100 SXM,L40S" --replicas 16,32,64 --model meta-llama/Llama-3.1-8B-Instruct \
      --sessions 64,128,256 --every-candidate    # also the farms dearer than the answer
  warden plan --workload claude-code --sessions 8,16 --out claude.html   # Claude Code's sessions (presets: warden sim --help)
  warden plan --plan my-plan.yaml --out capacity.html --json > result.json
  warden report --from result.json --out capacity.html
  warden plan --prometheus http://localhost:9090 --model Qwen/Qwen3-4B-Instruct-2507 --current-gpu "RTX A4000" \
      --since 6h --replicas 3,4,6 --json > predicted.json   # the farm you have, under the load you have`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.changed, opts.stderr = cmd.Flags().Changed, cmd.ErrOrStderr()
			return runPlan(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.PlanFile, "plan", "", "YAML plan file (candidates, workload, targets); see planner/examples/default.yaml")
	f.StringVar(&opts.Workload, "workload", "", "the workload to plan for, replacing the plan's: a preset ("+strings.Join(traces.PresetNames(), ", ")+") or a workload YAML file")
	f.StringSliceVar(&opts.GPUs, "gpu", nil, `candidate GPU kinds, comma-separated catalogue names or aliases ("RTX A4000,h100")`)
	f.IntSliceVar(&opts.Replicas, "replicas", defFarm.Replicas, "candidate replica counts (with --gpu; with --prometheus: of the current GPU, besides the current count)")
	f.IntSliceVar(&opts.TensorParallelSize, "tensor-parallel-size", defFarm.TensorParallelSizes, "candidate tensor parallel sizes, GPUs per replica (with --gpu)")
	f.StringVar(&opts.Model, "model", "", "model name or alias from the catalogue (with --gpu)")
	f.IntVar(&opts.MaxNumSeqs, "max-num-seqs", 0, "vLLM max_num_seqs per replica (with --gpu; 0: vLLM's default)")
	known := sim.KnownVLLMReleases()
	f.StringVar(&opts.VLLMVersion, "vllm-version", "", `vLLM release every candidate (and with --prometheus the current farm) runs, `+known[0]+` to `+known[len(known)-1]+`, e.g. "0.27"; "": each farm's vllm.version, else `+sim.DefaultVLLMVersion+` (sim/testdata/vllm says what each release does; the answer names the release)`)
	f.StringVar(&opts.WeightsDType, "weights-dtype", "", `weights format of every candidate: bf16, fp8 or int4 ("": each farm's weights_dtype, else bf16); fp8 halves a model's memory, so it fits on fewer cards`)
	f.StringVar(&opts.KVCacheDType, "kv-cache-dtype", "", `KV cache format of every candidate: auto (bf16) or fp8 ("": each farm's kv_cache_dtype)`)
	f.IntSliceVar(&opts.Sessions, "sessions", def.Sessions, "concurrent sessions levels to simulate")
	f.IntVar(&opts.Concurrency, "concurrency", 0, "concurrent sessions the answer is for (0: the highest --sessions level)")
	f.StringVar(&opts.Headroom, "headroom", headroomFlag(def), `a farm meets only if it also meets the targets at this much more load, a percentage ("20" or "20%"; 0: none)`)
	f.DurationVar(&opts.Duration, "duration", time.Duration(def.Duration), "simulated time of one sessions level (at least 1s)")
	f.StringSliceVar(&opts.Strategies, "strategies", def.Strategies, "strategies to try: "+placement.OptionsHelp()+" (affinity+kv+admit=30s; each is one more routing per spill threshold)")
	f.StringSliceVar(&opts.Spills, "spill-thresholds", def.SpillThresholds, "affinity spill thresholds to try: auto or requests in flight")
	f.Uint64Var(&opts.Seed, "seed", def.Seed, "seed of the synthetic sessions (the band adds the next two)")
	f.DurationVar(&opts.TargetTTFBP95, "target-ttfb-p95", time.Duration(def.Targets.TTFBP95MaxS*float64(time.Second)), "target: TTFB p95 at most this (0: none)")
	f.Float64Var(&opts.TargetHitPct, "target-hit-pct", def.Targets.PrefixHitPctMin, "target: prefix-cache hit rate at least this many % (0: none)")
	f.Float64Var(&opts.TargetOutputTokensMin, "target-output-tokens-per-min", 0, "target: output tokens per minute at least this (0: none)")
	f.Float64Var(&opts.TargetSessionsPerHour, "target-sessions-per-hour", 0, "target: sessions completed per hour at least this (0: none)")
	f.StringVar(&opts.Prices, "price", "", `per-GPU hourly prices, "RTX A4000=0.25,RTX 4090=0.69": rank by money, a GPU not given taking warden's price list (hardware/catalog/prices.yaml, on-demand USD; kinds that mix are ranked by it even without --price)`)
	f.BoolVar(&opts.EveryCandidate, "every-candidate", false, "simulate every candidate, also those that cost more than one that meets the targets (by default those are skipped: they cannot be the answer)")
	f.StringVar(&opts.Out, "out", "plan-report.html", `HTML report file ("" for none)`)
	f.BoolVar(&opts.JSON, "json", false, "print the result as JSON (what 'warden report --from' reads) instead of the summary")
	f.BoolVar(&opts.Progress, "progress", true, "show progress on stderr: a bar on a terminal, else a line every few seconds")
	f.BoolVar(&opts.Quiet, "quiet", false, "no progress on stderr (neither the bar nor the lines)")
	f.BoolVar(&opts.Wide, "wide", false, "print every column of the summary's table (by default it keeps within about 120 columns)")
	f.IntVar(&opts.Parallelism, "parallelism", 0, "simulations run at once (0: one per CPU)")
	f.StringVar(&opts.prom.Prometheus, "prometheus", "", "plan the farm this Prometheus watches, under its load (with --model, --current-gpu); --gpu/--replicas add candidates")
	f.DurationVar(&opts.prom.Since, "since", time.Hour, "with --prometheus: the window read, ending now (or at --end)")
	f.StringVar(&opts.prom.End, "end", "", "with --prometheus: end of the window, RFC 3339 (default: now)")
	f.StringVar(&opts.prom.CurrentGPU, "current-gpu", "", "with --prometheus: catalogue GPU of the current farm")
	f.StringVar(&opts.prom.Journal, "journal", "", "with --prometheus: the proxy's journal, for the load")
	f.Float64Var(&opts.prom.Tolerance, "tolerance", 0.1, "with --prometheus: relative drift that marks a KPI in prediction vs observation")
	cmd.MarkFlagsMutuallyExclusive("plan", "gpu")
	return cmd
}

// buildPlan makes the plan: the file, the flags, or the built-in example,
// with the flags given on the command line applied.
func (o *planOptions) buildPlan() (planner.Plan, error) {
	changed := o.changed
	if changed == nil {
		changed = func(string) bool { return false }
	}
	var (
		p   planner.Plan
		err error
	)
	switch {
	case o.PlanFile != "":
		// A plan file without targets: takes the command line's, as the
		// flags have defaults (the built-in plan's).
		p, err = planner.LoadPlanWith(o.PlanFile, planner.ParseOptions{DefaultTargets: &planner.Targets{
			TTFBP95MaxS:           o.TargetTTFBP95.Seconds(),
			PrefixHitPctMin:       o.TargetHitPct,
			OutputTokensPerMinMin: o.TargetOutputTokensMin,
			SessionsPerHourMin:    o.TargetSessionsPerHour,
		}})
	case len(o.GPUs) > 0:
		if o.Model == "" {
			return p, errors.New("--gpu needs --model (the model every candidate serves)")
		}
		for _, g := range o.GPUs {
			if _, err := hardware.LookupGPU(g); err != nil {
				return p, fmt.Errorf("--gpu: %w", err)
			}
		}
		if _, err := hardware.LookupModel(o.Model); err != nil {
			return p, fmt.Errorf("--model: %w", err)
		}
		p = planner.Plan{
			Farms: []planner.FarmSet{{
				GPUs: o.GPUs, Replicas: o.Replicas, TensorParallelSizes: o.TensorParallelSize, Model: o.Model,
				VLLM: sim.VLLMSpec{MaxNumSeqs: o.MaxNumSeqs},
			}},
		}
		// Every plan setting comes from its flag, default or not.
		changed = func(string) bool { return true }
	default:
		for _, name := range []string{"replicas", "tensor-parallel-size", "model", "max-num-seqs"} {
			if o.prom.Prometheus != "" && (name == "replicas" || name == "model" || name == "max-num-seqs") {
				continue // --prometheus takes them (plan_observed.go)
			}
			if o.changed != nil && o.changed(name) {
				return p, fmt.Errorf("--%s needs --gpu", name)
			}
		}
		p, err = planner.ParsePlan(planner.DefaultPlan, planner.DefaultPlanName)
	}
	if err != nil {
		return p, err
	}
	if err := o.checkFlags(changed); err != nil {
		return p, err
	}
	if o.VLLMVersion != "" {
		if _, err := sim.ParseVLLMVersion(o.VLLMVersion); err != nil {
			return p, fmt.Errorf("--vllm-version: %w", err)
		}
		for i := range p.Farms {
			p.Farms[i].VLLM.Version = o.VLLMVersion
		}
	}
	for _, d := range []struct {
		flag, value string
		set         func(*planner.FarmSet)
	}{
		{"--weights-dtype", o.WeightsDType, func(f *planner.FarmSet) { f.WeightsDType = o.WeightsDType }},
		{"--kv-cache-dtype", o.KVCacheDType, func(f *planner.FarmSet) { f.KVCacheDType = o.KVCacheDType }},
	} {
		if d.value == "" {
			continue
		}
		if err := checkDType(d.flag, d.value); err != nil {
			return p, err
		}
		for i := range p.Farms {
			d.set(&p.Farms[i])
		}
	}
	if o.Prices != "" {
		prices, err := parsePrices(o.Prices)
		if err != nil {
			return p, err
		}
		p.Prices, p.PricesFrom = prices, "--price"
	}
	if changed("sessions") {
		p.Sessions = o.Sessions
	}
	if changed("concurrency") {
		p.Concurrency = o.Concurrency
	}
	if changed("headroom") {
		h, err := parseHeadroom(o.Headroom)
		if err != nil {
			return p, err
		}
		p.Headroom = planner.HeadroomOf(h)
	}
	if changed("duration") {
		p.Duration = sim.Duration(o.Duration)
	}
	if changed("strategies") {
		p.Strategies = o.Strategies
	}
	if changed("spill-thresholds") {
		p.SpillThresholds = o.Spills
	}
	if changed("seed") {
		p.Seed = o.Seed
	}
	if changed("target-ttfb-p95") {
		p.Targets.TTFBP95MaxS = o.TargetTTFBP95.Seconds()
	}
	if changed("target-hit-pct") {
		p.Targets.PrefixHitPctMin = o.TargetHitPct
	}
	if changed("target-output-tokens-per-min") {
		p.Targets.OutputTokensPerMinMin = o.TargetOutputTokensMin
	}
	if changed("target-sessions-per-hour") {
		p.Targets.SessionsPerHourMin = o.TargetSessionsPerHour
	}
	if changed("every-candidate") {
		p.EveryCandidate = o.EveryCandidate
	}
	if o.Workload != "" {
		w, err := traces.LoadWorkloadRef(o.Workload)
		if err != nil {
			return p, fmt.Errorf("--workload: %w", err)
		}
		p.Workload = planner.WorkloadSpec{Preset: o.Workload, Workload: w}
	}
	p.Parallelism = o.Parallelism
	return p, nil
}

// checkFlags refuses flag values that would otherwise mean something else
// silently (a zero duration or replica count), naming the flag.
func (o *planOptions) checkFlags(changed func(string) bool) error {
	if changed("duration") && o.Duration < time.Second {
		return fmt.Errorf("--duration %s: want at least 1s of simulated time per sessions level", o.Duration)
	}
	if changed("replicas") {
		for _, n := range o.Replicas {
			if n < 1 || n > 4096 {
				return fmt.Errorf("--replicas: want replica counts from 1 to 4096, got %d", n)
			}
		}
	}
	if changed("tensor-parallel-size") {
		for _, n := range o.TensorParallelSize {
			if n < 1 || n > 64 {
				return fmt.Errorf("--tensor-parallel-size: want 1 to 64, got %d", n)
			}
		}
	}
	if changed("sessions") {
		for _, n := range o.Sessions {
			if n < 1 {
				return fmt.Errorf("--sessions: want levels of at least 1 concurrent session, got %d", n)
			}
		}
	}
	return nil
}

// parseHeadroom reads --headroom: a percentage, as --target-hit-pct takes
// one ("20" is 20 %), with or without its % sign as --tolerance takes one
// ("20%"). A bare number between 0 and 1 is refused: 0.2 could be meant as
// a fraction (20 %) or as 0.2 %; "0.2%" says the latter.
func parseHeadroom(s string) (float64, error) {
	t := strings.TrimSpace(s)
	sign := strings.HasSuffix(t, "%")
	v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(t, "%")), 64)
	switch {
	case err != nil || math.IsNaN(v) || math.IsInf(v, 0):
		return 0, fmt.Errorf("--headroom %q: want a percentage such as 20 or 20%% (0: none)", s)
	case v < 0 || v > 100*planner.MaxHeadroom:
		return 0, fmt.Errorf("--headroom %q: want a percentage from 0 (none) to %g", s, 100*float64(planner.MaxHeadroom))
	case !sign && v > 0 && v < 1:
		return 0, fmt.Errorf("--headroom %q: a percentage, e.g. 20 or 20%% for a fifth more load (write %s%% if you mean %s %%)", s, t, t)
	}
	return v / 100, nil
}

// headroomFlag is --headroom's default: the built-in plan's headroom.
func headroomFlag(def planner.Plan) string {
	h := planner.DefaultHeadroom
	if def.Headroom != nil {
		h = float64(*def.Headroom)
	}
	return strconv.FormatFloat(100*h, 'f', -1, 64) + "%"
}

// parsePrices reads --price: comma-separated GPU=price pairs, per GPU-hour.
func parsePrices(s string) (map[string]float64, error) {
	out := map[string]float64{}
	seen := map[string]string{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, val, ok := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("--price: %q: want GPU=price per GPU-hour, e.g. \"RTX A4000=0.25\"", item)
		}
		gpu, err := hardware.LookupGPU(name)
		if err != nil {
			return nil, fmt.Errorf("--price: %w", err)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || v != v {
			return nil, fmt.Errorf("--price: %q: want a price >= 0 per GPU-hour", item)
		}
		if prev, dup := seen[gpu.Name]; dup {
			return nil, fmt.Errorf("--price: %s is priced twice (%q and %q)", gpu.Name, prev, name)
		}
		seen[gpu.Name] = name
		out[name] = v
	}
	if len(out) == 0 {
		return nil, errors.New(`--price: no price given (want "GPU=price,...")`)
	}
	return out, nil
}

// checkDType refuses a --weights-dtype or --kv-cache-dtype value the
// simulator would refuse later, naming the flag and the choices.
func checkDType(flag, v string) error {
	choices := []string{"bf16", "fp8", "int4"}
	if flag == "--kv-cache-dtype" {
		choices = []string{"auto", "fp8"}
	}
	if !slices.Contains(choices, v) {
		return fmt.Errorf("%s %q: want %s", flag, v, joinOr(choices))
	}
	return nil
}

// joinOr joins "a", "a or b", "a, b or c".
func joinOr(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

func runPlan(ctx context.Context, o *planOptions, out io.Writer) error {
	if err := checkOutPath("--out", o.Out); err != nil {
		return err
	}
	var (
		res *planner.Result
		err error
	)
	if o.prom.Prometheus != "" {
		res, err = o.solveObserved(ctx)
	} else {
		res, err = o.solve(ctx)
	}
	if err != nil {
		return err
	}
	if res.Best < 0 && res.Closest < 0 {
		// No candidate can run the model: an error, said once.
		return errors.New(res.Answer)
	}
	if o.Out != "" {
		if err := writeReport(o.Out, web.PlanReport(res)); err != nil {
			return err
		}
	}
	if o.JSON {
		return writeJSON(out, res)
	}
	return writePlanSummary(out, res, o.Out, o.Wide)
}

// solve is plan's usual mode: a plan file, the flags or the example.
func (o *planOptions) solve(ctx context.Context) (*planner.Result, error) {
	p, err := o.buildPlan()
	if err != nil {
		return nil, err
	}
	show := o.Progress && !o.Quiet
	if pr := newProgress(progressConfig{bar: show, lines: show, stderr: o.stderr, terminal: o.isTerminal,
		desc: "simulating", throttle: 100 * time.Millisecond, every: o.progressEvery}); pr != nil {
		p.Progress, p.Note = pr.set, pr.note
		defer pr.finish()
	}
	return planner.Solve(ctx, p)
}

// summaryWidth is the column the summary's sentences wrap at, and
// tableWidth the widest its table may be without --wide: a terminal of
// about 120 columns shows both unbroken.
const (
	summaryWidth = 110
	tableWidth   = 120
)

// writePlanSummary prints the answer (with the sentence that reconciles
// the rule of thumb when the farm it names is over it) and the workload it
// assumed, one line per candidate within tableWidth columns (wide: every
// column, however wide), what a candidate misses where it stops meeting
// the targets and in which run of the band, what the routings, the band
// and the verdicts mean in plain words, and the sentence that reconciles
// the rule of thumb with the simulation. Sentences wrap at summaryWidth.
func writePlanSummary(w io.Writer, res *planner.Result, reportPath string, wide bool) error {
	var b bytes.Buffer
	para := func(sentences ...string) {
		var nonEmpty []string
		for _, s := range sentences {
			if s != "" {
				nonEmpty = append(nonEmpty, s)
			}
		}
		if len(nonEmpty) > 0 {
			b.WriteString(wrapText(strings.Join(nonEmpty, " "), summaryWidth))
		}
	}
	para(res.Answer)
	if bc := res.BuyerCheck; bc != nil {
		fmt.Fprintln(&b)
		para(bc.Lead())
		for i, st := range bc.Steps {
			why := wrapText(fmt.Sprintf("%d. %s", i+1, st.Why), summaryWidth-3)
			b.WriteString(strings.ReplaceAll(strings.TrimSuffix(why, "\n"), "\n", "\n   ") + "\n")
			if st.Command != "" {
				b.WriteString(wrapCommand(st.Command, summaryWidth, "   "))
			}
		}
		para("Then " + bc.Then)
		para(bc.Margin)
	}
	if wl := res.Workload.WorkloadLine(); wl != "" {
		fmt.Fprintln(&b)
		para(wl)
	}
	fmt.Fprintln(&b)
	table, cliffs, err := planTable(res, wide)
	if err != nil {
		return err
	}
	b.WriteString(table)
	if len(cliffs) > 0 {
		fmt.Fprintln(&b)
		for _, c := range cliffs {
			para(c)
		}
	}
	fmt.Fprintln(&b)
	for _, r := range res.RoutingWords() {
		para(r)
	}
	if band := res.BandWords(); band != "" {
		para("[band]: " + band)
	}
	para(res.SkipNote()) // what was not simulated, and why ("" for none)
	para("verdict: " + verdictRule(res))
	upTo := "up to: the most sessions at which the band's worst run still meets every target (bisected)"
	if wide {
		upTo += "; misses at: the next"
	}
	para(upTo + "; demand/KV: the rule of thumb, sessions x typical context over the farm's KV cache (over 100 % is over, " +
		"yet a farm over it can meet the targets: the simulation decides).")
	if res.CostUnit == "cards" {
		para(`cheapest by card count: one GPU kind, so the same order as by money (give --price "GPU=per GPU-hour,..." to see costs)`)
	} else if w := res.PricesWords(); w != "" {
		para(w)
	}
	if res.Reconcile != "" {
		fmt.Fprintln(&b)
		para(res.Reconcile)
	}
	for i := range res.Candidates {
		if c := &res.Candidates[i]; !c.Fits {
			fmt.Fprintln(&b)
			para(c.Name + ": " + c.Error)
		}
	}
	if ob := res.Observation; ob != nil {
		fmt.Fprintf(&b, "\nprediction vs observation (%s, %s over %s):\n", ob.Source, ob.Strategy, ob.End.Sub(ob.Start))
		if err := calibrate.WriteComparisons(&b, ob.KPIs); err != nil {
			return err
		}
	}
	if reportPath != "" {
		fmt.Fprintf(&b, "\nreport: %s\n", reportPath)
	}
	_, err = w.Write(b.Bytes())
	return err
}

// Columns of the summary's table that its default view may leave out.
const (
	colPer1k    = "per 1k turns"
	colMissesAt = "misses at"
	colRouting  = "routing"
)

// planTable is the summary's table, one line per candidate, and the
// sentences that say what each candidate misses where it stops meeting the
// targets. Wide keeps every column; else "misses at" is left out (the
// cliffs below say it), then, while a line is wider than tableWidth, the
// columns planTable's steps name.
func planTable(res *planner.Result, wide bool) (string, []string, error) {
	at := planner.Level(res.Sessions, res.Concurrency)
	priced := res.CostUnit != "cards"
	header := []string{"candidate"}
	if priced {
		header = append(header, "cost/h", colPer1k)
	}
	header = append(header, colRouting, "verdict", "TTFB p95 s [band]", "hit % [band]", "up to", colMissesAt, "demand/KV", "")
	col := func(name string) int { return slices.Index(header, name) }
	var rows [][]string
	var routings, labels, cliffs []string
	for i := range res.Candidates {
		c := &res.Candidates[i]
		row := make([]string, len(header))
		for j := range row {
			row[j] = "-"
		}
		row[0], row[len(row)-1] = c.Name, ""
		switch i {
		case res.Best:
			row[len(row)-1] = "<- answer"
		case res.Closest:
			row[len(row)-1] = "<- closest"
		}
		if priced {
			row[col("cost/h")] = strconv.FormatFloat(c.Cost, 'f', 2, 64)
			if c.CostPer1kTurns != nil {
				row[col(colPer1k)] = fmtFloat(float64(*c.CostPer1kTurns), 3)
			}
		}
		if !c.Fits {
			row[col("verdict")] = "does not fit"
			rows = append(rows, row)
			continue
		}
		if c.NotSimulated != "" {
			row[col("verdict")] = "not simulated"
			row[col("demand/KV")] = fmt.Sprintf("%.0f %%", 100*c.RuleOfThumb.Ratio)
			rows = append(rows, row)
			continue
		}
		cfg := &c.Configs[c.Chosen]
		r := &cfg.Rows[at]
		verdict := c.Verdict
		if verdict == "" {
			verdict = map[bool]string{true: "meets", false: "misses"}[c.Meets]
		}
		p95, hit := fmtFloat(float64(r.TTFBP95), 2), fmtFloat(float64(r.PrefixHitPct), 1)
		if k := c.KPIs; k != nil && k.Runs > 1 {
			p95 += " [" + fmtSpan(k.TTFBP95, 2) + "]"
			hit += " [" + fmtSpan(k.PrefixHitPct, 1) + "]"
		}
		upTo := "-"
		if c.MaxSessions > 0 {
			upTo = strconv.Itoa(c.MaxSessions)
			if c.FailsAt == 0 {
				upTo = ">= " + upTo
			}
		}
		if c.FailsAt > 0 {
			row[col(colMissesAt)] = strconv.Itoa(c.FailsAt)
			if len(c.FailsAtMisses) > 0 {
				cliffs = append(cliffs, fmt.Sprintf("%s at %d sessions misses %s.", c.Name, c.FailsAt, res.BandMisses(c.FailsAtMisses)))
			}
		}
		row[col(colRouting)] = cfg.Label()
		routings = append(routings, c.Name+": "+cfg.Label())
		labels = append(labels, cfg.Label())
		row[col("verdict")], row[col("TTFB p95 s [band]")], row[col("hit % [band]")] = verdict, p95, hit
		row[col("up to")], row[col("demand/KV")] = upTo, fmt.Sprintf("%.0f %%", 100*c.RuleOfThumb.Ratio)
		rows = append(rows, row)
	}
	drop := map[string]bool{}
	if !wide {
		drop[colMissesAt] = true
	}
	text, err := renderTable(header, rows, drop)
	if err != nil || wide || textWidth(text) <= tableWidth {
		return text, cliffs, err
	}
	// Leave out, one after the other until the table fits: the routing when
	// every candidate has the same (said once under the table), the cost per
	// 1,000 turns, the band's brackets (the nominal figure stays; the band is
	// in the report and with --wide), then the routing whatever it is.
	same := len(slices.Compact(slices.Clone(labels))) == 1
	steps := []func(){
		func() { drop[colRouting] = same },
		func() { drop[colPer1k] = true },
		func() {
			for _, name := range []string{"TTFB p95 s [band]", "hit % [band]"} {
				j := col(name)
				header[j] = strings.TrimSuffix(name, " [band]")
				for _, row := range rows {
					row[j], _, _ = strings.Cut(row[j], " [")
				}
			}
		},
		func() { drop[colRouting] = true },
	}
	for _, step := range steps {
		step()
		if text, err = renderTable(header, rows, drop); err != nil {
			return "", nil, err
		}
		if textWidth(text) <= tableWidth {
			break
		}
	}
	if !drop[colRouting] {
		return text, cliffs, nil
	}
	if same {
		return text + wrapText("routing: "+labels[0]+" for every candidate", summaryWidth), cliffs, nil
	}
	var b strings.Builder
	b.WriteString(text)
	for _, r := range routings {
		b.WriteString(wrapText("routing of "+r, summaryWidth))
	}
	return b.String(), cliffs, nil
}

// renderTable aligns the table's cells with two spaces between columns,
// leaving out the columns named in drop, with no padding after the last
// cell of a line.
func renderTable(header []string, rows [][]string, drop map[string]bool) (string, error) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	for _, row := range append([][]string{header}, rows...) {
		for j, cell := range row {
			if !drop[header[j]] {
				fmt.Fprint(tw, cell, "\t")
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return "", err
	}
	var b strings.Builder
	for line := range strings.Lines(buf.String()) {
		b.WriteString(strings.TrimRight(line, " \n") + "\n")
	}
	return b.String(), nil
}

// textWidth is the widest line of s, in characters.
func textWidth(s string) int {
	n := 0
	for line := range strings.Lines(s) {
		n = max(n, utf8.RuneCountInString(strings.TrimRight(line, "\n")))
	}
	return n
}

// wrapText breaks s into lines of at most width characters at spaces (a
// word longer than width, a path say, stands on a line of its own), each
// ending in a newline; its own newlines are kept.
func wrapText(s string, width int) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		n := 0
		var words []string
		for _, w := range strings.Fields(line) {
			if strings.HasPrefix(w, "%") && len(words) > 0 {
				words[len(words)-1] += " " + w // "5 %" stays on one line
				continue
			}
			words = append(words, w)
		}
		for _, word := range words {
			wl := utf8.RuneCountInString(word)
			switch {
			case n == 0:
			case n+1+wl > width:
				b.WriteByte('\n')
				n = 0
			default:
				b.WriteByte(' ')
				n++
			}
			b.WriteString(word)
			n += wl
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// wrapCommand writes a shell command indented, broken at spaces outside
// double quotes with a backslash at the end of each line but the last, so
// that it stays within width and still pastes into a shell as one command.
func wrapCommand(cmd string, width int, indent string) string {
	var words []string
	var cur strings.Builder
	quoted := false
	for _, r := range cmd {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case r == ' ' && !quoted:
			if cur.Len() > 0 {
				words = append(words, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		words = append(words, cur.String())
	}
	// A flag and its value stay on one line.
	for i := 0; i+1 < len(words); i++ {
		if strings.HasPrefix(words[i], "--") && !strings.Contains(words[i], "=") && !strings.HasPrefix(words[i+1], "-") {
			words = slices.Replace(words, i, i+2, words[i]+" "+words[i+1])
		}
	}
	var b strings.Builder
	line := indent
	for i, w := range words {
		switch {
		case i == 0:
			line += w
		case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(w)+2 > width:
			b.WriteString(line + " \\\n")
			line = indent + "  " + w
		default:
			line += " " + w
		}
	}
	b.WriteString(line + "\n")
	return b.String()
}

// fmtSpan writes a band's edges in ascending order, "2.90-3.60".
func fmtSpan(r planner.Range, d int) string {
	lo, hi := float64(r.Low), float64(r.High)
	if lo > hi {
		lo, hi = hi, lo
	}
	return fmtFloat(lo, d) + "-" + fmtFloat(hi, d)
}

// verdictRule says what the verdicts mean, with the plan's headroom.
func verdictRule(res *planner.Result) string {
	if res.HeadroomSessions == 0 {
		return "meets if the band's worst run meets every target, marginal if only the nominal run does, misses if that misses one."
	}
	n, h := res.Concurrency, res.HeadroomSessions
	return fmt.Sprintf("meets if the band's worst run meets every target at %d and, with %s %% headroom, at %d sessions; "+
		"marginal if only the nominal run does at %d, or the worst meets at %d but not at %d; misses if the nominal run misses one at %d.",
		n, strconv.FormatFloat(100*res.Headroom, 'f', -1, 64), h, n, n, h, n)
}

// joinAnd joins "a", "a and b", "a, b and c".
func joinAnd(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

// fmtFloat writes v with d decimals, "-" for NaN.
func fmtFloat(v float64, d int) string {
	if v != v {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', d, 64)
}
