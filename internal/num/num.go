// Package num holds the one quantile and the one number format of the
// reports (the simulator's, the load generator's, the planner's, the web
// pages'), so that they read the same figure the same way.
package num

import (
	"math"
	"slices"

	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// printer formats numbers with thousands separators (1,234,567.8).
var printer = message.NewPrinter(language.English)

// Format writes v with d decimals and thousands separators; "-" for NaN
// and infinities.
func Format(v float64, d int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return printer.Sprintf("%.*f", d, v)
}

// Int writes v with thousands separators.
func Int(v int64) string { return printer.Sprintf("%d", v) }

// Quantile is the q-quantile of sorted values by linear interpolation
// between order statistics (numpy's default, "linear"); NaN for none.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// QuantileOf is Quantile of values in any order (values is not changed).
func QuantileOf(values []float64, q float64) float64 {
	s := slices.Clone(values)
	slices.Sort(s)
	return Quantile(s, q)
}
