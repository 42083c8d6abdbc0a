// Package epp is `warden epp`: warden as the endpoint picker (EPP) of the
// Gateway API Inference Extension. A gateway (Envoy Gateway, kgateway,
// Istio, GKE) asks it, over Envoy's ext_proc gRPC protocol, which
// endpoint of an InferencePool serves each request; warden answers with
// exactly the placement the proxy (package live) makes: the same session
// extraction and checks, the same policy, the same session table shared
// through Redis by several pickers, the same admission.
//
// The protocol is the Endpoint Picker Protocol, gateway-api-inference-
// extension docs/proposals/004-endpoint-picker-protocol (v1.0.0): the
// picked endpoints, ip:port[,ip:port...] (the first, then the fallbacks
// the gateway tries in order), go in the request header
// x-gateway-destination-endpoint and in the dynamic metadata namespace
// envoy.lb under the same key; the gateway may restrict the pick with
// envoy.lb.subset_hint / x-gateway-destination-endpoint-subset in the
// request's metadata context (ip:port, or a bare IP for every port of that
// pod, as the reference pickers read it); no eligible endpoint is an
// ImmediateResponse 503, a request shed is 429 (a refusal's status is
// always one of Envoy's HttpStatus enum: Anthropic's 529 goes as 429 or
// 503); the response's metadata context carries envoy.lb /
// x-gateway-destination-endpoint-served. A request that is no
// conversation turn (no body, or a path that is no inference API) goes to
// the endpoint with the fewest requests in flight, uncounted.
//
// Where to start reading:
//
//   - server.go: Router, what the picker needs of the proxy (live.Decider,
//     the request path's one port, and the lifecycle: ClientListener,
//     Run, DrainTimeout; *live.Server is one); Server, New, Serve (gRPC:
//     ext_proc and the health
//     services liveness, readiness, inference-extension and
//     envoy.service.ext_proc.v3.ExternalProcessor, and the health
//     services alone on a port of their own, 9003, where the llm-d chart
//     and GAIE's conformance manifests probe; the admin handler, /metrics
//     and the dashboard, is live's; SIGTERM drains). What a gateway's
//     connections may hold is bounded as the proxy's clients are: the
//     gRPC listener is live's client listener (limits.max_connections),
//     and gRPC's own limits bound each connection (serverOptions).
//   - process.go: one ext_proc stream, i.e. one HTTP request. How the
//     messages come is what llm-d-router's EPP
//     (pkg/epp/handlers/server.go, request.go) handles in practice: in
//     FULL_DUPLEX_STREAMED the gateway sends the headers and then the
//     body chunks without waiting, and expects the headers' response (the
//     endpoint) once the body is whole, followed by the body, sent back
//     as StreamedBodyResponse chunks; in BUFFERED the headers are
//     answered at once (CONTINUE) and the endpoint goes with the body's
//     response (a header mutation there, with the dynamic metadata). The
//     mode is read from the first message's protocol_config; when the
//     gateway sends none, FULL_DUPLEX_STREAMED, which the protocol
//     requires an EPP to support, is assumed. The response phase
//     (headers, body, trailers) ends the request's in-flight count, reads
//     the usage for the conversation's footprint and attributes a retried
//     request to the endpoint that served it. The request phase must end
//     within timeouts.read (else 408 in the client's shape), and its
//     body, gathered from the gateway's chunks, is counted against the
//     proxy's budget, limits.max_body_bytes_in_flight (live's
//     TakeBodyBytes): past it the stream is refused (429 in the client's
//     shape, Retry-After); Decide reads the body in place.
//   - config.go: the configuration is the proxy's (live.Config) with the
//     picker's rules (ParseConfig; CheckConfig in server.go): listen is
//     the gRPC address, admin the /metrics address, and each model's
//     replicas are the pool's endpoints, http://IP:PORT, one per pod and
//     target port (a vLLM pod with one port per data-parallel rank is one
//     endpoint per port); session_key as the proxy takes it (no
//     placeholder, the key read from a Secret's file: live's
//     sessionkey.go, ConfigOptions.Keys).
//   - pool.go, discovery.go: warden epp --kubernetes. Pool reads the
//     InferencePool (inference.networking.k8s.io/v1, through the dynamic
//     client: spec.selector.matchLabels and spec.targetPorts[].number, as
//     gateway-api-inference-extension api/v1/inferencepool_types.go has
//     them), stops at start on what cannot work (no API server, no pool,
//     RBAC), and follows the pool; Discovery follows its ready pods with
//     a client-go informer. Each new set of endpoints is handed on
//     (WithEndpoints) to the same reload as SIGHUP, so homes are kept.
//     ParsePoolConfig reads a configuration that lists no replicas.
//
// Tests play the gateway: a hand-written Envoy side of ext_proc over real
// gRPC on 127.0.0.1 (no Envoy is installable here) that sends what Envoy's
// ext_proc filter sends (protocol_config on the first message, the
// forwarded metadata on every message, raw_value headers: Envoy's
// source/extensions/filters/http/ext_proc/ext_proc.cc, checked by
// TestGatewaySpeaksEnvoy), streams headers and body as Envoy does in each
// mode, forwards to emulated vLLM replicas (package emulator) and streams
// the response back through the response phase.
package epp
