package bench

import (
	"math"
	"slices"
)

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
