package bench

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/lm-warden/warden/internal/num"
)

// WriteText writes the result as `warden sim` writes its table (the same
// columns, one line per step), then what only a client sees: requests sent,
// finished, cut at the step's end and failed, with the first failure, and
// the exact TTFB quantiles (the table's too).
func (r *Result) WriteText(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "%s\n\n", r.Report.Farm); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "sessions\tstrategy\tsessions/h\toutput tok/min\tTTFB p50 s\tTTFB p95 s\treplicas busy\tprefix hit %\tstayed %\tunfinished\t")
	for _, x := range r.Report.Rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", x.Sessions, x.Strategy,
			num.Format(float64(x.SessionsPerHour), 0), num.Format(float64(x.OutputTokensPerMin), 0),
			num.Format(float64(x.TTFBP50), 2), num.Format(float64(x.TTFBP95), 2), num.Format(float64(x.ReplicasBusy), 1),
			num.Format(float64(x.PrefixHitPct), 1), num.Format(float64(x.StayedPct), 1), x.Unfinished)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w, "\nrequests (sent / finished / cut at the step's end / failed), exact TTFB p50 and p95 s:"); err != nil {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, s := range r.Steps {
		line := fmt.Sprintf("%d\t%d / %d / %d / %d\t%s / %s\t", s.Sessions, s.Sent, s.Finished, s.Cut, s.Failed,
			num.Format(s.TTFBExactP50, 3), num.Format(s.TTFBExactP95, 3))
		if s.FirstError != "" {
			line += "first failure: " + strconv.Quote(s.FirstError)
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}
