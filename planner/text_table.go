package planner

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// Columns of the summary's table that its default view may leave out.
const (
	colPer1k    = "per 1k turns"
	colMissesAt = "misses at"
	colRouting  = "routing"
)

// textTable is the summary's table, one line per candidate, and the
// sentences that say what each candidate misses where it stops meeting the
// targets. Wide keeps every column; else "misses at" is left out (the
// cliffs below say it), then, while a line is wider than tableWidth, the
// columns fitTable's steps name.
func (res *Result) textTable(wide bool) (string, []string, error) {
	t := textRows{header: []string{"candidate"}}
	priced := res.CostUnit != "cards"
	if priced {
		t.header = append(t.header, "cost/h", colPer1k)
	}
	t.header = append(t.header, colRouting, "verdict", "TTFB p95 s [band]", "hit % [band]", "up to", colMissesAt, "demand/KV", "")
	for i := range res.Candidates {
		t.rows = append(t.rows, res.textRow(&t, i, priced))
	}
	text, err := t.fit(wide)
	return text, t.cliffs, err
}

// textRows are the summary table's header and lines as they are built,
// with each simulated candidate's routing (as "name: routing" and alone)
// and the sentences of what each misses where it stops meeting the targets.
type textRows struct {
	header           []string
	rows             [][]string
	routings, labels []string
	cliffs           []string
}

// col is the index of the header's column name.
func (t *textRows) col(name string) int { return slices.Index(t.header, name) }

// textRow is candidate i's line; a simulated candidate's routing and cliff
// go to t.
func (res *Result) textRow(t *textRows, i int, priced bool) []string {
	c := &res.Candidates[i]
	col := t.col
	row := make([]string, len(t.header))
	for j := range row {
		row[j] = "-"
	}
	row[0], row[len(row)-1] = c.Name, ""
	switch i {
	case res.Best:
		row[len(row)-1] = "<- answer"
	case res.Closest:
		row[len(row)-1] = "<- closest"
	}
	if priced {
		row[col("cost/h")] = strconv.FormatFloat(c.Cost, 'f', 2, 64)
		if c.CostPer1kTurns != nil {
			row[col(colPer1k)] = fmtFloat(float64(*c.CostPer1kTurns), 3)
		}
	}
	if !c.Fits {
		row[col("verdict")] = "does not fit"
		return row
	}
	if c.NotSimulated != "" {
		row[col("verdict")] = "not simulated"
		row[col("demand/KV")] = fmt.Sprintf("%.0f %%", 100*c.RuleOfThumb.Ratio)
		return row
	}
	cfg := &c.Configs[c.Chosen]
	r := &cfg.Rows[Level(res.Sessions, res.Concurrency)]
	verdict := c.Verdict
	if verdict == "" {
		verdict = map[bool]string{true: "meets", false: "misses"}[c.Meets]
	}
	p95, hit := fmtFloat(float64(r.TTFBP95), 2), fmtFloat(float64(r.PrefixHitPct), 1)
	if k := c.KPIs; k != nil && k.Runs > 1 {
		p95 += " [" + fmtSpan(k.TTFBP95, 2) + "]"
		hit += " [" + fmtSpan(k.PrefixHitPct, 1) + "]"
	}
	upTo := "-"
	if c.MaxSessions > 0 {
		upTo = strconv.Itoa(c.MaxSessions)
		if c.FailsAt == 0 {
			upTo = ">= " + upTo
		}
	}
	if c.FailsAt > 0 {
		row[col(colMissesAt)] = strconv.Itoa(c.FailsAt)
		if len(c.FailsAtMisses) > 0 {
			t.cliffs = append(t.cliffs, fmt.Sprintf("%s at %d sessions misses %s.", c.Name, c.FailsAt, res.BandMisses(c.FailsAtMisses)))
		}
	}
	row[col(colRouting)] = cfg.Label()
	t.routings = append(t.routings, c.Name+": "+cfg.Label())
	t.labels = append(t.labels, cfg.Label())
	row[col("verdict")], row[col("TTFB p95 s [band]")], row[col("hit % [band]")] = verdict, p95, hit
	row[col("up to")], row[col("demand/KV")] = upTo, fmt.Sprintf("%.0f %%", 100*c.RuleOfThumb.Ratio)
	return row
}

// fit renders the table, wide with every column; else without "misses
// at", then leaving out, one after the other until the table fits within
// tableWidth: the routing when every candidate has the same (said once
// under the table), the cost per 1,000 turns, the band's brackets (the
// nominal figure stays; the band is in the report and with --wide), then
// the routing whatever it is (said per candidate under the table).
func (t *textRows) fit(wide bool) (string, error) {
	drop := map[string]bool{}
	if !wide {
		drop[colMissesAt] = true
	}
	text, err := renderTable(t.header, t.rows, drop)
	if err != nil || wide || textWidth(text) <= tableWidth {
		return text, err
	}
	same := len(slices.Compact(slices.Clone(t.labels))) == 1
	steps := []func(){
		func() { drop[colRouting] = same },
		func() { drop[colPer1k] = true },
		func() {
			for _, name := range []string{"TTFB p95 s [band]", "hit % [band]"} {
				j := t.col(name)
				t.header[j] = strings.TrimSuffix(name, " [band]")
				for _, row := range t.rows {
					row[j], _, _ = strings.Cut(row[j], " [")
				}
			}
		},
		func() { drop[colRouting] = true },
	}
	for _, step := range steps {
		step()
		if text, err = renderTable(t.header, t.rows, drop); err != nil {
			return "", err
		}
		if textWidth(text) <= tableWidth {
			break
		}
	}
	if !drop[colRouting] {
		return text, nil
	}
	if same {
		return text + wrapText("routing: "+t.labels[0]+" for every candidate", summaryWidth), nil
	}
	var b strings.Builder
	b.WriteString(text)
	for _, r := range t.routings {
		b.WriteString(wrapText("routing of "+r, summaryWidth))
	}
	return b.String(), nil
}

// renderTable aligns the table's cells with two spaces between columns,
// leaving out the columns named in drop, with no padding after the last
// cell of a line.
func renderTable(header []string, rows [][]string, drop map[string]bool) (string, error) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	for _, row := range append([][]string{header}, rows...) {
		for j, cell := range row {
			if !drop[header[j]] {
				fmt.Fprint(tw, cell, "\t")
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return "", err
	}
	var b strings.Builder
	for line := range strings.Lines(buf.String()) {
		b.WriteString(strings.TrimRight(line, " \n") + "\n")
	}
	return b.String(), nil
}

// textWidth is the widest line of s, in characters.
func textWidth(s string) int {
	n := 0
	for line := range strings.Lines(s) {
		n = max(n, utf8.RuneCountInString(strings.TrimRight(line, "\n")))
	}
	return n
}
