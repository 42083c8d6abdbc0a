package metrics

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics/names"
)

// Histogram accumulates observations into a cumulative classic Prometheus
// histogram and writes it to a [Store] as the series name_bucket{le=...}
// (one per upper bound plus le="+Inf"), name_sum and name_count.
//
// Observe accumulates; Append writes the current totals at a scrape instant.
// Like a real client library's histogram, the written values only grow.
//
// [Histogram.WithNative] adds the native histogram of the same name, as
// client_golang exposes both from one histogram with a
// NativeHistogramBucketFactor.
type Histogram struct {
	native  *NativeHistogram // nil unless WithNative
	bounds  []float64        // finite upper bounds, strictly increasing
	counts  []uint64         // per bucket (not cumulative); the last one is +Inf
	sum     float64
	count   uint64
	buckets []*Series // aligned with counts
	sumS    *Series
	countS  *Series
}

// NewHistogram creates the series of the histogram called name (the base
// name, without _bucket) with the extra labels l (a __name__ in l is
// replaced) and the given upper bounds. The bounds must be finite and
// strictly increasing; a trailing +Inf is accepted and dropped, since the
// +Inf bucket is always written. NewHistogram panics on invalid bounds or an
// empty name: both are programming errors. The le values are formatted as
// Prometheus 3 normalises them on scrape ("1.0", "0.005", "+Inf").
func NewHistogram(s *Store, name string, l labels.Labels, upperBounds []float64) *Histogram {
	if name == "" {
		panic("metrics: NewHistogram: empty name")
	}
	bounds := append([]float64(nil), upperBounds...)
	if n := len(bounds); n > 0 && math.IsInf(bounds[n-1], +1) {
		bounds = bounds[:n-1]
	}
	for i, b := range bounds {
		if math.IsNaN(b) || math.IsInf(b, 0) {
			panic(fmt.Sprintf("metrics: NewHistogram %s: bound %d is %v, want a finite number", name, i, b))
		}
		if i > 0 && b <= bounds[i-1] {
			panic(fmt.Sprintf("metrics: NewHistogram %s: bound %d (%v) is not above bound %d (%v)", name, i, b, i-1, bounds[i-1]))
		}
	}
	h := &Histogram{
		bounds:  bounds,
		counts:  make([]uint64, len(bounds)+1),
		buckets: make([]*Series, len(bounds)+1),
	}
	b := labels.NewBuilder(l)
	b.Set(names.LabelName, name+names.BucketSuffix)
	for i := range h.buckets {
		le := math.Inf(+1)
		if i < len(bounds) {
			le = bounds[i]
		}
		b.Set(names.LabelLE, labels.FormatOpenMetricsFloat(le))
		h.buckets[i] = s.Series(b.Labels())
	}
	b.Del(names.LabelLE)
	b.Set(names.LabelName, name+names.SumSuffix)
	h.sumS = s.Series(b.Labels())
	b.Set(names.LabelName, name+names.CountSuffix)
	h.countS = s.Series(b.Labels())
	return h
}

// WithNative makes h also write the native histogram called name (no
// suffix) with the same labels and parameters o: every Observe goes to
// both, every Append writes both. It returns h; calling it twice panics.
func (h *Histogram) WithNative(s *Store, o names.NativeOpts) *Histogram {
	if h.native != nil {
		panic("metrics: Histogram.WithNative called twice")
	}
	l := labels.NewBuilder(h.countS.Labels())
	l.Set(names.LabelName, strings.TrimSuffix(l.Get(names.LabelName), names.CountSuffix))
	h.native = NewNativeHistogram(s, l.Get(names.LabelName), l.Labels(), o)
	return h
}

// Native returns the native histogram added by WithNative, or nil.
func (h *Histogram) Native() *NativeHistogram { return h.native }

// Observe records one observation: v counts in every bucket whose upper bound
// is >= v, and in _sum and _count. NaN counts only in the +Inf bucket (and
// makes _sum NaN), as in client_golang.
func (h *Histogram) Observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // first bound >= v; len(bounds) for +Inf and NaN
	h.counts[i]++
	h.sum += v
	h.count++
	if h.native != nil {
		h.native.Observe(v)
	}
}

// ObserveN records n observations of v: the same counts and the same _sum,
// to the last bit, as n calls of Observe(v).
func (h *Histogram) ObserveN(v float64, n uint64) {
	if n == 0 {
		return
	}
	i := sort.SearchFloat64s(h.bounds, v)
	h.counts[i] += n
	for range n {
		h.sum += v // n additions, not v*n: the sum rounds as Observe's does
	}
	h.count += n
	if h.native != nil {
		for range n {
			h.native.Observe(v)
		}
	}
}

// Count reports the number of observations so far.
func (h *Histogram) Count() uint64 { return h.count }

// Sum reports the sum of all observations so far.
func (h *Histogram) Sum() float64 { return h.sum }

// Append writes the current cumulative bucket counts, _sum and _count as
// samples at tMs (milliseconds, non-decreasing; see [Series.Append]), and
// the native histogram's sample when there is one.
func (h *Histogram) Append(tMs int64) {
	var cum uint64
	for i, c := range h.counts {
		cum += c
		h.buckets[i].Append(tMs, float64(cum))
	}
	h.sumS.Append(tMs, h.sum)
	h.countS.Append(tMs, float64(h.count))
	if h.native != nil {
		h.native.Append(tMs)
	}
}
