package sim

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lm-warden/warden/internal/num"
)

// Report is the result of an experiment: one row per step and strategy.
// Its JSON form is the one `warden sim --json` prints; field order is fixed
// (structs, not maps) and floats are rounded, so two runs with the same
// seed give the same bytes.
type Report struct {
	Farm string `json:"farm"`
	Rows []Row  `json:"rows"`
	// Timelines, one per strategy, when Experiment.TimelineStep asked.
	Timelines []Timeline `json:"timelines,omitempty"`
}

// Row is one strategy over one measured step. The headline columns are the
// KPIs of metrics/kpi.promql evaluated over the step's window against the
// simulated series; the rest are counted directly.
type Row struct {
	Strategy           string `json:"strategy"`
	Sessions           int    `json:"sessions"` // concurrent sessions (closed loop) or sessions in the trace (open loop)
	SessionsPerHour    Float  `json:"sessions_per_hour"`
	OutputTokensPerMin Float  `json:"output_tokens_per_min"`
	TTFBP50            Float  `json:"ttfb_p50_s"`
	TTFBP95            Float  `json:"ttfb_p95_s"`
	ReplicasBusy       Float  `json:"replicas_busy"`
	PrefixHitPct       Float  `json:"prefix_hit_pct"` // vLLM's counters (vllm:prefix_cache_*), as the version counts them
	// AdmissionHitPct counts every request once, at its first admission:
	// the true hit rate. It equals PrefixHitPct from vLLM 0.27 on (PR
	// #48860); before, the counters also counted every failed lookup of a
	// blocked request.
	AdmissionHitPct Float        `json:"admission_hit_pct"`
	StayedPct       Float        `json:"stayed_pct"`
	MissTokens      MissTokens   `json:"miss_tokens"`
	Replicas        []ReplicaRow `json:"replicas"`
	DurationS       Float        `json:"duration_s"`
	Finished        int64        `json:"finished"`   // requests finished in the step
	Unfinished      int64        `json:"unfinished"` // cut at the end of the last step, or rejected
	// Censored counts the requests still waiting for their first token
	// when the step's window closed: their TTFB counts in this step with
	// the wait they had then.
	Censored    int64 `json:"censored_ttfbs"`
	Preemptions int64 `json:"preemptions"`
	// AdmissionWaits counts the requests (first turns of new
	// conversations) that waited at the router for KV headroom (admission:
	// kv), each attempt once; AdmissionRefused those of them refused after
	// the admission timeout (429/529 in the proxy); AdmissionRetries those
	// of the refused that their client sent again after the Retry-After
	// (a session replay's clients, as their SDKs do). The others,
	// AdmissionRefused - AdmissionRetries, are turns given up, also in
	// Unfinished.
	AdmissionWaits   int64 `json:"admission_waits,omitempty"`
	AdmissionRefused int64 `json:"admission_refused,omitempty"`
	AdmissionRetries int64 `json:"admission_retries,omitempty"`
	// PausedPct is the share of the sessions' time spent paused between
	// turns (tools running, a person replying: the workload's think
	// times) rather than waiting on a request, over the requests sent in
	// the step; absent when nothing paused (the bench).
	PausedPct Float         `json:"paused_pct,omitempty"`
	direct    directColumns // the same columns counted without PromQL (tests)
}

// ReplicaRow is one replica over one step.
type ReplicaRow struct {
	Replica     int   `json:"replica"`
	Requests    int64 `json:"requests"`   // routed here
	Sticky      int64 `json:"sticky"`     // later turns kept home here
	SpilledIn   int64 `json:"spilled_in"` // spilled here from an overloaded home
	KVUsageMean Float `json:"kv_usage_mean"`
	KVUsageMax  Float `json:"kv_usage_max"`
	HitPct      Float `json:"hit_pct"`
	Preemptions int64 `json:"preemptions"`
	// SessionsMin and SessionsMax are the least and the most sessions the
	// replica held over the step's scrapes (a closed loop's running
	// sessions whose last request was placed here); -1 when not counted
	// (a replay).
	SessionsMin int `json:"sessions_min"`
	SessionsMax int `json:"sessions_max"`
}

// directColumns are the headline columns counted directly from the
// simulator's state, for the test that PromQL agrees with them.
type directColumns struct {
	queries, hits      int64
	admitQ, admitH     int64 // once per request, at its first admission
	laterTurns, home   int64
	sessionsCompleted  int64
	outputTokens       int64
	busyMean           float64
	ttfbP50, ttfbP95   float64 // exact quantiles of the step's TTFBs
	prefillComputed    int64
	prefillAbandoned   int64
	preemptedQueries   int64
	preemptedHits      int64
	replicaHitPct      []float64
	replicaKVUsageMean []float64
}

// Float is a float64 written in JSON rounded to 3 decimals, NaN as null.
type Float float64

// MarshalJSON implements json.Marshaler.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, round3(v), 'f', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler: null reads back as NaN, so a
// saved result keeps "measured nothing" apart from zero.
func (f *Float) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = Float(math.NaN())
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("want a number or null, got %s", b)
	}
	*f = Float(v)
	return nil
}

func round3(v float64) float64 {
	r := math.Round(v*1000) / 1000
	if r == 0 {
		return 0 // no "-0"
	}
	return r
}

// pct is 100*a/b, NaN when b is 0.
func pct(a, b int64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return 100 * float64(a) / float64(b)
}

// WriteText writes the report as a table like the product's published one:
// one line per step; with two or three strategies every cell reads
// "off -> on", with more (a head-to-head, --strategies peers) one line per
// step and strategy, the best of each step's hit %, TTFB p95 and output
// tokens/min marked "*".
func (rep *Report) WriteText(w io.Writer) error {
	strategies := []string{}
	steps := []int{}
	for _, r := range rep.Rows {
		if !slices.Contains(strategies, r.Strategy) {
			strategies = append(strategies, r.Strategy)
		}
		if !slices.Contains(steps, r.Sessions) {
			steps = append(steps, r.Sessions)
		}
	}
	long := len(strategies) > maxArrowStrategies
	sep := " -> "
	if long {
		sep = ", "
	}
	if _, err := fmt.Fprintf(w, "%s: %s\n\n", rep.Farm, strings.Join(strategies, sep)); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	head := "sessions\tsessions/h\toutput tok/min\tTTFB p50 s\tTTFB p95 s\treplicas busy\tprefix hit %\tstayed %\tunfinished\t"
	if long {
		head = "sessions\tstrategy\t" + strings.TrimPrefix(head, "sessions\t")
	}
	fmt.Fprintln(tw, head)
	for _, n := range steps {
		var rows []Row
		for _, s := range strategies {
			if i := slices.IndexFunc(rep.Rows, func(r Row) bool { return r.Strategy == s && r.Sessions == n }); i >= 0 {
				rows = append(rows, rep.Rows[i])
			}
		}
		best := bestOf(rows)
		var cells [8][]string
		for k, r := range rows {
			vals := []string{
				fmtNum(float64(r.SessionsPerHour), 0), fmtNum(float64(r.OutputTokensPerMin), 0),
				fmtNum(float64(r.TTFBP50), 2), fmtNum(float64(r.TTFBP95), 2),
				fmtNum(float64(r.ReplicasBusy), 1), fmtNum(float64(r.PrefixHitPct), 1),
				fmtNum(float64(r.StayedPct), 1), strconv.FormatInt(r.Unfinished, 10),
			}
			if long {
				for _, j := range []int{1, 3, 5} {
					if best[j][k] {
						vals[j] += " *"
					}
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t\n", n, r.Strategy, strings.Join(vals, "\t"))
				continue
			}
			for j, v := range vals {
				cells[j] = append(cells[j], v)
			}
		}
		if long {
			continue
		}
		line := strconv.Itoa(n)
		for _, c := range cells {
			line += "\t" + strings.Join(c, " -> ")
		}
		fmt.Fprintln(tw, line+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if long {
		if _, err := fmt.Fprintln(w, "* the step's best output tok/min, TTFB p95 and prefix hit %"); err != nil {
			return err
		}
	}
	// Why prompt tokens missed, per step and strategy.
	if _, err := fmt.Fprintln(w, "\nprompt tokens not served from cache (cold / evicted / elsewhere / partial):"); err != nil {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, r := range rep.Rows {
		m := r.MissTokens
		fmt.Fprintf(tw, "%d\t%s\t%s / %s / %s / %s\t\n", r.Sessions, r.Strategy,
			fmtNum(float64(m.Cold), 0), fmtNum(float64(m.Evicted), 0), fmtNum(float64(m.Elsewhere), 0), fmtNum(float64(m.Partial), 0))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// How evenly the sessions sat on the replicas (a replay has no
	// sessions of its own to count).
	if len(rep.Rows) > 0 && len(rep.Rows[0].Replicas) > 1 && rep.Rows[0].Replicas[0].SessionsMin >= 0 {
		if _, err := fmt.Fprintln(w, "\nsessions held per replica over the step (least-most; a session is held where its last request went):"); err != nil {
			return err
		}
		tw = tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
		for _, r := range rep.Rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t\n", r.Sessions, r.Strategy, r.HeldPerReplica())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	var censored, differ []string
	for _, r := range rep.Rows {
		if r.Censored > 0 {
			censored = append(censored, fmt.Sprintf("%d %s: %d", r.Sessions, r.Strategy, r.Censored))
		}
		if a, b := float64(r.AdmissionHitPct), float64(r.PrefixHitPct); math.Abs(a-b) >= 0.05 {
			differ = append(differ, fmt.Sprintf("%d %s: %s (vLLM's counters %s)", r.Sessions, r.Strategy, fmtNum(a, 1), fmtNum(b, 1)))
		}
	}
	if len(censored) > 0 {
		if _, err := fmt.Fprintf(w, "\nTTFBs counted censored (still waiting when the step closed, with the wait they had): %s\n", strings.Join(censored, ", ")); err != nil {
			return err
		}
	}
	if len(differ) > 0 {
		// Before vLLM 0.27 the counters also count every failed lookup.
		if _, err := fmt.Fprintf(w, "\ntrue prefix hit %% at admission: %s\n", strings.Join(differ, ", ")); err != nil {
			return err
		}
	}
	var paused []string
	for _, r := range rep.Rows {
		if r.PausedPct > 0 {
			paused = append(paused, fmt.Sprintf("%d %s: %s", r.Sessions, r.Strategy, fmtNum(float64(r.PausedPct), 1)))
		}
	}
	if len(paused) > 0 {
		if _, err := fmt.Fprintf(w, "\nshare of the sessions' time paused between turns (tools, a person), %%: %s\n", strings.Join(paused, ", ")); err != nil {
			return err
		}
	}
	return rep.writeTimelines(w)
}

// maxArrowStrategies is the most strategies whose cells WriteText joins
// with arrows on one line per step.
const maxArrowStrategies = 3

// bestOf returns, for the columns of WriteText's vals, which of rows hold
// the step's best: the highest output tokens/min (1) and prefix hit % (5),
// the lowest TTFB p95 (3), compared as the table shows them (ties all
// marked); nil for the other columns.
func bestOf(rows []Row) [8][]bool {
	var best [8][]bool
	mark := func(j int, v func(Row) float64, higher bool) {
		b := math.NaN()
		for _, r := range rows {
			if x := v(r); !math.IsNaN(x) && (math.IsNaN(b) || (higher && x > b) || (!higher && x < b)) {
				b = x
			}
		}
		best[j] = make([]bool, len(rows))
		for k, r := range rows {
			best[j][k] = v(r) == b
		}
	}
	mark(1, func(r Row) float64 { return math.Round(float64(r.OutputTokensPerMin)) }, true)
	mark(3, func(r Row) float64 { return math.Round(float64(r.TTFBP95)*100) / 100 }, false)
	mark(5, func(r Row) float64 { return round1(float64(r.PrefixHitPct)) }, true)
	return best
}

// round1 rounds v to one decimal, as the table shows a percentage.
func round1(v float64) float64 { return math.Round(v*10) / 10 }

// writeTimelines writes the timelines: the hit rate of every strategy over
// time, then each strategy's KV-cache usage per replica.
func (rep *Report) writeTimelines(w io.Writer) error {
	if len(rep.Timelines) == 0 {
		return nil
	}
	t0 := rep.Timelines[0]
	step := time.Duration(t0.StepS * float64(time.Second))
	if _, err := fmt.Fprintf(w, "\nprefix hit %% over time, from cold caches (vLLM's counters; each point covers the %s before it):\n", step); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', tabwriter.AlignRight)
	head := "time\t"
	for _, tl := range rep.Timelines {
		head += tl.Strategy + "\t"
	}
	fmt.Fprintln(tw, head)
	for k, at := range t0.TimesS {
		line := time.Duration(at*float64(time.Second)).String() + "\t"
		for _, tl := range rep.Timelines {
			v := math.NaN()
			if k < len(tl.HitPct) {
				v = float64(tl.HitPct[k])
			}
			line += fmtNum(v, 1) + "\t"
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, tl := range rep.Timelines {
		if _, err := fmt.Fprintf(w, "\nKV-cache usage per replica, %% (%s; mean over each interval):\n", tl.Strategy); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		head := "time\t"
		for i := range tl.KVUsagePct {
			head += "r" + strconv.Itoa(i) + "\t"
		}
		fmt.Fprintln(tw, head)
		for k, at := range tl.TimesS {
			line := time.Duration(at*float64(time.Second)).String() + "\t"
			for _, s := range tl.KVUsagePct {
				line += fmtNum(float64(s[k]), 0) + "\t"
			}
			fmt.Fprintln(tw, line)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// fmtNum formats v with d decimals and thousands separators; "-" for NaN.
func fmtNum(v float64, d int) string { return num.Format(v, d) }

// HeldPerReplica is the sessions each replica held over the step, least
// and most, as "1-2 0-3 ..." in replica order ("-" for a replica not
// counted).
func (r *Row) HeldPerReplica() string {
	parts := make([]string, len(r.Replicas))
	for i, rr := range r.Replicas {
		parts[i] = "-"
		if rr.SessionsMin >= 0 {
			parts[i] = fmt.Sprintf("%d-%d", rr.SessionsMin, rr.SessionsMax)
		}
	}
	return strings.Join(parts, " ")
}
