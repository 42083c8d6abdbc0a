// Package sim is LM Warden's discrete-event simulator of a farm of vLLM
// data-parallel replicas with prefix caches, driven by agent sessions and
// routed by the very placement code that the proxy runs.
//
// # Reading guide
//
// Read the files in this order; each builds on the ones before.
//
//  1. farm.go: the farm spec (YAML, strict, errors "file:line: key: reason")
//     and its resolution into a Farm: GPU and model from hardware, the KV
//     cache sized by hardware.SizeKV unless num_gpu_blocks is given, vLLM's
//     defaults for the rest.
//  2. event.go: virtual time (int64 microseconds) and the event heap,
//     ordered by (time, push sequence): no two events ever tie, so a run is
//     deterministic.
//  3. blockpool.go: vLLM V1's KV block pool: the null block, the LRU free
//     queue (free appends at the tail, in reverse block order for a finished
//     request, allocation pops the head), lazy eviction of cached blocks,
//     duplicate hashes.
//  4. seq.go and replica.go: one engine. schedule() is vLLM's
//     Scheduler.schedule: running requests first (preempting the newest
//     running request when a block cannot be allocated, by recompute), then
//     waiting ones in FCFS order within max_num_seqs and the
//     max_num_batched_tokens budget, with chunked prefill; prefix-cache
//     lookups walk a request's chained block hashes (traces.Request.HashIDs,
//     then OutputHashIDs for blocks that generated tokens complete) to the
//     first miss, capped so that one token is always computed. finishStep
//     is update_from_output: a token for every request whose prefill is
//     done, finished requests freed. Misses of first lookups are classified
//     (cold, evicted, elsewhere, partial) against everset.go, the blocks
//     each replica ever cached.
//  5. steptime.go: how long a step takes: a roofline of the GPU (compute
//     bound prefill, memory bound decode), the all-reduces of tensor
//     parallelism (two per layer, over the GPU's interconnect from
//     hardware's catalogue; steptime_tp_test.go holds them against a
//     published vLLM measurement) and a per-step overhead, with
//     efficiency factors that a farm spec may override. floor.go: the
//     least time a replica can take to decode a token (planner's check of
//     a journal recorded on a faster clock).
//  6. run.go: one strategy on one farm: the event loop and a request's
//     life. routing.go: the router side (placement.Router, the one the
//     proxy drives too; an instant in-flight count, scraped fields
//     refreshed every scrape_interval; variants, the KV-aware options and
//     the admission queue).
//  7. driver.go: the clients: a closed loop of N sessions (next turn when
//     the answer is read plus the client's turnaround and think time, a new
//     session when one ends; steps start or retire sessions; a synthetic
//     session's subagents run on clients of their own, side by side, while
//     their parent waits for them, not counted in N), an
//     open-loop replay of a trace at its recorded arrival times, and a
//     session replay (each session from its recorded start, turns paced by
//     the farm; the router told of each request's start and end as the
//     proxy's is, refused first turns retried as the SDKs do).
//     frontend.go: vLLM's DP front end, which routes least-loaded, as the
//     release in vllm.version runs it (vllm.go).
//     apiserver.go: the way up, past vLLM's API server, which templates
//     and tokenises one request at a time (a FIFO per server).
//     requests.go: the per-request records of --requests.
//  8. record.go: the vllm:* and warden_* series written into a
//     metrics.Store at every scrape instant, as a real farm exposes them
//     (all of them when Experiment.OnStore reads the store, else only
//     those of the KPIs a Row holds), and marks of every counter at the
//     boundaries of measured steps.
//  9. experiment.go and result.go: Run, the public entry point: strategies
//     in parallel, each on a fresh farm, steps back to back on a warm one
//     (each driver runs its own steps on a stepper; trace.go: a trace in
//     memory);
//     rows whose headline columns are the KPIs of metrics/kpi.promql
//     evaluated by PromQL over each step's window; JSON and text output.
//     timeline.go: with Experiment.TimelineStep, each strategy's run over
//     time from its cold start (hit %, KV use and requests in flight per
//     replica), PromQL range queries on its store.
//
// engine.go exports one replica to drivers outside the event loop:
// EngineReplica (the emulator serves it over HTTP in wall time) runs the
// same schedule, finishStep, block pool and step time, with virtual time
// moved by its caller (Submit, Advance, Abort, Stats).
//
// # Semantics worth knowing
//
//   - Steps follow one another on the same warm farm: moving to the next
//     level starts or retires sessions while the others carry on, and only
//     the end of the last step cuts the requests in flight (reported
//     unfinished); with Experiment.FreshSteps every step's end cuts them
//     and the next step starts all its sessions at once, as warden bench
//     --fresh-steps runs its steps. Sessions that start together on one replica stay in
//     step, so each of their first turns waits for another's prefill
//     (tail_test.go); carried on, as the published benchmark of
//     testdata/validation ran, they do not, and affinity's TTFB tail at 8
//     sessions is a known gap there. A request still waiting for its first
//     token when a step closes counts in that step's TTFB with the wait it
//     had (censored). A replay without a duration runs to its end.
//   - Admission is vLLM 0.26's (vllm.version selects older behaviour):
//     scheduler_reserve_full_isl admits a waiting request only if its whole
//     sequence fits, and the waiting loop stops at the first that does not.
//   - Prefix-cache counters follow vLLM: up to 0.26 queries and hits
//     count every lookup, so a request blocked at the head of the queue is
//     counted at every step; from 0.27 (PR #48860) each request once, at
//     admission. A preempted request's re-lookup is counted apart (vLLM's
//     preempted_queries, not exported). Rows also give the true admission
//     hit %.
//   - least-loaded is vLLM's own data-parallel front end (frontend.go): its
//     API servers, their connections and the coordinator's counts, as the
//     release runs them (vllm.go: up to 0.26 a dense model's engines
//     publish nothing, and each server rotates blind to load); with
//     routing.balancer: warden it is the proxy's balancer instead.
//   - vllm.go is the one table of vLLM releases: every behaviour switch
//     with its PR, code, merge date and first release; VLLMBehaviourFor
//     reads it for a release and a model.
//   - A request longer than a whole replica's KV cache is rejected at once
//     (unfinished); its client abandons the session and starts the next one
//     a second later.
//   - The client is modelled (traces.Workload): a request reaches the
//     engine after half the network round trip and the API server's time,
//     and every event reaches the client half a round trip after the
//     engine emits it; client-side TTFB includes both.
//
// # Speed
//
// A planner runs thousands of simulations, so the hot path is kept lean
// without changing a single output byte (issue 16): the prefix-cache index
// and the farm's record of every hash ever cached are open-addressing
// tables (blockpool.go), a decode that fits its blocks skips
// allocate_slots' bookkeeping, a batch's inter-token latencies reach the
// histogram in runs, a request blocked at the head of the queue reuses its
// lookup and its count of evictable hits while they hold, and every series
// reserves its samples up front. A replay counts its trace's distinct
// hashes (linear counting) on another goroutine, which also makes each
// run's record of them at that size; a run whose store nobody reads
// records only the series its rows' KPIs read (TestLeanRunsAgree), and
// rows evaluate only those KPIs. LoadTrace parses on several goroutines
// (traces.Reader.ReadAll), reusing the ids a line shares with one before.
// stepByStep turns the fast paths off; TestFastPathEquivalence compares
// both on a set of workloads (farms, replay and closed loop, overload,
// preemption, prefix sharing, steps), report, request records and every
// sample of every series. The benchmarks of issue 16's workload are in
// speed_bench_test.go.
//
// # Determinism
//
// One goroutine per strategy, no map iteration into decisions or output,
// the sessions from a seeded generator (one PCG stream per session, in
// traces), ties broken by index in placement: the same seed gives
// byte-identical JSON (TestSameSeedSameJSON).
//
// sim imports placement, hardware, traces and metrics; it must not import
// live or net/http (TestArchitecture).
package sim
