package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/sim"
)

// promKPIs are the columns that come from a Prometheus server when one is
// given, by KPI name.
var promKPIs = []struct {
	name     string
	col      func(*sim.Row) *sim.Float
	min, max float64 // the KPI's possible values; outside them the data is broken
}{
	{"prefix_hit_pct", func(r *sim.Row) *sim.Float { return &r.PrefixHitPct }, 0, 100},
	{"replicas_busy", func(r *sim.Row) *sim.Float { return &r.ReplicasBusy }, 0, math.Inf(1)},
	{"stayed_pct", func(r *sim.Row) *sim.Float { return &r.StayedPct }, 0, 100},
}

// fromPrometheus replaces the rows' metrics columns by the KPIs of
// metrics/kpi.promql evaluated by the Prometheus server over each step's
// window ([Start, End], wall time). A KPI without data keeps the row's value
// read from /metrics, with a warning.
func (r *runner) fromPrometheus(ctx context.Context) error {
	prom, err := metrics.NewPrometheusClient(r.cfg.PrometheusURL, r.client)
	if err != nil {
		return err
	}
	for i := range r.res.Report.Rows {
		row, st := &r.res.Report.Rows[i], &r.res.Steps[i]
		window := st.End.Sub(st.Start).Truncate(time.Millisecond)
		for _, k := range promKPIs {
			kpi, ok := metrics.KPIByName(k.name)
			if !ok {
				return fmt.Errorf("KPI %s missing from metrics/kpi.promql", k.name)
			}
			v, err := queryScalar(ctx, prom, metrics.Expand(kpi.Expr, r.cfg.Model, window), st.End)
			if err != nil {
				return fmt.Errorf("KPI %s: %w", k.name, err)
			}
			if math.IsNaN(v) {
				r.warn("prometheus: KPI %s has no data for step %d (%d sessions); kept the value read from /metrics", k.name, i+1, st.Sessions)
				continue
			}
			if v < k.min || v > k.max {
				// A series missing at one end of the window (a failed or
				// late scrape of one engine) breaks the difference of sums.
				r.warn("prometheus: KPI %s is %g for step %d (%d sessions), outside [%g, %g]: a scrape is missing at an end of the window; kept the value read from /metrics",
					k.name, v, i+1, st.Sessions, k.min, k.max)
				continue
			}
			*k.col(row) = sim.Float(v)
		}
	}
	return nil
}

// queryScalar runs an instant query, bounded by metrics.DefaultQueryTimeout,
// and returns its single value, NaN when the result is empty.
func queryScalar(ctx context.Context, src metrics.Source, expr string, at time.Time) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, metrics.DefaultQueryTimeout)
	defer cancel()
	v, err := src.Instant(ctx, expr, at)
	if err != nil {
		return 0, err
	}
	switch len(v) {
	case 0:
		return math.NaN(), nil
	case 1:
		return v[0].F, nil
	}
	return 0, fmt.Errorf("%d series, want one", len(v))
}
