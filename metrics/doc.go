// Package metrics is LM Warden's one vocabulary of metrics and the PromQL
// that turns them into KPIs, shared by the simulator (sim), live mode (live)
// and the planner.
//
// Where to start reading:
//
//   - package names (metrics/names): the series and label names, vLLM's
//     (vllm:*, labels model_name and engine) and warden's own (warden_*,
//     labels model and replica), and the histogram bucket bounds. It
//     imports nothing of Prometheus, so that live mode names its series
//     without linking the PromQL engine; this package and every other
//     import it.
//   - kpi.promql: every KPI as a PromQL expression, with the format and the
//     window semantics documented at its top. kpi.go parses it and provides
//     [KPIs], [Expand] and [Evaluator.KPIValues].
//   - store.go: [Store], an in-memory [storage.Queryable] that the simulator
//     writes at each simulated scrape ([Store.Series], [Series.Append]);
//     histogram.go: [Histogram], a classic cumulative histogram on top of it;
//     native.go: [NativeHistogram], a Prometheus native histogram as
//     client_golang makes it (same buckets, bit for bit), which the store
//     serves to the engine as float-histogram samples.
//     warden_ttfb_seconds has both ([Histogram.WithNative],
//     names.WardenTTFBNative), as live mode's client_golang histogram exposes
//     both; the TTFB KPIs read the native one.
//   - eval.go: [Evaluator], the embedded PromQL engine (instant, scalar and
//     range queries); aligned.go puts a range query on a regular grid, one
//     series per replica or engine ([Evaluator.RangeAligned]: the
//     timelines of a plan and of a simulation).
//   - source.go: [Source], PromQL instant and range queries against a real
//     Prometheus server ([Prometheus], client_golang's HTTP API) or a
//     [Store] ([StoreSource], through the embedded engine), and
//     [KPIValues], every KPI on any Source. Calibration, the planner's
//     observed plans and bench read their data through it.
//
// The same KPI text runs against a real Prometheus server: [KPIValues] on a
// [Prometheus] source sends [Expand]'s result through client_golang's API,
// so a prediction and a measurement are computed by one definition.
//
// Typical simulator use:
//
//	st := metrics.NewStore()
//	hits := st.Series(labels.FromStrings(names.LabelName, names.VLLMPrefixCacheHits,
//		names.LabelModelName, "m", names.LabelEngine, "0"))
//	ttfb := metrics.NewHistogram(st, names.WardenTTFB, labels.FromStrings(names.LabelModel, "m"),
//		names.WardenTTFBBuckets()).WithNative(st, names.WardenTTFBNative())
//	// at every scrape instant t (ms), for every series, including both ends of a step:
//	hits.Append(t, float64(totalHits))
//	ttfb.Append(t)
//	// at the end of a step of length d:
//	vals, err := metrics.NewEvaluator().KPIValues(ctx, st, "m", time.UnixMilli(t), d)
//
// Of the project it imports only metrics/names; beyond the standard library,
// Prometheus's promql, model/labels, storage and related packages, and
// client_golang's HTTP API client (source.go).
package metrics
