package web

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lm-warden/warden/planner"
)

// TestPlanReportRoutingCards: a result with routing cards gets a section
// that sets them side by side after the overview: a row per strategy (its
// cheapest farm, the answer marked; "none up to" the dearest farm
// simulated where it meets the targets on none) and the bars of the cards
// each needs (golden).
func TestPlanReportRoutingCards(t *testing.T) {
	res := samplePlanResult()
	res.RoutingCards = []planner.RoutingCard{{Strategy: "least-loaded", Candidate: -1, Config: -1}, {Strategy: "affinity", Candidate: 1, Config: 1}}
	r := PlanReport(res)
	i := slices.IndexFunc(r.Sections, func(s Section) bool { return s.Heading == "Cards per routing" })
	if i != 1 || r.Sections[0].Heading != "Candidates compared" {
		t.Fatalf("the cards are section %d, want 1, after the overview", i)
	}
	s := r.Sections[i]
	want := [][]string{
		{"least-loaded", "none up to 3 x RTX A4000", "-", "-", "-", "-", "-"},
		{"affinity (spill auto)", "3 x RTX A4000 (the answer)", "3", "6.00", "75.0", "10,000", "80"},
	}
	if got := s.Tables[0].Rows; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("rows\n%q\nwant\n%q", got, want)
	}
	if p := strings.Join(s.Paragraphs, " "); !strings.Contains(p, "With least-loaded no farm simulated meets the targets (up to 3 x RTX A4000).") {
		t.Errorf("the paragraphs do not name the routing that meets the targets nowhere:\n%s", p)
	}
	c := s.Charts[0]
	got, err := c.OptionsJSON()
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, filepath.Join("testdata", "plan-"+c.ID+".json"), got)
}
