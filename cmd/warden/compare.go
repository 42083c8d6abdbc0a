package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/bench"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/web"
)

// compareOptions are the flags of `warden compare`.
type compareOptions struct {
	Predicted string
	Observed  []string
	Strategy  string
	Out       string
	JSON      bool
}

func newCompareCmd() *cobra.Command {
	opts := &compareOptions{}
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Put a prediction (warden sim --json) and a measurement (warden bench --json) side by side",
		Long: `Compare what the simulator predicted with what a benchmark measured, per step
and column: sessions per hour, output tokens per minute, TTFB p50 and p95,
replicas busy, prefix hit % and stayed %, each with the relative error
(observed - predicted) / predicted and, for percentages, the difference in
points.

Rows match by strategy and sessions: label each bench run with the strategy
it ran (warden bench --label affinity). --observed may be given several times
(one bench run per routing). With --strategy, the predicted rows of that
strategy are compared with every observed row, whatever its label.

--out writes the self-contained HTML report (charts of predicted against
observed for each column); the same inputs give the same bytes.`,
		Example: `  warden sim --sessions 4,8 --json > sim.json
  warden bench --target http://127.0.0.1:8080 --sessions 4,8 --label affinity --json > on.json
  warden compare --predicted sim.json --observed on.json --out compare.html
  warden compare --predicted sim.json --observed off.json --observed on.json --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCompare(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Predicted, "predicted", "", "warden sim --json report (required)")
	f.StringArrayVar(&opts.Observed, "observed", nil, "warden bench --json report; repeat for several runs (required)")
	f.StringVar(&opts.Strategy, "strategy", "", "compare the predicted rows of this strategy with every observed row")
	f.StringVar(&opts.Out, "out", "", "also write the HTML report to this file")
	f.BoolVar(&opts.JSON, "json", false, "print the comparison as JSON")
	_ = cmd.MarkFlagRequired("predicted")
	_ = cmd.MarkFlagRequired("observed")
	return cmd
}

// readSimReport reads a warden sim --json (or warden bench --json) report.
func readSimReport(path string) (*sim.Report, error) {
	res, rep, err := readResult(path)
	if err != nil {
		return nil, err
	}
	if res != nil {
		return nil, fmt.Errorf("%s: a warden plan --json result; want a warden sim --json or warden bench --json report", path)
	}
	return rep, nil
}

func runCompare(_ context.Context, o *compareOptions, out io.Writer) error {
	if err := checkOutPath("--out", o.Out); err != nil {
		return err
	}
	pred, err := readSimReport(o.Predicted)
	if err != nil {
		return fmt.Errorf("--predicted: %w", err)
	}
	var obs []*sim.Report
	for _, path := range o.Observed {
		r, err := readSimReport(path)
		if err != nil {
			return fmt.Errorf("--observed: %w", err)
		}
		obs = append(obs, r)
	}
	merged, err := bench.MergeReports(obs...)
	if err != nil {
		return fmt.Errorf("--observed: %w", err)
	}
	c, err := bench.Compare(pred, merged, bench.CompareOptions{Strategy: o.Strategy})
	if err != nil {
		return err
	}
	if o.Out != "" {
		if err := writeReport(o.Out, web.CompareReport(c, web.CompareReportOptions{})); err != nil {
			return err
		}
	}
	if o.JSON {
		return writeJSON(out, c)
	}
	if err := c.WriteText(out); err != nil {
		return err
	}
	if o.Out != "" {
		_, err = fmt.Fprintf(out, "\nreport: %s\n", o.Out)
	}
	return err
}
