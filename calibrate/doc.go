// Package calibrate reads a live farm's Prometheus data into the
// simulator's terms, a farm spec (sim.FarmSpec) and a workload
// (traces.Workload), and compares predictions with observations.
//
// # Where to start reading
//
//   - Everything reads through a metrics.Source (metrics/source.go): a
//     Prometheus server (metrics.Prometheus) or a simulator's series
//     (metrics.StoreSource), so the same code calibrates from a
//     simulation's own series (the unit tests: a farm with known
//     parameters is simulated, then recovered) and from a real server.
//   - observe.go: the window, model discovery and the clear errors
//     ([UnknownModelError], [NoDataError]; metrics.UnreachableError), the
//     per-window counter deltas and gauge means, and the routing strategy
//     in use ([RunningStrategy]).
//   - farm.go: [Calibrate]: engines, the KV cache from
//     vllm:cache_config_info (exact), max_num_seqs when exposed, the
//     strategy, the load, then the step-time fit.
//   - fit.go: [FitStepTime] and [Fit], whose doc comment states the method
//     (simulation matching of the mean inter-token latency and prefill time
//     per concurrency level, Gauss-Newton over the two efficiencies).
//   - workload.go: [DeriveWorkload] (from metrics) and [FromJournal] (from
//     the proxy's journal).
//   - kpi.go: [Compare] of predicted and observed KPIs (metrics.KPIValues:
//     metrics/kpi.promql on any Source) and the check table.
//   - output.go: the YAML written for `warden sim --farm` and
//     `--workload`, and the text summary.
//
// calibrate imports sim, metrics, traces, hardware and placement; planner imports it
// for `warden plan --prometheus`.
package calibrate
