package sim

// This file is the way up from a client to an engine, past vLLM's OpenAI
// API server, which works on one request at a time:
//
//   - vllm/entrypoints/openai/serving_chat.py OpenAIServingChat
//     create_chat_completion renders the chat template and tokenises the
//     whole prompt before it calls the engine client's generate; the
//     template runs on the server's single asyncio event loop.
//   - vllm/utils/async_utils.py AsyncMicrobatchTokenizer runs every encode
//     on a ThreadPoolExecutor(max_workers=1): one tokeniser thread per
//     API server process.
//   - vllm/v1/engine/processor.py process_inputs stamps arrival_time
//     after that work, so vLLM's TTFT and queue-time histograms start when
//     the engine client sends the request on (reachEngine), not when the
//     client sent it.
//
// So a server is a FIFO queue with one worker whose service time is
// traces.Workload.APIWork(prompt): requests that reach it together (the
// turns of sessions whose answers ended in the same engine step) reach
// the engine spaced by that time, one behind the other, as the real
// client, proxy and server space them, instead of sharing one prefill step.
// Which server: behind vLLM's data-parallel front end (frontend.go) the one
// the request's connection reached, and the balancer routes the request
// after the server's work; otherwise each replica is its own vLLM server
// with its own API server, and the router (the proxy or the strategy)
// routes the request before it.

// park puts s in a pending slot (run.pending), for the event that carries
// the slot.
func (r *run) park(s *seq) int32 {
	if n := len(r.pendingFree); n > 0 {
		slot := r.pendingFree[n-1]
		r.pendingFree = r.pendingFree[:n-1]
		r.pending[slot] = s
		return slot
	}
	r.pending = append(r.pending, s)
	return int32(len(r.pending) - 1)
}

// unpark frees slot and returns its request, or nil when it was cut on
// its way (abortAll): dropped then.
func (r *run) unpark(slot int32) *seq {
	s := r.pending[slot]
	r.pending[slot] = nil
	r.pendingFree = append(r.pendingFree, slot)
	if s == nil {
		return nil
	}
	if s.aborted {
		r.seqFree = append(r.seqFree, s)
		return nil
	}
	return s
}

// reachServer is s reaching the server its client sent it to, now: behind
// vLLM's data-parallel front end its connection's API server, which works
// on it before the balancer sees it; else the router, which routes it at
// once (place, then tokenise on the replica's API server).
func (r *run) reachServer(s *seq) {
	s.sentUs = r.now
	if r.front != nil && r.apiUs != nil {
		r.connect(s)
		r.tokenise(int(s.apiServer), s)
		return
	}
	r.drv.arrive(r, s)
}

// tokenise queues s on API server k, behind the work already queued there:
// it reaches the engine side when k is done with it.
func (r *run) tokenise(k int, s *seq) {
	for len(r.apiFreeUs) <= k {
		r.apiFreeUs = append(r.apiFreeUs, 0)
	}
	at := max(r.now, r.apiFreeUs[k]) + r.apiUs(s.prompt)
	r.apiFreeUs[k] = at
	r.ev.push(at, evTokenised, r.park(s))
}

// reachEngine is an API server done with s, now: the engine client sends
// it on (vLLM's arrival_time). A routed request joins its replica's
// waiting queue; behind the data-parallel front end the balancer routes it
// first.
func (r *run) reachEngine(s *seq) {
	s.sentUs = r.now
	if s.replica < 0 {
		r.drv.arrive(r, s)
		return
	}
	rep := r.reps[s.replica]
	rep.add(s)
	r.kick(rep)
}

// connect gives s the API server of its connection when its driver has
// not (a replay: one connection per request).
func (r *run) connect(s *seq) {
	if s.apiServer < 0 {
		s.apiServer = r.front.connect(nil)
	}
}

// releaseConn returns the connection s went out on to the client's pool
// when the client has read the answer's end, half a round trip after the
// engine sent it (the next turn goes out a turnaround later, on the most
// recently returned idle connection: its own, unless another answer was
// read in between).
func (r *run) releaseConn(s *seq) {
	if r.front != nil && s.apiServer >= 0 {
		r.ev.push(r.now+r.downlinkUs, evRelease, s.apiServer)
	}
}
