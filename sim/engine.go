package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/lm-warden/warden/traces"
)

// This file exports one replica of the model to drivers outside the
// simulator's event loop, such as the emulator (package emulator), which
// serves it over HTTP in wall time. An EngineReplica runs exactly the code
// that a simulated run does (replica.schedule, finishStep, the block pool
// and the step-time model); only the clock is the caller's: it moves the
// replica's virtual time forward with Advance and is told of every token.

// EngineReplica is one vLLM engine of a farm, driven from outside: requests
// are submitted at the replica's current virtual time, Advance runs the
// steps that end up to a given virtual time, and Stats reads its counters.
// Virtual time starts at 0 and never runs backwards.
//
// It is not safe for concurrent use; it never reads a clock and starts no
// goroutine.
type EngineReplica struct {
	cfg     engineConfig
	rep     *replica
	now     int64 // virtual time, µs
	stepEnd int64 // end of the step in flight, when rep.busy
	nextID  int
	live    map[int]*seq // requests in the replica, by id
	emit    func(EngineEvent)
	doneFn  func(*seq, bool)
	aborted int64
	obs     *EngineHistograms // nil: none recorded
}

// EngineEventKind says what happened to a request.
type EngineEventKind uint8

const (
	// EventToken: one output token was sampled (Generated counts them; the
	// first token is the event with Generated == 1).
	EventToken EngineEventKind = iota
	// EventFinished: the request generated all its tokens and left.
	EventFinished
	// EventAborted: the request was aborted (EngineReplica.Abort) and left.
	EventAborted
)

func (k EngineEventKind) String() string {
	switch k {
	case EventToken:
		return "token"
	case EventFinished:
		return "finished"
	case EventAborted:
		return "aborted"
	}
	return fmt.Sprintf("EngineEventKind(%d)", uint8(k))
}

// EngineEvent is one thing that happened to a request at a virtual time.
type EngineEvent struct {
	ID        int // as returned by Submit
	Kind      EngineEventKind
	At        time.Duration // virtual time
	Generated int           // output tokens so far
	// CachedTokens are the prompt tokens served from the prefix cache at the
	// request's first admission (vLLM's num_cached_tokens); known from the
	// first token on.
	CachedTokens int
	// LengthCapped: the request finishes with reason "length" (Submit's
	// outputCap reached), else "stop".
	LengthCapped bool
	Preemptions  int // times the request was preempted so far
}

// EngineStats are an engine's gauges and cumulative counters, as vLLM
// exposes them on /metrics.
type EngineStats struct {
	Running          int     // vllm:num_requests_running
	Waiting          int     // vllm:num_requests_waiting
	KVUsage          float64 // vllm:kv_cache_usage_perc, 0..1
	PrefixQueries    int64   // vllm:prefix_cache_queries_total (tokens)
	PrefixHits       int64   // vllm:prefix_cache_hits_total (tokens)
	PromptTokens     int64   // vllm:prompt_tokens_total
	GenerationTokens int64   // vllm:generation_tokens_total
	Preemptions      int64   // vllm:num_preemptions_total
	FinishedStop     int64   // vllm:request_success_total{finished_reason="stop"}
	FinishedLength   int64   // ... {finished_reason="length"}
	Aborted          int64   // requests aborted (finished_reason "abort")
	Steps            int64   // engine steps run
	NumGPUBlocks     int     // vllm:cache_config_info num_gpu_blocks
	BlockSize        int     // vllm:cache_config_info block_size
}

// ErrNeverFits is returned (wrapped) by Submit for a request that needs more
// KV blocks than the whole replica has.
var ErrNeverFits = errors.New("request can never fit in the KV cache")

// NewEngineReplica returns replica index (0-based) of farm f, idle and
// empty at virtual time 0. Every replica of a farm is identical, so index
// only numbers it. Unlike a simulated run, it does not record which blocks
// were ever cached (that record grows without bound in a long-running
// server), so it does not classify misses.
func NewEngineReplica(f *Farm, index int) *EngineReplica {
	e := &EngineReplica{cfg: newEngineConfig(f), live: map[int]*seq{}}
	e.rep = newReplica(index, &e.cfg, nil)
	e.rep.firstToken = e.onFirstToken
	e.rep.nextToken = e.onNextToken
	e.doneFn = e.onDone
	return e
}

// Record makes the replica observe h (NewEngineHistograms) exactly as a
// simulated run's engines do: the same observations at the same virtual
// instants. Call it before the first Submit; nil stops recording. The
// caller guards h's histograms with the lock that serialises the replica.
func (e *EngineReplica) Record(h *EngineHistograms) { e.obs = h }

// CacheWatch receives the changes of a replica's prefix cache, as vLLM's
// BlockPool reports them in KV events: Stored for each block cached
// (BlockStored; parent is the hash of the block before it in its
// request, hasParent false for a first block), Removed for each cached
// block evicted (BlockRemoved). Both are called from Advance and Submit,
// under the caller's lock.
type CacheWatch struct {
	Stored  func(hash, parent uint64, hasParent bool)
	Removed func(hash uint64)
}

// WatchCache makes the replica tell w of its prefix cache's changes; nil
// stops it. Both of w's functions must be set.
func (e *EngineReplica) WatchCache(w *CacheWatch) { e.rep.pool.watch = w }

// Now is the replica's virtual time.
func (e *EngineReplica) Now() time.Duration { return time.Duration(e.now) * time.Microsecond }

// Fits reports whether a request of prompt + output tokens can ever be held
// by the replica's KV cache.
func (e *EngineReplica) Fits(prompt, output int) bool { return e.cfg.fits(prompt, output) }

// Submit enqueues req at the tail of the waiting queue at the current
// virtual time and returns its id. The request is req.PromptTokens tokens
// whose blocks are req.HashIDs (and req.OutputHashIDs for the blocks its
// answer completes), generating req.OutputTokens tokens (at least 1),
// which finish with reason "length" when they reach outputCap (> 0).
// The replica keeps req until the request leaves; the caller must not
// change it. A step starts at the next Advance.
func (e *EngineReplica) Submit(req *traces.Request, outputCap int) (int, error) {
	if req.PromptTokens < 1 {
		return 0, fmt.Errorf("prompt of %d tokens: want at least 1", req.PromptTokens)
	}
	out := max(req.OutputTokens, 1)
	if !e.cfg.fits(req.PromptTokens, out) {
		return 0, fmt.Errorf("%w: %d prompt + %d output tokens, %d blocks of %d tokens",
			ErrNeverFits, req.PromptTokens, out, e.cfg.numGPUBlocks-1, e.cfg.blockSize)
	}
	s := new(seq)
	*s = makeSeq(e.nextID, req, -1, outputCap, e.now)
	e.nextID++
	e.live[s.id] = s
	e.rep.add(s)
	return s.id, nil
}

// Abort cuts request id (its client went away): at once if it waits or no
// step is in flight, else when the step in flight ends. Its EventAborted
// goes to emit, now or from the Advance that ends the step. Unknown ids
// (finished ones) are ignored.
func (e *EngineReplica) Abort(id int, emit func(EngineEvent)) {
	s, ok := e.live[id]
	if !ok {
		return
	}
	e.emit = emit
	e.rep.abort(s, e.doneFn)
	e.emit = nil
}

// Advance moves virtual time to to: it starts a step if the replica is idle
// with work, then ends every step that ends at or before to (starting the
// next one at once, as vLLM's busy loop does), passing each request's
// events to emit in order. Virtual time never runs backwards: a to before
// Now only runs what is due now.
func (e *EngineReplica) Advance(to time.Duration, emit func(EngineEvent)) {
	e.emit = emit
	defer func() { e.emit = nil }()
	toUs := to.Microseconds()
	e.kick()
	for e.rep.busy && e.stepEnd <= toUs {
		e.now = e.stepEnd
		e.rep.finishStep(e.now, e.doneFn)
		e.kick()
	}
	e.now = max(e.now, toUs)
}

// NextStepEnd is the virtual time at which the step in flight ends; false
// when the replica is idle (nothing happens until a Submit).
func (e *EngineReplica) NextStepEnd() (time.Duration, bool) {
	if !e.rep.busy {
		return 0, false
	}
	return time.Duration(e.stepEnd) * time.Microsecond, true
}

// Idle reports whether the replica has no request at all.
func (e *EngineReplica) Idle() bool { return len(e.live) == 0 }

// Stats returns the replica's gauges and counters now.
func (e *EngineReplica) Stats() EngineStats {
	st := &e.rep.stats
	return EngineStats{
		Running:          len(e.rep.running),
		Waiting:          e.rep.waiting.len(),
		KVUsage:          e.rep.pool.usage(),
		PrefixQueries:    st.queries,
		PrefixHits:       st.hits,
		PromptTokens:     st.promptTokens,
		GenerationTokens: st.generationTokens,
		Preemptions:      st.preemptions,
		FinishedStop:     st.finishedStop,
		FinishedLength:   st.finishedLength,
		Aborted:          e.aborted,
		Steps:            st.steps,
		NumGPUBlocks:     e.cfg.numGPUBlocks,
		BlockSize:        e.cfg.blockSize,
	}
}

// kick starts a step at the current time if the replica is idle with work.
func (e *EngineReplica) kick() {
	if us, ok := e.rep.startStep(); ok {
		e.stepEnd = e.now + us
		if e.obs != nil {
			e.obs.stepScheduled(e.rep, e.now)
		}
	}
}

func (e *EngineReplica) event(s *seq, k EngineEventKind) EngineEvent {
	return EngineEvent{
		ID: s.id, Kind: k, At: time.Duration(e.now) * time.Microsecond,
		Generated: s.generated, CachedTokens: s.cachedTokens,
		LengthCapped: s.lengthCapped, Preemptions: s.preemptions,
	}
}

func (e *EngineReplica) onFirstToken(s *seq) {
	if e.obs != nil {
		e.obs.firstToken(s)
	}
	e.onToken(s)
}

func (e *EngineReplica) onNextToken(s *seq, now int64) {
	if e.obs != nil {
		e.obs.nextToken(s, now)
	}
	e.onToken(s)
}

func (e *EngineReplica) onToken(s *seq) {
	if e.emit != nil {
		e.emit(e.event(s, EventToken))
	}
}

func (e *EngineReplica) onDone(s *seq, finished bool) {
	delete(e.live, s.id)
	k := EventFinished
	switch {
	case !finished:
		k = EventAborted
		e.aborted++
	case e.obs != nil:
		e.obs.finished(s, e.now)
	}
	if e.emit != nil {
		e.emit(e.event(s, k))
	}
}
