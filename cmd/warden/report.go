package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/web"
)

// reportOptions are the flags of `warden report`.
type reportOptions struct {
	From string
	Out  string
}

func newReportCmd() *cobra.Command {
	opts := &reportOptions{}
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Render a saved result (warden plan --json or warden sim --json) as an HTML report",
		Long: `Render a result saved as JSON into the self-contained HTML report:
a 'warden plan --json' result gives the capacity plan's report (the same bytes
as 'warden plan --out' wrote), a 'warden sim --json' report the simulation's.`,
		Example: `  warden plan --json --out "" > result.json
  warden report --from result.json --out capacity.html
  warden sim --json > sim.json && warden report --from sim.json --out sim.html`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReport(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.From, "from", "", "JSON result of warden plan --json or warden sim --json")
	f.StringVar(&opts.Out, "out", "report.html", "HTML report file")
	_ = cmd.MarkFlagRequired("from")
	return cmd
}

func runReport(_ context.Context, o *reportOptions, out io.Writer) error {
	if o.Out == "" {
		return fmt.Errorf("--out: want a file name")
	}
	data, err := os.ReadFile(o.From)
	if err != nil {
		return err
	}
	r, err := readAnyResult(data)
	if err != nil {
		return fmt.Errorf("%s: %w", o.From, err)
	}
	if err := writeReport(o.Out, r); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\nreport: %s\n", r.Answer, o.Out)
	return err
}

// readAnyResult tells a planner result (its "kind") from a simulator report
// (a "farm" and "rows") and builds its report.
func readAnyResult(data []byte) (*web.Report, error) {
	var probe struct {
		Kind string          `json:"kind"`
		Farm *string         `json:"farm"`
		Rows json.RawMessage `json:"rows"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("not a JSON result: %w", err)
	}
	switch {
	case probe.Kind == planner.Kind:
		res, err := planner.ReadResult(data)
		if err != nil {
			return nil, err
		}
		return web.PlanReport(res), nil
	case probe.Kind == "" && probe.Farm != nil && probe.Rows != nil:
		var rep sim.Report
		if err := planner.DecodeJSON(data, &rep); err != nil {
			return nil, fmt.Errorf("sim report: %w", err)
		}
		return web.SimReport(&rep, web.SimReportOptions{}), nil
	case probe.Kind != "":
		return nil, fmt.Errorf("kind %q: want %q (warden plan --json) or a warden sim --json report", probe.Kind, planner.Kind)
	}
	return nil, fmt.Errorf("neither a warden plan --json result (kind %q) nor a warden sim --json report (farm and rows)", planner.Kind)
}
