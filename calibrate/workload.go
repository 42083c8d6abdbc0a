package calibrate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/metrics/names"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// WorkloadEstimate is the load a farm served, derived from its metrics or
// from the proxy's journal, and the synthetic workload that reproduces it.
type WorkloadEstimate struct {
	// Workload is the synthetic agent-session model (traces.Workload) that
	// reproduces the observed load; Sessions the concurrent sessions.
	Workload traces.Workload `json:"workload"`
	Sessions float64         `json:"sessions"`
	// Windows is the load over time: the window tiled into equal parts.
	Windows []WindowLoad `json:"windows"`

	Requests          float64       `json:"requests"` // finished in the window
	MeanPromptTokens  float64       `json:"mean_prompt_tokens"`
	MeanOutputTokens  float64       `json:"mean_output_tokens"`
	Turns             float64       `json:"turns"`                // requests per session
	NewSessionsPerMin float64       `json:"new_sessions_per_min"` // sessions started per minute
	ThinkTime         time.Duration `json:"think_time"`

	// From names the data: a Prometheus URL or a journal file.
	From     string   `json:"from"`
	Warnings []string `json:"warnings,omitempty"`
}

// WindowLoad is the load of one part of the window.
type WindowLoad struct {
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Sessions sim.Float `json:"sessions"` // mean concurrent sessions (NaN: no data)
}

// WorkloadOptions say what to read.
type WorkloadOptions struct {
	Model  string
	Window Window
	// Windows is the number of equal parts the window is cut into for the
	// load over time; 0 means DefaultWindows.
	Windows int
}

// DefaultWindows is the number of parts a window is cut into.
const DefaultWindows = 6

// DeriveWorkload derives the workload that model served in the window from
// vLLM's and warden's series:
//
//   - concurrent sessions: the time average of the requests in vLLM
//     (vllm:num_requests_running + vllm:num_requests_waiting, all engines),
//     per window part; a closed-loop client has exactly one request in
//     flight, and its think time is not visible in metrics (assumed 0, a
//     warning says so: the estimate is then a lower bound);
//   - prompt and output sizes: the means of vllm:request_prompt_tokens and
//     vllm:request_generation_tokens (histograms), else the changes of
//     vllm:prompt_tokens_total and vllm:generation_tokens_total per request
//     finished (vllm:request_success_total);
//   - turns per session: from warden's counters, the share of later turns
//     f = warden_later_turns_total / warden_requests_total gives 1/(1-f);
//     without them the default (6) is assumed;
//   - the shape: the product's default proportions of system prompt, first
//     message and new text per turn, scaled so that the mean prompt over a
//     session's turns equals the observed mean (a journal gives the real
//     proportions: FromJournal).
func DeriveWorkload(ctx context.Context, src metrics.Source, o WorkloadOptions) (*WorkloadEstimate, error) {
	if o.Windows <= 0 {
		o.Windows = DefaultWindows
	}
	w, m := o.Window, o.Model
	if w.Len() < time.Second {
		return nil, fmt.Errorf("window %s: want at least 1s", w)
	}
	if err := metrics.Ping(ctx, src, w.End); err != nil {
		return nil, err
	}
	if err := CheckModel(ctx, src, m, w); err != nil {
		return nil, err
	}
	est := &WorkloadEstimate{From: src.String()}

	// Required: requests finished and tokens.
	var missing []string
	total := func(name string, extra ...string) (float64, bool, error) {
		s := sel(name, m, extra...)
		ok, err := hasData(ctx, src, s, w)
		if err != nil || !ok {
			return math.NaN(), false, err
		}
		d, err := deltas(ctx, src, s, w, 1)
		if err != nil {
			return math.NaN(), false, err
		}
		return d[0], !math.IsNaN(d[0]), nil
	}
	reqs, ok, err := total(names.VLLMRequestSuccess, names.LabelFinishedReason+`!="abort"`)
	if err != nil {
		return nil, err
	}
	if !ok || reqs <= 0 {
		missing = append(missing, names.VLLMRequestSuccess)
	}
	est.Requests = reqs
	// Answers cut at max_tokens finish with reason "length": when nearly
	// all do, they ran to the limit (traces.OutputMax), not to a lognormal.
	lengthCapped, okLen, err := total(names.VLLMRequestSuccess, names.LabelFinishedReason+`="length"`)
	if err != nil {
		return nil, err
	}
	mean := func(hist, counter string) (float64, string, error) {
		sum, okS, err := total(hist + names.SumSuffix)
		if err != nil {
			return 0, "", err
		}
		cnt, okC, err := total(hist + names.CountSuffix)
		if err != nil {
			return 0, "", err
		}
		if okS && okC && cnt > 0 {
			return sum / cnt, hist, nil
		}
		tok, okT, err := total(counter)
		if err != nil {
			return 0, "", err
		}
		if !okT || !(reqs > 0) {
			missing = append(missing, counter)
			return math.NaN(), "", nil
		}
		est.Warnings = append(est.Warnings, fmt.Sprintf("%s missing: mean from %s / %s instead", hist, counter, names.VLLMRequestSuccess))
		return tok / reqs, counter, nil
	}
	if est.MeanPromptTokens, _, err = mean(names.VLLMRequestPromptTokens, names.VLLMPromptTokens); err != nil {
		return nil, err
	}
	if est.MeanOutputTokens, _, err = mean(names.VLLMRequestGenerationTokens, names.VLLMGenerationTokens); err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, &NoDataError{Series: slices.Compact(missing), Model: m, Window: w, Source: src.String()}
	}

	// Concurrency over time.
	step := w.Len() / time.Duration(o.Windows)
	conc, err := gaugeMeans(ctx, src, inVLLM(m), w, o.Windows, resolution(step))
	if err != nil {
		return nil, err
	}
	var sum float64
	var n int
	for i, c := range conc {
		est.Windows = append(est.Windows, WindowLoad{Start: w.Start.Add(step * time.Duration(i)), End: w.Start.Add(step * time.Duration(i+1)), Sessions: sim.Float(c)})
		if !math.IsNaN(c) {
			sum += c
			n++
		}
	}
	if n == 0 {
		return nil, &NoDataError{Series: []string{names.VLLMNumRequestsRunning}, Model: m, Window: w, Source: src.String()}
	}
	est.Sessions = sum / float64(n)
	est.Warnings = append(est.Warnings, "think time is not visible in metrics: assumed 0s, so concurrent sessions = requests in vLLM (a lower bound when clients think; give --journal for the real figure)")

	// Turns per session from warden's counters.
	later, okL, err := total(names.WardenLaterTurns)
	if err != nil {
		return nil, err
	}
	routed, okR, err := total(names.WardenRequests)
	if err != nil {
		return nil, err
	}
	def := traces.DefaultWorkload()
	est.Turns = float64(def.Turns)
	if okL && okR && routed > 0 && later < routed {
		est.Turns = routed / (routed - later)
	} else {
		est.Warnings = append(est.Warnings, fmt.Sprintf("%s or %s missing (requests did not go through warden): assumed %d turns per session",
			names.WardenLaterTurns, names.WardenRequests, def.Turns))
	}
	if mins := w.Len().Minutes(); mins > 0 {
		est.NewSessionsPerMin = reqs / est.Turns / mins
	}
	est.Workload = shapeWorkload(est.MeanPromptTokens, est.MeanOutputTokens, est.Turns, 0)
	if okLen && reqs > 0 && lengthCapped >= 0.9*reqs {
		est.Workload.OutputTokens = traces.OutputMax
		est.Workload.MaxOutputTokens = max(1, int(math.Round(est.MeanOutputTokens)))
	} else {
		// The answers' spread, from vLLM's histogram of them.
		sigma, top, ok, err := histLogSigma(ctx, src, names.VLLMRequestGenerationTokens, m, w)
		if err != nil {
			return nil, err
		}
		if ok {
			est.Workload.OutputTokensSigma = math.Round(sigma*100) / 100
			est.Workload.MaxOutputTokens = max(est.Workload.MaxOutputTokens, int(top))
		} else {
			est.Warnings = append(est.Warnings, fmt.Sprintf("%s%s missing: the answers' spread assumed (sigma %g)", names.VLLMRequestGenerationTokens, names.BucketSuffix, est.Workload.OutputTokensSigma))
		}
	}
	est.Warnings = append(est.Warnings, "a farm's metrics do not show each turn's addition, the pauses, compactions or subagents: the workload keeps the bench's constant shape scaled to the observed means; give --journal (or run warden trace stats on a journal) for their distributions")
	return est, nil
}

// histLogSigma estimates the sigma of the logs of a histogram's values
// over the window from the changes of its buckets (each bucket's count at
// the geometric middle of its bounds; the +Inf bucket at its lower bound)
// and the upper bound of the highest bucket used. ok is false when the
// buckets are missing or saw fewer than 2 values.
func histLogSigma(ctx context.Context, src metrics.Source, name, model string, w Window) (sigma, top float64, ok bool, err error) {
	s := sel(name+names.BucketSuffix, model)
	expr := fmt.Sprintf("sum by (le) (%s) - (sum by (le) (%s offset %s))", s, s, promDur(w.Len()))
	v, err := src.Instant(ctx, expr, w.End)
	if err != nil {
		return 0, 0, false, err
	}
	type bucket struct{ le, cum float64 }
	var bs []bucket
	for _, x := range v {
		le, err := strconv.ParseFloat(x.Metric.Get("le"), 64)
		if err != nil || math.IsNaN(x.F) {
			continue
		}
		bs = append(bs, bucket{le, x.F})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	var n, sum, sum2, prevLe, prevCum float64
	for _, b := range bs {
		c := b.cum - prevCum
		if c > 0 {
			mid := b.le
			switch {
			case math.IsInf(b.le, 1):
				mid = prevLe
			case prevLe > 0:
				mid = math.Sqrt(prevLe * b.le)
			}
			l := math.Log(math.Max(mid, 1))
			n += c
			sum += c * l
			sum2 += c * l * l
			top = b.le
			if math.IsInf(top, 1) {
				top = prevLe
			}
		}
		prevLe, prevCum = b.le, math.Max(b.cum, prevCum)
	}
	if n < 2 {
		return 0, 0, false, nil
	}
	m := sum / n
	return math.Min(4, math.Sqrt(math.Max(sum2/n-m*m, 0))), top, true, nil
}

// shapeWorkload scales the default proportions of system prompt, first
// message and new text per turn so that a session of turns turns has the
// mean prompt meanPrompt when answers average meanOutput: the prompt of
// turn k is S + F + k(N + O), so its mean over T turns is
// S + F + (T-1)/2 (N + O); with S, F, N = c x (defaults), c follows.
func shapeWorkload(meanPrompt, meanOutput, turns float64, think time.Duration) traces.Workload {
	w := traces.DefaultWorkload()
	t := max(1, int(math.Round(turns)))
	w.Turns = t
	half := float64(t-1) / 2
	out := math.Max(1, meanOutput)
	c := (meanPrompt - half*out) / float64(w.SystemPromptTokens+w.FirstMessageTokens+int(half*float64(w.NewTokensPerTurn)))
	c = math.Max(c, 0.01)
	w.SystemPromptTokens = int(math.Round(c * float64(w.SystemPromptTokens)))
	w.FirstMessageTokens = max(1, int(math.Round(c*float64(w.FirstMessageTokens))))
	w.NewTokensPerTurn = int(math.Round(c * float64(w.NewTokensPerTurn)))
	// The default lognormal clipped at max_output_tokens loses ~4 % of its
	// mean; aim the mean that much higher.
	w.OutputTokens = traces.OutputLognormal // a fitted mean, not answers cut at max_tokens
	w.OutputTokensMean = math.Round(out*1.04*10) / 10
	if w.OutputTokensMean > 0.6*float64(w.MaxOutputTokens) {
		w.MaxOutputTokens = int(math.Ceil(w.OutputTokensMean / 0.6))
	}
	w.ThinkTime = think
	return w
}

// FromJournal derives the workload from the proxy's journal (or any trace
// in warden's format): sessions, turns, sizes and think times are read
// directly rather than inferred.
//
//   - concurrent sessions: the time average of the sessions in progress,
//     a session lasting from its first arrival to its last arrival plus
//     its mean gap between turns;
//   - the workload: traces.Fitter, the distributions of issue 48 (turns,
//     additions and pauses split into tools' results and a person's
//     messages, answers, compaction, subagents, agent kinds), as `warden
//     trace stats --workload-out` fits them; what it assumed is in the
//     warnings;
//   - think time: the mean think_ms of later turns.
func FromJournal(path string) (*WorkloadEstimate, error) {
	rd, err := traces.Open(path, traces.ReaderOptions{})
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	bs := rd.Header().BlockSize
	fitter := traces.NewFitter(bs, traces.FitOptions{})
	type sess struct {
		turns []traces.Request
	}
	index := map[string]int{}
	var ss []sess
	var promptSum, outSum float64
	var n int
	for {
		r, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		fitter.Add(r)
		c := r.Clone()
		i, ok := index[c.Session]
		if !ok {
			i = len(ss)
			index[c.Session] = i
			ss = append(ss, sess{})
		}
		ss[i].turns = append(ss[i].turns, c)
		promptSum += float64(c.PromptTokens)
		outSum += float64(c.OutputTokens)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("journal %s: no request", path)
	}
	est := &WorkloadEstimate{From: path, Requests: float64(n), MeanPromptTokens: promptSum / float64(n), MeanOutputTokens: outSum / float64(n)}
	est.Turns = float64(n) / float64(len(ss))

	var thinkSum float64
	var thinkN int
	type span struct{ start, end float64 }
	var spans []span
	var t0, t1 float64 = math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		slices.SortFunc(s.turns, func(a, b traces.Request) int { return a.Turn - b.Turn })
		first := s.turns[0]
		for k := 1; k < len(s.turns); k++ {
			a, b := s.turns[k-1], s.turns[k]
			if b.Turn != a.Turn+1 {
				continue
			}
			thinkSum += float64(max(b.ThinkMs, 0))
			thinkN++
		}
		start := float64(first.ArrivalMs)
		last := float64(s.turns[len(s.turns)-1].ArrivalMs)
		gap := 0.0
		if len(s.turns) > 1 {
			gap = (last - start) / float64(len(s.turns)-1)
		}
		spans = append(spans, span{start, last + gap})
		t0, t1 = math.Min(t0, start), math.Max(t1, last+gap)
	}
	var busy float64
	for _, sp := range spans {
		busy += sp.end - sp.start
	}
	if t1 > t0 {
		est.Sessions = busy / (t1 - t0)
		est.NewSessionsPerMin = float64(len(ss)) / ((t1 - t0) / 60000)
	} else {
		est.Sessions = float64(len(ss))
	}
	if thinkN > 0 {
		est.ThinkTime = (time.Duration(thinkSum/float64(thinkN)) * time.Millisecond).Round(time.Millisecond)
	}
	fit := fitter.Fit()
	w := fit.Workload
	est.Warnings = append(est.Warnings, fit.Notes...)
	est.Workload = w
	est.Windows = []WindowLoad{{Start: time.UnixMilli(int64(t0)), End: time.UnixMilli(int64(t1)), Sessions: sim.Float(est.Sessions)}}
	return est, nil
}
