// Package bench measures a live deployment with the load the simulator
// predicts for, and puts the two side by side: `warden bench` and `warden
// compare`.
//
// Where to start reading:
//
//   - bench.go: Config and Run. A preflight request (GET /v1/models, else
//     /health, with a short timeout) makes an unreachable target an error at
//     once. Then each step holds N closed-loop clients for Config.Step: a
//     client runs the sessions of traces.NewGenerator (the same seed gives
//     the same sessions as `warden sim`), sending each turn when the
//     previous answer has ended plus its think time; a failed request ends
//     its session (a new one starts after a second, as in the simulator).
//     As in the simulator the load carries on from step to step: a step's
//     end cuts nothing, the next step starts the clients it adds (a client
//     beyond a smaller step's level retires when its session ends), and
//     every event counts in the step open when it happens (a TTFB at its
//     first token); only the last step's end cuts the requests in flight
//     (unfinished). Config.FreshSteps cuts at every step's end and starts
//     the next step's sessions all at once.
//   - requests.go: Config.Requests, one sim.RequestRecord per request (the
//     lines of warden sim --requests), replica -1: a client cannot see it.
//   - text.go: how token counts become text (4 bytes per token of the
//     canonical text of traces/text.go, role markers accounted for), and the
//     session's UUID, sent as X-Claude-Code-Session-Id (and in Anthropic's
//     metadata.user_id) the way Claude Code sends it.
//   - stream.go: the two streaming APIs on the wire, and TTFB measured from
//     the send to the first non-empty text delta.
//   - scrape.go and prom.go: the farm's side: vLLM /metrics counters (metrics/vllm) read at
//     each step's ends and sampled during it (prefix hit %, replicas busy,
//     per-replica figures), a warden proxy's admin /metrics (stayed %), or a
//     Prometheus server running the KPIs of metrics/kpi.promql (queried
//     through metrics' Prometheus source).
//   - TTFB p50 and p95 are the client's exact quantiles (bench.go,
//     StepStats): the simulator's KPI reads warden_ttfb_seconds' native
//     histogram, the exact quantile within 2 %, so that a prediction and a
//     measurement are compared like with like.
//   - text_out.go: Result.WriteText, the table `warden sim` writes plus
//     what only a client sees (requests sent, finished, cut, failed).
//   - compare.go: Compare matches a prediction's rows (sim.Report) with a
//     measurement's by strategy and sessions and computes, per column, the
//     relative error and, for percentages, the difference in points.
//
// Results are sim.Report values (bench imports sim for its result types
// only), so `warden bench --json` prints what `warden sim --json` prints and
// `warden compare` and `warden report` read both. Columns a client cannot
// know are zero (miss_tokens) or null (a metrics column without a source).
//
// Time: Config.Speed is the target's time compression (warden emulate
// --speed); steps and think times are divided by it and measured times
// multiplied by it, so every column reads in the farm's own time.
package bench
