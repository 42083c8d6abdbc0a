package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lm-warden/warden/internal/num"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// Defaults of a Config.
const (
	DefaultStep           = 3 * time.Minute
	DefaultTimeout        = 10 * time.Minute
	DefaultSampleInterval = time.Second
	DefaultLabel          = "observed"
	// PreflightTimeout bounds the first request to the target, so an
	// unreachable target is an error at once.
	PreflightTimeout = 5 * time.Second
	// MaxSessions bounds the concurrency of one step.
	MaxSessions = 4096
)

// DefaultSessions are the steps of the product's published benchmark.
var DefaultSessions = []int{4, 8, 16, 24, 32}

// failBackoff is how long (target time) a client whose request failed
// waits before its next session, as the simulator's client does after a
// rejection.
const failBackoff = time.Second

// Config is one benchmark: a target, the load and where to read the
// servers' counters.
type Config struct {
	Target string // base URL of an OpenAI- or Anthropic-compatible server (a proxy or vLLM itself)
	API    API    // "": OpenAI
	Model  string // "": the first model of the target's /v1/models
	APIKey string // sent as Authorization: Bearer (OpenAI) or x-api-key (Anthropic)

	Sessions []int           // concurrent sessions of each step; nil: DefaultSessions
	Step     time.Duration   // length of each step, in the target's time; 0: DefaultStep
	Seed     uint64          // seed of the synthetic sessions (warden sim's --seed)
	Workload traces.Workload // zero: traces.DefaultWorkload()
	// Speed is the target's time compression (warden emulate --speed): a
	// step lasts Step/Speed of wall time, think times are divided by Speed
	// and measured times multiplied by it, so every column reads in the
	// target's time, like the simulator's. 0 means 1.
	Speed float64

	// MetricsURLs are the vLLM /metrics pages of the farm behind the target,
	// in replica order; nil: Target + "/metrics" (a failure is then a
	// warning and the metrics columns are null; a failing URL that was
	// given is an error).
	MetricsURLs []string
	// ProxyMetricsURL is a warden proxy's admin /metrics, for the stayed %
	// column (warden_later_turns_home_total); "": stayed % is null.
	ProxyMetricsURL string
	// PrometheusURL, when set, is a Prometheus server scraping the farm:
	// prefix hit %, replicas busy and stayed % are then the KPIs of
	// metrics/kpi.promql evaluated there over each step's window (a KPI
	// without data keeps the value read from /metrics).
	PrometheusURL string

	Label          string        // the strategy column (the routing the target runs); "": DefaultLabel
	Timeout        time.Duration // per request, wall time; 0: DefaultTimeout
	SampleInterval time.Duration // wall time between samples of the replicas' load; 0: DefaultSampleInterval
	// IgnoreEOS sends vLLM's ignore_eos with OpenAI requests, so answers
	// have the workload's lengths.
	IgnoreEOS bool
	// FreshSteps cuts the requests in flight at every step's end and
	// starts the next step's sessions all at once. false carries the load
	// on, as warden sim does by default and as the product's published
	// benchmark ran: a step's end cuts nothing, the next step adds clients
	// (or, with fewer sessions, retires clients as their sessions end),
	// and only the last step's end cuts. Which one decides the TTFB tail:
	// sessions that start together on one engine stay in step.
	FreshSteps bool
	// Requests, when set, receives one JSON line per request in the shape
	// of warden sim --requests (sim.RequestRecord), as each request ends
	// (finished, failed or cut). Replica is -1: a client does not see which
	// replica served it. Session is the bench's own synthetic UUID.
	Requests io.Writer

	Client *http.Client // nil: a client of bench's own
	// Progress, when set, is called about twice a second with the wall time
	// done and in total.
	Progress func(done, total time.Duration)
	// Warn, when set, receives warnings (a metrics page that failed, ...).
	Warn func(msg string)
}

// Result is a benchmark's outcome: the rows in the shape of `warden sim`
// (Report, whose JSON is what `warden bench --json` prints) and what only a
// client sees.
type Result struct {
	Report   sim.Report
	Model    string
	Steps    []StepStats
	Warnings []string
}

// StepStats are one step's client-side counts.
type StepStats struct {
	Sessions          int
	Start, End        time.Time // wall time: the step began, and was cut
	Sent              int64     // requests sent
	Finished          int64     // answers streamed to their end
	Cut               int64     // in flight at the step's end
	Failed            int64     // errors: status, error event, broken stream, timeout
	FirstError        string    // the first failure, "" if none
	SessionsCompleted int64
	OutputTokens      int64   // streamed: usage of finished answers, deltas of cut ones
	TTFBExactP50      float64 // exact quantiles of the step's TTFBs (target time, s), as the row has them
	TTFBExactP95      float64
	// PromptTokens and CachedTokens sum the usage of finished answers
	// (CachedTokens where the server reports it).
	PromptTokens, CachedTokens int64
}

// withDefaults checks c and fills its zero fields.
func (c Config) withDefaults() (Config, error) {
	u, err := url.Parse(c.Target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("target %q: want an http:// or https:// URL", c.Target)
	}
	c.Target = strings.TrimRight(c.Target, "/")
	if c.API == "" {
		c.API = OpenAI
	}
	if _, err := ParseAPI(string(c.API)); err != nil {
		return c, err
	}
	if len(c.Sessions) == 0 {
		c.Sessions = DefaultSessions
	}
	for _, n := range c.Sessions {
		if n < 1 || n > MaxSessions {
			return c, fmt.Errorf("sessions %d: want 1 to %d", n, MaxSessions)
		}
	}
	if c.Step == 0 {
		c.Step = DefaultStep
	}
	if c.Speed == 0 {
		c.Speed = 1
	}
	if !(c.Speed > 0) || math.IsInf(c.Speed, 0) {
		return c, fmt.Errorf("speed %g: want > 0", c.Speed)
	}
	if c.Step < 0 || c.wall(c.Step) < time.Millisecond {
		return c, fmt.Errorf("step %v at speed %g: want at least 1ms of wall time", c.Step, c.Speed)
	}
	if c.Workload.IsZero() {
		c.Workload = traces.DefaultWorkload()
	}
	if err := c.Workload.Validate(); err != nil {
		return c, fmt.Errorf("workload: %w", err)
	}
	if c.Label == "" {
		c.Label = DefaultLabel
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = DefaultSampleInterval
	}
	if c.Timeout < 0 || c.SampleInterval < 0 {
		return c, errors.New("timeout and sample interval must be positive")
	}
	for _, m := range append(append([]string(nil), c.MetricsURLs...), c.ProxyMetricsURL, c.PrometheusURL) {
		if m == "" {
			continue
		}
		if u, err := url.Parse(m); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c, fmt.Errorf("metrics URL %q: want an http:// or https:// URL", m)
		}
	}
	return c, nil
}

// wall converts a duration of the target's time into wall time.
func (c *Config) wall(d time.Duration) time.Duration { return time.Duration(float64(d) / c.Speed) }

// newClient is bench's HTTP client: connections for every session, dials
// bounded by PreflightTimeout, no overall timeout (each request has its
// own context).
func newClient(maxSessions int) *http.Client {
	d := &net.Dialer{Timeout: PreflightTimeout, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConns:        maxSessions + 8,
		MaxIdleConnsPerHost: maxSessions + 8,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// Run runs the benchmark: a preflight request (an unreachable target is an
// error at once), then each step in turn, back to back, N clients running
// the generator's sessions closed-loop until the step's end cuts them.
// Cancelling ctx ends everything; Run returns once every goroutine it
// started has ended.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	client := cfg.Client
	if client == nil {
		client = newClient(maxOf(cfg.Sessions))
		defer client.CloseIdleConnections()
	}
	r := &runner{cfg: cfg, client: client, res: &Result{}, log: newRequestLog(cfg.Requests)}
	defer r.stopClients()
	if err := r.preflight(ctx); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	r.res.Model = r.cfg.Model
	if err := r.setupMetrics(ctx); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	r.src = &source{gen: traces.NewGenerator(cfg.Workload, 16, cfg.Seed)}
	total := r.cfg.wall(r.cfg.Step) * time.Duration(len(r.cfg.Sessions))
	r.progress = func(done time.Duration) {
		if r.cfg.Progress != nil {
			r.cfg.Progress(min(done, total), total)
		}
	}
	start := r.snapshot(ctx, true)
	for i, n := range r.cfg.Sessions {
		row, st, end, err := r.step(ctx, i, n, start, time.Duration(i)*r.cfg.wall(r.cfg.Step))
		if err != nil {
			return nil, fmt.Errorf("bench: step %d (%d sessions): %w", i+1, n, err)
		}
		r.res.Report.Rows = append(r.res.Report.Rows, row)
		r.res.Steps = append(r.res.Steps, st)
		if st.Finished == 0 && st.Failed > 0 {
			return nil, fmt.Errorf("bench: step %d (%d sessions): all %d requests failed; the first: %s", i+1, n, st.Failed, st.FirstError)
		}
		start = end
	}
	if cfg.PrometheusURL != "" {
		if err := r.fromPrometheus(ctx); err != nil {
			return nil, fmt.Errorf("bench: %w", err) // err names the server
		}
	}
	r.res.Report.Farm = fmt.Sprintf("%s at %s (%s API)", r.cfg.Model, r.cfg.Target, r.cfg.API)
	return r.res, nil
}

func maxOf(v []int) int {
	m := 0
	for _, n := range v {
		m = max(m, n)
	}
	return m
}

// runner is one Run in progress.
type runner struct {
	cfg      Config
	client   *http.Client
	res      *Result
	src      *source
	scr      *scraper // nil: no vLLM metrics
	progress func(done time.Duration)

	// cur is the step whose window is open: every event counts there,
	// when it happens (a TTFB at its first token, as the simulator counts
	// it), whichever step sent the request.
	cur   atomic.Pointer[stepAcc]
	began time.Time // the first step's start: ArrivalS counts from it
	log   *requestLog

	// The clients, which outlive a step when the load carries on.
	mu        sync.Mutex
	level     int    // the open step's sessions: client k retires at a session's end when k >= level
	alive     []bool // client k is running
	clients   sync.WaitGroup
	cutAll    context.CancelFunc // ends every client (nil: none started)
	clientCtx context.Context    // the clients' context, ended by cutAll
}

// stepAcc is one step's counts. Closed once its step's row is taken: a
// client that still held it records in the step that followed.
type stepAcc struct {
	mu       sync.Mutex
	sessions int
	closed   bool
	c        clientStats
}

// record counts an event in the open step.
func (r *runner) record(f func(c *clientStats)) {
	for {
		a := r.cur.Load()
		a.mu.Lock()
		if !a.closed {
			f(&a.c)
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
	}
}

// openStep makes a fresh window for the next step, of n sessions, and
// closes the open one, whose counts it returns.
func (r *runner) openStep(n int) clientStats {
	prev := r.cur.Swap(&stepAcc{sessions: n})
	if prev == nil {
		return clientStats{}
	}
	prev.mu.Lock()
	defer prev.mu.Unlock()
	prev.closed = true
	return prev.c
}

func (r *runner) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.res.Warnings = append(r.res.Warnings, msg)
	if r.cfg.Warn != nil {
		r.cfg.Warn(msg)
	}
}

// preflight asks the target for its models (or, without /v1/models, its
// /health) with a short timeout, and picks the model when none was given.
func (r *runner) preflight(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(PreflightTimeout, r.cfg.Timeout))
	defer cancel()
	get := func(path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.cfg.Target+path, nil)
		if err != nil {
			return nil, err
		}
		setAuth(req.Header, r.cfg.API, r.cfg.APIKey)
		resp, err := r.client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("target %s is unreachable: %w", r.cfg.Target, err)
		}
		return resp, nil
	}
	resp, err := get("/v1/models")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		var v struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v); err != nil {
			return fmt.Errorf("target %s: GET /v1/models: %w", r.cfg.Target, err)
		}
		if r.cfg.Model == "" {
			if len(v.Data) == 0 || v.Data[0].ID == "" {
				return fmt.Errorf("target %s serves no model (GET /v1/models); set --model", r.cfg.Target)
			}
			r.cfg.Model = v.Data[0].ID
		}
		return nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("target %s refused the API key (GET /v1/models: %s); set --api-key", r.cfg.Target, resp.Status)
	}
	h, err := get("/health")
	if err != nil {
		return err
	}
	h.Body.Close()
	if h.StatusCode != http.StatusOK {
		return fmt.Errorf("target %s: GET /v1/models: %s, GET /health: %s", r.cfg.Target, resp.Status, h.Status)
	}
	if r.cfg.Model == "" {
		return fmt.Errorf("target %s lists no models (GET /v1/models: %s); set --model", r.cfg.Target, resp.Status)
	}
	return nil
}

// setupMetrics reads every metrics page once: a page that was asked for
// must answer; the default one may fail (the columns are then null).
func (r *runner) setupMetrics(ctx context.Context) error {
	urls, explicit := r.cfg.MetricsURLs, true
	if len(urls) == 0 {
		urls, explicit = []string{r.cfg.Target + "/metrics"}, false
	}
	scr := &scraper{client: r.client, urls: urls, proxy: r.cfg.ProxyMetricsURL, model: r.cfg.Model}
	ctx, cancel := context.WithTimeout(ctx, PreflightTimeout)
	defer cancel()
	f := scr.scrape(ctx, true)
	if f.proxyErr != nil {
		return fmt.Errorf("proxy metrics: %w", f.proxyErr)
	}
	switch {
	case f.err == nil:
	case explicit:
		return fmt.Errorf("metrics: %w", f.err)
	default:
		r.warn("no vLLM metrics at %s (%v): prefix hit %% and replicas busy are null; give --metrics-url", urls[0], f.err)
		scr.urls = nil
	}
	r.scr = scr
	return nil
}

// snapshot reads the farm (and the proxy, with withProxy) now; a failure is
// a warning and an empty farm.
func (r *runner) snapshot(ctx context.Context, withProxy bool) farm {
	ctx, cancel := context.WithTimeout(ctx, PreflightTimeout)
	defer cancel()
	f := r.scr.scrape(ctx, withProxy)
	if ctx.Err() == nil {
		for _, err := range []error{f.err, f.proxyErr} {
			if err != nil {
				r.warn("metrics: %v", err)
			}
		}
	}
	return f
}

// source hands out the generator's sessions to concurrent clients.
type source struct {
	mu  sync.Mutex
	gen *traces.Generator
}

func (s *source) next() traces.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, _ := s.gen.NextSession()
	return sess
}

// clientStats are one client's counts over one step (merged at its end).
type clientStats struct {
	sent, finished, cut, failed int64
	firstErr                    string
	completed, outputTokens     int64
	promptTokens, cachedTokens  int64
	ttfbs                       []float64 // target time, s
}

// samples are the replicas' load sampled during a step.
type samples struct {
	n      int
	busy   float64
	kvSum  []float64
	kvMax  []float64
	failed int
}

// step runs step i, of n sessions, starting from the farm's state start;
// at is the wall time of the run before it (for progress). With the load
// carried on (not Config.FreshSteps) the clients of the previous step go on
// and the step adds or retires clients; only the last step's end cuts.
func (r *runner) step(ctx context.Context, i, n int, start farm, at time.Duration) (sim.Row, StepStats, farm, error) {
	st := StepStats{Sessions: n, Start: time.Now()}
	last := i == len(r.cfg.Sessions)-1
	if i == 0 {
		r.began = st.Start
		r.cur.Store(&stepAcc{sessions: n}) // later steps' windows open at the end of the one before
	}
	r.startClients(ctx, n, i == 0 || r.cfg.FreshSteps)
	stepCtx, endStep := context.WithCancel(ctx)
	defer endStep()
	var smp samples
	var sampler sync.WaitGroup
	if len(r.scr.urls) > 0 {
		sampler.Go(func() { r.sample(stepCtx, &smp) })
	}
	wall := r.cfg.wall(r.cfg.Step)
	timer := time.NewTimer(wall)
	tick := time.NewTicker(500 * time.Millisecond)
	r.progress(at)
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-timer.C:
			break wait
		case <-tick.C:
			r.progress(at + time.Since(st.Start))
		}
	}
	timer.Stop()
	tick.Stop()
	st.End = time.Now()
	next := n
	if !last {
		next = r.cfg.Sessions[i+1]
	}
	// The window closes now: carried on, what happens from here counts in
	// the next step; cut, the clients' requests in flight end as cut, in
	// this one.
	cutting := last || r.cfg.FreshSteps || ctx.Err() != nil
	var c clientStats
	if cutting {
		r.cutClients()
	} else {
		c = r.openStep(next)
	}
	endStep()
	sampler.Wait()
	if cutting {
		r.stopClients()
		c = r.openStep(next)
	}
	if err := r.log.failed(); err != nil {
		return sim.Row{}, st, farm{}, fmt.Errorf("--requests: %w", err)
	}
	r.progress(at + wall)
	if err := ctx.Err(); err != nil {
		return sim.Row{}, st, farm{}, err
	}
	end := r.snapshot(ctx, true)
	st.Sent, st.Finished, st.Cut, st.Failed = c.sent, c.finished, c.cut, c.failed
	st.SessionsCompleted, st.OutputTokens = c.completed, c.outputTokens
	st.PromptTokens, st.CachedTokens = c.promptTokens, c.cachedTokens
	st.FirstError = c.firstErr
	st.TTFBExactP50, st.TTFBExactP95 = num.QuantileOf(c.ttfbs, 0.5), num.QuantileOf(c.ttfbs, 0.95)
	return r.row(n, &st, start, end, &smp), st, end, nil
}

// startClients sets the open step's level to n and starts the clients
// below it that are not running; fresh ends every client first (a fresh
// step's sessions all start at once).
func (r *runner) startClients(ctx context.Context, n int, fresh bool) {
	if fresh {
		r.stopClients()
		cctx, cut := context.WithCancel(ctx)
		r.mu.Lock()
		r.cutAll = cut
		r.clientCtx = cctx
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.level = n
	for len(r.alive) < n {
		r.alive = append(r.alive, false)
	}
	for k := range n {
		if !r.alive[k] {
			r.alive[k] = true
			r.clients.Go(func() { r.client1(r.clientCtx, k) })
		}
	}
}

// cutClients cuts every client's context: their requests in flight end
// as cut.
func (r *runner) cutClients() {
	r.mu.Lock()
	cut := r.cutAll
	r.cutAll = nil
	r.mu.Unlock()
	if cut != nil {
		cut()
	}
}

// stopClients cuts every client and waits for them to end.
func (r *runner) stopClients() {
	r.cutClients()
	r.clients.Wait()
	r.mu.Lock()
	clear(r.alive)
	r.mu.Unlock()
}

// retire reports whether client k ends now, between two sessions: the
// open step holds fewer sessions than k+1.
func (r *runner) retire(k int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k < r.level {
		return false
	}
	r.alive[k] = false
	return true
}

// row computes the step's row.
func (r *runner) row(n int, st *StepStats, start, end farm, smp *samples) sim.Row {
	durS := st.End.Sub(st.Start).Seconds() * r.cfg.Speed
	nan := sim.Float(math.NaN())
	row := sim.Row{
		Strategy:           r.cfg.Label,
		Sessions:           n,
		SessionsPerHour:    sim.Float(float64(st.SessionsCompleted) * 3600 / durS),
		OutputTokensPerMin: sim.Float(float64(st.OutputTokens) * 60 / durS),
		// The simulator's KPI is the exact quantile within 2 % (native
		// histograms), so the client's exact quantiles compare like with like.
		TTFBP50:      sim.Float(st.TTFBExactP50),
		TTFBP95:      sim.Float(st.TTFBExactP95),
		ReplicasBusy: nan,
		PrefixHitPct: nan,
		StayedPct:    nan,
		DurationS:    sim.Float(durS),
		Finished:     st.Finished,
		Unfinished:   st.Cut + st.Failed,
	}
	if smp.n > 0 {
		row.ReplicasBusy = sim.Float(smp.busy / float64(smp.n))
	}
	if a, b := start.engines, end.engines; len(a) == len(b) && len(a) > 0 && start.err == nil && end.err == nil {
		row.PrefixHitPct = sim.Float(hitPct(a, b))
		for i := range a {
			rr := sim.ReplicaRow{
				Replica:     i,
				Requests:    int64(b[i].Requests - a[i].Requests),
				HitPct:      sim.Float(ratioPct(b[i].PrefixHits-a[i].PrefixHits, b[i].PrefixQueries-a[i].PrefixQueries)),
				Preemptions: int64(b[i].Preemptions - a[i].Preemptions),
				KVUsageMean: nan,
				KVUsageMax:  nan,
				Sticky:      int64(end.proxy.Sticky[i] - start.proxy.Sticky[i]),
				SpilledIn:   int64(end.proxy.Spilled[i] - start.proxy.Spilled[i]),
			}
			if smp.n > 0 && i < len(smp.kvSum) {
				rr.KVUsageMean = sim.Float(smp.kvSum[i] / float64(smp.n))
				rr.KVUsageMax = sim.Float(smp.kvMax[i])
			}
			row.Preemptions += rr.Preemptions
			row.Replicas = append(row.Replicas, rr)
		}
	}
	if start.proxy.ok && end.proxy.ok {
		row.StayedPct = sim.Float(ratioPct(end.proxy.LaterHome-start.proxy.LaterHome, end.proxy.LaterTurns-start.proxy.LaterTurns))
	}
	return row
}

// sample reads the replicas' load every SampleInterval until ctx ends:
// replicas busy (requests running or waiting) and KV use. A sample whose
// pages did not all answer, or whose engine count changed, is dropped.
func (r *runner) sample(ctx context.Context, s *samples) {
	t := time.NewTicker(r.cfg.SampleInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f := r.scr.scrape(ctx, false)
		if f.err != nil || ctx.Err() != nil {
			s.failed++
			continue
		}
		if s.kvSum == nil {
			s.kvSum, s.kvMax = make([]float64, len(f.engines)), make([]float64, len(f.engines))
		}
		if len(f.engines) != len(s.kvSum) {
			s.failed++
			continue
		}
		s.n++
		s.busy += float64(f.busy())
		for i, e := range f.engines {
			s.kvSum[i] += e.KVUsage
			s.kvMax[i] = max(s.kvMax[i], e.KVUsage)
		}
	}
}

// client1 is closed-loop client k: sessions one after another, each turn
// sent when the previous answer has ended plus the turn's think time,
// until ctx ends or, between two sessions, the open step holds fewer than
// k+1 sessions.
func (r *runner) client1(ctx context.Context, k int) {
	defer func() {
		r.mu.Lock()
		r.alive[k] = false
		r.mu.Unlock()
	}()
	spec := &requestSpec{target: r.cfg.Target, api: r.cfg.API, model: r.cfg.Model, apiKey: r.cfg.APIKey, ignoreEOS: r.cfg.IgnoreEOS}
	for ctx.Err() == nil && !r.retire(k) {
		s := r.src.next()
		conv := NewConversation(s, r.cfg.Workload.SystemPromptTokens, r.cfg.Seed, r.cfg.API)
		completed := true
		for turn := range s.Turns {
			t := &s.Turns[turn]
			if t.ThinkMs > 0 && !sleep(ctx, r.cfg.wall(time.Duration(t.ThinkMs)*time.Millisecond)) {
				return
			}
			msgs := conv.Prompt(turn)
			r.record(func(c *clientStats) { c.sent++ })
			o, err := r.send(ctx, spec, conv, msgs, t.OutputTokens)
			r.log.add(r, conv.UUID, turn, o, err == nil)
			if err != nil {
				cut := ctx.Err() != nil
				r.record(func(c *clientStats) {
					c.outputTokens += int64(o.Deltas)
					if cut {
						c.cut++
						return
					}
					c.failed++
					if c.firstErr == "" {
						c.firstErr = err.Error()
					}
				})
				if cut {
					return
				}
				completed = false
				if !sleep(ctx, r.cfg.wall(failBackoff)) {
					return
				}
				break
			}
			r.record(func(c *clientStats) {
				c.finished++
				c.outputTokens += int64(o.Tokens)
				if o.PromptTokens >= 0 {
					c.promptTokens += int64(o.PromptTokens)
				}
				if o.CachedTokens >= 0 {
					c.cachedTokens += int64(o.CachedTokens)
				}
			})
			conv.Answer(o.Text)
		}
		if completed {
			r.record(func(c *clientStats) { c.completed++ })
		}
	}
}

// send sends one request and reads its stream, within the request timeout.
func (r *runner) send(ctx context.Context, spec *requestSpec, conv *Conversation, msgs []Message, maxTokens int) (outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	o := outcome{TTFB: -1, PromptTokens: -1, CachedTokens: -1}
	req, err := newRequest(ctx, spec, conv, msgs, maxTokens)
	if err != nil {
		return o, err
	}
	sent := time.Now()
	o.sent = sent
	level := 0 // the open step's sessions at the first token
	resp, err := r.client.Do(req)
	if err != nil {
		return o, timeoutErr(ctx, r.cfg.Timeout, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return o, statusError(resp)
	}
	// readStream asks the time once, at the first text delta: the TTFB
	// counts in the step open then.
	o, err = readStream(resp.Body, spec.api, sent, func() time.Time {
		now := time.Now()
		ttfb := now.Sub(sent).Seconds() * r.cfg.Speed
		r.record(func(c *clientStats) { c.ttfbs = append(c.ttfbs, ttfb) })
		level = r.openSessions()
		return now
	})
	o.sent, o.elapsed, o.level = sent, time.Since(sent), level
	if err != nil {
		return o, timeoutErr(ctx, r.cfg.Timeout, err)
	}
	return o, nil
}

// timeoutErr names a request timeout as such.
func timeoutErr(ctx context.Context, d time.Duration, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no complete answer within the request timeout (%v): %w", d, err)
	}
	return err
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
