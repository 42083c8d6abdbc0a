package planner

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/calibrate"
)

// TextOptions say how Result.WriteText writes the answer.
type TextOptions struct {
	// Report is the HTML report's path, named on the last line ("": none).
	Report string
	// Wide keeps every column of the table, however wide.
	Wide bool
}

// summaryWidth is the column the summary's sentences wrap at, and
// tableWidth the widest its table may be without --wide: a terminal of
// about 120 columns shows both unbroken.
const (
	summaryWidth = 110
	tableWidth   = 120
)

// WriteText writes the answer as `warden plan` prints it: the answer (with the sentence that reconciles
// the rule of thumb when the farm it names is over it) and the workload it
// assumed, one line per candidate within tableWidth columns (wide: every
// column, however wide), what a candidate misses where it stops meeting
// the targets and in which run of the band, what the routings, the band
// and the verdicts mean in plain words, and the sentence that reconciles
// the rule of thumb with the simulation. Sentences wrap at summaryWidth.
func (res *Result) WriteText(w io.Writer, o TextOptions) error {
	var b summary
	b.para(res.Answer)
	if bc := res.BuyerCheck; bc != nil {
		b.WriteString("\n")
		b.buyerCheck(bc)
	}
	if wl := res.Workload.WorkloadLine(); wl != "" {
		b.WriteString("\n")
		b.para(wl)
	}
	b.WriteString("\n")
	table, cliffs, err := res.textTable(o.Wide)
	if err != nil {
		return err
	}
	b.WriteString(table)
	if len(cliffs) > 0 {
		b.WriteString("\n")
		for _, c := range cliffs {
			b.para(c)
		}
	}
	cards, err := res.routingCardsText()
	if err != nil {
		return err
	}
	if cards != "" {
		b.WriteString("\n")
		b.WriteString(cards)
	}
	b.WriteString("\n")
	res.footnotes(&b, o.Wide)
	if res.Reconcile != "" {
		b.WriteString("\n")
		b.para(res.Reconcile)
	}
	for i := range res.Candidates {
		if c := &res.Candidates[i]; !c.Fits {
			b.WriteString("\n")
			b.para(c.Name + ": " + c.Error)
		}
	}
	if ob := res.Observation; ob != nil {
		fmt.Fprintf(&b, "\nprediction vs observation (%s, %s over %s):\n", ob.Source, ob.Strategy, ob.End.Sub(ob.Start))
		if err := calibrate.WriteComparisons(&b, ob.KPIs); err != nil {
			return err
		}
	}
	if o.Report != "" {
		fmt.Fprintf(&b, "\nreport: %s\n", o.Report)
	}
	_, err = w.Write(b.Bytes())
	return err
}

// summary is WriteText's text as it is written.
type summary struct{ bytes.Buffer }

// para writes the sentences that are not empty as one paragraph wrapped
// at summaryWidth; nothing when all are.
func (b *summary) para(sentences ...string) {
	var nonEmpty []string
	for _, s := range sentences {
		if s != "" {
			nonEmpty = append(nonEmpty, s)
		}
	}
	if len(nonEmpty) > 0 {
		b.WriteString(wrapText(strings.Join(nonEmpty, " "), summaryWidth))
	}
}

// buyerCheck writes what to rent and run to decide a marginal answer,
// the steps numbered and their commands indented, ready to paste.
func (b *summary) buyerCheck(bc *BuyerCheck) {
	b.para(bc.Lead())
	for i, st := range bc.Steps {
		why := wrapText(fmt.Sprintf("%d. %s", i+1, st.Why), summaryWidth-3)
		b.WriteString(strings.ReplaceAll(strings.TrimSuffix(why, "\n"), "\n", "\n   ") + "\n")
		if st.Command != "" {
			b.WriteString(wrapCommand(st.Command, summaryWidth, "   "))
		}
	}
	b.para("Then " + bc.Then)
	b.para(bc.Margin)
}

// footnotes say in plain words what the routings named do, what the band
// is, what was not simulated, what the verdicts and the table's columns
// mean (wide: "misses at" too) and what "cheapest" is.
func (res *Result) footnotes(b *summary, wide bool) {
	for _, r := range res.RoutingWords() {
		b.para(r)
	}
	if band := res.BandWords(); band != "" {
		b.para("[band]: " + band)
	}
	b.para(res.SkipNote()) // what was not simulated, and why ("" for none)
	b.para("verdict: " + res.VerdictRule())
	upTo := "up to: the most sessions at which the band's worst run still meets every target (bisected)"
	if wide {
		upTo += "; misses at: the next"
	}
	b.para(upTo + "; demand/KV: the rule of thumb, sessions x typical context over the farm's KV cache (over 100 % is over, " +
		"yet a farm over it can meet the targets: the simulation decides).")
	if res.CostUnit == "cards" {
		b.para(`cheapest by card count: one GPU kind, so the same order as by money (give --price "GPU=per GPU-hour,..." to see costs)`)
	} else if w := res.PricesWords(); w != "" {
		b.para(w)
	}
}

// fmtSpan writes a band's edges in ascending order, "2.90-3.60".
func fmtSpan(r Range, d int) string {
	lo, hi := float64(r.Low), float64(r.High)
	if lo > hi {
		lo, hi = hi, lo
	}
	return fmtFloat(lo, d) + "-" + fmtFloat(hi, d)
}

// VerdictRule says what the verdicts mean, with the plan's headroom.
func (res *Result) VerdictRule() string {
	if res.HeadroomSessions == 0 {
		return "meets if the band's worst run meets every target, marginal if only the nominal run does, misses if that misses one."
	}
	n, h := res.Concurrency, res.HeadroomSessions
	return fmt.Sprintf("meets if the band's worst run meets every target at %d and, with %s %% headroom, at %d sessions; "+
		"marginal if only the nominal run does at %d, or the worst meets at %d but not at %d; misses if the nominal run misses one at %d.",
		n, strconv.FormatFloat(100*res.Headroom, 'f', -1, 64), h, n, n, h, n)
}

// fmtFloat writes v with d decimals, "-" for NaN.
func fmtFloat(v float64, d int) string {
	if v != v {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', d, 64)
}
