package metrics

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"

	"github.com/lm-warden/warden/metrics/names"
)

// AlignedSeries is one series of a range query put on a regular grid.
type AlignedSeries struct {
	// Label is the value of the series' one grouping label (the replica
	// or engine number), "" for a series without labels.
	Label string
	// Values are at start+step, start+2*step, ...; NaN where the query
	// gave nothing.
	Values []float64
}

// RangeAligned evaluates expr at the n points start+step, ...,
// start+n*step and aligns the result: one series per value of its single
// grouping label (replica or engine; an instance label, absent in
// simulation, is not expected), ordered by number. The charts of a
// timeline (a plan's, a simulation's) read it.
func (e *Evaluator) RangeAligned(ctx context.Context, q storage.Queryable, expr string, start time.Time, step time.Duration, n int) ([]AlignedSeries, error) {
	if n == 0 {
		return nil, nil
	}
	first := start.Add(step)
	m, err := e.Range(ctx, q, expr, first, start.Add(step*time.Duration(n)), step)
	if err != nil {
		return nil, err
	}
	stepMs, firstMs := step.Milliseconds(), first.UnixMilli()
	var out []AlignedSeries
	for _, s := range m {
		label, err := seriesLabel(s.Metric)
		if err != nil {
			return nil, err
		}
		as := AlignedSeries{Label: label, Values: make([]float64, n)}
		for i := range as.Values {
			as.Values[i] = math.NaN()
		}
		for _, pt := range s.Floats {
			if k := (pt.T - firstMs) / stepMs; k >= 0 && k < int64(n) && (pt.T-firstMs)%stepMs == 0 {
				as.Values[k] = pt.F
			}
		}
		out = append(out, as)
	}
	slices.SortFunc(out, func(a, b AlignedSeries) int {
		x, _ := strconv.Atoi(a.Label)
		y, _ := strconv.Atoi(b.Label)
		return cmp.Or(cmp.Compare(x, y), strings.Compare(a.Label, b.Label))
	})
	return out, nil
}

// seriesLabel is the value of a result series' one label (replica or
// engine), or "" for a series without labels.
func seriesLabel(l labels.Labels) (string, error) {
	var name, value string
	n := 0
	l.Range(func(lb labels.Label) {
		name, value = lb.Name, lb.Value
		n++
	})
	switch {
	case n == 0:
		return "", nil
	case n == 1 && (name == names.LabelReplica || name == names.LabelEngine):
		return value, nil
	}
	return "", fmt.Errorf("result series %s: want no label or one replica or engine label", l)
}
