package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
)

// Engine limits of an [Evaluator].
const (
	// MaxSamples bounds the samples one query may hold in memory (the engine
	// fails every query when this is 0). 50M float samples are ~800 MB.
	MaxSamples = 50_000_000
	// QueryTimeout bounds one query's wall time.
	QueryTimeout = 2 * time.Minute
	// LookbackDelta is how far back an instant selector looks for a sample:
	// Prometheus's default, so that an expression gives the same answer here
	// and on a real server. A gauge therefore stays visible for 5 minutes
	// after its last sample; the simulator writes every series at every
	// scrape, so this matters only for series that stop (a removed replica).
	LookbackDelta = 5 * time.Minute
)

// Evaluator evaluates PromQL expressions against any [storage.Queryable]
// (a [Store] in simulation). It is safe for concurrent use.
type Evaluator struct {
	engine *promql.Engine
}

// NewEvaluator returns an evaluator with the limits above. The @ modifier and
// negative offsets are enabled, as in Prometheus servers since 2.33; the KPI
// table uses neither, so that it also runs on older servers.
func NewEvaluator() *Evaluator {
	return &Evaluator{engine: promql.NewEngine(promql.EngineOpts{
		MaxSamples:           MaxSamples,
		Timeout:              QueryTimeout,
		LookbackDelta:        LookbackDelta,
		EnableAtModifier:     true,
		EnableNegativeOffset: true,
		Parser:               parser.NewParser(parser.Options{}),
	})}
}

// Instant evaluates expr at the instant at. A scalar result is returned as a
// one-element vector without labels; a range-vector or string result is an
// error (use [Evaluator.Range] for charts).
func (e *Evaluator) Instant(ctx context.Context, q storage.Queryable, expr string, at time.Time) (promql.Vector, error) {
	qry, err := e.engine.NewInstantQuery(ctx, q, nil, expr, at)
	if err != nil {
		return nil, fmt.Errorf("metrics: query %q: %w", expr, err)
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		return nil, fmt.Errorf("metrics: evaluate %q at %s: %w", expr, at.UTC().Format(time.RFC3339Nano), res.Err)
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		return v, nil
	case promql.Scalar:
		return promql.Vector{{T: v.T, F: v.V}}, nil
	default:
		return nil, fmt.Errorf("metrics: evaluate %q: result is a %s, want an instant vector or scalar", expr, res.Value.Type())
	}
}

// Scalar evaluates expr at the instant at and returns its single value. An
// empty result is NaN with no error (no data is not a failure); a result of
// several elements, or a native histogram, is an error.
func (e *Evaluator) Scalar(ctx context.Context, q storage.Queryable, expr string, at time.Time) (float64, error) {
	v, err := e.Instant(ctx, q, expr, at)
	if err != nil {
		return math.NaN(), err
	}
	switch len(v) {
	case 0:
		return math.NaN(), nil
	case 1:
		if v[0].H != nil {
			return math.NaN(), fmt.Errorf("metrics: evaluate %q: result is a native histogram, want a float", expr)
		}
		return v[0].F, nil
	default:
		return math.NaN(), fmt.Errorf("metrics: evaluate %q: %d series (first %s), want at most one", expr, len(v), v[0].Metric)
	}
}

// Range evaluates expr at every step from start to end inclusive, as
// Prometheus's /api/v1/query_range does; for charts. The returned matrix is
// the caller's (a copy of the engine's pooled buffers), sorted by labels.
func (e *Evaluator) Range(ctx context.Context, q storage.Queryable, expr string, start, end time.Time, step time.Duration) (promql.Matrix, error) {
	if step <= 0 {
		return nil, fmt.Errorf("metrics: range query %q: step %v, want > 0", expr, step)
	}
	if end.Before(start) {
		return nil, fmt.Errorf("metrics: range query %q: end %s before start %s", expr, end, start)
	}
	qry, err := e.engine.NewRangeQuery(ctx, q, nil, expr, start, end, step)
	if err != nil {
		return nil, fmt.Errorf("metrics: query %q: %w", expr, err)
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		return nil, fmt.Errorf("metrics: evaluate %q over [%s, %s]: %w", expr, start.UTC().Format(time.RFC3339Nano), end.UTC().Format(time.RFC3339Nano), res.Err)
	}
	m, ok := res.Value.(promql.Matrix)
	if !ok {
		return nil, errors.New("metrics: range query returned no matrix")
	}
	out := make(promql.Matrix, len(m))
	for i, s := range m {
		out[i] = promql.Series{
			Metric:     s.Metric,
			Floats:     append([]promql.FPoint(nil), s.Floats...),
			Histograms: append([]promql.HPoint(nil), s.Histograms...),
		}
	}
	return out, nil
}
