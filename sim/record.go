package sim

import (
	"strconv"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/placement"
)

// recorder writes the series a real farm would expose, vLLM's per engine
// and warden's own, into a metrics.Store at every scrape instant. Every
// series gets a sample at every scrape, so that the KPI expressions of
// metrics/kpi.promql see exact values at both ends of a step.
type recorder struct {
	run    *run
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
	kvSum   []float64
	kvMax   []float64
	samples int64
	busySum int64 // sum over samples of the number of replicas with requests in flight
}

type engineSeries struct {
	running, waiting, kvUsage       *metrics.Series
	queries, hits, prompt, gen      *metrics.Series
	preempt, stop, length, cacheCfg *metrics.Series
	ttft                            *metrics.Histogram
	// vLLM's per-token, per-request and per-step histograms.
	itl, queue, prefill, decode, e2e *metrics.Histogram
	promptLen, genLen, iterTokens    *metrics.Histogram
}

type routerSeries struct {
	requests []*metrics.Series // by reason
	inFlight *metrics.Series
	sessions *metrics.Series
}

func newRecorder(r *run) *recorder {
	st := metrics.NewStore()
	rec := &recorder{run: r, store: st}
	n := len(r.reps)
	rec.kvSum = make([]float64, n)
	rec.kvMax = make([]float64, n)
	model := r.model
	v := r.farm.Spec.VLLM
	for i := range n {
		eng := strconv.Itoa(i)
		vl := func(name string, extra ...string) *metrics.Series {
			kv := append([]string{metrics.LabelName, name, metrics.LabelModelName, model, metrics.LabelEngine, eng}, extra...)
			return st.Series(labels.FromStrings(kv...))
		}
		rec.eng = append(rec.eng, engineSeries{
			running: vl(metrics.VLLMNumRequestsRunning),
			waiting: vl(metrics.VLLMNumRequestsWaiting),
			kvUsage: vl(metrics.VLLMKVCacheUsagePerc),
			queries: vl(metrics.VLLMPrefixCacheQueries),
			hits:    vl(metrics.VLLMPrefixCacheHits),
			prompt:  vl(metrics.VLLMPromptTokens),
			gen:     vl(metrics.VLLMGenerationTokens),
			preempt: vl(metrics.VLLMNumPreemptions),
			stop:    vl(metrics.VLLMRequestSuccess, metrics.LabelFinishedReason, metrics.FinishedStop),
			length:  vl(metrics.VLLMRequestSuccess, metrics.LabelFinishedReason, metrics.FinishedLength),
			cacheCfg: st.Series(labels.FromStrings(
				metrics.LabelName, metrics.VLLMCacheConfigInfo,
				metrics.LabelEngine, eng,
				metrics.LabelBlockSize, strconv.Itoa(v.BlockSize),
				metrics.LabelNumGPUBlocks, strconv.Itoa(r.farm.NumGPUBlocks),
				metrics.LabelGPUMemoryUtilization, strconv.FormatFloat(v.GPUMemoryUtilization, 'g', -1, 64),
				metrics.LabelEnablePrefixCaching, "True",
			)),
			ttft: metrics.NewHistogram(st, metrics.VLLMTimeToFirstToken,
				labels.FromStrings(metrics.LabelModelName, model, metrics.LabelEngine, eng), metrics.VLLMTTFTBuckets()),
		})
		e := &rec.eng[len(rec.eng)-1]
		hl := labels.FromStrings(metrics.LabelModelName, model, metrics.LabelEngine, eng)
		lat := metrics.VLLMRequestLatencyBuckets()
		e.itl = metrics.NewHistogram(st, metrics.VLLMInterTokenLatency, hl, metrics.VLLMITLBuckets())
		e.queue = metrics.NewHistogram(st, metrics.VLLMRequestQueueTime, hl, lat)
		e.prefill = metrics.NewHistogram(st, metrics.VLLMRequestPrefillTime, hl, lat)
		e.decode = metrics.NewHistogram(st, metrics.VLLMRequestDecodeTime, hl, lat)
		e.e2e = metrics.NewHistogram(st, metrics.VLLME2ERequestLatency, hl, lat)
		e.promptLen = metrics.NewHistogram(st, metrics.VLLMRequestPromptTokens, hl, metrics.VLLMTokenBuckets(v.MaxModelLen))
		e.genLen = metrics.NewHistogram(st, metrics.VLLMRequestGenerationTokens, hl, metrics.VLLMTokenBuckets(v.MaxModelLen))
		e.iterTokens = metrics.NewHistogram(st, metrics.VLLMIterationTokens, hl, metrics.VLLMIterationTokenBuckets())
		rs := routerSeries{
			inFlight: st.Series(labels.FromStrings(metrics.LabelName, metrics.WardenInFlight, metrics.LabelModel, model, metrics.LabelReplica, eng)),
			sessions: st.Series(labels.FromStrings(metrics.LabelName, metrics.WardenSessions, metrics.LabelModel, model, metrics.LabelReplica, eng)),
		}
		for reason := range numReasons {
			rs.requests = append(rs.requests, st.Series(labels.FromStrings(
				metrics.LabelName, metrics.WardenRequests, metrics.LabelModel, model,
				metrics.LabelReason, placement.Reason(reason).String(), metrics.LabelReplica, eng)))
		}
		rec.rt = append(rec.rt, rs)
	}
	wl := func(name string) *metrics.Series {
		return st.Series(labels.FromStrings(metrics.LabelName, name, metrics.LabelModel, model))
	}
	rec.later = wl(metrics.WardenLaterTurns)
	rec.home = wl(metrics.WardenLaterTurnsHome)
	rec.done = wl(metrics.WardenSessionsCompleted)
	rec.output = wl(metrics.WardenOutputTokens)
	rec.ttfb = metrics.NewHistogram(st, metrics.WardenTTFB, labels.FromStrings(metrics.LabelModel, model), metrics.WardenTTFBBuckets())
	return rec
}

// observeTTFB records one request's time to first token, client side
// (warden) and engine side (vLLM): the simulated network takes no time, so
// they are equal.
func (rec *recorder) observeTTFB(replica int, sec float64) {
	rec.ttfb.Observe(sec)
	rec.eng[replica].ttft.Observe(sec)
}

// observeStep records the step rep just scheduled at now: its tokens
// (vllm:iteration_tokens_total) and the first scheduling time of its
// requests.
func (rec *recorder) observeStep(rep *replica, now int64) {
	tokens := 0
	for i, s := range rep.batch {
		tokens += rep.chunks[i].n
		if s.scheduledUs < 0 {
			s.scheduledUs = now
		}
	}
	rec.eng[rep.id].iterTokens.Observe(float64(tokens))
}

// observeFinished records a request that finished at now, as vLLM does
// when a request finishes: its queue, prefill, decode and end-to-end
// times and its prompt and generated tokens.
func (rec *recorder) observeFinished(s *seq, now int64) {
	e := &rec.eng[s.replica]
	sec := func(us int64) float64 { return float64(us) / usPerSec }
	e.queue.Observe(sec(s.scheduledUs - s.sentUs))
	e.prefill.Observe(sec(s.firstTokenUs - s.scheduledUs))
	e.decode.Observe(sec(now - s.firstTokenUs))
	e.e2e.Observe(sec(now - s.sentUs))
	e.promptLen.Observe(float64(s.prompt))
	e.genLen.Observe(float64(s.generated))
}

// append writes one sample of every series at tMs.
func (rec *recorder) append(tMs int64) {
	r := rec.run
	busy := int64(0)
	for i, rep := range r.reps {
		e := &rec.eng[i]
		p := r.snap.Replicas[i]
		st := &rep.stats
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
		e.ttft.Append(tMs)
		for _, h := range [...]*metrics.Histogram{e.itl, e.queue, e.prefill, e.decode, e.e2e, e.promptLen, e.genLen, e.iterTokens} {
			h.Append(tMs)
		}

		rs := &rec.rt[i]
		for reason, s := range rs.requests {
			s.Append(tMs, float64(r.rt.requests[i][reason]))
		}
		rs.inFlight.Append(tMs, float64(r.rt.inFlight[i]))
		rs.sessions.Append(tMs, float64(p.Sessions))

		rec.kvSum[i] += p.KVUsage
		rec.kvMax[i] = max(rec.kvMax[i], p.KVUsage)
		if r.rt.inFlight[i] > 0 {
			busy++
		}
	}
	rec.later.Append(tMs, float64(r.rt.laterTurns))
	rec.home.Append(tMs, float64(r.rt.laterHome))
	rec.done.Append(tMs, float64(r.rt.sessionsCompleted))
	rec.output.Append(tMs, float64(r.outputTokens()))
	rec.ttfb.Append(tMs)
	rec.samples++
	rec.busySum += busy
}
