package live

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/lm-warden/warden/metrics/names"
)

// EngineStats are the figures of one vLLM engine (one data-parallel rank)
// read from a /metrics page.
type EngineStats struct {
	Engine           int     // the engine label (DP rank); 0 when absent
	Running          float64 // vllm:num_requests_running
	Waiting          float64 // vllm:num_requests_waiting
	KVUsage          float64 // vllm:kv_cache_usage_perc, 0..1
	PrefixQueries    float64 // vllm:prefix_cache_queries_total (tokens)
	PrefixHits       float64 // vllm:prefix_cache_hits_total (tokens)
	PromptTokens     float64 // vllm:prompt_tokens_total
	GenerationTokens float64 // vllm:generation_tokens_total
	BlockSize        int     // from vllm:cache_config_info, 0 if absent
	NumGPUBlocks     int     // from vllm:cache_config_info, 0 if absent
	MaxNumSeqs       int     // a max_num_seqs label of any vllm:*_config_info, 0 if absent
	// vllm:request_prefill_time_seconds: the sum and count of the
	// histogram, and whether the server exposes it.
	PrefillSeconds  float64
	PrefillRequests float64
	HasPrefill      bool
}

// maxMetricsBytes bounds a /metrics page the scraper reads.
const maxMetricsBytes = 8 << 20

// maxServerNumSeqs caps a max_num_seqs read from a server's
// *_config_info labels: 16 times vLLM's largest default (1024), far above
// any batch a GPU runs, so that a wrong or hostile page cannot make the
// auto spill threshold (a quarter of it) unreachable. A configured
// models[].max_num_seqs above it is refused (issue 46 item 8: 2^62 was
// taken).
const maxServerNumSeqs = 16384

// ParseVLLMMetrics reads vLLM's text exposition and returns the figures of
// each engine, sorted by engine. Series other than the ones EngineStats
// holds (including the *_created gauges) are ignored; a series with
// several label sets per engine (e.g. per model_name) is summed.
func ParseVLLMMetrics(r io.Reader) ([]EngineStats, error) {
	p := expfmt.NewTextParser(pmodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(r, maxMetricsBytes))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	var out []EngineStats
	// at indexes out by engine label: a page may carry up to 65,537 of
	// them, and a search of out for each sample made a scrape quadratic
	// (21 s of CPU for such a page, issue 35).
	at := map[int]int{}
	get := func(engine int) *EngineStats {
		if i, ok := at[engine]; ok {
			return &out[i]
		}
		at[engine] = len(out)
		out = append(out, EngineStats{Engine: engine})
		return &out[len(out)-1]
	}
	add := func(name string, field func(*EngineStats) *float64) {
		f := fams[name]
		if f == nil {
			return
		}
		for _, m := range f.GetMetric() {
			e, ok := engineOf(m)
			if !ok {
				continue
			}
			*field(get(e)) += sampleValue(m)
		}
	}
	add(names.VLLMNumRequestsRunning, func(s *EngineStats) *float64 { return &s.Running })
	add(names.VLLMNumRequestsWaiting, func(s *EngineStats) *float64 { return &s.Waiting })
	add(names.VLLMKVCacheUsagePerc, func(s *EngineStats) *float64 { return &s.KVUsage })
	add(names.VLLMPrefixCacheQueries, func(s *EngineStats) *float64 { return &s.PrefixQueries })
	add(names.VLLMPrefixCacheHits, func(s *EngineStats) *float64 { return &s.PrefixHits })
	add(names.VLLMPromptTokens, func(s *EngineStats) *float64 { return &s.PromptTokens })
	add(names.VLLMGenerationTokens, func(s *EngineStats) *float64 { return &s.GenerationTokens })
	if f := fams[names.VLLMRequestPrefillTime]; f != nil {
		for _, m := range f.GetMetric() {
			e, ok := engineOf(m)
			if !ok || m.Histogram == nil {
				continue
			}
			s := get(e)
			s.PrefillSeconds += m.GetHistogram().GetSampleSum()
			s.PrefillRequests += float64(m.GetHistogram().GetSampleCount())
			s.HasPrefill = true
		}
	}
	info := make([]string, 0, 4)
	for name := range fams {
		if strings.HasPrefix(name, "vllm:") && strings.HasSuffix(name, "_config_info") {
			info = append(info, name)
		}
	}
	slices.Sort(info) // map order must not decide which label wins
	for _, name := range info {
		for _, m := range fams[name].GetMetric() {
			e, ok := engineOf(m)
			if !ok {
				continue
			}
			s := get(e)
			for _, lp := range m.GetLabel() {
				v, err := strconv.ParseFloat(lp.GetValue(), 64)
				if err != nil || v < 0 || v > 1<<30 {
					continue
				}
				switch lp.GetName() {
				case names.LabelBlockSize:
					s.BlockSize = int(v)
				case names.LabelNumGPUBlocks:
					s.NumGPUBlocks = int(v)
				case "max_num_seqs":
					// A server is not trusted with the spill threshold:
					// 2^30 made it 268,435,456 (issue 35).
					s.MaxNumSeqs = min(int(v), maxServerNumSeqs)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b EngineStats) int { return a.Engine - b.Engine })
	return out, nil
}

// engineOf returns the engine label of a sample (0 when absent); false for
// a label that is not a small non-negative integer.
func engineOf(m *dto.Metric) (int, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == names.LabelEngine {
			e, err := strconv.Atoi(lp.GetValue())
			if err != nil || e < 0 || e > 1<<16 {
				return 0, false
			}
			return e, true
		}
	}
	return 0, true
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// ScrapeResult is one published observation of a backend server. It is
// immutable once published.
type ScrapeResult struct {
	Seq       uint64        // increases with every attempt
	Attempt   time.Time     // when this attempt finished
	OK        time.Time     // last successful /metrics scrape (zero: never)
	Err       string        // the last attempt's error, "" on success
	Engines   []EngineStats // from the last successful scrape
	Healthy   bool          // the last /health probe answered 200
	HealthErr string
}

// scraper polls one backend server's /metrics and /health at an interval
// and publishes each result through an atomic pointer, so readers take no
// lock. The loop follows Prometheus's scrape loop: a ticker, a select on
// ctx.Done, and a stopped channel closed when the loop has returned.
type scraper struct {
	base     string // server base URL, no trailing slash
	client   *http.Client
	interval time.Duration
	timeout  time.Duration
	last     atomic.Pointer[ScrapeResult]
	stopped  chan struct{}
	onResult func(*ScrapeResult) // optional, called after each publish (metrics)
	// down is done while /health says the server is down: attempts waiting
	// for its headers watch it (context.AfterFunc) to retry elsewhere. A
	// new, live one replaces it when the server is healthy again.
	down atomic.Pointer[downSignal]
	// first is closed once the first result is published, or when the loop
	// ends without one (awaitFirstProbe); firstDone is the run goroutine's.
	first     chan struct{}
	firstDone bool
	// healthFails counts the failed /health probes in a row (the run
	// goroutine's).
	healthFails int
}

// healthFall is the number of failed /health probes in a row (timeouts,
// error statuses) that mark a server down, as HAProxy's "fall 3": a
// replica busy enough to miss one probe's deadline is still serving, and
// taking every loaded replica out would turn load into 503s. A refused
// connection (nothing listens) and a failure before any good probe mark it
// down at once; passive ejection (model.go) acts on the requests' own
// failures meanwhile.
const healthFall = 3

type downSignal struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newDownSignal() *downSignal {
	ctx, cancel := context.WithCancel(context.Background())
	return &downSignal{ctx, cancel}
}

// downCtx returns a context that is done once the server's /health says it
// is down (already done while it is down).
func (s *scraper) downCtx() context.Context { return s.down.Load().ctx }

// setHealthy moves the down signal with a health probe's outcome.
func (s *scraper) setHealthy(ok bool) {
	d := s.down.Load()
	switch {
	case !ok:
		d.cancel()
	case d.ctx.Err() != nil:
		s.down.Store(newDownSignal())
	}
}

func newScraper(base string, client *http.Client, interval, timeout time.Duration) *scraper {
	s := &scraper{
		base:     strings.TrimSuffix(base, "/"),
		client:   client,
		interval: interval,
		timeout:  min(timeout, interval*3),
		stopped:  make(chan struct{}),
		first:    make(chan struct{}),
	}
	// Until the first probe answers, the server is presumed healthy with no
	// scraped data: routing uses local counts (see fill).
	s.last.Store(&ScrapeResult{Healthy: true})
	s.down.Store(newDownSignal())
	return s
}

// run scrapes until ctx is done, then closes s.stopped.
func (s *scraper) run(ctx context.Context) {
	defer close(s.stopped)
	defer s.published()
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.scrapeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *scraper) scrapeOnce(ctx context.Context) {
	prev := s.last.Load()
	next := &ScrapeResult{Seq: prev.Seq + 1, OK: prev.OK, Engines: prev.Engines}
	engines, err := s.fetchMetrics(ctx)
	if ctx.Err() != nil {
		return
	}
	next.Attempt = time.Now()
	if err != nil {
		next.Err = err.Error()
	} else {
		next.OK, next.Engines = next.Attempt, engines
	}
	if err := s.probeHealth(ctx); err != nil {
		next.HealthErr = err.Error()
		s.healthFails++
		next.Healthy = prev.Seq > 0 && prev.Healthy && s.healthFails < healthFall && !isConnectError(err)
	} else {
		s.healthFails = 0
		next.Healthy = true
	}
	if ctx.Err() != nil {
		return
	}
	s.last.Store(next)
	s.published()
	s.setHealthy(next.Healthy)
	if s.onResult != nil {
		s.onResult(next)
	}
}

// published closes s.first the first time; called by the run goroutine.
func (s *scraper) published() {
	if !s.firstDone {
		s.firstDone = true
		close(s.first)
	}
}

func (s *scraper) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+path, nil)
	if err != nil {
		return nil, err
	}
	res, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		res.Body.Close()
		return nil, fmt.Errorf("GET %s: status %d", path, res.StatusCode)
	}
	return res, nil
}

func (s *scraper) fetchMetrics(ctx context.Context) ([]EngineStats, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	res, err := s.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	return ParseVLLMMetrics(res.Body)
}

func (s *scraper) probeHealth(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	res, err := s.get(ctx, "/health")
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 4096))
	return res.Body.Close()
}

// fresh reports whether the result's data is recent enough to route on:
// a successful scrape no older than three intervals.
func (r *ScrapeResult) fresh(now time.Time, interval time.Duration) bool {
	return !r.OK.IsZero() && r.Err == "" && now.Sub(r.OK) <= 3*interval
}

// engine returns the stats of engine e; false when the page had none.
// Engines are sorted by engine label (ParseVLLMMetrics), and usually dense
// from 0: e's own index is tried first, then a binary search, since a page
// may hold 65,537 engines and fill asks once per replica and pick.
func (r *ScrapeResult) engine(e int) (EngineStats, bool) {
	if e >= 0 && e < len(r.Engines) && r.Engines[e].Engine == e {
		return r.Engines[e], true
	}
	i, ok := slices.BinarySearchFunc(r.Engines, e, func(s EngineStats, e int) int { return s.Engine - e })
	if !ok {
		return EngineStats{}, false
	}
	return r.Engines[i], true
}

// total sums all engines of the server (a one-replica server); false when
// the page had none.
func (r *ScrapeResult) total() (EngineStats, bool) {
	if len(r.Engines) == 0 {
		return EngineStats{}, false
	}
	t := EngineStats{Engine: r.Engines[0].Engine}
	for _, e := range r.Engines {
		t.Running += e.Running
		t.Waiting += e.Waiting
		t.KVUsage = max(t.KVUsage, e.KVUsage)
		t.PrefixQueries += e.PrefixQueries
		t.PrefixHits += e.PrefixHits
		t.PromptTokens += e.PromptTokens
		t.GenerationTokens += e.GenerationTokens
		t.BlockSize = max(t.BlockSize, e.BlockSize)
		t.NumGPUBlocks += e.NumGPUBlocks
		t.MaxNumSeqs = max(t.MaxNumSeqs, e.MaxNumSeqs)
		t.PrefillSeconds += e.PrefillSeconds
		t.PrefillRequests += e.PrefillRequests
		t.HasPrefill = t.HasPrefill || e.HasPrefill
	}
	return t, true
}
