package sim

import (
	"strconv"
	"time"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/metrics/names"
	"github.com/lm-warden/warden/placement"
)

// recorder writes the series a real farm would expose, vLLM's per engine
// and warden's own, into a metrics.Store at every scrape instant. Every
// series gets a sample at every scrape, so that the KPI expressions of
// metrics/kpi.promql see exact values at both ends of a step.
//
// A lean recorder writes only the series of rowKPIs, for a run whose
// store nobody else reads (Experiment.OnStore nil): the same samples of
// those, none of the others, and no engine histograms.
type recorder struct {
	run    *run
	lean   bool
	store  *metrics.Store
	eng    []engineSeries
	rt     []routerSeries
	later  *metrics.Series
	home   *metrics.Series
	done   *metrics.Series
	output *metrics.Series
	ttfb   *metrics.Histogram

	// Direct aggregates of the scraped gauges, for the per-replica columns
	// and for the test that PromQL agrees.
	kvSum []float64
	kvMax []float64
	// Sessions held per replica (run.held) over the samples since the last
	// mark: the least and the most; heldMin is -1 before a sample.
	heldMin, heldMax []int32
	samples          int64
	busySum          int64 // sum over samples of the number of replicas with requests in flight
}

type engineSeries struct {
	running, waiting, kvUsage       *metrics.Series
	queries, hits, prompt, gen      *metrics.Series
	preempt, stop, length, cacheCfg *metrics.Series
	// vLLM's per-token, per-request and per-step histograms: what is
	// observed when is EngineHistograms' (shared with the emulator); hists
	// are the same histograms, to append at each scrape.
	obs   *EngineHistograms
	hists []*metrics.Histogram
}

type routerSeries struct {
	requests []*metrics.Series // by reason
	inFlight *metrics.Series
	sessions *metrics.Series // homed (the session table's Sessions)
	active   *metrics.Series // what placement balances (Snapshot.Sessions)
}

func newRecorder(r *run, lean bool) *recorder {
	st := metrics.NewStore()
	rec := &recorder{run: r, lean: lean, store: st}
	n := len(r.reps)
	rec.kvSum = make([]float64, n)
	rec.kvMax = make([]float64, n)
	rec.heldMin = make([]int32, n)
	rec.heldMax = make([]int32, n)
	rec.resetHeld()
	model := r.model
	v := r.farm.Spec.VLLM
	for i := range n {
		eng := strconv.Itoa(i)
		vl := func(name string, extra ...string) *metrics.Series {
			kv := append([]string{names.LabelName, name, names.LabelModelName, model, names.LabelEngine, eng}, extra...)
			return st.Series(labels.FromStrings(kv...))
		}
		if lean {
			rec.eng = append(rec.eng, engineSeries{queries: vl(names.VLLMPrefixCacheQueries), hits: vl(names.VLLMPrefixCacheHits)})
			rec.rt = append(rec.rt, routerSeries{
				inFlight: st.Series(labels.FromStrings(names.LabelName, names.WardenInFlight, names.LabelModel, model, names.LabelReplica, eng)),
			})
			continue
		}
		rec.eng = append(rec.eng, engineSeries{
			running: vl(names.VLLMNumRequestsRunning),
			waiting: vl(names.VLLMNumRequestsWaiting),
			kvUsage: vl(names.VLLMKVCacheUsagePerc),
			queries: vl(names.VLLMPrefixCacheQueries),
			hits:    vl(names.VLLMPrefixCacheHits),
			prompt:  vl(names.VLLMPromptTokens),
			gen:     vl(names.VLLMGenerationTokens),
			preempt: vl(names.VLLMNumPreemptions),
			stop:    vl(names.VLLMRequestSuccess, names.LabelFinishedReason, names.FinishedStop),
			length:  vl(names.VLLMRequestSuccess, names.LabelFinishedReason, names.FinishedLength),
			cacheCfg: st.Series(labels.FromStrings(
				names.LabelName, names.VLLMCacheConfigInfo,
				names.LabelEngine, eng,
				names.LabelBlockSize, strconv.Itoa(v.BlockSize),
				names.LabelNumGPUBlocks, strconv.Itoa(r.farm.NumGPUBlocks),
				names.LabelGPUMemoryUtilization, strconv.FormatFloat(v.GPUMemoryUtilization, 'g', -1, 64),
				names.LabelEnablePrefixCaching, "True",
			)),
		})
		e := &rec.eng[len(rec.eng)-1]
		hl := labels.FromStrings(names.LabelModelName, model, names.LabelEngine, eng)
		e.obs = NewEngineHistograms(v.MaxModelLen, func(d HistogramDesc) Observer {
			h := metrics.NewHistogram(st, d.Name, hl, d.Buckets)
			e.hists = append(e.hists, h)
			return h
		})
		rs := routerSeries{
			inFlight: st.Series(labels.FromStrings(names.LabelName, names.WardenInFlight, names.LabelModel, model, names.LabelReplica, eng)),
			sessions: st.Series(labels.FromStrings(names.LabelName, names.WardenSessions, names.LabelModel, model, names.LabelReplica, eng)),
			active:   st.Series(labels.FromStrings(names.LabelName, names.WardenActiveSessions, names.LabelModel, model, names.LabelReplica, eng)),
		}
		for reason := range numReasons {
			rs.requests = append(rs.requests, st.Series(labels.FromStrings(
				names.LabelName, names.WardenRequests, names.LabelModel, model,
				names.LabelReason, placement.Reason(reason).String(), names.LabelReplica, eng)))
		}
		rec.rt = append(rec.rt, rs)
	}
	wl := func(name string) *metrics.Series {
		return st.Series(labels.FromStrings(names.LabelName, name, names.LabelModel, model))
	}
	rec.later = wl(names.WardenLaterTurns)
	rec.home = wl(names.WardenLaterTurnsHome)
	rec.done = wl(names.WardenSessionsCompleted)
	rec.output = wl(names.WardenOutputTokens)
	// Classic buckets and the native histogram, as live mode's client_golang
	// histogram exposes them: the TTFB KPIs read the native one.
	rec.ttfb = metrics.NewHistogram(st, names.WardenTTFB, labels.FromStrings(names.LabelModel, model), names.WardenTTFBBuckets()).
		WithNative(st, names.WardenTTFBNative())
	return rec
}

// observeFirstToken records one request's time to first token, client
// side (warden: ttfbS, network and API server included; negative when it
// was already counted censored at a step's end) and engine side (vLLM).
func (rec *recorder) observeFirstToken(s *seq, ttfbS float64) {
	if ttfbS >= 0 {
		rec.ttfb.Observe(ttfbS)
	}
	if !rec.lean {
		rec.eng[s.replica].obs.firstToken(s)
	}
}

// observeCensoredTTFB records the wait so far of a request that had no
// first token when its step's window closed.
func (rec *recorder) observeCensoredTTFB(waitS float64) { rec.ttfb.Observe(waitS) }

// observeRefusedTTFB records the wait of a request refused after waiting
// for admission: its client's answer (429/529) came after that long.
func (rec *recorder) observeRefusedTTFB(waitS float64) { rec.ttfb.Observe(waitS) }

// observeNextTokens records the inter-token latency of n tokens after the
// first, of requests of replica rep whose previous token came itlUs before.
func (rec *recorder) observeNextTokens(rep int, itlUs int64, n int) {
	rec.eng[rep].obs.nextTokens(itlUs, n)
}

// observeStep records the step rep just scheduled at now.
func (rec *recorder) observeStep(rep *replica, now int64) {
	if !rec.lean {
		rec.eng[rep.id].obs.stepScheduled(rep, now)
	}
}

// observeFinished records a request that finished at now.
func (rec *recorder) observeFinished(s *seq, now int64) {
	if !rec.lean {
		rec.eng[s.replica].obs.finished(s, now)
	}
}

// resetHeld starts the least and most sessions held per replica afresh
// (at a mark: they are per step).
func (rec *recorder) resetHeld() {
	for i := range rec.heldMin {
		rec.heldMin[i], rec.heldMax[i] = -1, 0
	}
}

// append writes one sample of every series at tMs.
func (rec *recorder) append(tMs int64) {
	r := rec.run
	busy := int64(0)
	for i, rep := range r.reps {
		e := &rec.eng[i]
		p := r.snap.Replicas[i]
		st := &rep.stats
		rec.kvSum[i] += p.KVUsage
		rec.kvMax[i] = max(rec.kvMax[i], p.KVUsage)
		if h := r.held; h != nil {
			if rec.heldMin[i] < 0 || h[i] < rec.heldMin[i] {
				rec.heldMin[i] = h[i]
			}
			rec.heldMax[i] = max(rec.heldMax[i], h[i])
		}
		if r.rt.inFlight[i] > 0 {
			busy++
		}
		if rec.lean {
			e.queries.Append(tMs, float64(st.queries))
			e.hits.Append(tMs, float64(st.hits))
			rec.rt[i].inFlight.Append(tMs, float64(r.rt.inFlight[i]))
			continue
		}
		e.running.Append(tMs, float64(p.Running))
		e.waiting.Append(tMs, float64(p.Waiting))
		e.kvUsage.Append(tMs, p.KVUsage)
		e.queries.Append(tMs, float64(st.queries))
		e.hits.Append(tMs, float64(st.hits))
		e.prompt.Append(tMs, float64(st.promptTokens))
		e.gen.Append(tMs, float64(st.generationTokens))
		e.preempt.Append(tMs, float64(st.preemptions))
		e.stop.Append(tMs, float64(st.finishedStop))
		e.length.Append(tMs, float64(st.finishedLength))
		e.cacheCfg.Append(tMs, 1)
		for _, h := range e.hists {
			h.Append(tMs)
		}

		rs := &rec.rt[i]
		for reason, s := range rs.requests {
			s.Append(tMs, float64(r.rt.requests[i][reason]))
		}
		rs.inFlight.Append(tMs, float64(r.rt.inFlight[i]))
		homed := 0
		if t := r.router.Table(); t != nil {
			homed = t.HomedOn(i)
		}
		rs.sessions.Append(tMs, float64(homed))
		rs.active.Append(tMs, float64(p.Sessions))
	}
	rec.later.Append(tMs, float64(r.rt.stay.Later))
	rec.home.Append(tMs, float64(r.rt.stay.Home))
	rec.done.Append(tMs, float64(r.rt.sessionsCompleted))
	rec.output.Append(tMs, float64(r.outputTokens()))
	rec.ttfb.Append(tMs)
	rec.samples++
	rec.busySum += busy
}

// Observer takes the observations of one histogram: a metrics.Histogram in
// the simulator's store, a /metrics histogram in the emulator.
type Observer interface{ Observe(v float64) }

// HistogramDesc describes one histogram of a vLLM engine: its base name
// (metrics.VLLM*), vLLM's help text and its upper bounds (+Inf excluded).
type HistogramDesc struct {
	Name, Help string
	Buckets    []float64
}

// EngineHistograms are the histograms one vLLM engine observes, and the one
// definition of what is observed when, shared by the simulator's recorder
// and the emulator's /metrics (EngineReplica.Record). As vLLM V1 does
// (vllm/v1/metrics/stats.py), in the model's virtual seconds:
//
//   - time to first token: arrival to first token, once per request;
//   - inter-token latency: between consecutive tokens of a request, once
//     per token after the first;
//   - iteration tokens: the tokens an engine step schedules (prompt chunks
//     and decodes), once per step;
//   - once per finished request (not an aborted one): queue time (arrival
//     to first scheduled), prefill time (first scheduled to first token),
//     decode time (first to last token), end-to-end latency (arrival to
//     last token), prompt tokens and generated tokens.
//
// A preempted request keeps its first scheduling and first token times.
type EngineHistograms struct {
	ttft, itl, iterTokens                        Observer
	queue, prefill, decode, e2e, prompt, outputs Observer
	// itlN is itl when it observes n equal values at once, else nil:
	// resolved once, not at every batch of inter-token latencies.
	itlN interface{ ObserveN(float64, uint64) }
}

// engineHistogramTable pairs each description with its field of h, in the
// order of EngineHistogramDescs.
func engineHistogramTable(h *EngineHistograms, maxModelLen int) []struct {
	desc  HistogramDesc
	field *Observer
} {
	lat := names.VLLMRequestLatencyBuckets
	tok := func() []float64 { return names.VLLMTokenBuckets(maxModelLen) }
	d := func(name, help string, buckets []float64) HistogramDesc {
		return HistogramDesc{Name: name, Help: help, Buckets: buckets}
	}
	return []struct {
		desc  HistogramDesc
		field *Observer
	}{
		{d(names.VLLMTimeToFirstToken, "Histogram of time to first token in seconds.", names.VLLMTTFTBuckets()), &h.ttft},
		{d(names.VLLMInterTokenLatency, "Histogram of inter-token latency in seconds.", names.VLLMITLBuckets()), &h.itl},
		{d(names.VLLMRequestQueueTime, "Histogram of time spent in WAITING phase for request.", lat()), &h.queue},
		{d(names.VLLMRequestPrefillTime, "Histogram of time spent in PREFILL phase for request.", lat()), &h.prefill},
		{d(names.VLLMRequestDecodeTime, "Histogram of time spent in DECODE phase for request.", lat()), &h.decode},
		{d(names.VLLME2ERequestLatency, "Histogram of e2e request latency in seconds.", lat()), &h.e2e},
		{d(names.VLLMRequestPromptTokens, "Number of prefill tokens processed.", tok()), &h.prompt},
		{d(names.VLLMRequestGenerationTokens, "Number of generation tokens processed.", tok()), &h.outputs},
		{d(names.VLLMIterationTokens, "Histogram of number of tokens per engine_step.", names.VLLMIterationTokenBuckets()), &h.iterTokens},
	}
}

// EngineHistogramDescs describes the histograms of EngineHistograms, in the
// order NewEngineHistograms makes them. maxModelLen (vllm.max_model_len, 0
// when unset) bounds the token-count buckets, as in vLLM.
func EngineHistogramDescs(maxModelLen int) []HistogramDesc {
	t := engineHistogramTable(new(EngineHistograms), maxModelLen)
	out := make([]HistogramDesc, len(t))
	for i, e := range t {
		out[i] = e.desc
	}
	return out
}

// NewEngineHistograms returns an engine's histograms, each made by newHist
// from its description, in the order of EngineHistogramDescs.
func NewEngineHistograms(maxModelLen int, newHist func(HistogramDesc) Observer) *EngineHistograms {
	h := new(EngineHistograms)
	for _, e := range engineHistogramTable(h, maxModelLen) {
		*e.field = newHist(e.desc)
	}
	h.itlN, _ = h.itl.(interface{ ObserveN(float64, uint64) })
	return h
}

func usToSec(us int64) float64 { return float64(us) / usPerSec }

// stepScheduled observes the step rep scheduled at now: its tokens, and
// the first scheduling time of its requests (vLLM's scheduled_ts).
func (h *EngineHistograms) stepScheduled(rep *replica, now int64) {
	for _, s := range rep.fresh {
		s.scheduledUs = now
	}
	h.iterTokens.Observe(float64(rep.stepTokens))
}

// firstToken observes a request's first token (s.firstTokenUs is set).
func (h *EngineHistograms) firstToken(s *seq) {
	h.ttft.Observe(usToSec(s.firstTokenUs - s.sentUs))
}

// nextToken observes a token after the first, sampled at now, before
// s.lastTokenUs moves to now.
func (h *EngineHistograms) nextToken(s *seq, now int64) {
	h.itl.Observe(usToSec(now - s.lastTokenUs))
}

// nextTokens observes n tokens after the first whose inter-token latency
// is itlUs: exactly as n calls of nextToken would.
func (h *EngineHistograms) nextTokens(itlUs int64, n int) {
	v := usToSec(itlUs)
	if h.itlN != nil {
		h.itlN.ObserveN(v, uint64(n))
		return
	}
	for range n {
		h.itl.Observe(v)
	}
}

// finished observes a request that finished at now.
func (h *EngineHistograms) finished(s *seq, now int64) {
	h.queue.Observe(usToSec(s.scheduledUs - s.sentUs))
	h.prefill.Observe(usToSec(s.firstTokenUs - s.scheduledUs))
	h.decode.Observe(usToSec(now - s.firstTokenUs))
	h.e2e.Observe(usToSec(now - s.sentUs))
	h.prompt.Observe(float64(s.prompt))
	h.outputs.Observe(float64(s.generated))
}

// refreshSnapshot copies the scraped fields of every replica into the
// snapshot the policy sees (one scrape).
func (r *run) refreshSnapshot() {
	for i, rep := range r.reps {
		p := &r.snap.Replicas[i]
		p.Running = len(rep.running)
		p.Waiting = rep.waiting.len()
		p.KVUsage = rep.pool.usage()
	}
	r.snap.Generation++
}

// countHeld counts, in a closed loop, the running sessions whose last
// request was placed on each replica (run.held): where each conversation's
// context lives, the sessions a replica holds.
func (r *run) countHeld() {
	c, ok := r.drv.(*closedLoop)
	if !ok {
		return
	}
	if r.held == nil {
		r.held = make([]int32, len(r.reps))
	}
	clear(r.held)
	for k := range c.clients {
		if cl := &c.clients[k]; cl.active && cl.last >= 0 && int(cl.last) < len(r.held) {
			r.held[cl.last]++
		}
	}
}

// scrape is one scrape instant: the snapshot is refreshed and every series
// gets a sample.
func (r *run) scrape() {
	r.refreshSnapshot()
	r.countHeld()
	r.router.Advance(time.UnixMicro(r.now)) // the active counts as of now, not of the last pick
	r.router.Fill(&r.snap)
	if r.kv != nil {
		r.kv.admit(r) // conversations that went idle make room
	}
	r.rec.append(r.now / usPerMs)
	r.lastScrape = r.now
}

// mark is the state of every counter at one scrape instant.
type mark struct {
	atUs     int64
	engines  []engineStats
	requests [][]int64
	router   routerStats // scalars only; slices are not copied
	kvSum    []float64   // running sums of KV usage samples per replica
	kvMax    []float64
	heldMin  []int32 // sessions held per replica since the last mark
	heldMax  []int32
	samples  int64
	busySum  int64
}

// takeMark records the counters now (right after a scrape at r.now).
func (r *run) takeMark() mark {
	m := mark{atUs: r.now, router: r.rt}
	m.router.requests, m.router.inFlight, m.router.ttfbs = nil, nil, nil
	m.engines = make([]engineStats, len(r.reps))
	m.requests = make([][]int64, len(r.reps))
	for i, rep := range r.reps {
		m.engines[i] = rep.stats
		m.requests[i] = append([]int64(nil), r.rt.requests[i]...)
	}
	m.kvSum = append([]float64(nil), r.rec.kvSum...)
	m.kvMax = append([]float64(nil), r.rec.kvMax...)
	clear(r.rec.kvMax) // the maximum is per step
	m.heldMin = append([]int32(nil), r.rec.heldMin...)
	m.heldMax = append([]int32(nil), r.rec.heldMax...)
	r.rec.resetHeld()
	m.samples = r.rec.samples
	m.busySum = r.rec.busySum
	return m
}
