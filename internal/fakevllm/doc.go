// Package fakevllm is test support: the one hand-written, fault-injecting
// stand-in for a vLLM API server that the tests of live (the proxy) and
// bench (the load generator) start on 127.0.0.1. A test that needs only a
// well-behaved vLLM, or one of the faults `warden emulate --fault` injects
// (stall after headers, 503 on every request, dying mid-stream, slow
// /metrics), runs the emulator (package emulator) instead; this fake is for
// what the emulator cannot do: pause streams until the test lets them go
// (Hold, HoldFirst), wedge at a chosen point and tell when the client left
// (Stall, Canceled), answer a status switched on and off mid-test, fail
// /metrics or /health, end every n-th stream with an error event, lack
// /v1/models, fake an engine's load, and record every request as received.
// No non-test file of the module may import it (internal/archtest's
// TestSupportOnlyInTests).
//
// # Where to start reading
//
//   - server.go: Server, New and its fields (the faults), the endpoints,
//     the routing to data-parallel engines (X-data-parallel-rank, or a
//     sticky session header), the answers in vLLM's JSON and SSE shapes
//     (Token: four bytes of text a token), Stall, Request (what it
//     records) and RefusingURL.
//   - metrics.go: the prefix cache per engine (chained 64-byte blocks of
//     the canonical text), Counters, Restart, and the /metrics exposition.
package fakevllm
