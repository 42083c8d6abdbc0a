package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/calibrate"
)

// workloadOptions are the flags of `warden workload`.
type workloadOptions struct {
	promOptions
	Journal string
	Out     string
	JSON    bool
}

func newWorkloadCmd() *cobra.Command {
	opts := &workloadOptions{}
	cmd := &cobra.Command{
		Use:   "workload",
		Short: "Derive the workload a live farm serves, from Prometheus or the proxy's journal",
		Long: `workload derives the load a farm served in a window and writes it as the
synthetic workload YAML that 'warden sim --workload' and plan files read:
concurrent sessions over time, mean prompt and output sizes, turns per session,
think time and the rate of new sessions.

From Prometheus (--prometheus, --model): sessions are the requests in vLLM
(running + waiting; think time is invisible there and assumed 0), prompt and output
sizes come from vLLM's request histograms or token counters, turns from warden's
later-turn counter; the shape (system prompt, first message, new text per turn)
keeps the default proportions scaled to the observed mean prompt.

From the proxy's journal (--journal, alone): everything is read per session,
including the shared system prompt (the common prefix of first turns) and the
think time.`,
		Example: `  warden workload --prometheus http://localhost:9090 --model Qwen/Qwen3-4B-Instruct-2507 --since 6h --out workload.yaml
  warden workload --journal journal.jsonl --out workload.yaml
  warden sim --farm farm.yaml --workload workload.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWorkload(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	opts.bind(cmd, 6*time.Hour)
	f := cmd.Flags()
	f.StringVar(&opts.Journal, "journal", "", "the proxy's journal (or any warden trace): read the load from it instead of Prometheus")
	f.StringVar(&opts.Out, "out", "", `workload file to write ("": print it)`)
	f.BoolVar(&opts.JSON, "json", false, "print the estimate (load over time, sources, warnings) as JSON")
	return cmd
}

func runWorkload(ctx context.Context, o *workloadOptions, out io.Writer) error {
	if err := checkOutPath("--out", o.Out); err != nil {
		return err
	}
	var (
		est *calibrate.WorkloadEstimate
		err error
	)
	if o.Journal != "" && o.Prometheus == "" {
		est, err = calibrate.FromJournal(o.Journal)
	} else {
		if o.Journal != "" {
			return fmt.Errorf("give --journal or --prometheus, not both")
		}
		src, w, oerr := o.open()
		if oerr != nil {
			return oerr
		}
		est, err = calibrate.DeriveWorkload(ctx, src, calibrate.WorkloadOptions{Model: o.Model, Window: w, Windows: o.Windows})
	}
	if err != nil {
		return err
	}
	header := []string{fmt.Sprintf("Derived by warden workload from %s: %.1f concurrent sessions, mean prompt %.0f tokens, mean output %.0f tokens, %.2f turns per session, %.2f new sessions per minute.",
		est.From, est.Sessions, est.MeanPromptTokens, est.MeanOutputTokens, est.Turns, est.NewSessionsPerMin)}
	for _, w := range est.Warnings {
		header = append(header, "warning: "+w)
	}
	data, err := calibrate.MarshalWorkload(est.Workload, header)
	if err != nil {
		return err
	}
	if o.Out != "" {
		if err := writeOutFile(o.Out, data); err != nil {
			return err
		}
	}
	if o.JSON {
		return writeJSON(out, est)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "load from %s\n", est.From)
	fmt.Fprintf(&b, "  concurrent sessions  %.1f (mean)\n", est.Sessions)
	for _, w := range est.Windows {
		fmt.Fprintf(&b, "    %s .. %s  %s\n", w.Start.UTC().Format("2006-01-02 15:04:05"), w.End.UTC().Format("15:04:05"), fmtFloat(float64(w.Sessions), 1))
	}
	fmt.Fprintf(&b, "  mean prompt          %.0f tokens\n  mean output          %.0f tokens\n  turns per session    %.2f\n  new sessions/min     %.2f\n  think time           %s\n",
		est.MeanPromptTokens, est.MeanOutputTokens, est.Turns, est.NewSessionsPerMin, est.ThinkTime)
	for _, w := range est.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", w)
	}
	if o.Out != "" {
		fmt.Fprintf(&b, "workload: %s\n", o.Out)
	} else {
		b.WriteString("\n" + string(data))
	}
	_, err = io.WriteString(out, b.String())
	return err
}

// fmtFloat writes v with d decimals, "-" for NaN.
func fmtFloat(v float64, d int) string {
	if v != v {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', d, 64)
}
