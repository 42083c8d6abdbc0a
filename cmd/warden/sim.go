package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/examples"
	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// simOptions are the flags of `warden sim`.
// defaultMaxSimTime bounds a closed loop's simulated time by default: 24
// hours of the built-in farm take about 3 GB.
const defaultMaxSimTime = 24 * time.Hour

type simOptions struct {
	Farm       string
	Workload   string
	Strategies []string
	Sessions   []int
	Duration   time.Duration
	MaxSimTime time.Duration // the most simulated time a closed loop may take, steps together; 0: no bound
	Seed       uint64
	JSON       bool
	Progress   bool
	Quiet      bool // no progress lines

	Replicas int     // when given (changed), >= 1; else the farm's
	KVScale  float64 // when given (changed), in [0.1, 10]; else the farm's kv_capacity_scale
	GPU      string  // "": the farm's
	Spill    string  // "": the farm's

	Trace         string
	Speed         float64
	ClosedLoop    bool
	SessionReplay bool

	Requests string // per-request records (JSON lines), "": none

	Timeline   time.Duration // > 0: each strategy's run over time, a point every Timeline
	FreshSteps bool          // every step cuts and starts its sessions afresh, as warden bench --fresh-steps does

	// changed reports whether a flag was given on the command line.
	changed func(name string) bool
	// stderr receives the progress bar; isTerminal, when set, says whether
	// it is a terminal (tests).
	stderr     io.Writer
	isTerminal func() bool
	// progressEvery, when set, is the wall time between two progress
	// lines (tests); 0: every few seconds.
	progressEvery time.Duration
}

func newSimCmd() *cobra.Command {
	opts := &simOptions{}
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate a farm of vLLM replicas under agent sessions, strategy against strategy",
		Long: `Simulate a farm of vLLM data-parallel replicas (KV cache, prefix caching,
chunked prefill, preemption, a roofline step time) driven by synthetic agent
sessions in a closed loop, and compare placement strategies on it.

Each strategy runs on its own copy of the farm, from cold caches; the sessions
steps (--sessions) run back to back on the same warm replicas, --duration each,
moving to the next level starts (or retires) sessions while the others carry on.
With --fresh-steps each step instead cuts the requests in flight at its end and
the next starts all its sessions at once, as warden bench --fresh-steps does (to
compare with a warden bench run): sessions that start together on one
replica stay in step, and each of their first turns waits for another's
prefill, which lengthens the TTFB tail. A request still waiting for its first
token when a step closes counts in that step's TTFB with the wait it had
(censored); the end of the last step cuts requests (unfinished). The columns are the KPIs of
metrics/kpi.promql evaluated by PromQL over the simulated vLLM and warden
series, the same expressions that run against a real Prometheus.

Without --farm, sim runs the built-in example: 4 x RTX A4000 with Qwen3-4B,
vLLM's own balancer (least-loaded) against affinity. With two strategies every
column reads "first -> second".

With --trace, sim replays a trace file instead: at its recorded arrival times
(divided by --speed), or with --closed-loop as sessions in a closed loop
(concurrency from the trace header, or the first --sessions value), or with
--session-replay session by session: each session from its recorded start,
each later turn after the previous answer plus its recorded think time (what
warden tune replays a proxy's journal with). In a session replay the router is
told when each request starts and ends, as the proxy's is, so a conversation
holds KV headroom for its return timeout after a turn, and a first turn
refused for admission is sent again after the Retry-After, at most twice, as
the Anthropic and OpenAI SDKs do.`,
		Example: `  warden sim
  warden sim --farm examples/rtx5090-gemma3-27b-int4.yaml --sessions 13,26 --duration 10m
  warden sim --strategies hash,least-loaded,affinity --sessions 8,16 --json
  warden sim --replicas 3 --spill-threshold 4 --progress
  warden sim --trace agents.jsonl --speed 2
  warden sim --sessions 4,8 --duration 1m --requests requests.jsonl
  warden sim --sessions 16 --kv-scale 0.85
  warden sim --farm examples/h100-llama31-70b-tp4.yaml --workload claude-code --sessions 16   # presets: bench, claude-code, codex, 5090-farm
  warden sim --farm examples/rtx5090-gemma3-27b-int4.yaml --workload 5090-farm --sessions 26 \
      --strategies hash,affinity --duration 40m --timeline 5m   # hit %, KV and load per replica over time
  warden sim --sessions 4,8 --fresh-steps             # each step's sessions start together, as warden bench --fresh-steps runs them`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.changed, opts.stderr = cmd.Flags().Changed, cmd.ErrOrStderr()
			return runSim(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Farm, "farm", "", "farm spec YAML (default: the built-in 4 x RTX A4000 example)")
	f.StringVar(&opts.Workload, "workload", "", "a workload preset ("+strings.Join(traces.PresetNames(), ", ")+") or a workload YAML file; a name without a slash or an extension is a preset (default: bench, the product's agent sessions)")
	f.StringSliceVar(&opts.Strategies, "strategies", sim.DefaultStrategies, "strategies to compare: "+placement.OptionsHelp()+" (affinity+kv+priced+admit, affinity+kv+admit=30s, affinity+rehome)")
	f.IntSliceVar(&opts.Sessions, "sessions", sim.DefaultSessions, "concurrent sessions of each step")
	f.DurationVar(&opts.Duration, "duration", sim.DefaultDuration, "simulated time of each step, at least 1s (with --trace: default and 0 = to the end of the trace)")
	f.DurationVar(&opts.MaxSimTime, "max-sim-time", defaultMaxSimTime, "refuse more simulated time than this, steps together (memory grows with the requests simulated, ~13 KB each); 0: no bound")
	f.Uint64Var(&opts.Seed, "seed", 1, "seed of the synthetic sessions")
	f.BoolVar(&opts.JSON, "json", false, "print the results as JSON")
	f.BoolVar(&opts.Progress, "progress", false, "show a progress bar on stderr when it is a terminal (elsewhere a line every few seconds is written unless --quiet)")
	f.BoolVar(&opts.Quiet, "quiet", false, "no progress lines on stderr when it is not a terminal")
	f.IntVar(&opts.Replicas, "replicas", 0, "override the farm's number of replicas, >= 1 (default: the farm's)")
	f.Float64Var(&opts.KVScale, "kv-scale", 0, "scale the KV cache sized from hardware, in [0.1, 10], e.g. 0.85 for a cache 15% smaller than estimated (default: the farm's kv_capacity_scale)")
	f.StringVar(&opts.GPU, "gpu", "", "override the farm's GPU, a catalogue name (warden gpus --catalog; default: the farm's)")
	f.StringVar(&opts.Spill, "spill-threshold", "", "override the spill threshold: auto or a number of requests in flight")
	f.StringVar(&opts.Trace, "trace", "", "replay this trace file instead of synthetic sessions")
	f.Float64Var(&opts.Speed, "speed", 1, "replay speed-up of a trace's arrival times, > 0")
	f.BoolVar(&opts.ClosedLoop, "closed-loop", false, "replay the trace's sessions in a closed loop")
	f.BoolVar(&opts.SessionReplay, "session-replay", false, "replay the trace's sessions from their recorded starts, each turn after the previous answer and its think time")
	f.StringVar(&opts.Requests, "requests", "", "write one JSON line per request to this file (session, turn, step, replica, times, tokens, reason)")
	f.DurationVar(&opts.Timeline, "timeline", 0, "follow each strategy's run from its cold start, a point every DURATION (e.g. 5m): the prefix-cache hit rate and each replica's KV-cache usage and requests in flight over time (text, JSON, and charts in warden report)")
	f.BoolVar(&opts.FreshSteps, "fresh-steps", false, "cut each step at its end and start the next step's sessions all at once, as warden bench --fresh-steps does (default: the load carries on from step to step, as warden bench runs it)")
	return cmd
}

// experiment builds the experiment the options describe.
func (o *simOptions) experiment() (sim.Experiment, error) {
	changed := o.changed
	if changed == nil {
		changed = func(string) bool { return false }
	}
	var e sim.Experiment
	// A flag given is used as given: 0 is not "no override" (the farm's
	// value is what an absent flag means).
	setReplicas, setKVScale := changed("replicas") || o.Replicas != 0, changed("kv-scale") || o.KVScale != 0
	if setReplicas && o.Replicas < 1 {
		return e, fmt.Errorf("--replicas %d: want >= 1 (leave the flag out for the farm's replicas)", o.Replicas)
	}
	if setKVScale && !(o.KVScale >= 0.1 && o.KVScale <= 10) {
		return e, fmt.Errorf("--kv-scale %g: want a factor in [0.1, 10], e.g. 0.85 or 1.1 (leave the flag out for the farm's)", o.KVScale)
	}
	// The GPU override is the flag's, not the farm file's: its errors name
	// the flag.
	if o.GPU == "auto" {
		if gpus, err := hardware.Probe(); err != nil || len(gpus) == 0 {
			return e, fmt.Errorf("--gpu auto: reading the local GPU: %v", cmp.Or(err, errors.New("NVML reports no GPU")))
		}
	} else if o.GPU != "" {
		if _, err := hardware.LookupGPU(o.GPU); err != nil {
			return e, fmt.Errorf("--gpu: %w", err)
		}
	}
	if o.Trace == "" && o.Duration == 0 {
		return e, errors.New("--duration 0: want the simulated time of each step, at least 1s (0 means \"to the end of the trace\" only with --trace)")
	}
	if total := o.Duration * time.Duration(max(len(o.Sessions), 1)); o.Trace == "" && o.MaxSimTime > 0 && total > o.MaxSimTime {
		return e, fmt.Errorf("--duration %s x %d steps is %s of simulated time, over --max-sim-time %s: the simulator's memory grows with the requests it simulates (~13 KB each: it remembers every block ever cached, to classify misses), about 130 MB per simulated hour at 8 sessions on 4 replicas and more with more sessions, so this could take gigabytes; shorten --duration, or raise --max-sim-time if the machine has the memory",
			o.Duration, max(len(o.Sessions), 1), total, o.MaxSimTime)
	}
	if changed("speed") && !(o.Speed > 0) {
		return e, fmt.Errorf("--speed %g: want a speed-up > 0, e.g. 2 to replay twice as fast", o.Speed)
	}
	data, name := examples.Default, examples.DefaultName
	if o.Farm != "" {
		var err error
		if data, err = os.ReadFile(o.Farm); err != nil {
			return e, err
		}
		name = o.Farm
	}
	farm, err := sim.ParseFarmWith(data, name, func(s *sim.FarmSpec) {
		if setReplicas {
			s.Replicas = o.Replicas
		}
		if o.GPU != "" {
			s.GPU = o.GPU
		}
		if setKVScale {
			s.KVCapacityScale = o.KVScale
		}
	})
	if err != nil {
		return e, err
	}
	if o.Timeline < 0 || (o.Timeline > 0 && o.Timeline < time.Duration(farm.Spec.ScrapeInterval)) {
		return e, fmt.Errorf("--timeline %s: want a resolution of at least the farm's scrape interval (%s), e.g. 1m", o.Timeline, time.Duration(farm.Spec.ScrapeInterval))
	}
	strategies, err := placement.ExpandSpecs(o.Strategies)
	if err != nil {
		return e, fmt.Errorf("--strategies: %w", err)
	}
	e = sim.Experiment{Farm: farm, Strategies: strategies, Sessions: o.Sessions, Duration: o.Duration, Seed: o.Seed, TimelineStep: o.Timeline, FreshSteps: o.FreshSteps}
	if o.Spill != "" {
		t, err := placement.ParseSpillThreshold(o.Spill)
		if err != nil {
			return e, fmt.Errorf("--spill-threshold: %w", err)
		}
		e.Spill = &t
	}
	if o.Workload != "" {
		if e.Workload, err = traces.LoadWorkloadRef(o.Workload); err != nil {
			return e, err
		}
	}
	if o.Trace != "" {
		if o.ClosedLoop && o.SessionReplay {
			return e, errors.New("--closed-loop and --session-replay: give one (a closed loop of the trace's sessions, or each from its recorded start)")
		}
		// Everything the loader allocates is kept (the requests and their
		// hash ids) but its line buffers, recycled: collecting as the heap
		// grows from nothing only re-marks it, at 4, 5, 9, 15, 28 MB. At
		// GOGC 800 the first collection waits for 32 MB (the runtime's
		// 4 MB minimum heap scales with GOGC) and the heap may reach 9
		// times what is live, which only the lines encoding/json decodes
		// (another spelling, floats) leave garbage for.
		gc := debug.SetGCPercent(800)
		e.Trace, err = sim.LoadTrace(o.Trace)
		debug.SetGCPercent(gc)
		if err != nil {
			return e, err
		}
		e.Speed, e.ClosedLoop, e.SessionReplay = o.Speed, o.ClosedLoop, o.SessionReplay
		if !changed("duration") {
			e.Duration = 0 // to the end of the trace
		}
		if !changed("sessions") {
			e.Sessions = nil // the trace header's concurrency
			if o.ClosedLoop && e.Trace.Header.Concurrency == 0 {
				return e, errors.New("--closed-loop: the trace header gives no concurrency; set --sessions")
			}
		}
	} else if changed("speed") || changed("closed-loop") || o.SessionReplay {
		return e, errors.New("--speed, --closed-loop and --session-replay need --trace")
	}
	return e, nil
}

func runSim(ctx context.Context, o *simOptions, out io.Writer) error {
	if err := checkOutPath("--requests", o.Requests); err != nil {
		return err
	}
	e, err := o.experiment()
	if err != nil {
		return err
	}
	// Lines unless --quiet or --progress=false: a long run is not silent
	// in a log.
	lines := !o.Quiet && (o.changed == nil || !o.changed("progress") || o.Progress)
	if pr := newProgress(progressConfig{bar: o.Progress && !o.Quiet, lines: lines, stderr: o.stderr, terminal: o.isTerminal,
		desc: "simulating", throttle: 100 * time.Millisecond, every: o.progressEvery}); pr != nil {
		e.Progress = pr.set
		defer pr.finish()
	}
	var reqs bytes.Buffer
	if o.Requests != "" {
		e.Requests = &reqs
	}
	rep, err := sim.Run(ctx, e)
	if err != nil {
		return err
	}
	if o.Requests != "" {
		if err := writeOutFile(o.Requests, reqs.Bytes()); err != nil {
			return fmt.Errorf("--requests: %w", err)
		}
	}
	if o.JSON {
		return writeJSON(out, rep)
	}
	f := e.Farm
	load := fmt.Sprintf("%s per step, seed %d", e.Duration, e.Seed)
	if e.Trace != nil {
		load = "replay of " + e.Trace.Name
	}
	replicas := "replicas"
	if f.Spec.Replicas == 1 {
		replicas = "replica"
	}
	if _, err := fmt.Fprintf(out, "%d %s x %d x %s, %s, vLLM %s: %d KV blocks of %d tokens per replica (%d tokens), max_num_seqs %d; %s\n",
		f.Spec.Replicas, replicas, f.Spec.TensorParallelSize, f.GPU.Name, f.Model.Name, sim.VLLMRelease(f.Behaviour.Version), f.NumGPUBlocks, f.Spec.VLLM.BlockSize,
		f.NumGPUBlocks*f.Spec.VLLM.BlockSize, f.Spec.VLLM.MaxNumSeqs, load); err != nil { // blocks x block size, as warden kv and vLLM's log say
		return err
	}
	return rep.WriteText(out)
}
