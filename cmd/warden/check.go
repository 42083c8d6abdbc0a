package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/calibrate"
	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/sim"
)

// checkOptions are the flags of `warden check`.
type checkOptions struct {
	promOptions
	Predicted string
	Tolerance string
	Strategy  string
	Sessions  int
	// Status is a proxy's /api/status URL: compare each replica's hit %
	// and KV events with the prediction (checkreplicas.go); Farm the farm
	// spec whose KV cache per replica vLLM's is checked against.
	Status string
	Farm   string
}

func newCheckCmd() *cobra.Command {
	opts := &checkOptions{}
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Compare a prediction with what Prometheus observed; exit non-zero on drift (for cron or CI)",
		Long: `check evaluates the KPIs of metrics/kpi.promql on a Prometheus server over the
window --since (ending now or at --end) and compares them with a prediction:

  - the JSON of 'warden plan --prometheus ... --json' (its prediction-vs-observation
    section), or
  - the JSON of 'warden sim --json' (a row: --strategy and --sessions pick it when it
    has several; else the last one).

It prints KPI / predicted / observed / error / verdict and exits with status 1 when
a KPI drifted beyond --tolerance (relative to the prediction; a KPI without data on
either side is reported, not failed).

With --status (a warden proxy's http://ADMIN/api/status), it also compares per
replica the predicted hit % with vLLM's prefix-cache counters and, where the proxy
follows vLLM's KV events (kv_events), with what they show, and says where they
part: hit % beyond the tolerance, a smaller cache than --farm configures, a changed
event format (batches that do not decode), no events from a replica that served,
evictions, or no block ever computed on two replicas (a changed or unset hash seed).
--prometheus is then optional.`,
		Example: `  warden check --prometheus http://localhost:9090 --model Qwen/Qwen3-4B-Instruct-2507 --predicted predicted.json
  warden check --prometheus http://prom:9090 --model m --predicted sim.json --strategy affinity --sessions 16 --tolerance 15% --since 1h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCheck(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	opts.bind(cmd, time.Hour)
	f := cmd.Flags()
	f.StringVar(&opts.Predicted, "predicted", "", "prediction: JSON of 'warden plan --prometheus --json' or 'warden sim --json' (required)")
	f.StringVar(&opts.Tolerance, "tolerance", "10%", `largest relative drift accepted, "10%" or 0.1`)
	f.StringVar(&opts.Strategy, "strategy", "", "with a sim report: the row's strategy")
	f.IntVar(&opts.Sessions, "sessions", 0, "with a sim report: the row's sessions level")
	f.StringVar(&opts.Status, "status", "", "a warden proxy's /api/status URL: check each replica's hit % and KV events too")
	f.StringVar(&opts.Farm, "farm", "", "with --status: the farm spec YAML whose KV cache per replica vLLM's should match")
	return cmd
}

// ErrDrift is returned by check when a KPI drifted beyond the tolerance.
var ErrDrift = errors.New("check: observed KPIs drifted beyond the tolerance from the prediction")

// parseTolerance reads "10%" or "0.1".
func parseTolerance(s string) (float64, error) {
	t := strings.TrimSpace(s)
	div := 1.0
	if strings.HasSuffix(t, "%") {
		t, div = strings.TrimSuffix(t, "%"), 100
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || !(v >= 0) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("--tolerance %q: want a percentage such as 10%% or a fraction such as 0.1", s)
	}
	return v / div, nil
}

// predictedKPIs reads the predicted KPI values from a plan result with an
// observation or from a simulator report.
func predictedKPIs(data []byte, name, strategy string, sessions int) (map[string]float64, error) {
	res, rep, err := decodeResult(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if res != nil {
		if res.Observation == nil {
			return nil, fmt.Errorf("%s: a plan result without a prediction of the current farm (make it with 'warden plan --prometheus ... --json')", name)
		}
		out := map[string]float64{}
		for k, v := range res.Observation.Predicted {
			out[k] = float64(v)
		}
		return out, nil
	}
	var row *sim.Row
	for i := range rep.Rows {
		r := &rep.Rows[i]
		if (strategy == "" || r.Strategy == strategy) && (sessions == 0 || r.Sessions == sessions) {
			row = r
		}
	}
	if row == nil {
		return nil, fmt.Errorf("%s: no row with strategy %q and sessions %d", name, strategy, sessions)
	}
	return map[string]float64{
		"prefix_hit_pct": float64(row.PrefixHitPct), "ttfb_p50_s": float64(row.TTFBP50), "ttfb_p95_s": float64(row.TTFBP95),
		"output_tokens_per_min": float64(row.OutputTokensPerMin), "sessions_per_hour": float64(row.SessionsPerHour),
		"replicas_busy": float64(row.ReplicasBusy), "stayed_pct": float64(row.StayedPct),
	}, nil
}

func runCheck(ctx context.Context, o *checkOptions, out io.Writer) error {
	if o.Predicted == "" {
		return errors.New("--predicted is required (a 'warden plan --prometheus --json' or 'warden sim --json' file)")
	}
	tol, err := parseTolerance(o.Tolerance)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(o.Predicted)
	if err != nil {
		return err
	}
	pred, err := predictedKPIs(data, o.Predicted, o.Strategy, o.Sessions)
	if err != nil {
		return err
	}
	drift := false
	if o.Status != "" {
		d, err := runReplicaCheck(ctx, o, pred["prefix_hit_pct"], tol, out)
		if err != nil {
			return err
		}
		drift = d
		if o.Prometheus == "" {
			if drift {
				return ErrDrift
			}
			return nil
		}
	}
	src, w, err := o.open()
	if err != nil {
		return err
	}
	if err := metrics.Ping(ctx, src, w.End); err != nil {
		return err
	}
	if err := calibrate.CheckModel(ctx, src, o.Model, w); err != nil {
		return err
	}
	obs, err := metrics.KPIValues(ctx, src, o.Model, w.End, w.Len())
	if err != nil {
		return err
	}
	var names []string
	for _, n := range calibrate.HeadlineKPIs {
		if _, ok := pred[n]; ok {
			names = append(names, n)
		}
	}
	if _, ok := pred["ttft_server_p95_s"]; ok {
		names = nil // a plan prediction: every KPI
	}
	cs := calibrate.Compare(names, pred, obs, tol)
	fmt.Fprintf(out, "%s, model %s, window %s, tolerance %.0f%%\n", src, o.Model, w, 100*tol)
	if err := calibrate.WriteComparisons(out, cs); err != nil {
		return err
	}
	if calibrate.Drifted(cs) || drift {
		return ErrDrift
	}
	return nil
}

// runReplicaCheck runs the per-replica check against --status and reports
// whether a replica drifted.
func runReplicaCheck(ctx context.Context, o *checkOptions, predicted, tol float64, out io.Writer) (bool, error) {
	if o.Model == "" {
		return false, errors.New("--model is required (the model name the proxy serves)")
	}
	farmKV := 0
	if o.Farm != "" {
		data, err := os.ReadFile(o.Farm)
		if err != nil {
			return false, err
		}
		f, err := sim.ParseFarm(data, o.Farm)
		if err != nil {
			return false, err
		}
		farmKV = f.KVTokensPerReplica()
	}
	st, err := fetchStatus(ctx, o.Status)
	if err != nil {
		return false, err
	}
	rows, err := checkReplicas(st, o.Model, predicted, tol, farmKV)
	if err != nil {
		return false, err
	}
	fmt.Fprintf(out, "%s, model %s, per replica, tolerance %.0f%%\n", o.Status, o.Model, 100*tol)
	if err := writeReplicaDrift(out, rows); err != nil {
		return false, err
	}
	for _, r := range rows {
		if r.Drifted {
			return true, nil
		}
	}
	return false, nil
}
