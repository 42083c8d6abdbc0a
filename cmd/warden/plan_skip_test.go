package main

import (
	"bytes"
	"html"
	"strings"
	"testing"

	"github.com/lm-warden/warden/internal/racetest"
	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/web"
)

// TestPlanSkipNote: `warden plan` says what it did not simulate and why,
// in the terminal's summary and in the HTML report, the sentence of the
// result's "skipped" counts (planner's SkipNote).
func TestPlanSkipNote(t *testing.T) {
	racetest.SimulationOnly(t)
	js, err := runWarden(t, "plan", "--json", "--out", "", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	res, err := planner.ReadResult([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped == nil || res.Skipped.Steps == 0 || res.Skipped.NominalOnly == 0 || res.Skipped.SharedWarmUps == 0 {
		t.Fatalf("skipped %+v: want steps simulated, band steps left at the nominal run and warm-ups shared (the built-in plan has each)", res.Skipped)
	}
	note := res.SkipNote()
	if !strings.HasPrefix(note, "Not simulated, as they could not change the answer: ") {
		t.Fatalf("note %q", note)
	}
	var sum bytes.Buffer
	if err := res.WriteText(&sum, planner.TextOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(unwrap(sum.String()), note) {
		t.Errorf("the summary lacks the skip note %q:\n%s", note, sum.String())
	}
	var page bytes.Buffer
	if err := web.PlanReport(res).Render(&page); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "<p>"+html.EscapeString(note)+"</p>") {
		t.Errorf("the HTML report lacks the skip note %q", note)
	}
}
