package planner

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/sim"
)

// targetSpec is one target: its JSON key, how it reads in a sentence, the
// figure of a row it limits, and whether it is a maximum.
type targetSpec struct {
	key    string
	phrase string // "TTFB p95 <= %s s"
	unit   string // for values in sentences
	isMax  bool
	limit  func(Targets) float64
	value  func(*sim.Row) float64
	digits int
}

var targetSpecs = []targetSpec{
	{"ttfb_p95_s_max", "TTFB p95 <= %s s", "s", true,
		func(t Targets) float64 { return t.TTFBP95MaxS }, func(r *sim.Row) float64 { return float64(r.TTFBP95) }, 2},
	{"prefix_hit_pct_min", "prefix hit >= %s %%", "%", false,
		func(t Targets) float64 { return t.PrefixHitPctMin }, func(r *sim.Row) float64 { return float64(r.PrefixHitPct) }, 1},
	{"output_tokens_per_min_min", "output >= %s tokens/min", "tokens/min", false,
		func(t Targets) float64 { return t.OutputTokensPerMinMin }, func(r *sim.Row) float64 { return float64(r.OutputTokensPerMin) }, 0},
	{"sessions_per_hour_min", "sessions/h >= %s", "sessions/h", false,
		func(t Targets) float64 { return t.SessionsPerHourMin }, func(r *sim.Row) float64 { return float64(r.SessionsPerHour) }, 0},
}

// check checks the targets on one row.
func (t Targets) check(r *sim.Row) Check {
	c := Check{Sessions: r.Sessions, Meets: true}
	var sum float64
	for _, ts := range targetSpecs {
		limit := ts.limit(t)
		if limit == 0 {
			continue
		}
		v := ts.value(r)
		var short float64
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0):
			short = NoValueShortfall
		case ts.isMax && v > limit:
			short = (v - limit) / limit
		case !ts.isMax && v < limit:
			short = (limit - v) / limit
		default:
			continue
		}
		c.Meets = false
		c.Misses = append(c.Misses, Miss{Target: ts.key, Value: sim.Float(v), Limit: limit, Shortfall: sim.Float(short)})
		sum += short
	}
	c.Shortfall = sim.Float(sum)
	return c
}

// Phrases returns the set targets as they read in a sentence, e.g.
// ["TTFB p95 <= 10 s", "prefix hit >= 80 %"].
func (t Targets) Phrases() []string {
	var out []string
	for _, ts := range targetSpecs {
		if l := ts.limit(t); l != 0 {
			out = append(out, fmt.Sprintf(ts.phrase, fmtLimit(l)))
		}
	}
	return out
}

func fmtLimit(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// decideConfigs checks every row and band, and chooses each candidate's
// routing, verdict and (sweep) capacity.
func (res *Result) decideConfigs() {
	at, hat := Level(res.Sessions, res.Concurrency), res.headroomLevel()
	for ci := range res.Candidates {
		c := &res.Candidates[ci]
		if !c.Fits || len(c.Configs) == 0 || c.decided {
			continue // a later tier's, not simulated yet, or an earlier tier's, already bisected
		}
		c.decided = true
		for k := range c.Configs {
			cfg := &c.Configs[k]
			cfg.Checks = make([]Check, len(cfg.Rows))
			cfg.Bands = make([]Band, len(cfg.Rows))
			verdicts := make([]Check, len(cfg.Rows))
			for l := range cfg.Rows {
				cfg.Checks[l] = res.Targets.check(&cfg.Rows[l])
				if len(cfg.runs) > 0 && l < cfg.banded {
					rows := make([]sim.Row, len(cfg.runs))
					for v := range cfg.runs {
						rows[v] = cfg.runs[v][l]
					}
					cfg.Bands[l] = res.Targets.band(rows, cfg.vs)
				} else {
					cfg.Bands[l] = res.Targets.nominalBand(cfg.Rows[l], res.Seed)
				}
				verdicts[l].Meets = cfg.Bands[l].Verdict == VerdictMeets
			}
			cfg.MaxSessions, cfg.FailsAt = capacity(res.Sessions, verdicts)
		}
		c.Chosen = chooseConfig(c.Configs, at, hat)
		ch := &c.Configs[c.Chosen]
		c.MaxSessions, c.FailsAt = ch.MaxSessions, ch.FailsAt
		c.FailsAtMisses = nil
		if l := Level(res.Sessions, c.FailsAt); l >= 0 {
			c.FailsAtMisses = ch.Bands[l].Misses
		}
		b := ch.Bands[at]
		c.KPIs = &b
		c.Verdict = configVerdict(ch, at, hat)
		c.Meets = c.Verdict == VerdictMeets
		row := &ch.Rows[at]
		c.TurnsPerHour = sim.Float(math.NaN())
		if d := float64(row.DurationS); d > 0 {
			c.TurnsPerHour = sim.Float(float64(row.Finished) / d * 3600)
		}
		if c.CostPerHour != nil {
			v := sim.Float(math.NaN())
			if t := float64(c.TurnsPerHour); t > 0 {
				v = sim.Float(*c.CostPerHour / t * 1000)
			}
			c.CostPer1kTurns = &v
		}
	}
}

// headroomLevel is the index of the headroom level in Sessions, -1 when the
// result has none.
func (res *Result) headroomLevel() int {
	if res.HeadroomSessions == 0 {
		return -1
	}
	return Level(res.Sessions, res.HeadroomSessions)
}

// explain says why each marginal candidate is marginal (Candidate.Why):
// its band's pessimistic edge misses a target at the wanted concurrency
// (marginalWhy), or it meets them there but not at the headroom level
// (cliffWhy, with the cliff the bisection found). It runs after the
// bisection.
func (res *Result) explain() {
	at, hat := Level(res.Sessions, res.Concurrency), res.headroomLevel()
	for i := range res.Candidates {
		c := &res.Candidates[i]
		c.Why = ""
		if !c.Fits || c.Chosen < 0 || c.Verdict != VerdictMarginal {
			continue
		}
		b := c.Configs[c.Chosen].Bands[at]
		if b.Verdict == VerdictMarginal {
			c.Why = res.Targets.marginalWhy(b, res.Seed)
			continue
		}
		c.Why = res.cliffWhy(c, hat)
	}
}

// pick picks the best candidate, the cheaper marginal ones and, when none
// meets, the closest.
func (res *Result) pick() {
	at := Level(res.Sessions, res.Concurrency)
	res.Best, res.Closest, res.Marginal = -1, -1, nil
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Meets {
			continue
		}
		if res.Best < 0 || betterFarm(c, &res.Candidates[res.Best], at) {
			res.Best = i
		}
	}
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Fits || c.Verdict != VerdictMarginal {
			continue
		}
		if res.Best >= 0 {
			b := &res.Candidates[res.Best]
			if cmp.Or(cmp.Compare(c.Cost, b.Cost), cmp.Compare(c.Cards, b.Cards)) >= 0 {
				continue
			}
		}
		res.Marginal = append(res.Marginal, i)
	}
	slices.SortStableFunc(res.Marginal, func(a, b int) int {
		x, y := &res.Candidates[a], &res.Candidates[b]
		return cmp.Or(cmp.Compare(x.Cost, y.Cost), cmp.Compare(x.Cards, y.Cards))
	})
	if res.Best >= 0 {
		res.Reconcile = res.Candidates[res.Best].Reconcile
		return
	}
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Fits || c.Chosen < 0 {
			continue
		}
		if res.Closest < 0 || closer(c, &res.Candidates[res.Closest], at) < 0 {
			res.Closest = i
		}
	}
	if res.Closest >= 0 {
		res.Reconcile = res.Candidates[res.Closest].Reconcile
	}
}

// capacity scans the levels upwards: the first run of levels that meet the
// targets ends at max; fails is the level after it (0 when the run reaches
// the highest level, or when no level meets the targets).
func capacity(sessions []int, checks []Check) (maxSessions, failsAt int) {
	started := false
	for l, ch := range checks {
		switch {
		case ch.Meets:
			started = true
			maxSessions = sessions[l]
		case started:
			return maxSessions, sessions[l]
		}
	}
	return maxSessions, 0
}

// chooseConfig picks the routing of a candidate at level index at: the
// best verdict there (configVerdict: meets, then marginal, then misses; a
// routing that meets at at but not at the headroom level hat, -1 for none,
// is marginal); among equal verdicts that meet at least nominally, the
// lowest nominal TTFB p95 (ties: plan order); among those that miss, the
// closest (Closeness).
func chooseConfig(configs []Config, at, hat int) int {
	best := -1
	for k := range configs {
		if best < 0 {
			best = k
			continue
		}
		a, b := &configs[k], &configs[best]
		ca, cb := a.Checks[at], b.Checks[at]
		va, vb := verdictRank(configVerdict(a, at, hat)), verdictRank(configVerdict(b, at, hat))
		switch {
		case va != vb:
			if va < vb {
				best = k
			}
		case ca.Meets:
			if ttfb(a.Rows[at]) < ttfb(b.Rows[at]) {
				best = k
			}
		default:
			if closeness(ca, cb) < 0 {
				best = k
			}
		}
	}
	return best
}

// ttfb is a row's TTFB p95 with a missing value as +Inf.
func ttfb(r sim.Row) float64 {
	v := float64(r.TTFBP95)
	if math.IsNaN(v) {
		return math.Inf(1)
	}
	return v
}

// closeness orders two checks that miss: fewer targets missed first, then
// the smaller sum of normalised shortfalls. It returns < 0 when a is closer.
//
// This is the plan's definition of "closest": a farm that misses one target
// by 40 % is closer than one that misses two by 5 % each; among farms that
// miss as many targets, the one whose figures are nearest their limits,
// each distance relative to its limit, is closer.
func closeness(a, b Check) int {
	if c := cmp.Compare(len(a.Misses), len(b.Misses)); c != 0 {
		return c
	}
	return cmp.Compare(float64(a.Shortfall), float64(b.Shortfall))
}

// betterFarm orders two candidates that meet the targets: cheaper (by
// price when the plan has prices, else by card count), then more headroom
// (MaxSessions, the band's pessimistic edge), then fewer cards, then lower
// TTFB p95 at the wanted concurrency. Equal ones keep plan order.
func betterFarm(a, b *Candidate, at int) bool {
	if c := cmp.Compare(a.Cost, b.Cost); c != 0 {
		return c < 0
	}
	if c := cmp.Compare(a.MaxSessions, b.MaxSessions); c != 0 {
		return c > 0
	}
	if c := cmp.Compare(a.Cards, b.Cards); c != 0 {
		return c < 0
	}
	return ttfb(a.Configs[a.Chosen].Rows[at]) < ttfb(b.Configs[b.Chosen].Rows[at])
}

// closer orders two candidates that do not meet the targets: a marginal
// one before one that misses, two marginal ones as betterFarm does; two
// that miss by the closeness of their chosen routings at the wanted
// concurrency, then cost.
func closer(a, b *Candidate, at int) int {
	if c := cmp.Compare(verdictRank(a.Verdict), verdictRank(b.Verdict)); c != 0 {
		return c
	}
	if a.Verdict == VerdictMarginal {
		if betterFarm(a, b, at) {
			return -1
		}
		if betterFarm(b, a, at) {
			return 1
		}
		return 0
	}
	if c := closeness(a.Configs[a.Chosen].Checks[at], b.Configs[b.Chosen].Checks[at]); c != 0 {
		return c
	}
	return cmp.Compare(a.Cost, b.Cost)
}

// question is the report's question.
func question(res *Result) string {
	return fmt.Sprintf("How many cards, of which kind, and which routing, for %d concurrent %s within %s?",
		res.Concurrency, res.sessionsNoun(), joinAnd(res.Targets.Phrases()))
}

func (res *Result) sessionsNoun() string {
	if res.Workload.Spec.Trace != "" {
		return "sessions of the trace"
	}
	return "agent sessions"
}

// answer is the answer in one sentence (two when a cheaper candidate is
// marginal).
func answer(res *Result) string {
	targets := joinAnd(res.Targets.Phrases())
	lead := fmt.Sprintf("For %d concurrent %s, ", res.Concurrency, res.sessionsNoun())
	// The release decides admission, the balancer and the KV sizing: the
	// answer holds for the one simulated, so it names it.
	switch {
	case res.Best >= 0 && res.Candidates[res.Best].VLLMRelease != "":
		lead = fmt.Sprintf("For %d concurrent %s on vLLM %s, ", res.Concurrency, res.sessionsNoun(), res.Candidates[res.Best].VLLMRelease)
	case res.Best < 0 && len(res.VLLMReleases) > 0:
		lead = fmt.Sprintf("For %d concurrent %s on vLLM %s, ", res.Concurrency, res.sessionsNoun(), joinAnd(res.VLLMReleases))
	}
	band := res.bandPhrase()
	if res.Best >= 0 {
		c := &res.Candidates[res.Best]
		by, cost := "by card count", ""
		if res.CostUnit != "cards" {
			by = "by price"
			cost = fmt.Sprintf(" (%s %s", fmtCost(c.Cost), res.CostUnit)
			if c.CostPer1kTurns != nil && !math.IsNaN(float64(*c.CostPer1kTurns)) {
				cost += fmt.Sprintf(", %s per 1,000 session-turns", fmtCost(float64(*c.CostPer1kTurns)))
			}
			cost += ")"
		}
		s := fmt.Sprintf("%s%s with %s is the cheapest farm %s%s that meets %s%s%s%s.",
			lead, c.Name, c.Configs[c.Chosen].label(), by, cost, targets, band, res.withHeadroom(true), upTo(c))
		if len(res.Marginal) > 0 {
			m := &res.Candidates[res.Marginal[0]]
			s += fmt.Sprintf(" %s with %s is cheaper but marginal: it %s.", m.Name, m.Configs[m.Chosen].label(), m.Why)
		}
		return s
	}
	if res.Closest < 0 {
		if len(res.Candidates) == 0 {
			return lead + "the plan has no candidate farm."
		}
		return fmt.Sprintf("%sno candidate can run the model: it does not fit on any of them (%s).", lead, res.Candidates[0].Error)
	}
	c := &res.Candidates[res.Closest]
	if c.Verdict == VerdictMarginal {
		return fmt.Sprintf("%sno candidate meets %s%s%s; the closest is %s with %s, which is marginal: it %s.",
			lead, targets, band, res.withHeadroom(false), c.Name, c.Configs[c.Chosen].label(), c.Why)
	}
	at := Level(res.Sessions, res.Concurrency)
	ch := c.Configs[c.Chosen].Checks[at]
	var missed []string
	for _, m := range ch.Misses {
		missed = append(missed, res.Targets.MissPhrase(m))
	}
	return fmt.Sprintf("%sno candidate meets %s; the closest is %s with %s, which misses %s.",
		lead, targets, c.Name, c.Configs[c.Chosen].label(), joinAnd(missed))
}

// bandPhrase is " at the band's pessimistic edge (KV x0.85 and x1.10,
// engine speed x0.8 and x1.2, 3 seeds)", "" for a result without a band.
func (res *Result) bandPhrase() string {
	var parts []string
	scales := func(name string, ks []float64, digits int) {
		if len(ks) > 1 {
			var s []string
			for _, k := range ks[1:] {
				s = append(s, "x"+strconv.FormatFloat(k, 'f', digits, 64))
			}
			parts = append(parts, name+" "+joinAnd(s))
		}
	}
	scales("KV", res.Band.KVScales, 2)
	scales("engine speed", res.Band.SpeedScales, 1)
	if len(res.Band.Seeds) > 1 {
		parts = append(parts, fmt.Sprintf("%d seeds", len(res.Band.Seeds)))
	}
	if len(parts) == 0 {
		return ""
	}
	return " at the band's pessimistic edge (" + strings.Join(parts, ", ") + ")"
}

// upTo is "; it meets them up to 19 sessions", "" without a capacity.
func upTo(c *Candidate) string {
	switch {
	case c.MaxSessions == 0:
		return ""
	case c.FailsAt == 0 && c.MaxSessionsCap > 0 && c.MaxSessions >= c.MaxSessionsCap:
		return fmt.Sprintf("; it meets them up to at least %d sessions (the highest tried)", c.MaxSessions)
	case c.FailsAt == 0:
		return fmt.Sprintf("; it meets them up to at least %d sessions (the highest level simulated)", c.MaxSessions)
	}
	return fmt.Sprintf("; it meets them up to %d sessions", c.MaxSessions)
}

// MissPhrase says which target a miss is of and by what figure, e.g.
// "TTFB p95 <= 10 s (34.20 s)".
func (t Targets) MissPhrase(m Miss) string {
	return fmt.Sprintf("%s (%s)", phraseOf(t, m.Target), fmtValue(m))
}

func phraseOf(t Targets, key string) string {
	for _, ts := range targetSpecs {
		if ts.key == key {
			return fmt.Sprintf(ts.phrase, fmtLimit(ts.limit(t)))
		}
	}
	return key
}

// fmtValue writes a missed figure with its unit, "no value" when the step
// measured none.
func fmtValue(m Miss) string {
	v := float64(m.Value)
	for _, ts := range targetSpecs {
		if ts.key != m.Target {
			continue
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return "none measured"
		}
		s := strconv.FormatFloat(v, 'f', ts.digits, 64)
		return s + " " + ts.unit
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func fmtCost(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// joinAnd joins "a", "a and b", "a, b and c".
func joinAnd(items []string) string {
	switch len(items) {
	case 0:
		return "no target"
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}
