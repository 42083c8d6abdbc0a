package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/calibrate"
	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/web"
)

// planOptions are the flags of `warden plan`.
type planOptions struct {
	PlanFile string

	GPUs               []string
	Replicas           []int
	TensorParallelSize []int
	Model              string
	MaxNumSeqs         int

	Sessions    []int
	Concurrency int
	Duration    time.Duration
	Strategies  []string
	Spills      []string
	Seed        uint64

	TargetTTFBP95         time.Duration
	TargetHitPct          float64
	TargetOutputTokensMin float64
	TargetSessionsPerHour float64

	Out         string
	JSON        bool
	Progress    bool
	Parallelism int

	prom planPromOptions // --prometheus mode (plan_observed.go)

	// changed reports whether a flag was given on the command line (flags
	// given override a plan file's values).
	changed func(name string) bool
	// stderr receives the progress bar; isTerminal, when set, says whether
	// it is a terminal (tests).
	stderr     io.Writer
	isTerminal func() bool
}

func newPlanCmd() *cobra.Command {
	opts := &planOptions{}
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Find the cheapest farm and routing that meet service targets (writes an HTML report)",
		Long: `Answer "how many cards, of which kind, and which routing, for N agent sessions?"

plan simulates every candidate farm (GPU kinds x replica counts x tensor parallel
sizes) with every strategy and spill threshold at every sessions level, checks the
service targets on each step, and prints the cheapest farm that meets them at the
wanted concurrency (--concurrency, default the highest --sessions level), with the
routing to run it with. Cost is the sum of per-GPU hourly prices given in a plan
file, else the card count. For each candidate it also gives the sessions level at
which it stops meeting the targets and the rule-of-thumb check (sessions x typical
context against the farm's KV cache). When no candidate meets the targets, it
names the closest one. A model that does not fit on a candidate is reported, not
dropped.

Candidates come from a YAML plan file (--plan; see planner/examples/default.yaml)
or from --gpu, --replicas and --model. With neither, plan runs the built-in
example: RTX A4000 farms of 2, 3 and 4 cards for 16 Qwen3-4B agent sessions.
Flags given with --plan override the file's values.

The self-contained HTML report goes to --out; --json prints the result as JSON,
which 'warden report --from' renders again. A progress bar is drawn on stderr when
it is a terminal.`,
		Example: `  warden plan                                   # the built-in example; writes plan-report.html
  warden plan --gpu "RTX A4000,RTX 4090" --replicas 2,3,4 --model Qwen/Qwen3-4B-Instruct-2507 \
      --sessions 4,8,16 --target-ttfb-p95 10s --target-hit-pct 80
  warden plan --gpu h100 --replicas 1,2 --tensor-parallel-size 4 --model llama-3.1-70b --sessions 32,64
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
	f.StringSliceVar(&opts.GPUs, "gpu", nil, `candidate GPU kinds, comma-separated catalogue names or aliases ("RTX A4000,h100")`)
	f.IntSliceVar(&opts.Replicas, "replicas", []int{1, 2, 3, 4}, "candidate replica counts (with --gpu)")
	f.IntSliceVar(&opts.TensorParallelSize, "tensor-parallel-size", []int{1}, "candidate tensor parallel sizes, GPUs per replica (with --gpu)")
	f.StringVar(&opts.Model, "model", "", "model name or alias from the catalogue (with --gpu)")
	f.IntVar(&opts.MaxNumSeqs, "max-num-seqs", 0, "vLLM max_num_seqs per replica (with --gpu; 0: vLLM's default)")
	f.IntSliceVar(&opts.Sessions, "sessions", planner.DefaultSessions, "concurrent sessions levels to simulate")
	f.IntVar(&opts.Concurrency, "concurrency", 0, "concurrent sessions the answer is for (0: the highest --sessions level)")
	f.DurationVar(&opts.Duration, "duration", planner.DefaultDuration, "simulated time of one sessions level")
	f.StringSliceVar(&opts.Strategies, "strategies", planner.DefaultStrategies, "strategies to try: hash, least-loaded, affinity")
	f.StringSliceVar(&opts.Spills, "spill-thresholds", []string{"auto"}, "affinity spill thresholds to try: auto or requests in flight")
	f.Uint64Var(&opts.Seed, "seed", 1, "seed of the synthetic sessions")
	f.DurationVar(&opts.TargetTTFBP95, "target-ttfb-p95", 10*time.Second, "target: TTFB p95 at most this (0: none)")
	f.Float64Var(&opts.TargetHitPct, "target-hit-pct", 80, "target: prefix-cache hit rate at least this many % (0: none)")
	f.Float64Var(&opts.TargetOutputTokensMin, "target-output-tokens-per-min", 0, "target: output tokens per minute at least this (0: none)")
	f.Float64Var(&opts.TargetSessionsPerHour, "target-sessions-per-hour", 0, "target: sessions completed per hour at least this (0: none)")
	f.StringVar(&opts.Out, "out", "plan-report.html", `HTML report file ("" for none)`)
	f.BoolVar(&opts.JSON, "json", false, "print the result as JSON (what 'warden report --from' reads) instead of the summary")
	f.BoolVar(&opts.Progress, "progress", true, "draw a progress bar on stderr (only when stderr is a terminal)")
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
		p, err = planner.LoadPlan(o.PlanFile)
	case len(o.GPUs) > 0:
		if o.Model == "" {
			return p, errors.New("--gpu needs --model (the model every candidate serves)")
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
			if o.changed != nil && o.changed(name) {
				return p, fmt.Errorf("--%s needs --gpu", name)
			}
		}
		p, err = planner.ParsePlan(planner.DefaultPlan, planner.DefaultPlanName)
	}
	if err != nil {
		return p, err
	}
	if changed("sessions") {
		p.Sessions = o.Sessions
	}
	if changed("concurrency") {
		p.Concurrency = o.Concurrency
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
	p.Parallelism = o.Parallelism
	return p, nil
}

func runPlan(ctx context.Context, o *planOptions, out io.Writer) error {
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
	if o.Out != "" {
		if err := writeReport(o.Out, web.PlanReport(res)); err != nil {
			return err
		}
	}
	if o.JSON {
		return writeJSON(out, res)
	}
	return writePlanSummary(out, res, o.Out)
}

// solve is plan's usual mode: a plan file, the flags or the example.
func (o *planOptions) solve(ctx context.Context) (*planner.Result, error) {
	p, err := o.buildPlan()
	if err != nil {
		return nil, err
	}
	if bar := newProgressBar(o.Progress, o.stderr, o.isTerminal, "simulating", 100*time.Millisecond); bar != nil {
		p.Progress = bar.set
		defer bar.finish()
	}
	return planner.Solve(ctx, p)
}

// writePlanSummary prints the answer and one line per candidate.
func writePlanSummary(w io.Writer, res *planner.Result, reportPath string) error {
	var b bytes.Buffer
	fmt.Fprintln(&b, res.Answer)
	fmt.Fprintln(&b)
	at := planner.Level(res.Sessions, res.Concurrency)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	cost := "cards"
	if res.CostUnit != "cards" {
		cost = "cost " + res.CostUnit
	}
	fmt.Fprintf(tw, "candidate\t%s\trouting\tmeets\tTTFB p95 s\thit %%\tmeets up to\tsessions x context / KV\t\n", cost)
	for i := range res.Candidates {
		c := &res.Candidates[i]
		mark := ""
		switch i {
		case res.Best:
			mark = "  <- answer"
		case res.Closest:
			mark = "  <- closest"
		}
		costCell := strconv.Itoa(c.Cards)
		if res.CostUnit != "cards" {
			costCell = strconv.FormatFloat(c.Cost, 'f', 2, 64)
		}
		if !c.Fits {
			fmt.Fprintf(tw, "%s\t%s\tdoes not fit\t-\t-\t-\t-\t-\t\n", c.Name, costCell)
			continue
		}
		cfg := &c.Configs[c.Chosen]
		row := &cfg.Rows[at]
		meets := "no"
		if c.Meets {
			meets = "yes"
		}
		upTo := "-"
		if c.MaxSessions > 0 {
			upTo = strconv.Itoa(c.MaxSessions)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f %%\t%s\n", c.Name, costCell, cfg.Label(), meets,
			fmtFloat(float64(row.TTFBP95), 2), fmtFloat(float64(row.PrefixHitPct), 1), upTo, 100*c.RuleOfThumb.Ratio, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i := range res.Candidates {
		if c := &res.Candidates[i]; !c.Fits {
			fmt.Fprintf(&b, "\n%s: %s", c.Name, c.Error)
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
	_, err := w.Write(b.Bytes())
	return err
}

// fmtFloat writes v with d decimals, "-" for NaN.
func fmtFloat(v float64, d int) string {
	if v != v {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', d, 64)
}
