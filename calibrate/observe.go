package calibrate

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/metrics/names"
	"github.com/lm-warden/warden/placement"
)

// Window is the time range a command reads, [Start, End].
type Window struct {
	Start, End time.Time
}

// Len is the window's length.
func (w Window) Len() time.Duration { return w.End.Sub(w.Start) }

func (w Window) String() string {
	return fmt.Sprintf("[%s, %s] (%s)", w.Start.UTC().Format(time.RFC3339), w.End.UTC().Format(time.RFC3339), w.Len())
}

// UnknownModelError is a model name that no vLLM series carries in the
// window; Present lists the model_name values that do.
type UnknownModelError struct {
	Model   string
	Present []string
	Source  string
}

func (e *UnknownModelError) Error() string {
	if len(e.Present) == 0 {
		return fmt.Sprintf("model %q: %s holds no vLLM series (vllm:num_requests_running) for any model in the window", e.Model, e.Source)
	}
	return fmt.Sprintf("model %q: no vLLM series on %s carries model_name=%q; models present: %s",
		e.Model, e.Source, e.Model, strings.Join(e.Present, ", "))
}

// NoDataError is a window in which required series have no sample.
type NoDataError struct {
	Series []string
	Model  string
	Window Window
	Source string
}

func (e *NoDataError) Error() string {
	return fmt.Sprintf("no data for model %q on %s in the window %s: series %s have no sample there (widen --since, or check the scrape targets)",
		e.Model, e.Source, e.Window, strings.Join(e.Series, ", "))
}

// promDur writes d as a PromQL duration in whole milliseconds ("90500ms"),
// or whole seconds when it is a multiple of one.
func promDur(d time.Duration) string {
	d = d.Truncate(time.Millisecond)
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// sel is a selector of series name for the model: vLLM's label
// (model_name) for vllm:* series, warden's (model) for the others.
func sel(name, model string, extra ...string) string {
	label := names.LabelModel
	if strings.HasPrefix(name, "vllm:") {
		label = names.LabelModelName
	}
	ms := append([]string{label + "=" + strconv.Quote(model)}, extra...)
	return name + "{" + strings.Join(ms, ",") + "}"
}

// inVLLM is the requests in vLLM for the model, all engines: running plus
// waiting (a farm may expose no waiting series).
func inVLLM(model string) string {
	return fmt.Sprintf("sum(%s) + (sum(%s) or vector(0))", sel(names.VLLMNumRequestsRunning, model), sel(names.VLLMNumRequestsWaiting, model))
}

// deltaExpr is the change of sum(s) over the window of length d that ends
// at the evaluation instant, with the KPI file's semantics (the value at
// the end minus the value at the start, a series born inside counting from
// zero).
func deltaExpr(s string, d time.Duration) string {
	return fmt.Sprintf("(sum(%s) - (sum(%s offset %s) or vector(0)))", s, s, promDur(d))
}

// Models lists the model_name values of vLLM's series in w, sorted.
func Models(ctx context.Context, src metrics.Source, w Window) ([]string, error) {
	expr := fmt.Sprintf("count by (%s) (count_over_time(%s[%s]))", names.LabelModelName, names.VLLMNumRequestsRunning, promDur(w.Len()))
	v, err := src.Instant(ctx, expr, w.End)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range v {
		if m := s.Metric.Get(names.LabelModelName); m != "" {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// CheckModel returns an *UnknownModelError when no vLLM series of model
// has a sample in w.
func CheckModel(ctx context.Context, src metrics.Source, model string, w Window) error {
	ms, err := Models(ctx, src, w)
	if err != nil {
		return err
	}
	if slices.Contains(ms, model) {
		return nil
	}
	if len(ms) == 0 {
		// Maybe the model exists outside the window.
		return &NoDataError{Series: []string{names.VLLMNumRequestsRunning}, Model: model, Window: w, Source: src.String()}
	}
	return &UnknownModelError{Model: model, Present: ms, Source: src.String()}
}

// hasData reports whether the series selector s has a sample in w.
func hasData(ctx context.Context, src metrics.Source, s string, w Window) (bool, error) {
	v, err := scalar(ctx, src, fmt.Sprintf("count(count_over_time(%s[%s]))", s, promDur(w.Len())), w.End)
	if err != nil {
		return false, err
	}
	return v > 0, nil
}

// deltas evaluates the change of sum(s) over each of n equal windows that
// tile w, in order; NaN where the series has no data.
func deltas(ctx context.Context, src metrics.Source, s string, w Window, n int) ([]float64, error) {
	return perWindow(ctx, src, w, n, func(step time.Duration) string { return deltaExpr(s, step) })
}

// gaugeMeans is the time average of expr (an instant-vector expression
// summed to one series) over each of n equal windows tiling w, sampled at
// res.
func gaugeMeans(ctx context.Context, src metrics.Source, expr string, w Window, n int, res time.Duration) ([]float64, error) {
	return perWindow(ctx, src, w, n, func(step time.Duration) string {
		return fmt.Sprintf("avg_over_time((%s)[%s:%s])", expr, promDur(step), promDur(res))
	})
}

// perWindow evaluates query(step), an expression over the window of length
// step that ends at the evaluation instant, at the end of each of n equal
// windows that tile w, and returns the values in order, several series
// summed; NaN where there is no data.
func perWindow(ctx context.Context, src metrics.Source, w Window, n int, query func(step time.Duration) string) ([]float64, error) {
	if n < 1 {
		return nil, fmt.Errorf("window %s cut into %d parts: want at least one", w, n)
	}
	step := w.Len() / time.Duration(n)
	if step < time.Millisecond {
		return nil, fmt.Errorf("window %s cut into %d parts: each is under 1ms (PromQL's resolution); cut it into fewer", w, n)
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = math.NaN()
	}
	m, err := src.Range(ctx, query(step), w.Start.Add(step), w.Start.Add(step*time.Duration(n)), step)
	if err != nil {
		return nil, err
	}
	for _, series := range m {
		for _, p := range series.Floats {
			i := int(math.Round(float64(p.T-w.Start.UnixMilli())/float64(step.Milliseconds()))) - 1
			if i >= 0 && i < n {
				if math.IsNaN(out[i]) {
					out[i] = 0
				}
				out[i] += p.F
			}
		}
	}
	return out, nil
}

// resolution is the sampling step of time averages over windows of
// length step: at most 600 samples per window, at least one per second.
func resolution(step time.Duration) time.Duration {
	return max(time.Second, (step / 600).Truncate(time.Second))
}

// RunningStrategy infers the routing strategy that served the model in w
// from warden_requests_total's reasons: the strategy with the most
// requests under reasons only it gives (placement.InferStrategy: new,
// sticky, spill, parent or rehome say affinity, hash says hash). Without
// warden's series the requests went through vLLM's own balancer:
// least-loaded. how says which.
func RunningStrategy(ctx context.Context, src metrics.Source, model string, w Window) (strategy, how string, err error) {
	v, err := src.Instant(ctx, fmt.Sprintf("sum by (%s) (%s)", names.LabelReason, sel(names.WardenRequests, model)), w.End)
	if err != nil {
		return "", "", err
	}
	counts := map[string]float64{}
	for _, s := range v {
		counts[s.Metric.Get(names.LabelReason)] += s.F
	}
	if len(v) == 0 {
		return placement.StrategyLeastLoaded, "no warden_requests_total series: requests reached vLLM without warden, whose data-parallel balancer is least-loaded", nil
	}
	name, reasons, ok := placement.InferStrategy(counts)
	if !ok {
		return placement.StrategyLeastLoaded, "warden_requests_total has no reason only one strategy gives (pinned requests only?): taken as least-loaded", nil
	}
	words := make([]string, len(reasons))
	for i, r := range reasons {
		words[i] = r.String()
	}
	return name, "warden_requests_total has reasons " + strings.Join(words, "/"), nil
}

// scalar evaluates expr at at and returns its single value, NaN when the
// result is empty; several series are summed.
func scalar(ctx context.Context, src metrics.Source, expr string, at time.Time) (float64, error) {
	v, err := src.Instant(ctx, expr, at)
	if err != nil {
		return math.NaN(), err
	}
	if len(v) == 0 {
		return math.NaN(), nil
	}
	sum := 0.0
	for _, s := range v {
		sum += s.F
	}
	return sum, nil
}
