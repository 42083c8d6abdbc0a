package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/traces"
)

func newTraceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Inspect, import and synthesise request traces",
		Long: `Traces are JSONL files of requests with their prefix structure (traces/FORMAT.md).
They replay in the simulator: warden sim --trace FILE.`,
		Example: `  warden trace synth --sessions 8 --duration 3m agents.jsonl
  warden trace import --from mooncake conversation_trace.jsonl mooncake.jsonl.gz
  warden trace stats mooncake.jsonl.gz`,
	}
	cmd.AddCommand(newTraceStatsCmd(), newTraceImportCmd(), newTraceSynthCmd())
	return cmd
}

// traceStatsOptions are the flags of `warden trace stats`.
type traceStatsOptions struct {
	File       string
	JSON       bool
	SkipBad    bool
	SessionTTL time.Duration
}

func newTraceStatsCmd() *cobra.Command {
	opts := traceStatsOptions{SessionTTL: traces.DefaultStatsOptions().SessionTTL}
	cmd := &cobra.Command{
		Use:   "stats FILE",
		Short: "Summarise a trace: sessions, context lengths, prefix reuse, working set",
		Long: `Stats streams a trace (plain or gzip; - is stdin) and prints its requests, sessions,
turns per session, context length percentiles, tokens per minute, the upper bound
of the prefix-cache hit rate with an infinite cache (reused full blocks / all full
blocks), and the working set (active sessions x their context, sampled each minute)
to hold against a farm's KV capacity.`,
		Example: `  warden trace stats agents.jsonl
  warden trace stats --json mooncake.jsonl.gz | jq .reuse_upper_bound_pct`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.File = args[0]
			return runTraceStats(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&opts.JSON, "json", false, "print JSON")
	f.BoolVar(&opts.SkipBad, "skip-bad", false, "skip bad lines (counted) instead of stopping at the first")
	f.DurationVar(&opts.SessionTTL, "session-ttl", opts.SessionTTL, "a session stays in the working set this long after its latest request (synthetic traces run on an estimated 1 s per turn clock: use a few seconds)")
	return cmd
}

func runTraceStats(_ context.Context, opts traceStatsOptions, out io.Writer) error {
	r, err := traces.Open(opts.File, traces.ReaderOptions{SkipBad: opts.SkipBad})
	if err != nil {
		return err
	}
	defer r.Close()
	so := traces.DefaultStatsOptions()
	so.SessionTTL = opts.SessionTTL
	st, err := traces.StatsWithOptions(r, so)
	if err != nil {
		return err
	}
	if opts.JSON {
		return writeJSON(out, st)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "requests\t%d\n", st.Requests)
	fmt.Fprintf(tw, "sessions\t%d\t(turns per session p50 %d, max %d)\n", st.Sessions, st.TurnsPerSessionP50, st.TurnsPerSessionMax)
	fmt.Fprintf(tw, "duration\t%.1f s\n", st.DurationS)
	fmt.Fprintf(tw, "context tokens\tp50 %d\tp90 %d, p99 %d, max %d\n", st.ContextTokensP50, st.ContextTokensP90, st.ContextTokensP99, st.ContextTokensMax)
	fmt.Fprintf(tw, "tokens per minute\tprompt %.0f\toutput %.0f\n", st.PromptTokensPerMin, st.OutputTokensPerMin)
	fmt.Fprintf(tw, "reuse upper bound\t%.1f %%\tof full %d-token blocks (%.1f %% of prompt tokens), infinite cache\n", st.ReuseUpperBoundPct, st.BlockSize, st.ReuseUpperBoundTokenPct)
	fmt.Fprintf(tw, "working set\tp50 %d\tmax %d tokens (active sessions p50 %d, max %d; TTL %s, %d samples)\n",
		st.WorkingSetTokensP50, st.WorkingSetTokensMax, st.ActiveSessionsP50, st.ActiveSessionsMax, opts.SessionTTL, st.WorkingSetSamples)
	if st.Skipped > 0 {
		fmt.Fprintf(tw, "skipped lines\t%d\n", st.Skipped)
	}
	return tw.Flush()
}

// traceImportOptions are the flags of `warden trace import`.
type traceImportOptions struct {
	From      string
	BlockSize int
	SkipBad   bool
	In, Out   string
	// Log receives the summary line (stderr: OUT may be stdout).
	Log io.Writer
}

func newTraceImportCmd() *cobra.Command {
	opts := traceImportOptions{BlockSize: 16}
	cmd := &cobra.Command{
		Use:   "import --from mooncake|bailian|azure IN OUT",
		Short: "Convert a public trace into warden's trace format",
		Long: `Import converts a public trace into warden's format (traces/FORMAT.md):

  mooncake  Mooncake JSONL; each 512-token hash id expands into chained blocks of
            --block-size; sessions are inferred from prefix chains.
  bailian   Alibaba Bailian usage traces; chat_id / parent_chat_id chains give sessions.
  azure     Azure LLM inference CSV (TIMESTAMP,ContextTokens,GeneratedTokens); no prefix
            information: every prompt is unique and its own session.

IN may be gzip-compressed; - is stdin. OUT ending in .gz is compressed; - is stdout.`,
		Example: `  warden trace import --from mooncake conversation_trace.jsonl mooncake.jsonl
  warden trace import --from azure --skip-bad AzureLLMInferenceTrace_conv.csv azure.jsonl.gz`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.In, opts.Out = args[0], args[1]
			opts.Log = cmd.ErrOrStderr()
			return runTraceImport(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.From, "from", "", "source format: "+strings.Join(traces.Importers, ", "))
	f.IntVar(&opts.BlockSize, "block-size", opts.BlockSize, "tokens per block of the written trace (vLLM's block_size)")
	f.BoolVar(&opts.SkipBad, "skip-bad", false, "skip bad input lines (counted) instead of stopping at the first")
	_ = cmd.MarkFlagRequired("from")
	return cmd
}

// runTraceImport writes the trace to opts.Out (out when it is "-").
func runTraceImport(_ context.Context, opts traceImportOptions, out io.Writer) error {
	if !slices.Contains(traces.Importers, opts.From) {
		return fmt.Errorf("--from %q: want one of %s", opts.From, strings.Join(traces.Importers, ", "))
	}
	if opts.BlockSize < 1 {
		return fmt.Errorf("--block-size %d: must be >= 1", opts.BlockSize)
	}
	var in io.Reader = os.Stdin
	if opts.In != "-" {
		f, err := os.Open(opts.In)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	h := traces.Header{BlockSize: opts.BlockSize, Source: opts.From + ":" + filepath.Base(opts.In), CreatedBy: "warden " + version}
	var res traces.ImportResult
	err := writeTrace(opts.Out, h, out, func(w *traces.Writer) error {
		var err error
		res, err = traces.Import(opts.From, in, opts.In, w, traces.ImportOptions{BlockSize: opts.BlockSize, SkipBad: opts.SkipBad})
		return err
	})
	if err != nil {
		return err
	}
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "imported %d requests in %d sessions from %s (%s), %d bad lines skipped\n",
			res.Requests, res.Sessions, opts.In, opts.From, res.Skipped)
	}
	return nil
}

// writeTrace writes a trace to path ("-": stdout) with fill. A file is
// written under a temporary name beside path and renamed to it only once
// fill and the close succeed: a failed run leaves no file (a header-only
// one would pass for an empty trace) and an existing path as it was.
func writeTrace(path string, h traces.Header, stdout io.Writer, fill func(*traces.Writer) error) error {
	if path == "-" {
		w := traces.NewWriter(stdout, h)
		err := fill(w)
		return errors.Join(err, w.Close())
	}
	dir, base := filepath.Split(path)
	gz := ""
	if strings.HasSuffix(base, ".gz") {
		gz = ".gz" // traces.Create compresses by the name's suffix
	}
	tmp, err := os.CreateTemp(dir, "."+strings.TrimSuffix(base, gz)+".partial-*"+gz)
	if err != nil {
		return err
	}
	name := tmp.Name()
	if err := tmp.Close(); err != nil {
		return errors.Join(err, os.Remove(name))
	}
	w, err := traces.Create(name, h)
	if err != nil {
		return errors.Join(err, os.Remove(name))
	}
	if err := errors.Join(fill(w), w.Close()); err != nil {
		return errors.Join(err, os.Remove(name))
	}
	if err := os.Rename(name, path); err != nil {
		return errors.Join(err, os.Remove(name))
	}
	return nil
}

// traceSynthOptions are the flags of `warden trace synth`.
type traceSynthOptions struct {
	Sessions    int
	Duration    time.Duration
	Workload    string
	Seed        uint64
	BlockSize   int
	MinTurnTime time.Duration
	Out         string
}

func newTraceSynthCmd() *cobra.Command {
	opts := traceSynthOptions{Sessions: 8, Duration: 3 * time.Minute, Seed: 1, BlockSize: 16, MinTurnTime: time.Second}
	cmd := &cobra.Command{
		Use:   "synth --sessions N --duration D OUT",
		Short: "Write synthetic agent sessions to a trace file",
		Long: `Synth writes the sessions that the simulator's synthetic workload would run with N
concurrent closed-loop sessions for D, in the order a closed loop starts them.

It cannot know how fast a farm answers, so it writes enough sessions for turns as
short as --min-turn-time plus the workload's think time: a closed-loop replay of D
with N sessions cannot run out. Arrival times are estimates on that same clock
(session k of each round starts (k/N) x turn time after the round); they are in
order, and sessions first appear in generation order. The header records N as
the trace's concurrency. --sessions counts top-level sessions; subagents follow
their parent.`,
		Example: `  warden trace synth --sessions 8 --duration 3m agents.jsonl
  warden trace synth --sessions 32 --duration 1h --workload agents.yaml --seed 7 big.jsonl.gz`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Out = args[0]
			return runTraceSynth(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Sessions, "sessions", opts.Sessions, "concurrent closed-loop sessions")
	f.DurationVar(&opts.Duration, "duration", opts.Duration, "how long the replay runs")
	f.StringVar(&opts.Workload, "workload", "", "workload YAML (default: the built-in agent shape)")
	f.Uint64Var(&opts.Seed, "seed", opts.Seed, "random seed")
	f.IntVar(&opts.BlockSize, "block-size", opts.BlockSize, "tokens per block (vLLM's block_size)")
	f.DurationVar(&opts.MinTurnTime, "min-turn-time", opts.MinTurnTime, "lower bound of one turn's service time, for the session count")
	return cmd
}

// synthPlan is how many sessions synth writes and on what clock.
type synthPlan struct {
	perTurnMs int64 // estimated time of one turn: min turn time + think time
	roundMs   int64 // one round of N sessions
	rounds    int
}

func planSynth(opts traceSynthOptions, w traces.Workload) synthPlan {
	per := max((opts.MinTurnTime + w.ThinkTime).Milliseconds(), 1)
	turns := int64(w.Turns)
	round := turns * per
	if w.SubagentProbability > 0 {
		round = max(turns, int64(w.SubagentTurns)+1) * per
	}
	// Each slot runs at most D / (turns x per) sessions; one round more
	// covers the session in progress when D ends.
	rounds := int(ceilDiv64(opts.Duration.Milliseconds(), turns*per)) + 1
	return synthPlan{perTurnMs: per, roundMs: round, rounds: rounds}
}

func ceilDiv64(a, b int64) int64 { return (a + b - 1) / b }

func runTraceSynth(ctx context.Context, opts traceSynthOptions, out io.Writer) error {
	switch {
	case opts.Sessions < 1:
		return fmt.Errorf("--sessions %d: must be >= 1", opts.Sessions)
	case opts.Duration <= 0:
		return fmt.Errorf("--duration %s: must be > 0", opts.Duration)
	case opts.BlockSize < 1:
		return fmt.Errorf("--block-size %d: must be >= 1", opts.BlockSize)
	case opts.MinTurnTime < time.Millisecond:
		return fmt.Errorf("--min-turn-time %s: must be >= 1ms", opts.MinTurnTime)
	}
	w := traces.DefaultWorkload()
	source := "synthetic"
	if opts.Workload != "" {
		var err error
		if w, err = traces.LoadWorkload(opts.Workload); err != nil {
			return err
		}
		source += " workload=" + filepath.Base(opts.Workload)
	}
	source += fmt.Sprintf(" seed=%d", opts.Seed)
	h := traces.Header{BlockSize: opts.BlockSize, Source: source, CreatedBy: "warden " + version, Concurrency: opts.Sessions}
	return writeTrace(opts.Out, h, out, func(tw *traces.Writer) error { return writeSynth(ctx, tw, opts, w) })
}

// writeSynth writes plan.rounds rounds of N top-level sessions (and their
// subagents), each round's requests sorted by estimated arrival.
func writeSynth(ctx context.Context, tw *traces.Writer, opts traceSynthOptions, w traces.Workload) error {
	plan := planSynth(opts, w)
	N := int64(opts.Sessions)
	gen := traces.NewGenerator(w, opts.BlockSize, opts.Seed)
	type item struct {
		req   traces.Request
		order int // generation order, breaks ties
	}
	var (
		batch   []item
		pending *traces.Session // a session read past the end of a round
		top     int64           // top-level sessions generated
		order   int
	)
	for round := range plan.rounds {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch = batch[:0]
		base := int64(round) * plan.roundMs
		var parentStart int64
		subs := int64(0)
		for {
			var s traces.Session
			if pending != nil {
				s, pending = *pending, nil
			} else {
				s, _ = gen.NextSession()
			}
			var start int64
			if s.Parent == "" {
				if top == int64(round+1)*N {
					pending = &s
					break
				}
				k := top % N
				start = base + k*plan.perTurnMs/N
				parentStart, subs = start, 0
				top++
			} else {
				// Between the parent's start and the next session's.
				subs++
				start = parentStart + subs*plan.perTurnMs/(N*int64(w.Turns+1))
			}
			for t, r := range s.Turns {
				r.ArrivalMs = start + int64(t)*plan.perTurnMs
				batch = append(batch, item{req: r, order: order})
			}
			order++
		}
		slices.SortStableFunc(batch, func(a, b item) int {
			return cmp.Or(cmp.Compare(a.req.ArrivalMs, b.req.ArrivalMs), cmp.Compare(a.order, b.order))
		})
		for i := range batch {
			if err := tw.Write(&batch[i].req); err != nil {
				return err
			}
		}
	}
	return nil
}
