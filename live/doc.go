// Package live is warden's production router: a reverse proxy in front of
// vLLM replicas that keeps each agent conversation on the replica holding
// its prefix cache, using exactly the placement code the simulator runs.
//
// Where to start reading:
//
//   - server.go: Server, NewServer, Serve (listeners, drain on shutdown:
//     at timeouts.drain the streams still running end with their API's
//     error event, then connections close),
//     Reload (SIGHUP: atomic swap of the routing state; a changed model's
//     successor inherits its session table and each kept backend's
//     in-flight count, so affinity and running streams survive), Admin (/metrics,
//     /api/status, /api/history, /healthz, and what WithAdminHandler adds: cmd/warden
//     mounts web's dashboard at "/", since live does not import web).
//   - handler.go: the request path. ServeHTTP, the HTTP front end, routes
//     by path and method and hands the request to admit, the step "check,
//     extract, place, admit" that has no http.ResponseWriter, so that
//     another front end can reuse it: admit checks the key, reads the body
//     once (size-capped), validates it and decodes only model, stream,
//     metadata.user_id, prompt_cache_key and user, keeping the raw values
//     of system, messages, instructions, input and prompt for the fallback
//     session id (package jsonscan: keys compared after unescaping, exactly, as
//     vLLM's Python does; any of these given twice, "mod\u0065l" after
//     "model" included, is refused with 400, since the proxy and vLLM
//     would read different values), finds the session (session.go), asks
//     placement for a replica (pick.go) and returns the call (call.go: one
//     client request, finished once) or the refusal to answer. forward.go
//     forwards the original bytes (the client's headers less the
//     hop-by-hop ones and the proxy's own, an event stream flushed event
//     by event, a torn answer ending the client's connection). Its
//     transport (attempt.go) retries a failure
//     that reached no client byte once on another replica and times every
//     reply (watchdog.go); its response bodies (respbody.go) pass on whole
//     SSE events only, so a stream that dies midway ends with the API's
//     own error event (sse.go, apierr.go). models.go answers /v1/models.
//     Request bodies and copy buffers are recycled through a free list
//     that garbage collection does not empty (upstream.Body); a body is read
//     into a buffer sized by what has arrived on the client's socket
//     (FIONREAD, upstream.WrapClient), and checked for UTF-8 with its ASCII
//     runs passed over by AVX2 (jsonscan.ValidUTF8).
//   - decide.go: Decider, the request path's one port for a front end
//     that forwards nothing itself (warden epp): Decide runs admit and
//     returns a Decision that holds the in-flight counts until Finish;
//     Refuse, AnyEndpoint and the body budget (TakeBodyBytes) beside it.
//     The lifecycle (NewServer, Serve, Run, Reload) is server.go's.
//   - package upstream: the HTTP/1.1 client for the replicas. The body is in
//     memory, so an attempt is synchronous on the handler's goroutine: one
//     writev of head and body, the response head read with
//     http.ReadResponse, an idle pool per replica, a request that meets a
//     connection the replica closed meanwhile sent again on a new one;
//     https replicas go through net/http's Transport. Together with
//     `warden proxy --procs auto` (internal/procs: GOMAXPROCS sized to the
//     load) and upstream's rawConn (client and replica sockets read and
//     written with RawSyscall, so that the runtime's sysmon thread is not
//     woken at each busy stretch) it is what brought the CPU a request
//     costs within 1.5 times HAProxy's (issue 13 item 12, `make speed`).
//   - model.go: per-model state, and its hand-over to a reload's
//     successor. In-flight counts are atomics, released exactly once per
//     attempt; the placement.Router (the policy, its session table), the
//     admission queue and the ejection state (eject.go: passive outlier
//     detection, back-off, warm-up) sit behind one mutex, the only lock of
//     the request path. pick.go: fill builds the placement.Snapshot from
//     the latest scrape, pick asks the router, as the simulator does.
//     admission.go: a model's admission queue (admission: kv), where a
//     new conversation that fits on no replica waits in arrival order.
//     prefill.go: the priced spill's inputs, each replica's prompt tokens
//     still to prefill and its prefill rate.
//   - scrape.go: one loop per backend server reads /metrics (vLLM's text
//     exposition, per engine label, parsed by metrics/vllm) and /health,
//     and publishes an immutable ScrapeResult through an atomic.Pointer.
//   - kvevents.go: with models[].kv_events (configkvevents.go), one
//     kvevents subscriber per replica (the proxy dials), or one listener
//     the publishers connect to, told apart by topic and rank (kvRoutes),
//     follows vLLM's KV-cache events over ZeroMQ from the model's start to
//     its stop (a reload that changes kv_events replaces the model:
//     sameKVEvents); status.go shows each replica's blocks held and computed
//     tokens by why (kv_events) and the listener (kv_events_listen).
//   - max_num_seqs (for the auto spill threshold): models[].max_num_seqs,
//     else the server's *_config_info label, else vLLM's default for
//     models[].gpu (1024 on >= 70 GiB GPUs other than the A100, else 256),
//     else 256; the last two are assumptions, logged once after the first
//     scrape and listed in /api/status "warnings".
//   - config.go (strict YAML, errors "file:line: key: ..."; configresolve.go:
//     defaults and the checks across keys; configvalues.go: the values
//     that read themselves, such as prefill_tokens_per_s; sessionkey.go:
//     session_key from --session-key-file, placeholders refused), status.go
//     (the dashboard's data), history.go (the last hour of token rates per
//     model and replica, from vLLM's counters, for the stats page: GET
//     /api/history), obs.go (Prometheus metrics), journal.go (request
//     journal in the trace format).
//
// Packages below live, each a leaf it drives: upstream (the replica
// client, request bodies, raw sockets), jsonscan (the request body's one
// pass), sessionstore (the state shared between proxies, in Redis);
// redistest and internal/rawbackend serve the tests.
//
// Session ids, in the order tried: X-Claude-Code-Session-Id, session-id
// (Codex), x-session-id (OpenCode), Anthropic metadata.user_id (JSON form
// or user_..._session_<id>), OpenAI prompt_cache_key, user, else a hash of
// the system prompt and first user message (Claude Code's billing block
// skipped; for /v1/completions the prompt's first 32 KiB). A body with
// none of these, not even a system prompt or a user message, has no
// session (source "none"): it is placed as new, least loaded, each time,
// instead of all such bodies sharing the hash of nothing. A Claude Code
// subagent (x-claude-code-agent-id) is its own session with the root
// conversation as parent. Ids are HMAC-hashed (session_key, or a random key
// per process) before they are stored, logged or journaled; ids longer than
// limits.max_session_id (256) bytes are refused with 400.
//
// Failure handling. Refused or reset connections and 502/503 answers
// before any byte reached the client are retried once on another replica
// (reason "retried"), and so is a request still waiting for headers on a
// replica that /health marks down. Every reply is timed to its end
// (watchdog.go): timeouts.response_header bounds the wait for its
// headers; a streamed request is bounded by timeouts.first_token (sent ->
// first output, default 5m: the first event vLLM sends only with it, the
// role chunk, message_start, or for the Responses API the first after
// response.created and response.in_progress; sse.go says where in vLLM's
// code) and then timeouts.stream_idle (the wait for
// each whole event, default 60s: bytes that end no event are no
// progress); an event stream sent to a request that did not ask for one
// waits at most stream_idle for each event, and any other reply (a JSON
// answer, a stream's error) at most stream_idle in all for its body after
// its headers (time spent writing to the client not counted). On expiry
// the backend request is cancelled, the replica takes a strike, and the
// client gets the API's error: 504 in its shape if nothing was sent yet
// (the status of a reply that is not an event stream is sent with its
// first 32 KiB, or all of it when it is known to be shorter: a JSON
// answer that stalls before is a 504, not an empty reply), else the
// API's error event, or for a longer JSON body its
// connection cut so that a torn answer is not taken for a whole one.
// What a replica can make the proxy hold is bounded (package upstream): a
// reply head (status lines and headers, informational replies included)
// of at most 64 KiB and at most 5 informational (1xx) replies, a status
// within 100-599; beyond, the reply is a bad reply: the connection is
// closed at once, the attempt is retried like a 502, the replica takes a
// strike, and the client gets 502 in its shape. Idle connections to the
// replicas are closed after 4 s even when no traffic comes (uvicorn
// closes them at 5 s). A body the replica encoded (Content-Encoding: gzip
// or another) passes through untouched: usage and a stream's events are
// read from identity-encoded bodies only, so an encoded stream that breaks
// ends with the client's connection cut, not an error event. A refused
// connection ejects the replica at once, 3 consecutive 5xx, timeouts or
// bad replies do too (passive outlier detection, as Envoy's
// consecutive_5xx), for a back-off of 1 s doubling to 30 s, never more
// than half of a model's replicas at once; after its back-off a replica
// warms up for 30 s, seen as healthy by a share of new conversations'
// picks growing from 10 % to 100 % (its own conversations come home at
// once: warm-up never moves a sticky session). /health is probed with
// every scrape (timeouts.health). A scrape that failed or is older than
// three intervals is replaced by the proxy's own counts (see model.fill),
// shown as "failed"/"stale" in /api/status; a max_num_seqs a server
// exposes is capped at 16,384 (vllm.MaxServerNumSeqs). When no replica can
// take a request the answer is 503 (OpenAI shape) or 529 overloaded_error
// (Anthropic shape), at once. The session store is marked down after
// failed exchanges with no success between them for 1 s, up again after
// good ones for 1 s (a store not known yet is up at its first); while it is
// down new conversations go to the rendezvous choice of their id over the
// replicas' names, so that proxies listing them in another order agree
// (shared.go). What the store can make the proxy hold is bounded
// (package sessionstore: a reply's announced sizes; keys of the wrong
// type or size skipped and counted, other proxies' counts trusted up to
// limits.max_in_flight, the work of one sync capped).
//
// Requests. The API paths take POST only (else 405 with Allow: POST;
// /v1/models takes GET and HEAD); any other path is 404 with code
// not_found (Anthropic: not_found_error), in the client's shape (Anthropic
// when it sent anthropic-version). A body is JSON when its Content-Type is
// application/json or application/<x>+json, any case, any parameters, or
// when there is none (FastAPI's rule, which vLLM runs on; the OpenAI and
// Anthropic SDKs send application/json, curl -d sends a form type): else
// 415. A body shorter than its Content-Length is 400, one not sent within
// timeouts.read 408; no error text names a socket address. Until every
// server of a model has been scraped and probed once (the first
// milliseconds after start), a request waits for it, so that it is
// answered as it would be a moment later: 503/529 when no replica is up,
// not a 502 from a replica only presumed healthy. /v1/messages/count_tokens
// goes to a replica (vLLM serves it since its pull request 35588); a 404
// a replica gives an Anthropic request in another shape than Anthropic's
// (FastAPI's {"detail":"Not Found"}: a route it lacks) is answered as a
// 404 not_found_error.
//
// Clients. limits.max_connections bounds the client connections open at
// once, idle ones included (default from the file descriptor limit, see
// DefaultMaxConnections): at the bound a new connection is answered at
// once, 429 (OpenAI shapes) or 529 overloaded_error (Anthropic) with
// Retry-After: 1 and Connection: close, or closed at once when 64 are
// being answered already (listener.go refuse), which is logged at ERROR
// and counted, and the admin /healthz answers 503 while it lasts, or while accepting fails
// (out of file descriptors: logged at ERROR, retried with back-off). A
// write to a client that makes no progress for timeouts.client_write
// (default 60s: a client that stopped reading) ends the exchange and
// cancels the replica's request (upstream's rawConn), logged and counted
// (warden_client_write_timeouts_total); on Linux a client's socket holds
// at most 32 KiB the client has not taken (TCP_NOTSENT_LOWAT), so that the
// wait begins when the client stops, not megabytes of send buffer later. A request with a
// Transfer-Encoding closes its connection after the answer (RFC 9112 6.1:
// Go drops a Content-Length beside it before the handler, so this covers
// requests that had both). The admin address answers only requests whose
// Host names it (an IP address, localhost, the admin setting's host, the
// machine's name, admin_hosts): else 403, against DNS rebinding. It is
// bounded as the clients' listener is, by the same clientListener (Serve
// and Run: adminListener in server.go): 64 connections, idle ones closed
// after 30 s; over them a GET /healthz is still answered (a probe during
// a flood) and any other request gets 503 with Retry-After.
//
// Limits. limits.max_in_flight bounds the requests the whole proxy holds
// (default sized for the machine's memory, see DefaultMaxInFlight); beyond
// it a request is answered at once, before its body is read: 429
// rate_limit_error (OpenAI shapes) or 529 overloaded_error (Anthropic),
// with Retry-After: 1. A body is allocated as its bytes arrive, never its
// declared Content-Length up front, and limits.max_body_bytes_in_flight
// bounds the bytes of the buffers all bodies hold at once, each from its
// first byte until the replica answers (default an eighth of the
// machine's memory, see DefaultMaxBodyBytesInFlight; upstream.Budget,
// which counts warden epp's bodies too: TakeBodyBytes, and Decide reads
// its caller's body in place): a body that would pass it is refused the
// same way (its rest read and dropped first, so that a client still
// sending reads the answer), 413 when it is larger than the bound alone;
// warden_request_body_bytes shows what is held.
// Bodies over limits.max_body_bytes get 413 in the client's shape.
// Headers over limits.max_header_bytes get 431 in the client's shape;
// only headers over four times the limit meet Go's own plain-text 431,
// before any handler, as a backstop. Slow clients are bounded by
// timeouts.read_header and timeouts.read.
//
// Tests run real HTTP servers on 127.0.0.1: internal/fakevllm is a
// hand-written vLLM (OpenAI and Anthropic streaming, per-engine prefix
// caches, vLLM-style /metrics) whose load, answers and faults a test sets
// at will and at once (SetLoad, Status, Hold, Stall, HealthDown,
// Restart), which the emulator's simulated engine cannot; a fault the
// emulator injects (warden emulate --fault: die-mid-stream,
// stall-after-headers) is tested on it. NewServer and Serve(ctx, ln, adminLn)
// accept 127.0.0.1:0 listeners for end-to-end tests from other packages.
// prometheus_test.go has a real Prometheus server (metrics/promtest) scrape
// the proxy and a fake, and checks the KPI PromQL of metrics/kpi.promql
// against what they counted.
package live
