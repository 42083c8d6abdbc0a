package planner

import (
	"strconv"
	"strings"
)

// routingCardsText is the routing cards side by side, one line per
// strategy: the cheapest farm on which it meets the targets, its cards (and
// cost when priced), TTFB p95 and hit % there; "" without cards.
func (res *Result) routingCardsText() (string, error) {
	if len(res.RoutingCards) == 0 {
		return "", nil
	}
	at := Level(res.Sessions, res.Concurrency)
	priced := res.CostUnit != "cards"
	header := []string{"routing", "farm", "cards"}
	if priced {
		header = append(header, "cost/h")
	}
	header = append(header, "TTFB p95 s", "hit %", "")
	none := "none"
	if d := res.DearestSimulated(); d >= 0 {
		none = "none up to " + res.Candidates[d].Name
	}
	var rows [][]string
	missing := false
	for _, rc := range res.RoutingCards {
		if rc.Candidate < 0 {
			missing = true
			row := []string{rc.Strategy, none, "-"}
			if priced {
				row = append(row, "-")
			}
			rows = append(rows, append(row, "-", "-", ""))
			continue
		}
		c := &res.Candidates[rc.Candidate]
		cfg := &c.Configs[rc.Config]
		row := []string{cfg.Label(), c.Name, strconv.Itoa(c.Cards)}
		if priced {
			row = append(row, strconv.FormatFloat(c.Cost, 'f', 2, 64))
		}
		mark := ""
		if rc.Candidate == res.Best && rc.Config == c.Chosen {
			mark = "<- answer"
		}
		r := &cfg.Rows[at]
		rows = append(rows, append(row, fmtFloat(float64(r.TTFBP95), 2), fmtFloat(float64(r.PrefixHitPct), 1), mark))
	}
	table, err := renderTable(header, rows, nil)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(wrapText("Cards per routing, the cheapest farm on which each meets the targets "+res.meetsWhere()+":", summaryWidth))
	b.WriteString(table)
	if missing && res.SomeNotSimulated() {
		b.WriteString(wrapText("Farms dearer than the answer were not simulated (--every-candidate simulates them): "+
			"a routing with none here may meet the targets on one of them.", summaryWidth))
	}
	return b.String(), nil
}

// meetsWhere says where a farm must meet the targets: "at 16 and, with
// 20 % headroom, at 20 sessions", or "at 16 sessions".
func (res *Result) meetsWhere() string {
	if res.HeadroomSessions == 0 {
		return "at " + strconv.Itoa(res.Concurrency) + " sessions"
	}
	return "at " + strconv.Itoa(res.Concurrency) + " and, with " + strconv.FormatFloat(100*res.Headroom, 'f', -1, 64) +
		" % headroom, at " + strconv.Itoa(res.HeadroomSessions) + " sessions"
}
