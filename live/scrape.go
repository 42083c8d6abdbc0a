package live

import (
	"context"
	"fmt"
	"github.com/lm-warden/warden/metrics/vllm"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// EngineStats are the figures of one vLLM engine read from a /metrics
// page (package metrics/vllm parses it).
type EngineStats = vllm.Engine

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
	return vllm.Parse(res.Body, vllm.MaxPageBytes)
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
// Engines are sorted by engine label (vllm.Parse), and usually dense
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
