package web

import (
	"math"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/sim"
)

// sessionsPerHour is the row's sessions per hour, or, when no session finished in the step,
// says so ("none finished in a 1 m step") instead of a 0 that reads as a measured rate.
func sessionsPerHour(x *sim.Row, durationS float64) string {
	if v := float64(x.SessionsPerHour); finite(v) && v > 0 {
		return fmtNum(v, 0)
	}
	d := float64(x.DurationS)
	if !(d > 0) {
		d = durationS
	}
	return "no session finished in a " + fmtSpan(d) + " step"
}

// fmtSpan writes a duration in seconds the way a reader says it: "45 s", "1 m", "1.5 h".
func fmtSpan(s float64) string {
	switch {
	case s >= 3600 && math.Mod(s, 360) == 0:
		return strconv.FormatFloat(s/3600, 'f', -1, 64) + " h"
	case s >= 60 && math.Mod(s, 6) == 0:
		return strconv.FormatFloat(s/60, 'f', -1, 64) + " m"
	}
	return strconv.FormatFloat(roundF(s, 1), 'f', -1, 64) + " s"
}

func roundF(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten... of a quarter of it, so an axis
// ends on a round tick just past v.
func niceCeil(v float64) float64 {
	if !(v > 0) {
		return 1
	}
	step := math.Pow(10, math.Floor(math.Log10(v/4)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v/(m*step) <= 5 {
			return math.Ceil(v/(m*step)) * m * step
		}
	}
	return math.Ceil(v/(10*step)) * 10 * step
}

// fmtPctOf writes a fraction as a percentage, 0.2 as "20".
func fmtPctOf(f float64) string { return strconv.FormatFloat(roundF(100*f, 1), 'f', -1, 64) }

// joinAndWeb joins "a", "a and b", "a, b and c".
func joinAndWeb(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

func firstOr(items []string, def string) string {
	if len(items) == 0 {
		return def
	}
	return items[0]
}
