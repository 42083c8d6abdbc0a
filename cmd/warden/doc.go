// Command warden simulates, routes and reports on farms of vLLM replicas
// serving coding agents. See the README and `warden --help`.
//
// Where to start reading: main.go (the process: signals, exit codes) and
// root.go (the cobra tree). Each command is one file that binds its flags
// into an Options struct and calls a run function (cli/cli style, no
// package-level flag variables):
//
//   - simulate and plan: sim.go (warden sim), plan.go (warden plan) and
//     plan_observed.go (warden plan --prometheus: the farm and workload
//     read from a live farm), kv.go (warden kv: KV-cache sizing), gpus.go
//     (warden gpus), trace.go (warden trace), workload.go (warden
//     workload), tune.go (warden tune: the journal replayed through each
//     routing variant).
//   - route: proxy.go (warden proxy) and epp.go (warden epp, with
//     epp_kube.go following an InferencePool's pods), both served by
//     frontend.go's runner: the logger, the listeners, the SIGHUP reload
//     loop; emulate.go (warden emulate: the simulator's replica over
//     vLLM's HTTP APIs).
//   - measure and compare: bench.go (warden bench), calibrate.go (warden
//     calibrate), compare.go (warden compare), check.go (warden check,
//     with checkreplicas.go's per-replica drift against a running proxy),
//     report.go (warden report: a saved result as HTML).
//   - shared: output.go (JSON on stdout, output files, saved results),
//     progress.go (a long run's progress on stderr), completion.go and
//     version.go.
package main
