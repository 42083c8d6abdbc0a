package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/calibrate"
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
	File        string
	JSON        bool
	SkipBad     bool
	SessionTTL  time.Duration
	UserPause   time.Duration
	WorkloadOut string // write the fitted workload here ("": don't)
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
to hold against a farm's KV capacity.

It also fits the workload the trace's sessions follow (traces/WORKLOAD.md):
turns per session, each turn's addition and the pause before it (a tool's result
after a pause under --user-pause, else a person's message), answers,
compactions (a prompt under half the context before it), subagents (sessions
with a parent) and agent kinds (sessions whose first prompts begin apart).
--workload-out writes it as a workload file that warden sim --workload and
plan files read: a public trace or your own proxy's journal turned into a preset.`,
		Example: `  warden trace stats agents.jsonl
  warden trace stats --json mooncake.jsonl.gz | jq .reuse_upper_bound_pct
  warden trace stats journal.jsonl --workload-out mine.yaml && warden sim --workload mine.yaml`,
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
	f.DurationVar(&opts.UserPause, "user-pause", traces.DefaultUserPause, "in the fitted workload, a turn after a pause this long or longer follows a person's message, a shorter one a tool's result")
	f.StringVar(&opts.WorkloadOut, "workload-out", "", "write the workload fitted to the trace to this YAML file")
	return cmd
}

func runTraceStats(_ context.Context, opts traceStatsOptions, out io.Writer) error {
	if err := checkOutPath("--workload-out", opts.WorkloadOut); err != nil {
		return err
	}
	if opts.UserPause <= 0 {
		return fmt.Errorf("--user-pause %s: want a pause > 0, e.g. 30s", opts.UserPause)
	}
	r, err := traces.Open(opts.File, traces.ReaderOptions{SkipBad: opts.SkipBad})
	if err != nil {
		return err
	}
	defer r.Close()
	so := traces.DefaultStatsOptions()
	so.SessionTTL = opts.SessionTTL
	so.Fit = traces.NewFitter(r.Header().BlockSize, traces.FitOptions{UserPause: opts.UserPause})
	st, err := traces.StatsWithOptions(r, so)
	if err != nil {
		return err
	}
	fit := so.Fit.Fit()
	if opts.WorkloadOut != "" {
		header := []string{fmt.Sprintf("Fitted by warden trace stats to %s: %d sessions, %d subagents, %d requests.", filepath.Base(opts.File), fit.Sessions, fit.Subagents, fit.Requests)}
		for _, n := range fit.Notes {
			header = append(header, "note: "+n)
		}
		data, err := calibrate.MarshalWorkload(fit.Workload, header)
		if err != nil {
			return err
		}
		if err := writeOutFile(opts.WorkloadOut, data); err != nil {
			return err
		}
	}
	if opts.JSON {
		return writeJSON(out, struct {
			traces.TraceStats
			Fit traces.Fit `json:"fitted_workload"`
		}{st, fit})
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
	if err := tw.Flush(); err != nil {
		return err
	}
	if st.Requests == 0 {
		return nil
	}
	_, err = io.WriteString(out, describeFit(fit, opts.WorkloadOut))
	return err
}

// describeFit says in a few lines what workload the trace follows.
func describeFit(fit traces.Fit, written string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nfitted workload (%d sessions, %d subagents", fit.Sessions, fit.Subagents)
	if fit.Kinds > 1 {
		fmt.Fprintf(&b, ", %d agent kinds", fit.Kinds)
	}
	b.WriteString("):\n")
	shapes := []traces.Agent{{Name: "", Weight: 1, Shape: fit.Workload}}
	if len(fit.Workload.Agents) > 0 {
		shapes = fit.Workload.Agents
	}
	for _, a := range shapes {
		w := a.Shape
		ind := "  "
		if a.Name != "" {
			fmt.Fprintf(&b, "  %s (weight %g):\n", a.Name, a.Weight)
			ind = "    "
		}
		turns := strconv.Itoa(w.Turns)
		if w.TurnsSigma > 0 {
			turns = fmt.Sprintf("mean %d, sigma %g, max %d", w.Turns, w.TurnsSigma, w.TurnsMax)
		}
		fmt.Fprintf(&b, "%ssystem prompt %d tokens, first message %d, turns %s\n", ind, w.SystemPromptTokens, w.FirstMessageTokens, turns)
		if len(w.Additions) == 0 {
			fmt.Fprintf(&b, "%seach later turn adds %d tokens after %s\n", ind, w.NewTokensPerTurn, w.ThinkTime)
		}
		for _, ad := range w.Additions {
			fmt.Fprintf(&b, "%s%s %.0f %%: tokens %s (median %.0f), pause %s (median %s)\n", ind, ad.Kind, 100*ad.Weight,
				ad.Tokens, ad.Tokens.Median(), ad.Think, time.Duration(ad.Think.Median()*float64(time.Second)).Round(time.Millisecond))
		}
		if w.OutputTokens == traces.OutputMax {
			fmt.Fprintf(&b, "%sanswers run to max_tokens %d\n", ind, w.MaxOutputTokens)
		} else {
			fmt.Fprintf(&b, "%sanswers lognormal mean %g sigma %g, at most %d\n", ind, w.OutputTokensMean, w.OutputTokensSigma, w.MaxOutputTokens)
		}
		if w.ContextLimit > 0 {
			fmt.Fprintf(&b, "%scompaction at %.0f tokens (context_limit %d x compact_at %g), summary %s\n", ind,
				float64(w.ContextLimit)*w.CompactAt, w.ContextLimit, w.CompactAt, w.SummaryTokens)
		}
		if w.SubagentProbability > 0 {
			par := "1"
			if !w.SubagentParallel.IsZero() {
				par = w.SubagentParallel.String()
			}
			fmt.Fprintf(&b, "%ssubagents after %.2f %% of turns, %s at once, %d turns, task %d tokens\n", ind, 100*w.SubagentProbability, par, w.SubagentTurns, w.SubagentTaskTokens)
		}
	}
	for _, n := range fit.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if written != "" {
		fmt.Fprintf(&b, "workload: %s\n", written)
	}
	return b.String()
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
short as --min-turn-time plus each turn's pause: a closed-loop replay of D with N
sessions cannot run out. Arrival times are estimates on that same clock: each of
the N slots starts its next session when its last ends (slot k's first at k/N of a
turn); a session's subagents start when the request they follow is answered, side
by side, and the parent's next turn waits for the last of them. Requests are in
order of arrival. The header records N as the trace's concurrency. --sessions
counts top-level sessions. --workload takes a preset name or a file.`,
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
	f.StringVar(&opts.Workload, "workload", "", "a workload preset ("+strings.Join(traces.PresetNames(), ", ")+") or a workload YAML file (default: bench)")
	f.Uint64Var(&opts.Seed, "seed", opts.Seed, "random seed")
	f.IntVar(&opts.BlockSize, "block-size", opts.BlockSize, "tokens per block (vLLM's block_size)")
	f.DurationVar(&opts.MinTurnTime, "min-turn-time", opts.MinTurnTime, "lower bound of one turn's service time, for the session count")
	return cmd
}

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
		if w, err = traces.LoadWorkloadRef(opts.Workload); err != nil {
			return err
		}
		source += " workload=" + filepath.Base(opts.Workload)
	}
	source += fmt.Sprintf(" seed=%d", opts.Seed)
	h := traces.Header{BlockSize: opts.BlockSize, Source: source, CreatedBy: "warden " + version, Concurrency: opts.Sessions}
	return writeTrace(opts.Out, h, out, func(tw *traces.Writer) error { return writeSynth(ctx, tw, opts, w) })
}

// writeSynth writes the sessions of N closed-loop slots: each slot starts
// its next session when its last request of the one before is answered
// (turns of --min-turn-time, the pause before each), from slot k's start
// (k/N of a turn), until a slot has started a session at or after D (one
// more than D needs). A session's subagents start when the parent's request
// they follow is answered, and the parent's next turn waits for the last.
// Requests are written in order of arrival (ties: generation order) as soon
// as no session still to come can arrive before them.
func writeSynth(ctx context.Context, tw *traces.Writer, opts traceSynthOptions, w traces.Workload) error {
	per := max(opts.MinTurnTime.Milliseconds(), 1)
	N := opts.Sessions
	D := opts.Duration.Milliseconds()
	gen := traces.NewGenerator(w, opts.BlockSize, opts.Seed)
	type item struct {
		req   traces.Request
		order int // generation order of its session, breaks ties
	}
	var pending []item
	order := 0
	clocks := make([]int64, N)
	done := make([]bool, N)
	for k := range clocks {
		clocks[k] = int64(k) * per / int64(N)
	}
	// timed adds session s from start and returns when its last answer is
	// in: its subagents start when the request they follow is answered, and
	// its next turn waits for the last of them.
	var timed func(s *traces.Session, start int64) int64
	timed = func(s *traces.Session, start int64) int64 {
		o := order
		t, ready := start, start
		next := 0
		for j := range s.Turns {
			r := s.Turns[j]
			if j > 0 {
				t = ready + max(r.ThinkMs, 0)
			}
			r.ArrivalMs = t
			pending = append(pending, item{req: r, order: o})
			ready = t + per
			end := ready
			for next < len(s.Subagents) && s.Subagents[next].ParentTurn == j {
				order++
				end = max(end, timed(&s.Subagents[next], ready))
				next++
			}
			ready = end
		}
		return ready
	}
	flush := func(upTo int64) error {
		slices.SortStableFunc(pending, func(a, b item) int {
			return cmp.Or(cmp.Compare(a.req.ArrivalMs, b.req.ArrivalMs), cmp.Compare(a.order, b.order))
		})
		n := 0
		for n < len(pending) && pending[n].req.ArrivalMs <= upTo {
			if err := tw.Write(&pending[n].req); err != nil {
				return err
			}
			n++
		}
		pending = append(pending[:0], pending[n:]...)
		return nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := -1
		for i := range clocks {
			if !done[i] && (k < 0 || clocks[i] < clocks[k]) {
				k = i
			}
		}
		if k < 0 {
			return flush(math.MaxInt64)
		}
		fam, _ := gen.NextFamily()
		done[k] = clocks[k] >= D
		clocks[k] = timed(&fam, clocks[k])
		order++
		bound := int64(math.MaxInt64)
		for i := range clocks {
			if !done[i] {
				bound = min(bound, clocks[i])
			}
		}
		if err := flush(bound); err != nil {
			return err
		}
	}
}
