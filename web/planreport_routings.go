package web

import (
	"fmt"
	"math"
	"strconv"

	"github.com/lm-warden/warden/planner"
)

// planRoutingCards is the routing cards side by side (planner.RoutingCard): for each strategy
// tried, the cheapest farm on which it meets the targets, as a table and as bars of the cards
// each needs. It answers the buyer's "with llm-d, how many cards would I need?".
func planRoutingCards(res *planner.Result, at int) Section {
	byCards := res.CostUnit == "cards" || res.CostUnit == ""
	header := []string{"routing", "cheapest farm that meets the targets", "cards"}
	if !byCards {
		header = append(header, "cost "+res.CostUnit)
	}
	p95Head, hitHead := "TTFB p95 s", "prefix hit %"
	if banded(res) {
		p95Head, hitHead = "TTFB p95 s (band)", "prefix hit % (band)"
	}
	t := Table{
		Caption: fmt.Sprintf("Each routing's cheapest farm at %d concurrent sessions", res.Concurrency),
		Header:  append(header, p95Head, hitHead, "output tok/min", "sessions/h"),
	}
	none, noneWords := "none", "no farm simulated meets the targets"
	if d := res.DearestSimulated(); d >= 0 {
		none, noneWords = "none up to "+res.Candidates[d].Name, noneWords+" (up to "+res.Candidates[d].Name+")"
	}
	names, cards, missing := routingCardRows(res, at, &t, byCards, none)
	paras := []string{
		"With each routing tried, the cheapest farm on which it meets the targets as the answer must (the band's pessimistic " +
			"edge at " + strconv.Itoa(res.Concurrency) + " sessions" + headroomClause(res) + "), with its figures there: how many " +
			"cards you would need with each. The cheapest of them is the answer.",
	}
	if len(missing) > 0 {
		p := "With " + joinAndWeb(missing) + " " + noneWords + "."
		if res.SomeNotSimulated() {
			p += " Farms dearer than the answer were not simulated (every_candidate: true in the plan, or --every-candidate, " +
				"simulates them): it may meet the targets on one of them."
		}
		paras = append(paras, p)
	}
	return Section{
		Heading:    "Cards per routing",
		Paragraphs: paras,
		Tables:     []Table{t},
		Charts: []*Chart{NewBarChart("routing-cards", "Cards each routing needs to meet the targets", names,
			Axis{Name: "cards", Min: ptr(0.0)}, Series{Name: "cards of its cheapest farm", Y: cards}).WithCategoryName("routing")},
	}
}

// routingCardRows adds a row per routing card to t and returns the bars' names and cards (NaN
// for a routing that meets the targets on no farm simulated: its row says none) and those
// routings.
func routingCardRows(res *planner.Result, at int, t *Table, byCards bool, none string) (names []string, cards []float64, missing []string) {
	for _, rc := range res.RoutingCards {
		if rc.Candidate < 0 {
			missing = append(missing, rc.Strategy)
			row := []string{rc.Strategy, none, "-"}
			if !byCards {
				row = append(row, "-")
			}
			t.Rows = append(t.Rows, append(row, "-", "-", "-", "-"))
			names, cards = append(names, rc.Strategy+" (none meets)"), append(cards, math.NaN())
			continue
		}
		c := &res.Candidates[rc.Candidate]
		cfg := &c.Configs[rc.Config]
		x := &cfg.Rows[at]
		farm := c.Name
		if rc.Candidate == res.Best && rc.Config == c.Chosen {
			farm += " (the answer)"
		}
		row := []string{cfg.Label(), farm, strconv.Itoa(c.Cards)}
		if !byCards {
			row = append(row, fmtCost(c.Cost, res.CostUnit))
		}
		p95, hit := fmtNum(float64(x.TTFBP95), 2), fmtNum(float64(x.PrefixHitPct), 1)
		if at < len(cfg.Bands) {
			b := &cfg.Bands[at]
			p95, hit = withBand(float64(x.TTFBP95), &b.TTFBP95, 2, b.Runs), withBand(float64(x.PrefixHitPct), &b.PrefixHitPct, 1, b.Runs)
		}
		t.Rows = append(t.Rows, append(row, p95, hit, fmtNum(float64(x.OutputTokensPerMin), 0), sessionsPerHour(x, res.DurationS)))
		names, cards = append(names, cfg.Label()), append(cards, float64(c.Cards))
	}
	return names, cards, missing
}

// headroomClause is ", and with 20 % headroom at 20" for a result with headroom, else "".
func headroomClause(res *planner.Result) string {
	if res.HeadroomSessions == 0 {
		return ""
	}
	return fmt.Sprintf(" and, with %s %% headroom, at %d", fmtPctOf(res.Headroom), res.HeadroomSessions)
}
