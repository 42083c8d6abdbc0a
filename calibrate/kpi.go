package calibrate

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/sim"
)

// Comparison is one KPI predicted and observed.
type Comparison struct {
	Name      string    `json:"name"`
	Title     string    `json:"title"`
	Unit      string    `json:"unit"`
	Predicted sim.Float `json:"predicted"`
	Observed  sim.Float `json:"observed"`
	// RelErr is (observed - predicted) / |predicted|; NaN when either is
	// missing or the prediction is 0.
	RelErr sim.Float `json:"rel_err"`
	// Verdict is "ok", "drift" (|RelErr| beyond the tolerance) or
	// "no data".
	Verdict string `json:"verdict"`
}

// Verdicts of a Comparison.
const (
	VerdictOK     = "ok"
	VerdictDrift  = "drift"
	VerdictNoData = "no data"
)

// HeadlineKPIs are the KPIs a prediction and an observation are compared
// on (the columns of the simulator's rows).
var HeadlineKPIs = []string{"prefix_hit_pct", "ttfb_p50_s", "ttfb_p95_s", "output_tokens_per_min", "sessions_per_hour", "replicas_busy", "stayed_pct"}

// Compare compares the KPIs named by names (nil: every KPI of the file that
// has no labels) predicted and observed, with a relative tolerance (0.1 for
// 10%). A zero prediction compares absolutely: any observed value beyond
// the tolerance drifts.
func Compare(names []string, predicted, observed map[string]float64, tolerance float64) []Comparison {
	if names == nil {
		for _, k := range metrics.KPIs() {
			if !strings.Contains(k.Name, "_by_") {
				names = append(names, k.Name)
			}
		}
	}
	var out []Comparison
	for _, n := range names {
		k, _ := metrics.KPIByName(n)
		p, pok := predicted[n]
		o, ook := observed[n]
		pv, ov := nanIfMissing(p, pok), nanIfMissing(o, ook)
		c := Comparison{Name: n, Title: k.Title, Unit: k.Unit, Predicted: sim.Float(pv), Observed: sim.Float(ov), RelErr: sim.Float(math.NaN())}
		switch {
		case !finite(pv) || !finite(ov):
			c.Verdict = VerdictNoData
		case pv == 0:
			c.Verdict = VerdictOK
			if math.Abs(ov) > tolerance {
				c.Verdict = VerdictDrift
			}
		default:
			rel := (ov - pv) / math.Abs(pv)
			c.RelErr = sim.Float(rel)
			c.Verdict = VerdictOK
			if math.Abs(rel) > tolerance {
				c.Verdict = VerdictDrift
			}
		}
		out = append(out, c)
	}
	return out
}

func nanIfMissing(v float64, ok bool) float64 {
	if !ok {
		return math.NaN()
	}
	return v
}

// Drifted reports whether any comparison drifted.
func Drifted(cs []Comparison) bool {
	for _, c := range cs {
		if c.Verdict == VerdictDrift {
			return true
		}
	}
	return false
}

// WriteComparisons writes a table of KPI, predicted, observed, error and
// verdict.
func WriteComparisons(w io.Writer, cs []Comparison) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KPI\tunit\tpredicted\tobserved\terror\tverdict")
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, c.Unit, num(float64(c.Predicted)), num(float64(c.Observed)), pct(float64(c.RelErr)), c.Verdict)
	}
	return tw.Flush()
}

func num(v float64) string {
	if !finite(v) {
		return "-"
	}
	if math.Abs(v) >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func pct(v float64) string {
	if !finite(v) {
		return "-"
	}
	return fmt.Sprintf("%+.1f%%", 100*v)
}
