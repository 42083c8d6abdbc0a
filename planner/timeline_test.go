package planner

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/racetest"
)

// TestSolveTimeline checks the answer's time series against the sweep's own
// figures for the same step: the extra simulation must repeat that step
// exactly, and the range queries must cover it.
func TestSolveTimeline(t *testing.T) {
	racetest.SimulationOnly(t)
	p := kvBoundPlan()
	p.Farms[0].Replicas = []int{3} // the answer of kvBoundPlan, alone (quicker)
	res, err := Solve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	tl := res.Timeline
	if tl == nil {
		t.Fatal("no timeline")
	}
	if tl.Candidate != res.Best || tl.Config != res.Candidates[res.Best].Chosen || tl.Sessions != 12 {
		t.Fatalf("timeline of candidate %d config %d at %d sessions, want the best (%d), its chosen config and 12", tl.Candidate, tl.Config, tl.Sessions, res.Best)
	}
	if want := []float64{5, 10, 15, 20, 25, 30}; tl.StepS != 5 || !slices.Equal(tl.TimesS, want) {
		t.Fatalf("step %v s, times %v; want 5 s and %v", tl.StepS, tl.TimesS, want)
	}
	c := res.Candidates[tl.Candidate]
	for _, q := range []QuerySeries{tl.InFlight, tl.KVUsage} {
		var labels []string
		for _, s := range q.Series {
			labels = append(labels, s.Label)
		}
		if !slices.Equal(labels, []string{"0", "1", "2"}) {
			t.Errorf("%s: series %q, want one per replica 0, 1, 2", q.Name, labels)
		}
	}
	if !strings.Contains(tl.KVUsage.Query, `model_name="Qwen/Qwen3-4B-Instruct-2507"`) || !strings.Contains(tl.KVUsage.Query, "[5s]") {
		t.Errorf("KV query %q: want the model and the 5 s window substituted", tl.KVUsage.Query)
	}
	var inFlight float64
	for k := range tl.TimesS {
		for r, s := range tl.KVUsage.Series {
			if v := float64(s.Values[k]); !(v >= 0 && v <= 100) {
				t.Errorf("KV usage of replica %d at %v s = %v, want 0..100", r, tl.TimesS[k], v)
			}
		}
		for _, s := range tl.InFlight.Series {
			inFlight += float64(s.Values[k])
		}
	}
	// A closed loop of 12 sessions keeps about 12 requests in flight.
	if mean := inFlight / float64(len(tl.TimesS)); mean < 10 || mean > 12.001 {
		t.Errorf("mean requests in flight, all replicas = %v, want 10 to 12", mean)
	}
	// The intervals tile the step: their cached and computed tokens give
	// the step's hit rate, as the sweep measured it.
	var cached, computed float64
	for _, q := range []struct {
		s   QuerySeries
		sum *float64
	}{{tl.PromptCached, &cached}, {tl.PromptComputed, &computed}} {
		if len(q.s.Series) != 1 || q.s.Series[0].Label != "" {
			t.Fatalf("%s: %d series, want one farm-wide", q.s.Name, len(q.s.Series))
		}
		for _, v := range q.s.Series[0].Values {
			*q.sum += float64(v) * tl.StepS
		}
	}
	row := c.Configs[tl.Config].Rows[Level(res.Sessions, 12)]
	if got, want := 100*cached/(cached+computed), float64(row.PrefixHitPct); math.Abs(got-want) > 0.01 {
		t.Errorf("hit rate from the timeline %.3f %%, the step's %.3f %%", got, want)
	}
}

func TestTimelineStep(t *testing.T) {
	for _, tc := range []struct{ win, want time.Duration }{
		{3 * time.Second, 3 * time.Second},
		{30 * time.Second, 5 * time.Second},
		{20 * time.Minute, 5 * time.Second},
		{time.Hour, 15 * time.Second},
		{time.Hour + time.Millisecond, 16 * time.Second},
	} {
		if got := timelineStep(tc.win); got != tc.want {
			t.Errorf("timelineStep(%v) = %v, want %v", tc.win, got, tc.want)
		}
	}
}
