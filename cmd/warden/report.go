package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

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
	if err := checkOutPath("--out", o.Out); err != nil {
		return err
	}
	r, err := resultReport(o.From)
	if err != nil {
		return err
	}
	if err := writeReport(o.Out, r); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\nreport: %s\n", r.Answer, o.Out)
	return err
}

// resultReport builds the report of a saved result: a plan's or a
// simulation's.
func resultReport(path string) (*web.Report, error) {
	res, rep, err := readResult(path)
	if err != nil {
		return nil, err
	}
	if res != nil {
		return web.PlanReport(res), nil
	}
	return web.SimReport(rep, web.SimReportOptions{}), nil
}
