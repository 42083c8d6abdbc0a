package web

import (
	"bytes"
	"fmt"
	"io"
)

// Report is a self-contained HTML page: the question and its one-sentence answer at the top,
// then sections of prose, tables, charts and KPI definitions. It knows nothing of the simulator:
// SimReport (and the planner's report) fill it from their results.
type Report struct {
	Title    string
	Question string // e.g. "How many H100s, and which routing, for 64 agent sessions?"
	Answer   string // the answer in one sentence, shown under the question
	// Notes are short lines under the answer: what it assumed (the plan's workload, say).
	Notes    []string
	Sections []Section
}

// Section is one part of a report, rendered in this order: paragraphs, tables, charts,
// definitions.
type Section struct {
	Heading     string
	Paragraphs  []string
	Tables      []Table
	Charts      []*Chart
	Definitions []Definition
}

// Table is a plain table of strings; every cell is HTML-escaped.
type Table struct {
	Caption string
	Header  []string
	Rows    [][]string
	// Prose aligns every cell left: a table of sentences, not figures.
	Prose bool
}

// Definition says how a figure of the report is computed: a KPI name and its PromQL expression,
// the same expression that runs against a real Prometheus server scraping a live farm.
type Definition struct {
	Name  string // e.g. "prefix_hit_pct"
	Title string // e.g. "Prefix cache hit rate"
	Unit  string
	Expr  string // PromQL
}

// Charts returns every chart of the report in page order.
func (r *Report) Charts() []*Chart {
	var out []*Chart
	for _, s := range r.Sections {
		out = append(out, s.Charts...)
	}
	return out
}

// Render writes the report as one HTML page with echarts inlined: it opens offline and fetches
// nothing. The output is deterministic. Render checks the report first: chart ids unique and
// valid, every chart buildable, table rows as wide as their header.
func (r *Report) Render(w io.Writer) error {
	page, err := r.page()
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := reportTemplate.Execute(&buf, page); err != nil {
		return fmt.Errorf("report %q: %w", r.Title, err)
	}
	_, err = w.Write(buf.Bytes())
	return err
}

// page turns the report into the template's view, checking it on the way.
func (r *Report) page() (*pageView, error) {
	p := &pageView{
		Title:    r.Title,
		Question: r.Question,
		Answer:   r.Answer,
		Notes:    r.Notes,
		Head:     inlineHead(),
	}
	seen := map[string]bool{}
	for si, s := range r.Sections {
		sv := sectionView{Heading: s.Heading, Paragraphs: s.Paragraphs, Definitions: s.Definitions}
		for ti, t := range s.Tables {
			for ri, row := range t.Rows {
				if len(t.Header) > 0 && len(row) != len(t.Header) {
					return nil, fmt.Errorf("report section %d (%q) table %d (%q) row %d: %d cells, header has %d",
						si, s.Heading, ti, t.Caption, ri, len(row), len(t.Header))
				}
			}
			sv.Tables = append(sv.Tables, t)
		}
		for _, c := range s.Charts {
			if c == nil {
				return nil, fmt.Errorf("report section %d (%q): nil chart", si, s.Heading)
			}
			if seen[c.ID] {
				return nil, fmt.Errorf("report section %d (%q): chart id %q used twice", si, s.Heading, c.ID)
			}
			seen[c.ID] = true
			cv, err := newChartView(c)
			if err != nil {
				return nil, fmt.Errorf("report section %d (%q): %w", si, s.Heading, err)
			}
			sv.Charts = append(sv.Charts, cv)
		}
		p.Sections = append(p.Sections, sv)
	}
	return p, nil
}
