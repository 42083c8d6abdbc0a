package sim

import (
	"context"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// run is one strategy on one farm: the replicas, the router in front of
// them, the event heap and the metric recorder. It runs on one goroutine.
type run struct {
	farm  *Farm
	model string
	cfg   engineConfig
	reps  []*replica
	// router drives the placement policy (placement.Router): its session
	// table, the admission rule, what each request's start and end tell it.
	router   *placement.Router
	snap     placement.Snapshot
	preq     placement.Request
	ev       eventHeap
	now      int64
	scrapeUs int64
	// refreshUs > 0 is the policy's own scrape interval (placement.Scraper,
	// shorter than scrapeUs): the snapshot's gauges are refreshed at it.
	refreshUs int64

	lastScrape int64 // time of the last scrape written, -1 before the first
	rec        *recorder
	rt         routerStats
	drv        driver
	nextID     int
	seqFree    []*seq
	kickQueued []bool
	doneFn     func(*seq, bool)
	err        error
	stopped    bool

	stopWhenIdle bool // stop at the next scrape once the driver is idle
	stopQueued   bool

	// The client side's delays (traces.Workload): a request sent at t
	// reaches its server (the router, or vLLM's API server behind a
	// data-parallel front end) at t + netUpUs; an event the engine emits at
	// t reaches the client at t + downlinkUs. On its way to the engine it
	// then queues for its API server, which works on one request at a time
	// for apiUs(prompt) (apiserver.go). pending holds the requests on their
	// way up, by slot (the arg of an evArrive or evTokenised).
	netUpUs     int64
	apiUs       func(prompt int) int64 // nil: no API server time (a replay)
	apiFreeUs   []int64                // per API server: when its queued work ends
	downlinkUs  int64
	pending     []*seq
	pendingFree []int32

	stepSessions int         // the level of the step running now
	log          *requestLog // per-request records, or nil

	// front is vLLM's own DP front end (frontend.go), which places the
	// requests of the least-loaded strategy; nil for the others.
	front *dpFrontend

	// held counts, at each scrape of a closed loop, the running sessions
	// whose last request went to each replica (countHeld); nil otherwise.
	held []int32

	// kv feeds affinity's KV-aware options and holds its admission FIFO
	// (routing.go); nil for every other variant.
	kv *kvRouter
	// shared is the workload's shared system prompt, in tokens (0 for a
	// trace): Request.SharedPrefixTokens of the policies that read it.
	shared int
	// heldIdx indexes which replicas hold each hash, for a policy that
	// reads Prompt.Held on a farm of at most 64 replicas (routing.go).
	heldIdx *heldIndex
	name    string // the variant's display name (routing.go)

	// clientRetries is how many times a client sends a request again
	// after it was refused for admission (429/529 with Retry-After): the
	// SDKs' default for a session replay (sdkMaxRetries), 0 for the closed
	// and open loops, whose clients (warden bench) do not retry.
	clientRetries int

	// boundaries: the counters at each scrape that closes a measured step
	// (and at the first one), for the direct counts of the results.
	marks []mark

	// everHint, until it is used, will tell how many hashes the record of
	// those ever cached is to hold (reserveEver).
	everHint *hashHint
	// forgetOwn: a session's hashes past its system prompt
	// (traces.Session.SharedTokens) are its own, forgotten by the record of
	// hashes ever cached when it is over (sessionOver); false: every hash
	// is kept (a trace's sessions).
	forgetOwn bool
}

// reserveEver makes room in the record of hashes ever cached once the
// estimate of how many there will be is known (at each scrape). Its
// contents, hence the run's outputs, do not depend on its size.
func (r *run) reserveEver() {
	if r.everHint == nil {
		return
	}
	if slots, ok := r.everHint.take(); ok {
		r.reps[0].pool.ever.moveTo(slots)
		r.everHint = nil
	}
}

// routerStats are the router's cumulative counters: the source of the
// warden_* series and of the per-replica columns.
type routerStats struct {
	requests          [][]int64 // [replica][reason]
	inFlight          []int
	stay              placement.StayCount // later turns, and those on the first turn's replica
	sessionsCompleted int64
	ttfbs             []float64 // every TTFB of the current step, seconds (direct quantiles)
	censored          int64     // TTFBs counted censored at a step's end
	finished          int64
	unfinished        int64
	rejected          int64
	// admissionWaits: requests that waited at the router for admission
	// (admission: kv); admissionRefused: those refused after the timeout;
	// admissionRetries: those of them their client sent again.
	admissionWaits   int64
	admissionRefused int64
	admissionRetries int64
	// pausedUs sums the pauses (think times) before the turns a closed
	// loop sent, requestUs the time from each request's send to its end
	// reaching the client: a session's time is one or the other (or its
	// client's turnaround), so their ratio is the share of time paused.
	pausedUs  int64
	requestUs int64
}

// clientNetwork gives r the clients' side of w: half a network round trip
// on the way up, the API server's work on each prompt (apiserver.go), and
// the downlink's delay of each event on the way back.
func (r *run) clientNetwork(w traces.Workload) {
	r.netUpUs = micros(w.NetworkRTT / 2)
	r.apiUs = func(prompt int) int64 { return micros(w.APIWork(prompt)) }
	r.downlinkUs = micros(w.Downlink())
}

// outputTokens is warden_output_tokens_total: every token streamed to a
// client, counted as its engine emits it (the sum of the engines'
// generation counters); the downlink (downlinkUs) delays its arrival, not
// its count.
func (r *run) outputTokens() int64 {
	var n int64
	for _, rep := range r.reps {
		n += rep.stats.generationTokens
	}
	return n
}

// driver is the client side of a run: it decides what is sent when.
type driver interface {
	// send is called when an evSend event with arg fires.
	send(r *run, arg int32)
	// arrive is called when a request sent with r.dispatch reaches the
	// engine side, to be routed (r.submit).
	arrive(r *run, s *seq)
	// done is called when a request finishes (finished) or is aborted or
	// rejected (!finished).
	done(r *run, s *seq, finished bool)
	// idle reports whether the driver will send nothing more and has
	// nothing in flight.
	idle() bool
}

// newRunLean returns a run of strategy (with the spill threshold spill) on
// a fresh copy of f's replicas, with a lean recorder when lean is set (its
// store holds only the series of rowKPIs).
func newRunLean(f *Farm, strategy string, spill placement.SpillThreshold, lean bool, seed uint64) (*run, error) {
	vr, err := newVariant(f, strategy, spill)
	if err != nil {
		return nil, err
	}
	vr.cfg.Seed = seed // the tie-breaks of a policy that draws (the peers')
	pol, err := placement.New(vr.strategy, vr.cfg)
	if err != nil {
		return nil, err
	}
	v := f.Spec.VLLM
	r := &run{
		farm:       f,
		model:      f.Spec.Model,
		cfg:        newEngineConfig(f),
		router:     placement.NewRouter(pol, nil),
		scrapeUs:   time.Duration(f.Spec.ScrapeInterval).Microseconds(),
		lastScrape: -1,
		name:       vr.name,
	}
	n := f.Spec.Replicas
	ever := newEverSet(n)
	r.reps = make([]*replica, n)
	r.snap = placement.Snapshot{Replicas: make([]placement.Replica, n), MaxNumSeqs: v.MaxNumSeqs}
	r.rt.requests = make([][]int64, n)
	r.rt.inFlight = make([]int, n)
	r.kickQueued = make([]bool, n)
	for i := range n {
		r.reps[i] = newReplica(i, &r.cfg, ever)
		r.reps[i].firstToken = r.onFirstToken
		if !lean { // inter-token latencies go to an engine histogram only
			r.reps[i].nextTokens = r.onNextTokens
		}
		// The KV cache's size is known to every router, as vLLM's
		// cache_config_info tells it (llm-d sizes its index by it).
		r.snap.Replicas[i] = placement.Replica{ID: i, Healthy: true, KVCapacityTokens: f.KVTokensPerReplica()}
		r.rt.requests[i] = make([]int64, numReasons)
	}
	r.doneFn = r.onDone
	r.rec = newRecorder(r, lean)
	r.initKV(vr)
	if r.router.ReadsHeld() {
		r.router.SetHeld(r) // the block pools say what each replica holds (routing.go)
		if n <= 64 {
			r.heldIdx = newHeldIndex()
			for i, rep := range r.reps {
				rep.pool.held, rep.pool.heldID = r.heldIdx, i
			}
		}
	}
	return r, nil
}

// numReasons is the number of placement reasons the router counts.
const numReasons = placement.NumReasons

// micros converts a duration to virtual time.
func micros(d time.Duration) int64 { return d.Microseconds() }

// loop runs events until the heap is empty, the time passes until, the run
// is stopped or ctx is done.
func (r *run) loop(ctx context.Context, until int64) error {
	for n := 0; r.ev.len() > 0 && !r.stopped && r.err == nil; n++ {
		if n&4095 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if r.ev.peek().at > until {
			break
		}
		e := r.ev.pop()
		r.now = e.at
		switch e.kind {
		case evStepEnd:
			rep := r.reps[e.arg]
			rep.finishStep(r.now, r.doneFn)
			if r.front != nil {
				// The engine's counts after update_from_output removed the
				// finished requests.
				if at := r.front.stepEnded(rep, r.now); at >= 0 {
					r.ev.push(at, evPublish, publishChange)
				}
			}
			r.start(rep)
		case evPublish:
			if e.arg == publishRepublish {
				r.ev.push(r.front.republish(r.now), evPublish, publishRepublish)
			} else {
				r.front.publish(r.now)
			}
		case evRelease:
			r.front.release(e.arg)
		case evRefresh:
			r.refreshSnapshot()
			r.ev.push(r.now+r.refreshUs, evRefresh, 0)
		case evAdmit:
			r.kv.admitQueued = false
			r.kv.admit(r)
		case evKick:
			r.kickQueued[e.arg] = false
			r.start(r.reps[e.arg])
		case evSend:
			r.drv.send(r, e.arg)
		case evScrape:
			if r.lastScrape != r.now {
				r.scrape()
			}
			r.reserveEver()
			r.ev.push(r.now+r.scrapeUs, evScrape, 0)
		case evStop:
			r.stopped = true
		case evArrive:
			if s := r.unpark(e.arg); s != nil {
				r.reachServer(s)
			}
		case evTokenised:
			if s := r.unpark(e.arg); s != nil {
				r.reachEngine(s)
			}
		}
	}
	return r.err
}

// kick makes an idle replica look at its queues at the current instant,
// after every other event of this instant that is already queued (so that
// requests arriving together are scheduled together, as vLLM's busy loop
// would).
func (r *run) kick(rep *replica) {
	if rep.busy || r.kickQueued[rep.id] {
		return
	}
	r.kickQueued[rep.id] = true
	r.ev.push(r.now, evKick, int32(rep.id))
}

// start runs the scheduler of an idle replica and, if it scheduled
// anything, queues the end of the step.
func (r *run) start(rep *replica) {
	if us, ok := rep.startStep(); ok {
		r.rec.observeStep(rep, r.now)
		r.ev.push(r.now+us, evStepEnd, int32(rep.id))
	}
}

// newSeq returns a request ready to be routed.
func (r *run) newSeq(req *traces.Request, client int32, outputCap int) *seq {
	var s *seq
	if n := len(r.seqFree); n > 0 {
		s = r.seqFree[n-1]
		r.seqFree = r.seqFree[:n-1]
	} else {
		s = new(seq)
	}
	*s = makeSeq(r.nextID, req, client, outputCap, r.now)
	r.nextID++
	return s
}

// dispatch sends s from the client: it reaches its server after the
// network's half round trip, at once when there is none.
func (r *run) dispatch(s *seq) { r.dispatchAfter(s, 0) }

// dispatchAfter is dispatch with the send delayed by wait µs (a client
// waiting out a Retry-After): until it arrives, s is on its way up.
func (r *run) dispatchAfter(s *seq, wait int64) {
	if d := wait + r.netUpUs; d > 0 {
		r.ev.push(r.now+d, evArrive, r.park(s))
		return
	}
	r.reachServer(s)
}

// censorTTFBs counts, in the step closing now, the wait so far of every
// request sent whose first token has not reached its client: on its way to
// the engine, waiting, or in prefill. It returns how many there were.
func (r *run) censorTTFBs() int64 {
	var n int64
	censor := func(s *seq) {
		if s == nil || s.aborted || s.censored || (s.firstTokenUs >= 0 && s.firstTokenUs+r.downlinkUs <= r.now) {
			return
		}
		s.censored = true
		s.ttfbUs = r.now - s.clientSentUs
		s.stepSessions = r.stepSessions
		w := float64(s.ttfbUs) / usPerSec
		r.rec.observeCensoredTTFB(w)
		r.rt.ttfbs = append(r.rt.ttfbs, w)
		n++
	}
	for _, s := range r.pending {
		censor(s)
	}
	if r.kv != nil {
		r.kv.each(censor) // waiting for admission at the router
	}
	for _, rep := range r.reps {
		for i := range rep.waiting.len() {
			censor(rep.waiting.at(i))
		}
		for _, s := range rep.running {
			censor(s)
		}
	}
	r.rt.censored += n
	return n
}

// makeSeq returns request number id, sent at now: req's prompt, and its
// output tokens (at least 1), which finish with reason "length" when they
// reach outputCap (> 0), else "stop".
func makeSeq(id int, req *traces.Request, client int32, outputCap int, now int64) seq {
	out := max(req.OutputTokens, 1)
	return seq{
		id:           id,
		req:          req,
		client:       client,
		turn:         req.Turn,
		prompt:       req.PromptTokens,
		output:       out,
		numTokens:    req.PromptTokens,
		sentUs:       now,
		clientSentUs: now,
		ttfbUs:       -1,
		replica:      -1,
		apiServer:    -1,
		memoReplica:  -1,
		firstTokenUs: -1,
		scheduledUs:  -1,
		lengthCapped: outputCap > 0 && out >= outputCap,
	}
}

// logRequest writes the record of s once, when records are kept.
func (r *run) logRequest(s *seq, finished bool) {
	if r.log == nil || s.logged {
		return
	}
	s.logged = true
	if s.ttfbUs < 0 {
		s.stepSessions = r.stepSessions
	}
	r.log.add(r, s, finished)
}

// onDone is every replica's report of a request that left it.
func (r *run) onDone(s *seq, finished bool) {
	rp := s.replica
	r.rt.inFlight[rp]--
	if r.front != nil {
		r.front.finished(s.apiServer, rp)
	}
	r.snap.Replicas[rp].InFlight = r.rt.inFlight[rp]
	if r.kv != nil {
		r.kv.prefilled(r, s)
	}
	if r.router.Tracks() {
		r.router.Finished(r.request(s), rp, time.UnixMicro(r.now))
	}
	if finished {
		r.rt.finished++
		r.rec.observeFinished(s, r.now)
		r.observeHits(s)
	}
	r.turnEnded(s, finished)
	r.logRequest(s, finished)
	r.drv.done(r, s, finished)
	r.seqFree = append(r.seqFree, s)
	r.checkIdle()
}

// turnEnded tells the router that s ended now, as the proxy's finish does
// (live/call.go call.finish): with the conversation's footprint, prompt +
// answer tokens, when it finished, else none (0 keeps the last one). When
// the router is told turn ends (a session replay) the conversation stays
// held for its return timeout and, as the proxy wakes its front waiter at
// every request's end, admission looks again.
func (r *run) turnEnded(s *seq, finished bool) {
	if s.req.Session == "" {
		return
	}
	tokens := 0
	if finished {
		tokens = s.prompt + s.generated
	}
	r.router.Ended(s.req.Session, tokens, time.UnixMicro(r.now))
	if r.kv != nil && r.router.TurnEnds && r.router.Table() != nil {
		r.kv.wake(r)
	}
}

// onFirstToken records a request's time to first token: as its client
// sees it (warden_ttfb_seconds: from the client's send to the engine's
// first token plus the downlink, the uplink and the API server's work in
// between) and as its engine does (vLLM's TTFT, from the request's arrival
// there).
func (r *run) onFirstToken(s *seq) {
	if r.kv != nil {
		r.kv.prefilled(r, s)
	}
	if r.router.Tracks() {
		r.router.FirstToken(r.request(s), s.replica, time.UnixMicro(r.now))
	}
	if s.censored {
		r.rec.observeFirstToken(s, -1)
		return
	}
	s.ttfbUs = s.firstTokenUs + r.downlinkUs - s.clientSentUs
	s.stepSessions = r.stepSessions
	ttfb := float64(s.ttfbUs) / usPerSec
	r.rec.observeFirstToken(s, ttfb)
	r.rt.ttfbs = append(r.rt.ttfbs, ttfb)
}

// onNextTokens records the inter-token latency of n tokens after the
// first, of replica rep.
func (r *run) onNextTokens(rep int, itlUs int64, n int) {
	r.rec.observeNextTokens(rep, itlUs, n)
}

// checkIdle stops the run at the next scrape instant once the driver has
// nothing left to do, when the run is set to stop then.
func (r *run) checkIdle() {
	if !r.stopWhenIdle || r.stopQueued || !r.drv.idle() {
		return
	}
	r.stopQueued = true
	at := (r.now + r.scrapeUs - 1) / r.scrapeUs * r.scrapeUs
	r.ev.push(at, evStop, 0)
}

// abortAll cuts every request in flight (the end of a measured step) and
// returns how many there were.
func (r *run) abortAll() int {
	n := 0
	for _, c := range r.rt.inFlight {
		n += c
	}
	for i, s := range r.pending {
		switch {
		case s == nil || s.aborted:
		case s.replica >= 0:
			// Routed, with its API server: counted in flight above, it
			// leaves as a waiting request does.
			r.pending[i] = nil // the slot is freed when its event fires
			s.aborted = true
			r.doneFn(s, false)
		default:
			s.aborted = true // dropped when it arrives
			n++
			r.logRequest(s, false)
		}
	}
	if r.kv != nil {
		for r.kv.waiting.Len() > 0 { // waiting for admission: cut too
			s := r.kv.waiting.Pop()
			n++
			r.logRequest(s, false)
			r.seqFree = append(r.seqFree, s)
		}
	}
	if r.log != nil {
		// Running requests of a busy replica leave when its step ends,
		// which the run may not reach: record every cut request now.
		for _, rep := range r.reps {
			for _, s := range rep.running {
				r.logRequest(s, false)
			}
			for i := range rep.waiting.len() {
				r.logRequest(rep.waiting.at(i), false)
			}
		}
	}
	for _, rep := range r.reps {
		rep.abortAll(r.doneFn)
	}
	return n
}
