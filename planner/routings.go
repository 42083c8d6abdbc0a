package planner

import (
	"cmp"
	"slices"
)

// RoutingCard is one routing's own answer, for a buyer who asks "with
// llm-d, how many cards would I need?": the cheapest farm simulated on
// which the strategy (with the best of its spill thresholds) meets the
// targets as the answer must (the band's pessimistic edge at the wanted
// concurrency and at the headroom level). The cheapest card of all is the
// answer's farm (Result.Best).
type RoutingCard struct {
	Strategy string `json:"strategy"`
	// Candidate is the farm's index in Result.Candidates and Config its
	// routing's in that candidate's Configs; both -1 when the strategy
	// meets the targets on none of the farms simulated.
	Candidate int `json:"candidate"`
	Config    int `json:"config"`
}

// routingCards is one card per strategy tried, in plan order; none when
// the plan tries one strategy (its card would be the answer).
func (res *Result) routingCards() []RoutingCard {
	if len(res.Strategies) < 2 {
		return nil
	}
	at, hat := Level(res.Sessions, res.Concurrency), res.headroomLevel()
	cards := make([]RoutingCard, 0, len(res.Strategies))
	for _, s := range res.Strategies {
		card := RoutingCard{Strategy: s, Candidate: -1, Config: -1}
		for i := range res.Candidates {
			c := &res.Candidates[i]
			k := bestMeeting(c.Configs, s, at, hat)
			if k < 0 {
				continue
			}
			if card.Candidate < 0 || cheaperCard(c, &c.Configs[k], &res.Candidates[card.Candidate], &res.Candidates[card.Candidate].Configs[card.Config], at) {
				card.Candidate, card.Config = i, k
			}
		}
		cards = append(cards, card)
	}
	return cards
}

// bestMeeting is the index of strategy s's routing in configs that meets
// the targets with the lowest TTFB p95 at level at, -1 when none meets.
func bestMeeting(configs []Config, s string, at, hat int) int {
	best := -1
	for k := range configs {
		cfg := &configs[k]
		if cfg.Strategy != s || configVerdict(cfg, at, hat) != VerdictMeets {
			continue
		}
		if best < 0 || ttfb(cfg.Rows[at]) < ttfb(configs[best].Rows[at]) {
			best = k
		}
	}
	return best
}

// cheaperCard orders two farms that meet the targets with one strategy:
// by cost, then cards, then the routing's TTFB p95 at level at; a tie
// keeps the farm listed first.
func cheaperCard(a *Candidate, ac *Config, b *Candidate, bc *Config, at int) bool {
	return cmp.Or(cmp.Compare(a.Cost, b.Cost), cmp.Compare(a.Cards, b.Cards), cmp.Compare(ttfb(ac.Rows[at]), ttfb(bc.Rows[at]))) < 0
}

// DearestSimulated is the index of the dearest farm simulated (by cost,
// then cards; the last listed on a tie), -1 when none was: a routing card
// without a farm meets the targets on none up to it.
func (res *Result) DearestSimulated() int {
	best := -1
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Fits || c.NotSimulated != "" || len(c.Configs) == 0 {
			continue
		}
		if best < 0 || cmp.Or(cmp.Compare(c.Cost, res.Candidates[best].Cost), cmp.Compare(c.Cards, res.Candidates[best].Cards)) >= 0 {
			best = i
		}
	}
	return best
}

// SomeNotSimulated says whether a farm that fits was left unsimulated (it
// cost more than one that meets the targets): a routing that meets them on
// none of the farms simulated might on one of those.
func (res *Result) SomeNotSimulated() bool {
	return slices.ContainsFunc(res.Candidates, func(c Candidate) bool { return c.Fits && c.NotSimulated != "" })
}
