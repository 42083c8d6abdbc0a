// Package emulator serves a farm of emulated vLLM replicas over HTTP in
// wall time: each replica is the simulator's replica model
// (sim.EngineReplica: the same scheduler, KV block pool, prefix cache and
// step time as `warden sim`), speaking vLLM's OpenAI (chat, completions, Responses) and Anthropic APIs and
// exposing vLLM's /metrics. It lets operators try the proxy, and tests run
// the whole loop, without GPUs (`warden emulate`).
//
// # Where to start reading
//
//   - emulator.go: Options, New, Serve (the lifetime: one driver goroutine
//     per engine, one HTTP server per listener, all stopped when ctx is
//     done), the two layouts (one listener per replica, or one
//     data-parallel server whose requests pick a rank with
//     X-data-parallel-rank or else through vLLM's front end as the farm's
//     release runs it, sim.DPFrontEnd: each connection reaches one of
//     api_server_count API servers, which balance on their own; up to 0.26
//     a dense model's engines report no counts, so each server rotates).
//   - engine.go: one engine: its virtual time is the wall clock times
//     --speed; the driver advances the model to it and sleeps until the step
//     in flight ends; handlers submit and abort requests and receive one
//     event per token through a stream.
//   - request.go: ParseRequest (the untrusted body: model, stream,
//     max_tokens, messages or prompt) and APIError.
//   - text.go: how a prompt becomes blocks (the canonical-text rule of
//     traces/text.go, shared with the proxy's journal) and the deterministic
//     answer, whose decode blocks a following turn hits.
//   - server.go and shapes.go: the endpoints and vLLM's JSON and SSE shapes;
//     responses.go: the Responses API's (/v1/responses); metrics.go: /metrics.
//   - apiserver.go: vLLM's API server, which templates and tokenises one
//     request at a time before the engine sees it (Options.APIServerTime,
//     APIServerPerKToken; the simulator's own queue, in model time).
//   - kvevents.go: KVEventsOptions (--kv-events): each engine publishes
//     vLLM's KV-cache events (package kvevents) from its block pool's
//     changes (sim.EngineReplica.WatchCache), one batch per Advance.
//   - fault.go: Faults (--fault): stall-after-headers, error-503,
//     die-mid-stream and slow-metrics, drawn per request from the seed.
//
// # Fidelity and time
//
// Every scheduling decision, cache hit and step duration comes from package
// sim's code, unchanged; only the clock differs. The model's time is
// virtual: a step that the model says takes 26 ms ends 26 ms / speed of
// wall time after it started. Token events are delivered when their step
// ends (a late driver delivers them late but keeps their model times).
// The histograms on /metrics are vLLM's (sim.EngineHistogramDescs: TTFT,
// inter-token latency, queue, prefill, decode and end-to-end times, prompt
// and generated tokens per request, tokens per step), observed by the
// replica model exactly as the simulator observes them
// (sim.EngineHistograms), in model time; counters are exact. Output length is the request's max_tokens
// (max_completion_tokens, max_tokens; default 256), finished with reason
// "length" (Anthropic "max_tokens").
package emulator
