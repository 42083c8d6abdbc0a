package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lm-warden/warden/internal/racetest"
	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/web"
)

// TestPlanRoutingCards: `warden plan --strategies llm-d,dynamo,affinity`
// answers with a card per routing, each strategy's cheapest farm that
// meets the targets as the answer must, side by side in the terminal (the
// block pinned by testdata/plan-routing-cards.txt) and in the report. The
// cheapest card is the answer; each card's routing is its strategy and
// meets the targets there; a strategy that meets them nowhere says so. The
// README's line runs the same plan.
func TestPlanRoutingCards(t *testing.T) {
	racetest.SimulationOnly(t)
	js, err := runWarden(t, "plan", "--json", "--out", "", "--quiet", "--gpu", "RTX A4000", "--replicas", "2,4",
		"--model", "Qwen/Qwen3-4B-Instruct-2507", "--sessions", "4,8", "--duration", "20s", "--strategies", "llm-d,dynamo,affinity")
	if err != nil {
		t.Fatal(err)
	}
	res, err := planner.ReadResult([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.RoutingCards) != 3 {
		t.Fatalf("%d routing cards, want one per strategy (3): %+v", len(res.RoutingCards), res.RoutingCards)
	}
	cheapest := -1
	for k, rc := range res.RoutingCards {
		if rc.Strategy != res.Strategies[k] {
			t.Errorf("card %d is %q, want the plan's strategy %q (plan order)", k, rc.Strategy, res.Strategies[k])
		}
		if rc.Candidate < 0 {
			continue
		}
		c := &res.Candidates[rc.Candidate]
		cfg := &c.Configs[rc.Config]
		if cfg.Strategy != rc.Strategy {
			t.Errorf("%s's card names a %s routing", rc.Strategy, cfg.Strategy)
		}
		at, hat := planner.Level(res.Sessions, res.Concurrency), planner.Level(res.Sessions, res.HeadroomSessions)
		if cfg.Bands[at].Verdict != planner.VerdictMeets || cfg.Bands[hat].Verdict != planner.VerdictMeets {
			t.Errorf("%s's card %s: verdicts %s and %s with headroom, want meets", rc.Strategy, c.Name, cfg.Bands[at].Verdict, cfg.Bands[hat].Verdict)
		}
		if cheapest < 0 || c.Cost < res.Candidates[cheapest].Cost {
			cheapest = rc.Candidate
		}
	}
	if res.Best < 0 || cheapest < 0 || res.Candidates[cheapest].Cost != res.Candidates[res.Best].Cost {
		t.Errorf("the cheapest card is candidate %d, the answer %d: want the same farm's cost", cheapest, res.Best)
	}
	var text bytes.Buffer
	if err := res.WriteText(&text, planner.TextOptions{}); err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(text.String(), "\nCards per routing")
	block, _, _ = strings.Cut(block, "\n\n")
	if !ok {
		t.Fatalf("the summary has no cards per routing:\n%s", text.String())
	}
	golden(t, "plan-routing-cards.txt", "Cards per routing"+block+"\n")
	var page bytes.Buffer
	if err := web.PlanReport(res).Render(&page); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<h2>Cards per routing", "Each routing&#39;s cheapest farm at 8 concurrent sessions", `id="routing-cards"`} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}
