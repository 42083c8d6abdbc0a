package metrics

import (
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics/names"
)

// A synthetic farm written exactly as the simulator writes its series: every
// series at every scrape instant, 1 s apart, from t = 0 to farmSeconds
// inclusive. Besides the store it keeps the truth (every counter's value at
// every second, every histogram observation with the scrape that first shows
// it), from which the tests count the KPIs directly.
const (
	farmModel   = "qwen3-4b"
	farmOther   = "other-model" // a second model whose series must never leak in
	farmEngines = 2
	farmSeconds = 360
	farmScrape  = time.Second
)

var farmReasons = []string{"new", "sticky", "spill"}

type farmTruth struct {
	hits, queries, preempt [][]float64          // cumulative, [engine][second]
	kv, inFlight           [][]float64          // gauges
	requests               map[string][]float64 // reason -> cumulative over replicas, [second]
	later, laterHome       []float64
	completed, outTokens   []float64
	ttfb, ttft             [][]float64 // observations first visible at [second]
}

// newFarm writes the fixture. It is deterministic: a fixed PCG seed.
// warden_ttfb_seconds has its native histogram, as the simulator writes it.
func newFarm(tb testing.TB, engines, seconds int) (*Store, *farmTruth) {
	tb.Helper()
	return newFarmWith(tb, engines, seconds, true)
}

// newFarmWith is newFarm; native=false writes warden_ttfb_seconds' classic
// buckets only, as a Prometheus without native histograms stores them.
func newFarmWith(tb testing.TB, engines, seconds int, native bool) (*Store, *farmTruth) {
	tb.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	s := NewStore()
	tr := &farmTruth{requests: map[string][]float64{}}
	for _, p := range []*[][]float64{&tr.hits, &tr.queries, &tr.preempt, &tr.kv, &tr.inFlight} {
		*p = make([][]float64, engines)
	}

	type engineSeries struct {
		hits, queries, prompt, gen, preempt, running, waiting, kv *Series
		success                                                   [2]*Series
		ttft                                                      *Histogram
		inFlight, sessions                                        *Series
		requests                                                  map[string]*Series
	}
	vl := func(name, engine string, extra ...string) *Series {
		return s.Series(labels.FromStrings(append([]string{names.LabelName, name, names.LabelModelName, farmModel, names.LabelEngine, engine}, extra...)...))
	}
	wl := func(name string, extra ...string) *Series {
		return s.Series(labels.FromStrings(append([]string{names.LabelName, name, names.LabelModel, farmModel}, extra...)...))
	}
	es := make([]engineSeries, engines)
	for e := range es {
		id := strconv.Itoa(e)
		es[e] = engineSeries{
			hits: vl(names.VLLMPrefixCacheHits, id), queries: vl(names.VLLMPrefixCacheQueries, id),
			prompt: vl(names.VLLMPromptTokens, id), gen: vl(names.VLLMGenerationTokens, id),
			preempt: vl(names.VLLMNumPreemptions, id), running: vl(names.VLLMNumRequestsRunning, id),
			waiting: vl(names.VLLMNumRequestsWaiting, id), kv: vl(names.VLLMKVCacheUsagePerc, id),
			success: [2]*Series{
				vl(names.VLLMRequestSuccess, id, names.LabelFinishedReason, names.FinishedStop),
				vl(names.VLLMRequestSuccess, id, names.LabelFinishedReason, names.FinishedLength),
			},
			ttft: NewHistogram(s, names.VLLMTimeToFirstToken,
				labels.FromStrings(names.LabelModelName, farmModel, names.LabelEngine, id), names.VLLMTTFTBuckets()),
			inFlight: wl(names.WardenInFlight, names.LabelReplica, id),
			sessions: wl(names.WardenSessions, names.LabelReplica, id),
			requests: map[string]*Series{},
		}
		s.Series(labels.FromStrings(names.LabelName, names.VLLMCacheConfigInfo, names.LabelEngine, id, names.LabelBlockSize, "16",
			names.LabelNumGPUBlocks, "2437", names.LabelGPUMemoryUtilization, "0.9", names.LabelEnablePrefixCaching, "True")).Append(0, 1)
	}
	later, laterHome := wl(names.WardenLaterTurns), wl(names.WardenLaterTurnsHome)
	completed, outTokens := wl(names.WardenSessionsCompleted), wl(names.WardenOutputTokens)
	ttfb := NewHistogram(s, names.WardenTTFB, labels.FromStrings(names.LabelModel, farmModel), names.WardenTTFBBuckets())
	if native {
		ttfb.WithNative(s, names.WardenTTFBNative())
	}
	// The other model: one engine, large values, same names.
	oHits := s.Series(labels.FromStrings(names.LabelName, names.VLLMPrefixCacheHits, names.LabelModelName, farmOther, names.LabelEngine, "0"))
	oQueries := s.Series(labels.FromStrings(names.LabelName, names.VLLMPrefixCacheQueries, names.LabelModelName, farmOther, names.LabelEngine, "0"))
	oOut := s.Series(labels.FromStrings(names.LabelName, names.WardenOutputTokens, names.LabelModel, farmOther))

	var (
		hits, queries, prompt, gen, preempt = make([]float64, engines), make([]float64, engines),
			make([]float64, engines), make([]float64, engines), make([]float64, engines)
		success                    = make([][2]float64, engines)
		reqs                       = make([]map[string]float64, engines)
		nLater, nHome, nDone, nOut float64
	)
	for e := range reqs {
		reqs[e] = map[string]float64{}
	}
	for sec := 0; sec <= seconds; sec++ {
		tMs := int64(sec) * farmScrape.Milliseconds()
		var ttfbObs, ttftObs []float64
		if sec > 0 {
			for e := range engines {
				q := float64(rng.IntN(3000))
				queries[e] += q
				// Engine 1 serves no hit before second 200, so that its hit
				// counter is 0 at the start of the second window.
				if e != 1 || sec >= 200 {
					hits[e] += math.Floor(q * rng.Float64())
				}
				prompt[e] += q
				gen[e] += float64(rng.IntN(200))
				if rng.IntN(20) == 0 {
					preempt[e]++
				}
				for r := range 2 {
					success[e][r] += float64(rng.IntN(2))
				}
				for _, reason := range farmReasons {
					if reason == "spill" && sec < 250 { // a series born late
						continue
					}
					reqs[e][reason] += float64(rng.IntN(3))
				}
				for range rng.IntN(4) {
					v := rng.ExpFloat64() * 0.8
					ttftObs = append(ttftObs, v)
					es[e].ttft.Observe(v)
				}
			}
			turns := rng.IntN(5)
			nLater += float64(turns)
			nHome += float64(rng.IntN(turns + 1)) // some later turns stay home
			nDone += float64(rng.IntN(2))
			nOut += float64(rng.IntN(500))
			for range rng.IntN(6) {
				v := rng.ExpFloat64() * 3
				ttfbObs = append(ttfbObs, v)
				ttfb.Observe(v)
			}
		}
		for e := range engines {
			x := es[e]
			x.hits.Append(tMs, hits[e])
			x.queries.Append(tMs, queries[e])
			x.prompt.Append(tMs, prompt[e])
			x.gen.Append(tMs, gen[e])
			x.preempt.Append(tMs, preempt[e])
			x.running.Append(tMs, float64(rng.IntN(32)))
			x.waiting.Append(tMs, float64(rng.IntN(4)))
			kv := float64(rng.IntN(1000)) / 1000
			x.kv.Append(tMs, kv)
			for r := range 2 {
				x.success[r].Append(tMs, success[e][r])
			}
			x.ttft.Append(tMs)
			inf := float64(max(0, rng.IntN(6)-2)) // 0 half of the time
			x.inFlight.Append(tMs, inf)
			x.sessions.Append(tMs, float64(rng.IntN(8)))
			for _, reason := range farmReasons {
				if reason == "spill" && sec < 250 {
					continue
				}
				sr, ok := x.requests[reason]
				if !ok {
					sr = wl(names.WardenRequests, names.LabelReplica, strconv.Itoa(e), names.LabelReason, reason)
					x.requests[reason] = sr
				}
				sr.Append(tMs, reqs[e][reason])
			}
			tr.hits[e] = append(tr.hits[e], hits[e])
			tr.queries[e] = append(tr.queries[e], queries[e])
			tr.preempt[e] = append(tr.preempt[e], preempt[e])
			tr.kv[e] = append(tr.kv[e], kv)
			tr.inFlight[e] = append(tr.inFlight[e], inf)
		}
		for _, reason := range farmReasons {
			var sum float64
			for e := range engines {
				sum += reqs[e][reason]
			}
			tr.requests[reason] = append(tr.requests[reason], sum)
		}
		later.Append(tMs, nLater)
		laterHome.Append(tMs, nHome)
		completed.Append(tMs, nDone)
		outTokens.Append(tMs, nOut)
		ttfb.Append(tMs)
		tr.later = append(tr.later, nLater)
		tr.laterHome = append(tr.laterHome, nHome)
		tr.completed = append(tr.completed, nDone)
		tr.outTokens = append(tr.outTokens, nOut)
		tr.ttfb = append(tr.ttfb, ttfbObs)
		tr.ttft = append(tr.ttft, ttftObs)
		oHits.Append(tMs, 7e6*float64(sec))
		oQueries.Append(tMs, 8e6*float64(sec))
		oOut.Append(tMs, 1e6*float64(sec))
	}
	return s, tr
}

// idx returns the index of the newest sample at or before tMs.
func idx(tMs int64) int { return int(tMs / farmScrape.Milliseconds()) }

// delta is v[end] - v[start] where start is the sample an instant selector at
// end-window sees (the newest at or before it).
func delta(v []float64, end time.Time, window time.Duration) float64 {
	return v[idx(end.UnixMilli())] - v[idx(end.Add(-window).UnixMilli())]
}

func sumEngines(v [][]float64, end time.Time, window time.Duration) float64 {
	var d float64
	for _, e := range v {
		d += e[idx(end.UnixMilli())]
	}
	var s float64
	for _, e := range v {
		s += e[idx(end.Add(-window).UnixMilli())]
	}
	return d - s
}

// quantile is the bucket interpolation that histogram_quantile applies
// (promql.BucketQuantile), computed over the observations first visible in
// the scrapes after end-window up to end.
func quantile(q float64, obs [][]float64, bounds []float64, end time.Time, window time.Duration) float64 {
	counts := make([]float64, len(bounds)+1)
	for i := idx(end.Add(-window).UnixMilli()) + 1; i <= idx(end.UnixMilli()); i++ {
		for _, v := range obs[i] {
			counts[sort.SearchFloat64s(bounds, v)]++
		}
	}
	for i := 1; i < len(counts); i++ { // cumulative
		counts[i] += counts[i-1]
	}
	total := counts[len(counts)-1]
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	b := sort.Search(len(counts)-1, func(i int) bool { return counts[i] >= rank })
	if b == len(counts)-1 {
		return bounds[len(bounds)-1]
	}
	start, count := 0.0, counts[b]
	if b > 0 {
		start = bounds[b-1]
		count -= counts[b-1]
		rank -= counts[b-1]
	}
	return start + (bounds[b]-start)*(rank/count)
}

// windowSamples returns, sorted, the observations that the native TTFB
// KPIs count: increase() over (end-window-1ms, end], i.e. those first
// visible after the first scrape at or after end-window.
func windowSamples(obs [][]float64, end time.Time, window time.Duration) []float64 {
	first := int((end.Add(-window).UnixMilli() + farmScrape.Milliseconds() - 1) / farmScrape.Milliseconds())
	var out []float64
	for i := first + 1; i <= idx(end.UnixMilli()); i++ {
		out = append(out, obs[i]...)
	}
	sort.Float64s(out)
	return out
}
