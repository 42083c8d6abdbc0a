package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

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
The routers people run instead (llm-d, dynamo, sglang, ...: warden sim --help)
are strategies too. With two strategies or more the summary and the report
give a card per routing: each one's cheapest farm that meets the targets.

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
  warden plan --strategies llm-d,dynamo,affinity  # a card per routing: with llm-d, how many cards?
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
	p, changed, err := o.basePlan()
	if err != nil {
		return p, err
	}
	if err := o.checkFlags(changed); err != nil {
		return p, err
	}
	return o.applyFlags(p, changed)
}

// basePlan is the plan before the flags apply: the file, the --gpu flags
// or the built-in example, with whether each flag is to override it (for a
// --gpu plan every one is: each setting comes from its flag).
func (o *planOptions) basePlan() (planner.Plan, func(string) bool, error) {
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
			return p, nil, errors.New("--gpu needs --model (the model every candidate serves)")
		}
		for _, g := range o.GPUs {
			if _, err := hardware.LookupGPU(g); err != nil {
				return p, nil, fmt.Errorf("--gpu: %w", err)
			}
		}
		if _, err := hardware.LookupModel(o.Model); err != nil {
			return p, nil, fmt.Errorf("--model: %w", err)
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
				return p, nil, fmt.Errorf("--%s needs --gpu", name)
			}
		}
		p, err = planner.ParsePlan(planner.DefaultPlan, planner.DefaultPlanName)
	}
	return p, changed, err
}

// applyFlags applies to p the flags that override it (changed) and those
// that set every candidate (--vllm-version, the dtypes, --price,
// --workload).
func (o *planOptions) applyFlags(p planner.Plan, changed func(string) bool) (planner.Plan, error) {
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
	return res.WriteText(out, planner.TextOptions{Report: o.Out, Wide: o.Wide})
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
