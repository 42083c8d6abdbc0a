package web

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/bench"
)

// CompareReportOptions say what a comparison report is about; every field is optional.
type CompareReportOptions struct {
	Title    string // default "LM Warden: predicted against observed"
	Question string // default "Did the deployment do what the simulation promised?"
	Answer   string // default: the largest differences of the headline columns
}

// CompareReport turns a comparison of a prediction (warden sim) and a measurement (warden bench)
// into a report: the answer (how far apart the headline columns are at worst), the table of
// every step and column with the relative error (and points for percentages), one chart per
// column with the predicted and observed lines of each strategy against sessions, and the PromQL
// that defines each figure. The same comparison gives the same bytes.
func CompareReport(c *bench.Comparison, o CompareReportOptions) *Report {
	r := &Report{
		Title:    cmp.Or(o.Title, "LM Warden: predicted against observed"),
		Question: cmp.Or(o.Question, "Did the deployment do what the simulation promised?"),
		Answer:   cmp.Or(o.Answer, compareAnswer(c)),
	}
	t := Table{
		Caption: "Per step and column: error = (observed - predicted) / predicted; for percentages also observed - predicted in points",
		Header:  []string{"sessions", "strategy", "column", "predicted", "observed", "error"},
	}
	for _, p := range c.Pairs {
		strategy := p.Strategy
		if p.Observed != p.Strategy {
			strategy += " / " + p.Observed
		}
		for i, col := range bench.Columns {
			cell := p.Cells[i]
			t.Rows = append(t.Rows, []string{strconv.Itoa(p.Sessions), strategy, col.Title,
				fmtNum(cell.Predicted, col.Digits), fmtNum(cell.Observed, col.Digits), cell.FormatError(col)})
		}
	}
	paras := []string{
		"Predicted: " + c.Predicted + ".",
		"Observed: " + c.Observed + ".",
	}
	if len(c.Unmatched) > 0 {
		paras = append(paras, "Steps without a partner (not compared): "+strings.Join(c.Unmatched, ", ")+".")
	}
	side := Section{Heading: "Prediction and measurement, step by step", Paragraphs: paras, Tables: []Table{t}}

	// One chart per column: x = sessions, a predicted and an observed line per strategy.
	var strategies []string
	var steps []int
	for _, p := range c.Pairs {
		if !slices.Contains(strategies, p.Strategy) {
			strategies = append(strategies, p.Strategy)
		}
		if !slices.Contains(steps, p.Sessions) {
			steps = append(steps, p.Sessions)
		}
	}
	slices.Sort(steps)
	xs := make([]float64, len(steps))
	for i, n := range steps {
		xs[i] = float64(n)
	}
	charts := Section{Heading: "Predicted against observed, column by column",
		Paragraphs: []string{"Each chart draws, per strategy, the simulator's prediction and the benchmark's measurement " +
			"against sessions; a value that a side did not report is a gap."}}
	for i, col := range bench.Columns {
		var series []Series
		for _, s := range strategies {
			pred, obs := nanSlice(len(steps)), nanSlice(len(steps))
			for _, p := range c.Pairs {
				if p.Strategy == s {
					k := slices.Index(steps, p.Sessions)
					pred[k], obs[k] = p.Cells[i].Predicted, p.Cells[i].Observed
				}
			}
			series = append(series, Series{Name: s + " predicted", Y: pred}, Series{Name: s + " observed", Y: obs})
		}
		y := Axis{Name: col.Unit, Min: ptr(0.0)}
		if col.Percent {
			y.Max = ptr(100.0)
		}
		if col.Unit == "s" {
			y = Axis{Name: "seconds", Log: true}
		}
		id := "cmp-" + strings.ReplaceAll(col.Key, "_", "-")
		charts.Charts = append(charts.Charts, NewLineChart(id, col.Title+": predicted and observed", Axis{Name: "sessions"}, xs, y, series...))
	}
	defs := definitionsSection(nil)
	defs.Paragraphs = []string{"The simulator evaluates each figure's PromQL over a step's window; the benchmark counts sessions, " +
		"output tokens and TTFB itself (exact TTFB quantiles, which the expression matches within 2 % through native histograms), " +
		"and reads prefix hits, replicas busy and stayed turns from the servers' counters or runs the same PromQL on Prometheus."}
	r.Sections = []Section{side, charts, defs}
	return r
}

// compareAnswer summarises the largest differences of the headline columns.
func compareAnswer(c *bench.Comparison) string {
	if len(c.Pairs) == 0 {
		return "No step of the prediction matches a measured step."
	}
	var parts []string
	for i, col := range bench.Columns {
		switch col.Key {
		case "prefix_hit_pct", "ttfb_p50_s", "ttfb_p95_s", "sessions_per_hour":
		default:
			continue
		}
		k, e := c.Worst(i)
		if k < 0 {
			continue
		}
		p := c.Pairs[k]
		where := fmt.Sprintf("%s at %d sessions", p.Strategy, p.Sessions)
		if col.Percent {
			parts = append(parts, fmt.Sprintf("%s within %s points (worst %s)", col.Title, fmtNum(math.Abs(e), 1), where))
		} else {
			parts = append(parts, fmt.Sprintf("%s within %s %% (worst %s)", col.Title, fmtNum(100*math.Abs(e), 0), where))
		}
	}
	if len(parts) == 0 {
		return fmt.Sprintf("Over %d matched steps no headline figure was reported by both sides.", len(c.Pairs))
	}
	return fmt.Sprintf("Over %d matched steps the measurement is, at worst, %s of the prediction.", len(c.Pairs), strings.Join(parts, ", "))
}
