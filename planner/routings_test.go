package planner

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/lm-warden/warden/sim"
)

// TestRoutingCards: each strategy's card is the cheapest farm on which one
// of its routings meets the targets at the wanted concurrency and at the
// headroom level (a routing that meets at the concurrency alone does not
// count), with the routing of the lowest TTFB p95 there; -1 where none
// does; no cards for a plan of one strategy.
func TestRoutingCards(t *testing.T) {
	// cfg is a routing at levels 8 and 10 (the headroom level) with its
	// verdict at each and its TTFB p95 at 8.
	cfg := func(strategy, spill string, v8, v10 string, p95 float64) Config {
		return Config{Strategy: strategy, Spill: spill,
			Rows:  []sim.Row{{TTFBP95: sim.Float(p95)}, {}},
			Bands: []Band{{Verdict: v8}, {Verdict: v10}}}
	}
	const M, G, X = VerdictMeets, VerdictMarginal, VerdictMisses
	farms := func(two, four []Config) []Candidate {
		return []Candidate{
			{Name: "4 x A", Cost: 4, Cards: 4, Fits: true, Configs: four},
			{Name: "2 x A", Cost: 2, Cards: 2, Fits: true, Configs: two},
			{Name: "6 x A", Cost: 6, Cards: 6, Fits: true, NotSimulated: "it costs more"},
		}
	}
	tests := []struct {
		name       string
		strategies []string
		cands      []Candidate
		want       []RoutingCard
	}{
		{
			name:       "one strategy: no cards",
			strategies: []string{"affinity"},
			cands:      farms([]Config{cfg("affinity", "auto", M, M, 1)}, []Config{cfg("affinity", "auto", M, M, 1)}),
		},
		{
			name:       "the cheapest farm that meets, whatever the order of the candidates",
			strategies: []string{"llm-d", "affinity"},
			cands: farms(
				[]Config{cfg("llm-d", "", X, X, 20), cfg("affinity", "auto", M, M, 3)},
				[]Config{cfg("llm-d", "", M, M, 2), cfg("affinity", "auto", M, M, 1)}),
			want: []RoutingCard{{"llm-d", 0, 0}, {"affinity", 1, 1}},
		},
		{
			name:       "meets at the concurrency but not with the headroom: not a card",
			strategies: []string{"dynamo", "affinity"},
			cands: farms(
				[]Config{cfg("dynamo", "", M, G, 2), cfg("affinity", "auto", M, M, 3)},
				[]Config{cfg("dynamo", "", M, X, 2), cfg("affinity", "auto", M, M, 1)}),
			want: []RoutingCard{{"dynamo", -1, -1}, {"affinity", 1, 1}},
		},
		{
			name:       "of a strategy's spill thresholds, the one with the lowest TTFB p95 that meets",
			strategies: []string{"least-loaded", "affinity"},
			cands: farms(
				[]Config{cfg("least-loaded", "", X, X, 9), cfg("affinity", "auto", M, M, 3), cfg("affinity", "8", M, M, 2.5), cfg("affinity", "4", X, X, 1)},
				[]Config{cfg("least-loaded", "", X, X, 5)}),
			want: []RoutingCard{{"least-loaded", -1, -1}, {"affinity", 1, 2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := &Result{Strategies: tt.strategies, Sessions: []int{8, 10}, Concurrency: 8, HeadroomSessions: 10, Headroom: 0.2, Candidates: tt.cands}
			if diff := cmp.Diff(tt.want, res.routingCards()); diff != "" {
				t.Errorf("cards (-want +got):\n%s", diff)
			}
			if d := res.DearestSimulated(); d != 0 {
				t.Errorf("dearest simulated %d, want 0 (4 x A; 6 x A was not simulated)", d)
			}
			if !res.SomeNotSimulated() {
				t.Error("SomeNotSimulated false, want true (6 x A)")
			}
		})
	}
}
