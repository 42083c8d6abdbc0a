package planner

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/sim"
)

// Timeline is the answer's farm (the best candidate, or the closest when
// none meets the targets) run with its chosen routing at the wanted
// concurrency, seen over that measured step through PromQL range queries on
// the simulator's metric store: the series a Prometheus scraping the real
// farm would give, queried by the same text.
//
// Point k is evaluated at the step's start + TimesS[k] and covers the StepS
// seconds before it (the queries' $window is StepS), so each value is a mean
// or a rate over one interval, not a lone sample.
type Timeline struct {
	Candidate int       `json:"candidate"` // index in Result.Candidates
	Config    int       `json:"config"`    // index in that candidate's Configs
	Sessions  int       `json:"sessions"`  // the concurrency level
	StepS     float64   `json:"step_s"`    // resolution of the range queries, seconds
	TimesS    []float64 `json:"times_s"`   // each point, seconds from the step's start

	InFlight       QuerySeries `json:"in_flight"`       // requests in flight per replica, mean
	KVUsage        QuerySeries `json:"kv_usage"`        // KV-cache usage per replica, %
	PromptCached   QuerySeries `json:"prompt_cached"`   // prompt tokens per second served from cache
	PromptComputed QuerySeries `json:"prompt_computed"` // prompt tokens per second computed
}

// QuerySeries is what one PromQL range query gave.
type QuerySeries struct {
	// Name is the query's name: a KPI of metrics/kpi.promql or one of
	// TimelineQueries.
	Name  string `json:"name"`
	Title string `json:"title"`
	Unit  string `json:"unit"`
	// Query is the PromQL as evaluated ($model and $window substituted):
	// sent as a range query with step Timeline.StepS to a Prometheus
	// scraping the real farm, it gives the same chart.
	Query string `json:"query"`
	// Series are one per replica (ordered by replica number) for a query
	// grouped by replica or engine, else the one farm-wide series.
	Series []TimeSeries `json:"series"`
}

// TimeSeries is one series of a range query, its values aligned with
// Timeline.TimesS (NaN, null in JSON, where the query gave nothing).
type TimeSeries struct {
	// Label is the value of the grouping label (the replica or engine
	// number), "" for a farm-wide series.
	Label  string      `json:"label,omitempty"`
	Values []sim.Float `json:"values"`
}

// TimelineQuery is a query of a Timeline that is not a KPI of
// metrics/kpi.promql (it has no meaning as one figure over a whole step).
// Placeholders as in kpi.promql: $model, $window (here the resolution).
type TimelineQuery struct {
	Name, Title, Unit, Expr string
}

// InFlightByReplica is the load chart's query: the requests warden has
// in flight at each replica (sent, not yet finished: running and
// waiting), averaged over each interval.
var InFlightByReplica = TimelineQuery{
	Name:  "in_flight_by_replica",
	Title: "Requests in flight per replica, mean",
	Unit:  "requests",
	Expr:  sim.InFlightByReplicaExpr,
}

// The KPIs of metrics/kpi.promql that a Timeline evaluates as range
// queries, with $window set to the resolution.
const (
	kpiKVUsageByEngine    = "kv_usage_by_engine"
	kpiPromptCachedRate   = "prompt_tokens_per_s_cached"
	kpiPromptComputedRate = "prompt_tokens_per_s_computed"
)

// Timeline resolution: TimelineStep, made coarser (whole seconds) when a
// step would need more than maxTimelinePoints points.
const (
	TimelineStep      = 5 * time.Second
	maxTimelinePoints = 240
)

// timelineStep is the resolution for a window of length win.
func timelineStep(win time.Duration) time.Duration {
	step := TimelineStep
	if n := int64(win / step); n > maxTimelinePoints {
		step = (win/maxTimelinePoints + time.Second - 1).Truncate(time.Second)
	}
	return min(step, win)
}

// timeline runs the answer's farm with its chosen routing once more, up to
// the wanted concurrency (the same seed gives the same steps as the
// sweep's), and queries that step's series from the run's metric store.
// It leaves res.Timeline nil when there is no answer farm.
func (p Plan) timeline(ctx context.Context, res *Result, farms []*sim.Farm, trace *sim.Trace) error {
	ci := res.Best
	if ci < 0 {
		ci = res.Closest
	}
	at := Level(res.Sessions, res.Concurrency)
	if ci < 0 || at < 0 || farms[ci] == nil || res.Candidates[ci].Chosen < 0 {
		return nil
	}
	c := &res.Candidates[ci]
	cfg := &c.Configs[c.Chosen]
	e, err := p.experiment(res, farms[ci], cfg, trace, at)
	if err != nil {
		return err
	}
	if trace == nil {
		e.Sessions = res.Sessions[:at+1] // the steps after it do not change it
	}
	var store *metrics.Store
	e.OnStore = func(_ string, st *metrics.Store) { store = st }
	rep, err := sim.Run(ctx, e)
	if err != nil {
		return fmt.Errorf("%s, %s, timeline: %w", c.Name, cfg.label(), err)
	}
	if store == nil || len(rep.Rows) != len(e.Sessions) {
		return fmt.Errorf("%s, %s, timeline: the simulator returned %d rows for %d sessions levels", c.Name, cfg.label(), len(rep.Rows), len(e.Sessions))
	}
	res.Workload.PausedPct = rep.Rows[len(rep.Rows)-1].PausedPct // the sessions' pauses on this farm
	// The steps lie back to back from time 0: the wanted one ends where
	// the sum of their durations does.
	var endMs, winMs int64
	for _, r := range rep.Rows {
		winMs = int64(math.Round(float64(r.DurationS) * 1000))
		endMs += winMs
	}
	win := time.Duration(winMs) * time.Millisecond
	if win < time.Millisecond {
		return nil
	}
	step := timelineStep(win)
	tl := &Timeline{Candidate: ci, Config: c.Chosen, Sessions: res.Concurrency, StepS: step.Seconds()}
	start := time.UnixMilli(endMs - winMs)
	for d := step; d <= win; d += step {
		tl.TimesS = append(tl.TimesS, d.Seconds())
	}
	q := timelineQuerier{ev: metrics.NewEvaluator(), store: store, model: farms[ci].Spec.Model, start: start, step: step, n: len(tl.TimesS)}
	if tl.InFlight, err = q.run(ctx, InFlightByReplica); err != nil {
		return err
	}
	for _, x := range []struct {
		dst *QuerySeries
		kpi string
	}{{&tl.KVUsage, kpiKVUsageByEngine}, {&tl.PromptCached, kpiPromptCachedRate}, {&tl.PromptComputed, kpiPromptComputedRate}} {
		k, ok := metrics.KPIByName(x.kpi)
		if !ok {
			return fmt.Errorf("timeline: metrics/kpi.promql has no KPI %s", x.kpi)
		}
		if *x.dst, err = q.run(ctx, TimelineQuery{Name: k.Name, Title: k.Title, Unit: k.Unit, Expr: k.Expr}); err != nil {
			return err
		}
	}
	res.Timeline = tl
	return nil
}

// timelineQuerier evaluates range queries over one step of one store.
type timelineQuerier struct {
	ev    *metrics.Evaluator
	store *metrics.Store
	model string
	start time.Time
	step  time.Duration
	n     int // points
}

// run evaluates tq at the n points start+step, start+2*step, ... and
// aligns the result (metrics.Evaluator.RangeAligned).
func (q timelineQuerier) run(ctx context.Context, tq TimelineQuery) (QuerySeries, error) {
	expr := metrics.Expand(tq.Expr, q.model, q.step)
	out := QuerySeries{Name: tq.Name, Title: tq.Title, Unit: tq.Unit, Query: expr}
	aligned, err := q.ev.RangeAligned(ctx, q.store, expr, q.start, q.step, q.n)
	if err != nil {
		return out, fmt.Errorf("timeline %s: %w", tq.Name, err)
	}
	for _, a := range aligned {
		ts := TimeSeries{Label: a.Label, Values: make([]sim.Float, len(a.Values))}
		for i, v := range a.Values {
			ts.Values[i] = sim.Float(v)
		}
		out.Series = append(out.Series, ts)
	}
	return out, nil
}
