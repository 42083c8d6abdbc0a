package bench

import (
	"math"
	"slices"
	"sort"

	"github.com/lm-warden/warden/metrics"
)

// ttfbHistogram counts TTFBs in the buckets of warden_ttfb_seconds
// (metrics.WardenTTFBBuckets), so that bench's quantiles are the very
// estimate that the simulator's KPI (histogram_quantile over that
// histogram, metrics/kpi.promql) reports: a prediction and a measurement
// are then compared like with like.
type ttfbHistogram struct {
	bounds []float64 // upper bounds, +Inf excluded
	counts []float64 // per bucket (not cumulative), the last one +Inf
}

func newTTFBHistogram() *ttfbHistogram {
	b := metrics.WardenTTFBBuckets()
	return &ttfbHistogram{bounds: b, counts: make([]float64, len(b)+1)}
}

func (h *ttfbHistogram) observe(sec float64) {
	i := sort.SearchFloat64s(h.bounds, sec) // first bound >= sec: "le" semantics
	h.counts[i]++
}

// quantile is PromQL's histogram_quantile(q, ...) of the histogram: linear
// interpolation inside the bucket that holds the rank, the first bucket
// starting at 0, a rank in the +Inf bucket answered with the highest finite
// bound; NaN when empty.
func (h *ttfbHistogram) quantile(q float64) float64 {
	var total float64
	for _, c := range h.counts {
		total += c
	}
	if total == 0 || math.IsNaN(q) {
		return math.NaN()
	}
	if q < 0 {
		return math.Inf(-1)
	}
	if q > 1 {
		return math.Inf(1)
	}
	rank := q * total
	var cum float64
	for i, c := range h.counts {
		if cum+c >= rank && c > 0 || i == len(h.counts)-1 {
			if i == len(h.bounds) {
				return h.bounds[len(h.bounds)-1]
			}
			start := 0.0
			if i > 0 {
				start = h.bounds[i-1]
			}
			if c == 0 {
				return h.bounds[i]
			}
			return start + (h.bounds[i]-start)*((rank-cum)/c)
		}
		cum += c
	}
	return math.NaN() // not reached
}

// exactQuantile is the q-quantile of values by linear interpolation between
// order statistics (the simulator's direct TTFB quantiles), NaN for none.
func exactQuantile(values []float64, q float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	s := slices.Clone(values)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}
