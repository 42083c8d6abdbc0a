package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	pmodel "github.com/prometheus/common/model"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/sim"
)

// promKPIs are the columns that come from a Prometheus server when one is
// given, by KPI name.
var promKPIs = []struct {
	name string
	col  func(*sim.Row) *sim.Float
}{
	{"prefix_hit_pct", func(r *sim.Row) *sim.Float { return &r.PrefixHitPct }},
	{"replicas_busy", func(r *sim.Row) *sim.Float { return &r.ReplicasBusy }},
	{"stayed_pct", func(r *sim.Row) *sim.Float { return &r.StayedPct }},
}

// fromPrometheus replaces the rows' metrics columns by the KPIs of
// metrics/kpi.promql evaluated by the Prometheus server over each step's
// window ([Start, End], wall time). A KPI without data keeps the row's value
// read from /metrics, with a warning.
func (r *runner) fromPrometheus(ctx context.Context) error {
	c, err := api.NewClient(api.Config{Address: r.cfg.PrometheusURL, Client: r.client})
	if err != nil {
		return err
	}
	papi := v1.NewAPI(c)
	for i := range r.res.Report.Rows {
		row, st := &r.res.Report.Rows[i], &r.res.Steps[i]
		window := st.End.Sub(st.Start).Truncate(time.Millisecond)
		for _, k := range promKPIs {
			kpi, ok := metrics.KPIByName(k.name)
			if !ok {
				return fmt.Errorf("KPI %s missing from metrics/kpi.promql", k.name)
			}
			v, err := queryScalar(ctx, papi, metrics.Expand(kpi.Expr, r.cfg.Model, window), st.End)
			if err != nil {
				return fmt.Errorf("KPI %s: %w", k.name, err)
			}
			if math.IsNaN(v) {
				r.warn("prometheus: KPI %s has no data for step %d (%d sessions); kept the value read from /metrics", k.name, i+1, st.Sessions)
				continue
			}
			*k.col(row) = sim.Float(v)
		}
	}
	return nil
}

// queryScalar runs an instant query and returns its single value, NaN when
// the result is empty.
func queryScalar(ctx context.Context, papi v1.API, expr string, at time.Time) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	val, _, _, err := papi.Query(ctx, expr, at)
	if err != nil {
		return 0, err
	}
	switch v := val.(type) {
	case pmodel.Vector:
		if len(v) == 0 {
			return math.NaN(), nil
		}
		if len(v) > 1 {
			return 0, fmt.Errorf("%d series, want one", len(v))
		}
		return float64(v[0].Value), nil
	case *pmodel.Scalar:
		return float64(v.Value), nil
	}
	return 0, fmt.Errorf("result of type %s, want a vector", val.Type())
}
