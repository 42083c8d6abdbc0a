package web

import (
	"fmt"
	"math"
	"strconv"

	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
)

// planTimeline shows the answer's farm over the step at the wanted concurrency: the series of
// PromQL range queries over the simulated metric store, each chart with the query behind it.
func planTimeline(res *planner.Result) Section {
	tl := res.Timeline
	c := &res.Candidates[tl.Candidate]
	label := c.Configs[tl.Config].Label()
	role := "the answer"
	if tl.Candidate != res.Best {
		role = "the closest candidate"
	}
	t := Axis{Name: "seconds into the step"}
	perReplica := func(q planner.QuerySeries) []Series {
		out := make([]Series, 0, len(q.Series))
		for _, s := range q.Series {
			name := "replica " + s.Label
			if s.Label == "" {
				name = "all replicas"
			}
			out = append(out, Series{Name: name, Y: timeValues(s.Values)})
		}
		return out
	}
	farmWide := func(name string, q planner.QuerySeries) Series {
		if len(q.Series) == 0 {
			return Series{Name: name, Y: nanSlice(len(tl.TimesS))}
		}
		return Series{Name: name, Y: timeValues(q.Series[0].Values)}
	}
	step := strconv.FormatFloat(tl.StepS, 'f', -1, 64)
	s := Section{
		Heading: fmt.Sprintf("Over time: %s with %s at %d sessions", c.Name, label, tl.Sessions),
		Paragraphs: []string{
			fmt.Sprintf("%s (%s) run with its routing through the measured step at %d concurrent sessions. Each point is a "+
				"PromQL range query over the series the simulator wrote, evaluated every %s s and covering the %s s before it "+
				"($window below is %s s): the same queries, sent with that step to a Prometheus that scrapes the real farm, "+
				"draw the same charts.", c.Name, role, tl.Sessions, step, step, step),
		},
		Charts: []*Chart{
			NewLineChart("timeline-in-flight", "Requests in flight per replica (mean over each interval)", t, tl.TimesS,
				Axis{Name: "requests", Min: ptr(0.0)}, perReplica(tl.InFlight)...),
			NewLineChart("timeline-kv", "KV cache use per replica (mean over each interval)", t, tl.TimesS,
				Axis{Name: "%", Min: ptr(0.0), Max: ptr(100.0)}, perReplica(tl.KVUsage)...),
			NewStackedAreaChart("timeline-prompt", "Prompt tokens per second, computed and cached", t, tl.TimesS,
				Axis{Name: "tokens/s", Min: ptr(0.0)}, farmWide("computed", tl.PromptComputed), farmWide("cached", tl.PromptCached)),
		},
	}
	s.Tables = append(s.Tables, replicaSpread(tl))
	for _, q := range []planner.QuerySeries{tl.InFlight, tl.KVUsage, tl.PromptCached, tl.PromptComputed} {
		s.Definitions = append(s.Definitions, Definition{Name: q.Name, Title: q.Title, Unit: q.Unit, Expr: q.Query})
	}
	return s
}

// replicaSpread is the per-replica lines as numbers (mean, lowest, highest over the step):
// lines of replicas that carry the same load lie on each other in the charts.
func replicaSpread(tl *planner.Timeline) Table {
	t := Table{
		Caption: "Per replica over the step (the lines above can lie on each other)",
		Header:  []string{"replica", "in flight, mean", "in flight, min", "in flight, max", "KV use %, mean", "KV use %, min", "KV use %, max"},
	}
	stats := func(v []sim.Float, scale float64) []string {
		n, sum, lo, hi := 0, 0.0, math.Inf(1), math.Inf(-1)
		for _, x := range v {
			if f := float64(x); finite(f) {
				n++
				sum += f
				lo, hi = math.Min(lo, f), math.Max(hi, f)
			}
		}
		if n == 0 {
			return []string{"-", "-", "-"}
		}
		return []string{fmtNum(scale*sum/float64(n), 1), fmtNum(scale*lo, 1), fmtNum(scale*hi, 1)}
	}
	kv := map[string][]sim.Float{}
	for _, s := range tl.KVUsage.Series {
		kv[s.Label] = s.Values
	}
	for _, s := range tl.InFlight.Series {
		name := s.Label
		if name == "" {
			name = "all replicas"
		}
		row := append([]string{name}, stats(s.Values, 1)...)
		t.Rows = append(t.Rows, append(row, stats(kv[s.Label], 1)...))
	}
	return t
}

// timeValues converts a time series to chart values (NaN stays NaN: a gap).
func timeValues(v []sim.Float) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}
