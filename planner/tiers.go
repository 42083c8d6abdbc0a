package planner

import (
	"cmp"
	"fmt"
	"slices"
)

// A plan answers with the cheapest farm that meets the targets (betterFarm
// orders by cost first), and names, besides, only the marginal farms
// cheaper than it (pick). So once a farm meets them, no dearer candidate
// can change the answer, whatever its simulation gives, and Solve does not
// simulate one: it takes the candidates in tiers of equal cost, cheapest
// first (each tier's sweep and bisection in parallel, as a plan of those
// candidates alone), and stops after the first tier after which a farm
// meets the targets. The candidates of the tiers left say why they were
// not simulated (Candidate.NotSimulated; Skipped.Candidates counts them).
// Plan.EveryCandidate makes one tier of every candidate.
//
// This is exact for the answer and for every candidate simulated: a
// candidate's runs depend on its farm, the workload and the seed alone,
// never on another candidate's.

// tiers returns the candidates' farms in tiers of equal cost, cheapest
// first, each a copy of cands with the other tiers' farms nil; one tier of
// all with Plan.EveryCandidate.
func (p Plan) tiers(res *Result, cands []*candFarms) [][]*candFarms {
	var order []int
	for i, cf := range cands {
		if cf != nil {
			order = append(order, i)
		}
	}
	if p.EveryCandidate || len(order) == 0 {
		return [][]*candFarms{cands}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(res.Candidates[a].Cost, res.Candidates[b].Cost)
	})
	var out [][]*candFarms
	for start := 0; start < len(order); {
		end := start + 1
		for end < len(order) && res.Candidates[order[end]].Cost == res.Candidates[order[start]].Cost {
			end++
		}
		tier := make([]*candFarms, len(cands))
		for _, i := range order[start:end] {
			tier[i] = cands[i]
		}
		out = append(out, tier)
		start = end
	}
	return out
}

// dearerNotSimulated reports whether a candidate simulated so far meets
// the targets and, if so, marks every fitting candidate not simulated yet,
// all of them dearer than it, as not simulated, naming the cheapest that
// meets (the first in plan order among equals).
func (res *Result) dearerNotSimulated(cands []*candFarms) bool {
	meets := -1
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if c.Meets && (meets < 0 || c.Cost < res.Candidates[meets].Cost) {
			meets = i
		}
	}
	if meets < 0 {
		return false
	}
	m := &res.Candidates[meets]
	for i, cf := range cands {
		c := &res.Candidates[i]
		if cf == nil || len(c.Configs) > 0 {
			continue
		}
		// Dearer than m: the tiers are by cost, and one that cost no more
		// would have been simulated with m's or before.
		c.NotSimulated = fmt.Sprintf("it costs more than %s, which meets the targets", m.Name)
		if res.CostUnit == "cards" {
			c.NotSimulated = fmt.Sprintf("it takes more cards than %s, which meets the targets", m.Name)
		}
		res.skips.Candidates++
	}
	return true
}
