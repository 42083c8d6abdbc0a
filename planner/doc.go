// Package planner answers the capacity question LM Warden exists for: how
// many cards, of which kind, and which routing, for this many concurrent
// agent sessions within these service targets?
//
// Start reading at plan.go: a Plan (a YAML plan file, or built from flags)
// names a workload, candidate farms (GPU kinds x replica counts x tensor
// parallel sizes), the strategies and spill thresholds to try, the sessions
// levels to simulate and the targets (TTFB p95, prefix hit %, output tokens
// per minute, sessions per hour), and the headroom (headroom.go: 20 % unless
// given; its level, the concurrency plus the headroom, is added to the
// levels). Solve (solve.go) expands the candidates, takes them in tiers of
// equal cost, cheapest first, stopping once a farm meets the targets
// (tiers.go: no dearer farm can be the answer), runs every simulation
// in parallel through the simulator (package sim), each as a band (band.go:
// the KV cache x0.85, x1, x1.10 by the engine's speed x0.8, x1, x1.2 by 3
// seeds, every combination, less the axes a candidate has measured: its
// num_gpu_blocks, its calibrated step_time; every KPI a low / nominal /
// high, low the pessimistic edge; a level the nominal run already misses
// keeps it alone), checks the targets on every step and decides
// (decide.go): the cheapest candidate (by money whenever GPU kinds mix or
// a price is given, each kind at its given price or hardware's dated price
// list, price.go, the result saying which; one kind unpriced: by card
// count) whose
// pessimistic edge meets them at the wanted concurrency and at the headroom
// level, with its routing, and the cheaper "marginal" ones that meet them
// only nominally, or not with the headroom (near a cache cliff); for each
// candidate the exact number of sessions at which it
// stops meeting them (bisect.go); the rule-of-thumb check (concurrency x
// typical context against the farm's KV cache, workload.go says how the
// typical context is computed: from the constants of a bench-like workload,
// measured on its drawn sessions for one of distributions, with the
// histogram of prompt lengths the report charts) with a sentence that reconciles it with the
// simulation (reconcile.go); and, when no candidate meets the targets, the
// closest one. timeline.go then runs
// the answer's farm once more with its routing and keeps, from that run's
// metric store, PromQL range queries over the step at the wanted
// concurrency (per-replica load and KV use, prompt tokens cached and
// computed per second): the report's charts over time.
//
// With two strategies or more, routings.go gives each its own answer
// (Result.RoutingCards): the cheapest farm on which it meets the targets,
// "with llm-d you would need N cards", side by side.
//
// The answer names the vLLM release simulated (Result.VLLMReleases). When
// it hangs on a marginal candidate whose KV cache or speed is estimated,
// buyer.go says what to rent for an hour and run to decide it, or what
// margin to buy instead (Result.BuyerCheck).
//
// tune.go is `warden tune`'s planning: the proxy's journal (JournalFiles,
// LoadJournal: rotated files oldest first, each file's times following on
// from the previous one's) replayed session by session on a farm once per
// routing variant (Tune), and the rule that recommends one (TuneRule,
// Recommend); compression.go checks that the journal was recorded at the
// farm's speed (a journal behind `warden emulate --speed N` finished its
// turns N times faster than the farm could: JournalCompression).
//
// observed.go is `warden plan --prometheus`: the farm a Prometheus server
// watches and its load, read through package calibrate, planned as a plan
// file would be (SolveObserved), with the prediction set against what was
// observed (Result.Observation).
//
// skip.go says which work Solve leaves out because it cannot change the
// answer, and which it does once for two uses (the bisection's first probe
// takes the last step of the sweep's runs), and counts both
// (Result.Skipped, SkipNote).
//
// A Result's JSON (result.go, json.go) round-trips exactly, so `warden
// report --from` renders a saved result as `warden plan` did. A Result
// writes its own terminal summary (Result.WriteText, text.go: the answer,
// the buyer's check, the workload, then the plain words of glossary.go:
// what each routing does, the band, the verdicts), as sim.Report and
// bench.Result do: text_table.go is its table of candidates, fitted to
// about 120 columns, text_routings.go the routing cards, text_wrap.go the
// wrapping of sentences and shell commands. Package web (PlanReport) turns
// a Result into the HTML report. DefaultPlan (examples.go,
// examples/default.yaml) is the built-in plan.
package planner
