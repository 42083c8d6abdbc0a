package web

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/internal/num"
	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
)

// SimReportOptions say what a simulator report is about; every field is optional.
type SimReportOptions struct {
	Title    string   // default "LM Warden simulation: FARM"
	Question string   // default: what the simulation compares
	Answer   string   // default: the strategy with the lowest TTFB p95 at the highest load
	Workload []string // paragraphs describing the workload and farm used
	// KPIs define the report's figures; nil means metrics.KPIs().
	KPIs []metrics.KPI
}

// SimReport turns the simulator's result into a report: the per-strategy table in the shape of
// `warden sim`'s text output, charts of TTFB p50/p95 (log scale), prefix hit %, output tokens per
// minute and replicas busy against sessions, the reasons prompt tokens missed the cache, the
// per-replica figures at the highest load, and the PromQL that defines each figure.
func SimReport(rep *sim.Report, o SimReportOptions) *Report {
	strategies, steps := axes(rep.Rows)
	xs := make([]float64, len(steps))
	for i, n := range steps {
		xs[i] = float64(n)
	}
	row := func(s string, n int) *sim.Row {
		i := slices.IndexFunc(rep.Rows, func(r sim.Row) bool { return r.Strategy == s && r.Sessions == n })
		if i < 0 {
			return nil
		}
		return &rep.Rows[i]
	}
	perStrategy := func(suffix string, f func(*sim.Row) float64) []Series {
		out := make([]Series, 0, len(strategies))
		for _, s := range strategies {
			ys := make([]float64, len(steps))
			for i, n := range steps {
				ys[i] = math.NaN()
				if r := row(s, n); r != nil {
					ys[i] = f(r)
				}
			}
			out = append(out, Series{Name: s + suffix, Y: ys})
		}
		return out
	}

	r := &Report{
		Title:    cmp.Or(o.Title, "LM Warden simulation: "+rep.Farm),
		Question: cmp.Or(o.Question, fmt.Sprintf("Which routing serves agent sessions best on %s: %s?", rep.Farm, strings.Join(strategies, ", "))),
		Answer:   cmp.Or(o.Answer, simAnswer(rep, strategies, steps, row)),
	}

	// The table, one row per step and strategy.
	table := Table{
		Caption: "Per strategy and load (KPIs evaluated with PromQL over each step's window)",
		Header: []string{"sessions", "strategy", "sessions/h", "output tok/min", "TTFB p50 s", "TTFB p95 s",
			"replicas busy", "prefix hit %", "stayed %", "finished", "unfinished", "preemptions"},
	}
	for _, n := range steps {
		for _, s := range strategies {
			if x := row(s, n); x != nil {
				table.Rows = append(table.Rows, []string{
					strconv.Itoa(n), s, fmtNum(float64(x.SessionsPerHour), 0), fmtNum(float64(x.OutputTokensPerMin), 0),
					fmtNum(float64(x.TTFBP50), 2), fmtNum(float64(x.TTFBP95), 2), fmtNum(float64(x.ReplicasBusy), 1),
					fmtNum(float64(x.PrefixHitPct), 1), fmtNum(float64(x.StayedPct), 1),
					fmtInt(x.Finished), fmtInt(x.Unfinished), fmtInt(x.Preemptions),
				})
			}
		}
	}
	summary := Section{Heading: "Strategies compared", Paragraphs: o.Workload, Tables: []Table{table}}
	sessions := Axis{Name: "sessions"}
	ttfb := append(perStrategy(" p50", func(r *sim.Row) float64 { return float64(r.TTFBP50) }),
		perStrategy(" p95", func(r *sim.Row) float64 { return float64(r.TTFBP95) })...)
	// Against the sessions levels, a line per strategy; with one level a
	// line would be a single dot, so bars: one group per strategy.
	chart := NewLineChart
	if len(xs) == 1 {
		chart = func(id, title string, _ Axis, _ []float64, y Axis, series ...Series) *Chart {
			ys := make([]float64, len(series))
			cats := make([]string, len(series))
			for i, se := range series {
				cats[i], ys[i] = se.Name, se.Y[0]
			}
			return NewBarChart(id, fmt.Sprintf("%s at %d sessions", title, steps[0]), cats, y, Series{Name: title, Y: ys}).WithCategoryName("strategy")
		}
	}
	if len(strategies) > maxLineStrategies {
		// A head-to-head (warden sim --strategies peers): a line per
		// strategy is a tangle, so bars, one group per strategy, a bar per
		// sessions level; the TTFB's p95 only.
		summary.Charts = headToHeadCharts(strategies, steps, row)
	} else {
		summary.Charts = []*Chart{
			chart("ttfb", "Time to first token, p50 and p95", sessions, xs, Axis{Name: "seconds", Log: true}, ttfb...),
			chart("hit", "Prefix-cache hit rate", sessions, xs, Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)},
				perStrategy("", func(r *sim.Row) float64 { return float64(r.PrefixHitPct) })...),
			chart("tokens", "Output tokens per minute", sessions, xs, Axis{Name: "tokens/min"},
				perStrategy("", func(r *sim.Row) float64 { return float64(r.OutputTokensPerMin) })...),
			chart("busy", "Replicas busy (mean)", sessions, xs, Axis{Name: "replicas", Min: ptr(0.0)},
				perStrategy("", func(r *sim.Row) float64 { return float64(r.ReplicasBusy) })...),
		}
	}

	// Why prompt tokens missed the cache.
	var cats []string
	miss := [4]Series{{Name: "cold"}, {Name: "evicted"}, {Name: "elsewhere"}, {Name: "partial"}}
	missTable := Table{Caption: "Prompt tokens not served from cache", Header: []string{"sessions", "strategy", "cold", "evicted", "elsewhere", "partial"}}
	for _, n := range steps {
		for _, s := range strategies {
			x := row(s, n)
			if x == nil {
				continue
			}
			m := x.MissTokens
			cats = append(cats, fmt.Sprintf("%s @ %d", s, n))
			for i, v := range []int64{m.Cold, m.Evicted, m.Elsewhere, m.Partial} {
				miss[i].Y = append(miss[i].Y, float64(v))
			}
			missTable.Rows = append(missTable.Rows, []string{strconv.Itoa(n), s, fmtInt(m.Cold), fmtInt(m.Evicted), fmtInt(m.Elsewhere), fmtInt(m.Partial)})
		}
	}
	missSection := Section{
		Heading: "Why prompt tokens missed the cache",
		Paragraphs: []string{"cold: never computed on any replica; evicted: cached on this replica before and gone; " +
			"elsewhere: computed only on other replicas (the cost of moving a conversation); partial: a trailing partial block, or the block the hit cap forces."},
		Tables: []Table{missTable},
		Charts: []*Chart{NewBarChart("miss", "Prompt tokens missed, by reason", cats, Axis{Name: "tokens"}, miss[:]...)},
	}

	r.Sections = []Section{summary, missSection}
	if len(rep.Timelines) > 0 {
		r.Sections = append(r.Sections, timelineSection(rep.Timelines))
	}
	if len(steps) > 0 {
		r.Sections = append(r.Sections, replicaSection(steps[len(steps)-1], strategies, row))
	}
	r.Sections = append(r.Sections, definitionsSection(o.KPIs))
	return r
}

// maxLineStrategies is the most strategies the summary draws as lines
// against the sessions; more are a head-to-head, drawn as bars.
const maxLineStrategies = 4

// headToHeadCharts draws a head-to-head: for TTFB p95, prefix hit %,
// output tokens per minute and replicas busy, one group of bars per
// strategy, one bar per sessions level.
func headToHeadCharts(strategies []string, steps []int, row func(string, int) *sim.Row) []*Chart {
	bars := func(id, title string, y Axis, f func(*sim.Row) float64) *Chart {
		series := make([]Series, len(steps))
		for i, n := range steps {
			series[i] = Series{Name: fmt.Sprintf("%d sessions", n), Y: make([]float64, len(strategies))}
			for j, s := range strategies {
				series[i].Y[j] = math.NaN()
				if r := row(s, n); r != nil {
					series[i].Y[j] = f(r)
				}
			}
		}
		return NewBarChart(id, title, strategies, y, series...) // the slanted names say what the categories are
	}
	return []*Chart{
		bars("ttfb", "Time to first token, p95, by strategy", Axis{Name: "seconds", Log: true, Seconds: true}, func(r *sim.Row) float64 { return float64(r.TTFBP95) }),
		bars("hit", "Prefix-cache hit rate, by strategy", Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)}, func(r *sim.Row) float64 { return float64(r.PrefixHitPct) }),
		bars("tokens", "Output tokens per minute, by strategy", Axis{Name: "tokens/min"}, func(r *sim.Row) float64 { return float64(r.OutputTokensPerMin) }),
		bars("busy", "Replicas busy (mean), by strategy", Axis{Name: "replicas", Min: ptr(0.0)}, func(r *sim.Row) float64 { return float64(r.ReplicasBusy) }),
	}
}

// timelineSection draws the runs over time (warden sim --timeline): every
// strategy's prefix-cache hit rate from the cold start, then per strategy
// each replica's KV-cache usage and requests in flight: where a cache fills
// and evicts, and which replicas idle.
func timelineSection(tls []sim.Timeline) Section {
	minutes := func(tl sim.Timeline) []float64 {
		xs := make([]float64, len(tl.TimesS))
		for i, t := range tl.TimesS {
			xs[i] = roundF(t/60, 2)
		}
		return xs
	}
	step := fmtSpan(tls[0].StepS)
	sec := Section{
		Heading: "Over time, from cold caches",
		Paragraphs: []string{"Each point covers the " + step + " before it: the prefix-cache hit rate by vLLM's counters (as a dashboard of the real farm shows it), " +
			"and per replica the mean KV-cache usage (vllm:kv_cache_usage_perc counts the blocks of requests running: a paused conversation's cached blocks are free " +
			"to evict and count as unused) and the mean requests in flight. The queries are in the JSON (timelines[].queries); a Prometheus scraping the real farm " +
			"draws the same charts with them."},
	}
	var hit []Series
	for _, tl := range tls {
		hit = append(hit, Series{Name: tl.Strategy, Y: timeValues(tl.HitPct)})
	}
	mins := Axis{Name: "minutes"}
	sec.Charts = append(sec.Charts, NewLineChart("timeline-hit", "Prefix-cache hit rate over time", mins, minutes(tls[0]),
		Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)}, hit...))
	for i, tl := range tls {
		var kv, inflight []Series
		for k := range tl.KVUsagePct {
			kv = append(kv, Series{Name: "replica " + strconv.Itoa(k), Y: timeValues(tl.KVUsagePct[k])})
		}
		for k := range tl.InFlight {
			inflight = append(inflight, Series{Name: "replica " + strconv.Itoa(k), Y: timeValues(tl.InFlight[k])})
		}
		id := "timeline-" + strconv.Itoa(i)
		sec.Charts = append(sec.Charts,
			NewLineChart(id+"-kv", tl.Strategy+": KV-cache usage per replica", mins, minutes(tl), Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)}, kv...),
			NewLineChart(id+"-inflight", tl.Strategy+": requests in flight per replica", mins, minutes(tl), Axis{Name: "requests", Min: ptr(0.0)}, inflight...))
	}
	return sec
}

// replicaSection shows the per-replica figures of every strategy at n sessions.
func replicaSection(n int, strategies []string, row func(string, int) *sim.Row) Section {
	nrep := 0
	for _, s := range strategies {
		if x := row(s, n); x != nil {
			nrep = max(nrep, len(x.Replicas))
		}
	}
	cats := make([]string, nrep)
	for i := range cats {
		cats[i] = "replica " + strconv.Itoa(i)
	}
	var req, hit, kv []Series
	t := Table{
		Caption: fmt.Sprintf("Per replica at %d sessions", n),
		Header:  []string{"strategy", "replica", "requests", "sticky", "spilled in", "KV use mean %", "KV use max %", "prefix hit %", "preemptions"},
	}
	for _, s := range strategies {
		x := row(s, n)
		if x == nil {
			continue
		}
		rq, ht, kvm := nanSlice(nrep), nanSlice(nrep), nanSlice(nrep)
		for _, rr := range x.Replicas {
			if rr.Replica < 0 || rr.Replica >= nrep {
				continue
			}
			rq[rr.Replica] = float64(rr.Requests)
			ht[rr.Replica] = float64(rr.HitPct)
			kvm[rr.Replica] = 100 * float64(rr.KVUsageMean)
			t.Rows = append(t.Rows, []string{s, strconv.Itoa(rr.Replica), fmtInt(rr.Requests), fmtInt(rr.Sticky), fmtInt(rr.SpilledIn),
				fmtNum(100*float64(rr.KVUsageMean), 1), fmtNum(100*float64(rr.KVUsageMax), 1), fmtNum(float64(rr.HitPct), 1), fmtInt(rr.Preemptions)})
		}
		req = append(req, Series{Name: s, Y: rq})
		hit = append(hit, Series{Name: s, Y: ht})
		kv = append(kv, Series{Name: s, Y: kvm})
	}
	return Section{
		Heading: fmt.Sprintf("Replicas at %d sessions", n),
		Tables:  []Table{t},
		Charts: []*Chart{
			NewBarChart("replica-requests", "Requests routed to each replica", cats, Axis{Name: "requests"}, req...),
			NewBarChart("replica-hit", "Prefix-cache hit rate per replica", cats, Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)}, hit...),
			NewBarChart("replica-kv", "KV cache use per replica (mean)", cats, Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)}, kv...),
		},
	}
}

// definitionsSection lists the PromQL of every KPI.
func definitionsSection(kpis []metrics.KPI) Section {
	if kpis == nil {
		kpis = metrics.KPIs()
	}
	s := Section{
		Heading: "How each figure is defined",
		Paragraphs: []string{"Each figure is a PromQL expression, evaluated over each step's window against the series the simulator " +
			"writes; the same text runs against a Prometheus server scraping a live farm. $model is the model name, " +
			"$window the window as a PromQL duration and $window_s the same in seconds."},
	}
	for _, k := range kpis {
		s.Definitions = append(s.Definitions, Definition{Name: k.Name, Title: k.Title, Unit: k.Unit, Expr: k.Expr})
	}
	return s
}

// simAnswer names the strategy with the lowest TTFB p95 at the highest load.
func simAnswer(rep *sim.Report, strategies []string, steps []int, row func(string, int) *sim.Row) string {
	if len(steps) == 0 {
		return "The simulation produced no results."
	}
	n := steps[len(steps)-1]
	var best *sim.Row
	var others []string
	for _, s := range strategies {
		x := row(s, n)
		if x == nil || math.IsNaN(float64(x.TTFBP95)) {
			continue
		}
		if best == nil || x.TTFBP95 < best.TTFBP95 {
			best = x
		}
	}
	if best == nil {
		return fmt.Sprintf("At %d sessions on %s no strategy finished a request.", n, rep.Farm)
	}
	for _, s := range strategies {
		switch x := row(s, n); {
		case x == nil || x == best:
		case !finite(float64(x.TTFBP95)):
			others = append(others, s+" finished no request")
		default:
			others = append(others, fmt.Sprintf("%s %s s", s, fmtNum(float64(x.TTFBP95), 2)))
		}
	}
	if len(strategies) > maxLineStrategies {
		others = headToHeadOthers(strategies, best, func(s string) *sim.Row { return row(s, n) })
	}
	ans := fmt.Sprintf("At %d sessions on %s, %s routing gives the lowest TTFB p95, %s s, with a prefix-cache hit rate of %s %%",
		n, rep.Farm, best.Strategy, fmtNum(float64(best.TTFBP95), 2), fmtNum(float64(best.PrefixHitPct), 1))
	if len(others) > 0 {
		ans += " (" + strings.Join(others, ", ") + ")"
	}
	return ans + "."
}

// headToHeadOthers names, beside the best, the lowest TTFB p95 of each
// side of a head-to-head: warden's routings (affinity and its options),
// the peers' routers, and vLLM's own balancer (least-loaded), each with
// its hit rate. A strategy is placed by the registry name its label
// begins with.
func headToHeadOthers(strategies []string, best *sim.Row, row func(string) *sim.Row) []string {
	side := func(label string) string {
		name, _, _ := strings.Cut(label, " (")
		st, _ := placement.LookupStrategy(name)
		switch {
		case st.Peer:
			return "the best peer"
		case name == placement.StrategyAffinity:
			return "warden's best"
		default:
			return name
		}
	}
	var order []string
	bestOf := map[string]*sim.Row{}
	for _, s := range strategies {
		x := row(s)
		if x == nil || x == best || !finite(float64(x.TTFBP95)) {
			continue
		}
		k := side(s)
		if b, ok := bestOf[k]; !ok || x.TTFBP95 < b.TTFBP95 {
			if !ok {
				order = append(order, k)
			}
			bestOf[k] = x
		}
	}
	var out []string
	for _, k := range order {
		x := bestOf[k]
		who := x.Strategy
		if k != x.Strategy {
			if side(best.Strategy) == k { // the best is on this side: its runner-up
				k = strings.Replace(k, "best", "next best", 1)
			}
			who = k + ", " + x.Strategy + ","
		}
		out = append(out, fmt.Sprintf("%s %s s at %s %% hit", who, fmtNum(float64(x.TTFBP95), 2), fmtNum(float64(x.PrefixHitPct), 1)))
	}
	return out
}

// axes returns the strategies in order of first appearance and the session steps ascending.
func axes(rows []sim.Row) (strategies []string, steps []int) {
	for _, r := range rows {
		if !slices.Contains(strategies, r.Strategy) {
			strategies = append(strategies, r.Strategy)
		}
		if !slices.Contains(steps, r.Sessions) {
			steps = append(steps, r.Sessions)
		}
	}
	slices.Sort(steps)
	return strategies, steps
}

func nanSlice(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = math.NaN()
	}
	return s
}

func ptr[T any](v T) *T { return &v }

func fmtInt(v int64) string { return fmtNum(float64(v), 0) }

// fmtNum formats v with d decimals and thousands separators; "-" for NaN or infinity.
func fmtNum(v float64, d int) string { return num.Format(v, d) }
