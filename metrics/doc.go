// Package metrics is LM Warden's one vocabulary of metrics and the PromQL
// that turns them into KPIs, shared by the simulator (sim), live mode (live)
// and the planner.
//
// Where to start reading:
//
//   - names.go: the series and label names, vLLM's (vllm:*, labels
//     model_name and engine) and warden's own (warden_*, labels model and
//     replica), and the histogram bucket bounds.
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
//     [WardenTTFBNative]), as live mode's client_golang histogram exposes
//     both; the TTFB KPIs read the native one.
//   - eval.go: [Evaluator], the embedded PromQL engine (instant, scalar and
//     range queries).
//
// The same KPI text runs against a real Prometheus server: live mode and the
// planner call [Expand] and send the result through client_golang's API, so
// a prediction and a measurement are computed by one definition.
//
// Typical simulator use:
//
//	st := metrics.NewStore()
//	hits := st.Series(labels.FromStrings(metrics.LabelName, metrics.VLLMPrefixCacheHits,
//		metrics.LabelModelName, "m", metrics.LabelEngine, "0"))
//	ttfb := metrics.NewHistogram(st, metrics.WardenTTFB, labels.FromStrings(metrics.LabelModel, "m"),
//		metrics.WardenTTFBBuckets()).WithNative(st, metrics.WardenTTFBNative())
//	// at every scrape instant t (ms), for every series, including both ends of a step:
//	hits.Append(t, float64(totalHits))
//	ttfb.Append(t)
//	// at the end of a step of length d:
//	vals, err := metrics.NewEvaluator().KPIValues(ctx, st, "m", time.UnixMilli(t), d)
//
// This package is a leaf: it imports only the standard library and
// Prometheus's promql, model/labels, storage and related packages.
package metrics
