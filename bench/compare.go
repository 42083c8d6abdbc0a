package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/lm-warden/warden/internal/num"
	"github.com/lm-warden/warden/sim"
)

// Column is one figure that both the simulator and bench report.
type Column struct {
	Key     string // the JSON field, e.g. "prefix_hit_pct"
	Title   string // e.g. "prefix hit %"
	Unit    string // e.g. "%", "s"
	Percent bool   // a percentage: differences are also given in points
	Digits  int    // decimals shown
	get     func(*sim.Row) float64
}

// Columns are the compared figures, in the order of `warden sim`'s table.
var Columns = []Column{
	{Key: "sessions_per_hour", Title: "sessions/h", Unit: "sessions/h", Digits: 0, get: func(r *sim.Row) float64 { return float64(r.SessionsPerHour) }},
	{Key: "output_tokens_per_min", Title: "output tok/min", Unit: "tokens/min", Digits: 0, get: func(r *sim.Row) float64 { return float64(r.OutputTokensPerMin) }},
	{Key: "ttfb_p50_s", Title: "TTFB p50 s", Unit: "s", Digits: 2, get: func(r *sim.Row) float64 { return float64(r.TTFBP50) }},
	{Key: "ttfb_p95_s", Title: "TTFB p95 s", Unit: "s", Digits: 2, get: func(r *sim.Row) float64 { return float64(r.TTFBP95) }},
	{Key: "replicas_busy", Title: "replicas busy", Unit: "replicas", Digits: 1, get: func(r *sim.Row) float64 { return float64(r.ReplicasBusy) }},
	{Key: "prefix_hit_pct", Title: "prefix hit %", Unit: "%", Percent: true, Digits: 1, get: func(r *sim.Row) float64 { return float64(r.PrefixHitPct) }},
	{Key: "stayed_pct", Title: "stayed %", Unit: "%", Percent: true, Digits: 1, get: func(r *sim.Row) float64 { return float64(r.StayedPct) }},
}

// Value returns the column's value in row r.
func (c *Column) Value(r *sim.Row) float64 { return c.get(r) }

// Cell is one column of one matched step: prediction, measurement and how
// far apart they are.
type Cell struct {
	Predicted, Observed float64 // NaN: not reported
	// RelErr is (observed - predicted) / predicted; NaN when either is
	// missing or the prediction is 0.
	RelErr float64
	// Points is observed - predicted for a percentage column, NaN otherwise.
	Points float64
}

// Pair is one step (strategy and sessions) present in both reports.
type Pair struct {
	Strategy string // the predicted row's strategy
	Observed string // the observed row's strategy (its label)
	Sessions int
	Cells    []Cell // aligned with Columns
	Pred     sim.Row
	Obs      sim.Row
}

// Comparison is a prediction and a measurement side by side.
type Comparison struct {
	Predicted, Observed string // the reports' farm descriptions
	Pairs               []Pair // by sessions, then the predicted report's strategy order
	// Unmatched lists the rows of either report without a partner, e.g.
	// "predicted least-loaded @ 16".
	Unmatched []string
}

// CompareOptions say how rows are matched.
type CompareOptions struct {
	// Strategy, when set, compares the predicted rows of this strategy with
	// every observed row, whatever its label (the observed report must
	// then hold one strategy). Empty: rows match by equal strategy and
	// sessions.
	Strategy string
}

// Compare matches the rows of a predicted report (warden sim --json) and an
// observed one (warden bench --json, several merged) by strategy and
// sessions. It fails when no row matches.
func Compare(pred, obs *sim.Report, o CompareOptions) (*Comparison, error) {
	c := &Comparison{Predicted: pred.Farm, Observed: obs.Farm}
	obsStrategies := strategiesOf(obs.Rows)
	if o.Strategy != "" {
		if !slices.Contains(strategiesOf(pred.Rows), o.Strategy) {
			return nil, fmt.Errorf("strategy %q: the predicted report has %s", o.Strategy, strings.Join(strategiesOf(pred.Rows), ", "))
		}
		if len(obsStrategies) > 1 {
			return nil, fmt.Errorf("strategy %q: the observed report holds several strategies (%s); match them by name instead", o.Strategy, strings.Join(obsStrategies, ", "))
		}
	}
	label := func(predicted string) string {
		if o.Strategy != "" && len(obsStrategies) == 1 {
			if predicted != o.Strategy {
				return "" // compared strategy only
			}
			return obsStrategies[0]
		}
		return predicted
	}
	used := make([]bool, len(obs.Rows))
	pairs := make([]Pair, 0, len(pred.Rows))
	for _, p := range pred.Rows {
		l := label(p.Strategy)
		j := -1
		if l != "" {
			j = slices.IndexFunc(obs.Rows, func(r sim.Row) bool { return r.Strategy == l && r.Sessions == p.Sessions })
		}
		if j < 0 || used[j] {
			if o.Strategy == "" || p.Strategy == o.Strategy {
				c.Unmatched = append(c.Unmatched, fmt.Sprintf("predicted %s @ %d", p.Strategy, p.Sessions))
			}
			continue
		}
		used[j] = true
		pair := Pair{Strategy: p.Strategy, Observed: obs.Rows[j].Strategy, Sessions: p.Sessions, Pred: p, Obs: obs.Rows[j]}
		for _, col := range Columns {
			pair.Cells = append(pair.Cells, newCell(col, col.get(&p), col.get(&obs.Rows[j])))
		}
		pairs = append(pairs, pair)
	}
	for j, r := range obs.Rows {
		if !used[j] {
			c.Unmatched = append(c.Unmatched, fmt.Sprintf("observed %s @ %d", r.Strategy, r.Sessions))
		}
	}
	if len(pairs) == 0 {
		return nil, fmt.Errorf("no step matches: predicted %s, observed %s (rows match by strategy and sessions; with one observed strategy, name the predicted one to compare it with)",
			rowNames(pred.Rows), rowNames(obs.Rows))
	}
	order := strategiesOf(pred.Rows)
	slices.SortStableFunc(pairs, func(a, b Pair) int {
		if a.Sessions != b.Sessions {
			return a.Sessions - b.Sessions
		}
		return slices.Index(order, a.Strategy) - slices.Index(order, b.Strategy)
	})
	c.Pairs = pairs
	return c, nil
}

func newCell(col Column, p, o float64) Cell {
	c := Cell{Predicted: p, Observed: o, RelErr: math.NaN(), Points: math.NaN()}
	if finite(p) && finite(o) {
		if p != 0 {
			c.RelErr = (o - p) / math.Abs(p)
		} else if o == 0 {
			c.RelErr = 0
		}
		if col.Percent {
			c.Points = o - p
		}
	}
	return c
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func strategiesOf(rows []sim.Row) []string {
	var out []string
	for _, r := range rows {
		if !slices.Contains(out, r.Strategy) {
			out = append(out, r.Strategy)
		}
	}
	return out
}

func rowNames(rows []sim.Row) string {
	if len(rows) == 0 {
		return "no rows"
	}
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = fmt.Sprintf("%s @ %d", r.Strategy, r.Sessions)
	}
	return strings.Join(names, ", ")
}

// MergeReports joins observed reports (one per bench run) into one; their
// farm descriptions are joined with "; ". A step (strategy and sessions)
// present twice is an error.
func MergeReports(reps ...*sim.Report) (*sim.Report, error) {
	if len(reps) == 0 {
		return nil, errors.New("no report to merge")
	}
	out := &sim.Report{}
	var farms []string
	for _, r := range reps {
		if !slices.Contains(farms, r.Farm) {
			farms = append(farms, r.Farm)
		}
		for _, row := range r.Rows {
			if slices.ContainsFunc(out.Rows, func(x sim.Row) bool { return x.Strategy == row.Strategy && x.Sessions == row.Sessions }) {
				return nil, fmt.Errorf("step %s @ %d appears twice; give each bench run its own --label", row.Strategy, row.Sessions)
			}
			out.Rows = append(out.Rows, row)
		}
	}
	out.Farm = strings.Join(farms, "; ")
	return out, nil
}

// FormatError writes a cell's difference: "+12.3%" for a figure,
// "-2.1 pts (-2.5%)" for a percentage, "-" when it cannot be computed.
func (c Cell) FormatError(col Column) string {
	rel := "-"
	if finite(c.RelErr) {
		rel = signed(100*c.RelErr, 1) + "%"
	}
	if col.Percent && finite(c.Points) {
		return signed(c.Points, 1) + " pts (" + rel + ")"
	}
	return rel
}

func signed(v float64, d int) string {
	s := strconv.FormatFloat(v, 'f', d, 64)
	if s == "-"+strconv.FormatFloat(0, 'f', d, 64) {
		s = s[1:]
	}
	if !strings.HasPrefix(s, "-") {
		s = "+" + s
	}
	return s
}

// WriteText writes the comparison as a table: one line per step and column,
// prediction, measurement and the error; then the rows without a partner.
func (c *Comparison) WriteText(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "predicted: %s\nobserved:  %s\n\n", c.Predicted, c.Observed); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "sessions\tstrategy\tcolumn\tpredicted\tobserved\terror\t")
	for _, p := range c.Pairs {
		strategy := p.Strategy
		if p.Observed != p.Strategy {
			strategy += " / " + p.Observed
		}
		for i, col := range Columns {
			cell := p.Cells[i]
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t\n", p.Sessions, strategy, col.Title,
				num.Format(cell.Predicted, col.Digits), num.Format(cell.Observed, col.Digits), cell.FormatError(col))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(c.Unmatched) > 0 {
		if _, err := fmt.Fprintf(w, "\nwithout a partner: %s\n", strings.Join(c.Unmatched, ", ")); err != nil {
			return err
		}
	}
	return nil
}

// Worst returns, for column index i, the pair with the largest absolute
// error (points for a percentage, else relative) and that error; -1 when
// no pair has one.
func (c *Comparison) Worst(i int) (int, float64) {
	best, worst := -1, 0.0
	for k, p := range c.Pairs {
		cell := p.Cells[i]
		e := cell.RelErr
		if Columns[i].Percent {
			e = cell.Points
		}
		if finite(e) && (best < 0 || math.Abs(e) > math.Abs(worst)) {
			best, worst = k, e
		}
	}
	return best, worst
}

// comparisonJSON is the JSON form of a Comparison (`warden compare --json`).
type comparisonJSON struct {
	Predicted string     `json:"predicted"`
	Observed  string     `json:"observed"`
	Pairs     []pairJSON `json:"pairs"`
	Unmatched []string   `json:"unmatched"`
}

type pairJSON struct {
	Strategy         string     `json:"strategy"`
	ObservedStrategy string     `json:"observed_strategy"`
	Sessions         int        `json:"sessions"`
	Columns          []cellJSON `json:"columns"`
}

type cellJSON struct {
	Column    string     `json:"column"`
	Predicted sim.Float  `json:"predicted"`
	Observed  sim.Float  `json:"observed"`
	RelErr    sim.Float  `json:"rel_err"`          // (observed - predicted) / predicted
	Points    *sim.Float `json:"points,omitempty"` // observed - predicted, percentage columns
}

// MarshalJSON writes the comparison with its columns in order; a value that
// is missing (NaN) is null.
func (c *Comparison) MarshalJSON() ([]byte, error) {
	v := comparisonJSON{Predicted: c.Predicted, Observed: c.Observed, Unmatched: c.Unmatched, Pairs: []pairJSON{}}
	if v.Unmatched == nil {
		v.Unmatched = []string{}
	}
	for _, p := range c.Pairs {
		pj := pairJSON{Strategy: p.Strategy, ObservedStrategy: p.Observed, Sessions: p.Sessions}
		for i, col := range Columns {
			cell := p.Cells[i]
			cj := cellJSON{Column: col.Key, Predicted: sim.Float(cell.Predicted), Observed: sim.Float(cell.Observed), RelErr: sim.Float(cell.RelErr)}
			if col.Percent {
				pts := sim.Float(cell.Points)
				cj.Points = &pts
			}
			pj.Columns = append(pj.Columns, cj)
		}
		v.Pairs = append(v.Pairs, pj)
	}
	return json.Marshal(v)
}
