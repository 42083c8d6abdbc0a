package web

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
)

// planCandidate is one candidate's section: every routing at every level, in a table and in
// charts, and per replica at the wanted concurrency.
func planCandidate(res *planner.Result, i, at int) Section {
	c := &res.Candidates[i]
	id := func(name string) string { return fmt.Sprintf("c%d-%s", i+1, name) }
	s := Section{
		Heading:    "Candidate: " + c.Name,
		Paragraphs: []string{candidateSentence(res, c)},
		Tables:     []Table{candidateTable(res, c)},
		Charts:     candidateCharts(res, c, id),
	}
	if at >= 0 {
		s.Charts = append(s.Charts, replicaCharts(res, c, at, id)...)
	}
	return s
}

// candidateSentence says what the candidate is and how it does with its routing.
func candidateSentence(res *planner.Result, c *planner.Candidate) string {
	status := "does not meet the targets at " + strconv.Itoa(res.Concurrency) + " sessions"
	switch {
	case c.Meets && res.HeadroomSessions > 0:
		status = fmt.Sprintf("meets the targets at %d sessions and, with %s %% headroom, at %d", res.Concurrency, fmtPctOf(res.Headroom), res.HeadroomSessions)
	case c.Meets:
		status = "meets the targets at " + strconv.Itoa(res.Concurrency) + " sessions"
	case c.Verdict == planner.VerdictMarginal && c.Why != "":
		status = "is marginal: it " + c.Why
	}
	upTo := "; it meets them up to " + strings.Replace(upToCell(c), ">= ", "at least ", 1) + " sessions"
	if c.MaxSessions == 0 {
		upTo = "; it meets them at no level simulated"
	}
	if c.Verdict == planner.VerdictMarginal && c.KPIs != nil && c.KPIs.Verdict == planner.VerdictMeets && c.Why != "" {
		upTo = "" // marginal for want of headroom: the reason already says where it stops
	}
	return fmt.Sprintf("%s serving %s, %d replica(s) at tensor parallel size %d, max_num_seqs %d, %s KV blocks (%s tokens) per replica. "+
		"With %s it %s%s.",
		c.Name, c.Model, c.Replicas, c.TensorParallelSize, c.MaxNumSeqs, fmtInt(int64(c.NumGPUBlocks)), fmtInt(int64(c.KVTokensPerReplica)),
		c.Configs[c.Chosen].Label(), status, upTo)
}

// candidateTable is every routing of the candidate at every level, with the targets it meets.
func candidateTable(res *planner.Result, c *planner.Candidate) Table {
	t := Table{
		Caption: "Per routing and load (KPIs evaluated with PromQL over each step's window)",
		Header: []string{"sessions", "routing", "sessions/h", "output tok/min", "TTFB p50 s", "TTFB p95 s", "replicas busy",
			"prefix hit %", "stayed %", "unfinished", "preemptions", "targets"},
	}
	for l, n := range res.Sessions {
		for k := range c.Configs {
			cfg := &c.Configs[k]
			x, ch := &cfg.Rows[l], cfg.Checks[l]
			verdict := "met"
			if !ch.Meets {
				var m []string
				for _, miss := range ch.Misses {
					m = append(m, res.Targets.MissPhrase(miss))
				}
				verdict = "misses " + strings.Join(m, ", ")
			}
			t.Rows = append(t.Rows, []string{strconv.Itoa(n), cfg.Label(), sessionsPerHour(x, res.DurationS), fmtNum(float64(x.OutputTokensPerMin), 0),
				fmtNum(float64(x.TTFBP50), 2), fmtNum(float64(x.TTFBP95), 2), fmtNum(float64(x.ReplicasBusy), 1),
				fmtNum(float64(x.PrefixHitPct), 1), fmtNum(float64(x.StayedPct), 1), fmtInt(x.Unfinished), fmtInt(x.Preemptions), verdict})
		}
	}
	return t
}

// candidateCharts are the candidate's routings against sessions: TTFB p50 and p95 (the band
// shaded on p95), the prefix hit rate (its band shaded), output tokens per minute, replicas busy.
func candidateCharts(res *planner.Result, c *planner.Candidate, id func(string) string) []*Chart {
	xs := make([]float64, len(res.Sessions))
	for k, n := range res.Sessions {
		xs[k] = float64(n)
	}
	perConfig := func(suffix string, f func(*sim.Row) float64) []Series {
		out := make([]Series, 0, len(c.Configs))
		for k := range c.Configs {
			out = append(out, Series{Name: c.Configs[k].Label() + suffix, Y: column(c.Configs[k].Rows, f)})
		}
		return out
	}
	sessions := Axis{Name: "concurrent sessions"}
	ttfb := append(perConfig(" p50", func(r *sim.Row) float64 { return float64(r.TTFBP50) }),
		perConfig(" p95", func(r *sim.Row) float64 { return float64(r.TTFBP95) })...)
	if len(ttfb) > 0 {
		ttfb[0].Marks = targetMarks(res, "ttfb")
	}
	hitSeries := perConfig("", func(r *sim.Row) float64 { return float64(r.PrefixHitPct) })
	if len(hitSeries) > 0 {
		hitSeries[0].Marks = targetMarks(res, "hit")
	}
	// Each routing's band where the result has one: p95 (not p50, to keep the chart readable)
	// and the hit rate.
	for k := range c.Configs {
		ttfb[len(c.Configs)+k].Low, ttfb[len(c.Configs)+k].High = kpiBand(&c.Configs[k], ttfbP95)
		hitSeries[k].Low, hitSeries[k].High = kpiBand(&c.Configs[k], prefixHit)
	}
	return []*Chart{
		NewLineChart(id("ttfb"), "Time to first token, p50 and p95, with the TTFB p95 target", sessions, xs, Axis{Name: "seconds", Log: true}, ttfb...),
		NewLineChart(id("hit"), "Prefix-cache hit rate, with the target", sessions, xs, Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)},
			hitSeries...),
		NewLineChart(id("tokens"), "Output tokens per minute", sessions, xs, Axis{Name: "tokens/min"},
			perConfig("", func(r *sim.Row) float64 { return float64(r.OutputTokensPerMin) })...),
		NewLineChart(id("busy"), "Replicas busy (mean)", sessions, xs, Axis{Name: "replicas", Min: ptr(0.0)},
			perConfig("", func(r *sim.Row) float64 { return float64(r.ReplicasBusy) })...),
	}
}

// replicaCharts are per replica at the wanted concurrency (level index at), each routing: the
// step's requests and mean KV use (the answer's farm also has them over time, in the timeline
// section).
func replicaCharts(res *planner.Result, c *planner.Candidate, at int, id func(string) string) []*Chart {
	nrep := c.Replicas
	cats := make([]string, nrep)
	for k := range cats {
		cats[k] = "replica " + strconv.Itoa(k)
	}
	var req, kv []Series
	for k := range c.Configs {
		rq, kvm := nanSlice(nrep), nanSlice(nrep)
		for _, rr := range c.Configs[k].Rows[at].Replicas {
			if rr.Replica >= 0 && rr.Replica < nrep {
				rq[rr.Replica] = float64(rr.Requests)
				kvm[rr.Replica] = 100 * float64(rr.KVUsageMean)
			}
		}
		req = append(req, Series{Name: c.Configs[k].Label(), Y: rq})
		kv = append(kv, Series{Name: c.Configs[k].Label(), Y: kvm})
	}
	return []*Chart{
		NewBarChart(id("replica-requests"), fmt.Sprintf("Requests routed to each replica at %d sessions", res.Concurrency), cats, Axis{Name: "requests"}, req...).WithCategoryName("replica"),
		NewBarChart(id("replica-kv"), fmt.Sprintf("KV cache use per replica at %d sessions (mean over the step)", res.Concurrency), cats,
			Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)}, kv...).WithCategoryName("replica"),
	}
}

// column is one figure of each row.
func column(rows []sim.Row, f func(*sim.Row) float64) []float64 {
	out := make([]float64, len(rows))
	for i := range rows {
		out[i] = f(&rows[i])
	}
	return out
}
