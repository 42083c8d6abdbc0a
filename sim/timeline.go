package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/lm-warden/warden/metrics"
)

// Timeline is one strategy's run seen over time, from its start (cold
// caches) to its end, steps together: the farm's prefix-cache hit rate and
// each replica's KV-cache usage and requests in flight. Point k is
// evaluated at TimesS[k] and covers the StepS seconds before it: PromQL
// range queries on the run's metric store, the same text a Prometheus
// scraping the real farm evaluates (Queries), so a chart of a real farm's
// first hour and of its simulation compare point for point.
type Timeline struct {
	Strategy string    `json:"strategy"`
	StepS    float64   `json:"step_s"`
	TimesS   []float64 `json:"times_s"`
	// HitPct is prefix_hit_pct of metrics/kpi.promql over each interval:
	// vLLM's counters, as a dashboard of the real farm shows them.
	HitPct []Float `json:"hit_pct"`
	// KVUsagePct and InFlight have one series per replica, by number.
	KVUsagePct [][]Float `json:"kv_usage_pct"`
	InFlight   [][]Float `json:"in_flight"`
	// Queries are the PromQL expressions evaluated, $model and $window
	// substituted, in the order of the fields above.
	Queries []string `json:"queries"`
}

// InFlightByReplicaExpr is the requests warden has in flight at each
// replica (sent, not yet finished: running and waiting), averaged over
// each interval of a timeline. Placeholders as in kpi.promql.
const InFlightByReplicaExpr = `avg by (replica) (avg_over_time(warden_in_flight{model="$model"}[$window]))`

// maxTimelinePoints bounds a timeline: a step too fine for the run's
// length is made coarser, in whole seconds.
const maxTimelinePoints = 2000

// timeline queries a run's store, from time 0 to end (µs), every step.
func (r *run) timeline(ctx context.Context, strategy string, end int64, step time.Duration) (*Timeline, error) {
	total := time.Duration(end) * time.Microsecond
	if n := int64(total / step); n > maxTimelinePoints {
		step = (total/maxTimelinePoints + time.Second - 1).Truncate(time.Second)
	}
	n := int(total / step)
	tl := &Timeline{Strategy: strategy, StepS: step.Seconds()}
	for k := 1; k <= n; k++ {
		tl.TimesS = append(tl.TimesS, (time.Duration(k) * step).Seconds())
	}
	ev := metrics.NewEvaluator()
	query := func(expr string) ([]metrics.AlignedSeries, error) {
		expr = metrics.Expand(expr, r.model, step)
		tl.Queries = append(tl.Queries, expr)
		s, err := ev.RangeAligned(ctx, r.rec.store, expr, time.UnixMicro(0), step, n)
		if err != nil {
			return nil, fmt.Errorf("sim: timeline of %s: %w", strategy, err)
		}
		return s, nil
	}
	hit, ok := metrics.KPIByName("prefix_hit_pct")
	kv, ok2 := metrics.KPIByName("kv_usage_by_engine")
	if !ok || !ok2 {
		return nil, fmt.Errorf("sim: timeline: metrics/kpi.promql lacks prefix_hit_pct or kv_usage_by_engine")
	}
	h, err := query(hit.Expr)
	if err != nil {
		return nil, err
	}
	if len(h) == 1 {
		tl.HitPct = floats(h[0].Values)
	}
	for _, x := range []struct {
		expr string
		dst  *[][]Float
	}{{kv.Expr, &tl.KVUsagePct}, {InFlightByReplicaExpr, &tl.InFlight}} {
		s, err := query(x.expr)
		if err != nil {
			return nil, err
		}
		for _, a := range s {
			*x.dst = append(*x.dst, floats(a.Values))
		}
	}
	return tl, nil
}

func floats(v []float64) []Float {
	out := make([]Float, len(v))
	for i, x := range v {
		out[i] = Float(x)
	}
	return out
}
