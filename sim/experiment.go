package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/lm-warden/warden/internal/num"
	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// Defaults of an Experiment.
var (
	// DefaultStrategies is "off -> on": vLLM's own balancer, then affinity.
	DefaultStrategies = []string{placement.StrategyLeastLoaded, placement.StrategyAffinity}
	// DefaultSessions are the steps of the product's published benchmark.
	DefaultSessions = []int{4, 8, 16, 24, 32}
)

// DefaultDuration is the length of one measured step.
const DefaultDuration = 3 * time.Minute

// Experiment is what to simulate: a farm, the strategies to compare and
// the load. Each strategy runs on a fresh copy of the farm (cold caches);
// within a strategy the steps run back to back on the same, warm replicas.
//
// Without a Trace the load is synthetic agent sessions (Workload, Seed) in a
// closed loop, Sessions[i] at a time for Duration each. With a Trace it is a
// replay: open loop at the recorded arrival times (divided by Speed), or,
// with ClosedLoop, the trace's sessions in a closed loop with Sessions[0]
// (or the trace header's concurrency) at a time, or, with SessionReplay,
// each session from its recorded start with its turns paced by the farm.
type Experiment struct {
	Farm       *Farm
	Strategies []string                  // nil: DefaultStrategies
	Spill      *placement.SpillThreshold // nil: the farm's routing.spill_threshold

	Workload traces.Workload // zero: traces.DefaultWorkload()
	Sessions []int           // nil: DefaultSessions (closed loop)
	Duration time.Duration   // per step; 0: DefaultDuration (replay: until the trace is done)
	Seed     uint64
	// FreshSteps starts every step's sessions afresh, all at once, the
	// previous step's requests cut (unfinished), as warden bench
	// --fresh-steps runs its steps (bench.Config.FreshSteps); false carries the load on from step to step,
	// as the product's published benchmark describes its steps. It decides
	// the TTFB tail: sessions that start together on one engine stay in
	// step, and each of their first turns queues behind another's prefill.
	FreshSteps bool

	Trace      *Trace
	Speed      float64 // replay speed-up (open loop, session replay); 0 means 1
	ClosedLoop bool
	// SessionReplay replays the Trace session by session: each starts at
	// its first request's recorded arrival, its later turns paced by the
	// farm's answers plus the recorded think times (sessionReplay).
	SessionReplay bool

	// Progress, when set, is called now and then with the simulated time
	// done and in total, summed over strategies. Calls are serialised.
	Progress func(done, total time.Duration)

	// Requests, when set, receives one JSON line per request
	// (RequestRecord), strategy after strategy in the order given.
	Requests io.Writer

	// TimelineStep > 0 adds a Timeline per strategy to the report: the
	// run from its cold start to its end, a point every TimelineStep.
	TimelineStep time.Duration

	// OnStore, when set, receives each strategy's metric store once its
	// run is over (simulated time starts at the Unix epoch), so that a
	// caller can evaluate any PromQL on the series, as calibration does.
	// Calls come from the strategies' goroutines, possibly concurrently.
	OnStore func(strategy string, st *metrics.Store)

	// lean: the runs' stores are read by nobody but Run (OnStore is nil),
	// which needs only the series of rowKPIs.
	lean bool

	// everHint will hold about how many distinct block hashes Trace holds
	// (Trace.hashCount), nil when unknown: room each run reserves in its
	// record of the hashes ever cached once it is known.
	everHint *hashHint
}

// withDefaults fills the zero fields and checks the rest.
func (e Experiment) withDefaults() (Experiment, error) {
	if e.Farm == nil {
		return e, errors.New("sim: experiment without a farm")
	}
	if len(e.Strategies) == 0 {
		e.Strategies = DefaultStrategies
	}
	strategies, err := placement.ExpandSpecs(e.Strategies)
	if err != nil {
		return e, fmt.Errorf("sim: %w", err)
	}
	e.Strategies = strategies
	if e.Spill == nil {
		e.Spill = &e.Farm.Spill
	}
	if e.Workload.IsZero() {
		e.Workload = traces.DefaultWorkload()
	}
	if err := e.Workload.Validate(); err != nil {
		return e, fmt.Errorf("sim: workload: %w", err)
	}
	if len(e.Sessions) == 0 {
		e.Sessions = DefaultSessions
		if e.Trace != nil && e.Trace.Header.Concurrency > 0 {
			e.Sessions = []int{e.Trace.Header.Concurrency}
		}
	}
	for _, n := range e.Sessions {
		if n < 1 || n > maxClients {
			return e, fmt.Errorf("sim: sessions %d: want 1 to %d", n, maxClients)
		}
	}
	if e.Duration == 0 && e.Trace == nil {
		e.Duration = DefaultDuration
	}
	e.Duration = e.Duration.Truncate(time.Millisecond)
	if e.Duration < 0 || (e.Trace == nil && e.Duration < time.Duration(e.Farm.Spec.ScrapeInterval)) {
		return e, fmt.Errorf("sim: duration %v: want at least one scrape interval (%v)", e.Duration, time.Duration(e.Farm.Spec.ScrapeInterval))
	}
	if e.Speed == 0 {
		e.Speed = 1
	}
	if !(e.Speed > 0) || math.IsInf(e.Speed, 0) {
		return e, fmt.Errorf("sim: speed %g: want > 0", e.Speed)
	}
	if e.SessionReplay && (e.Trace == nil || e.ClosedLoop) {
		return e, errors.New("sim: a session replay needs a trace and no closed loop")
	}
	if e.Trace != nil && e.Trace.Header.BlockSize != e.Farm.Spec.VLLM.BlockSize {
		return e, fmt.Errorf("sim: trace %s has block_size %d, the farm's vllm.block_size is %d: hash ids must be of the farm's block size",
			e.Trace.Name, e.Trace.Header.BlockSize, e.Farm.Spec.VLLM.BlockSize)
	}
	return e, nil
}

// Run runs the experiment: the strategies in parallel, each on its own
// goroutine and its own copy of the farm. The report's rows go step by
// step, strategies in the order given.
func Run(ctx context.Context, e Experiment) (*Report, error) {
	e, err := e.withDefaults()
	if err != nil {
		return nil, err
	}
	e.lean = e.OnStore == nil && e.TimelineStep <= 0
	var wg sync.WaitGroup
	if e.Trace != nil {
		// Counting reads every hash id once more: on a core of its own
		// when there is one, while the runs start.
		e.everHint = newHashHint(len(e.Strategies))
		count := func() { e.everHint.prepare(e.Trace, len(e.Strategies)) }
		if runtime.GOMAXPROCS(0) > 1 {
			wg.Go(count)
		} else {
			count()
		}
	}
	prog := newProgress(e)
	rows := make([][]Row, len(e.Strategies))
	errs := make([]error, len(e.Strategies))
	logs := make([]*requestLog, len(e.Strategies))
	timelines := make([]*Timeline, len(e.Strategies))
	for i, s := range e.Strategies {
		wg.Go(func() {
			var r *run
			rows[i], r, errs[i] = runStrategy(ctx, e, s, prog.slot(i))
			if errs[i] == nil {
				logs[i] = r.log
				if e.TimelineStep > 0 {
					timelines[i], errs[i] = r.timeline(ctx, r.name, r.now, e.TimelineStep)
				}
				if e.OnStore != nil {
					e.OnStore(s, r.rec.store)
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if e.Requests != nil {
		for _, l := range logs {
			if _, err := l.buf.WriteTo(e.Requests); err != nil {
				return nil, fmt.Errorf("sim: writing the request records: %w", err)
			}
		}
	}
	rep := &Report{Farm: e.Farm.Name()}
	for k := range rows[0] {
		for i := range rows {
			rep.Rows = append(rep.Rows, rows[i][k])
		}
	}
	for _, tl := range timelines {
		if tl != nil {
			rep.Timelines = append(rep.Timelines, *tl)
		}
	}
	return rep, nil
}

// progress sums the simulated time of the strategies' goroutines.
type progress struct {
	mu    sync.Mutex
	f     func(done, total time.Duration)
	done  []time.Duration
	total time.Duration
}

func newProgress(e Experiment) *progress {
	p := &progress{f: e.Progress, done: make([]time.Duration, len(e.Strategies))}
	per := e.Duration * time.Duration(len(e.Sessions))
	if e.Trace != nil {
		per = e.Duration
		if per == 0 && len(e.Trace.Requests) > 0 && !e.ClosedLoop {
			per = time.Duration(float64(e.Trace.Requests[len(e.Trace.Requests)-1].ArrivalMs)/e.Speed) * time.Millisecond
		}
	}
	p.total = per * time.Duration(len(e.Strategies))
	return p
}

// slot returns the callback of strategy i (nil when there is no Progress).
func (p *progress) slot(i int) func(time.Duration) {
	if p.f == nil {
		return nil
	}
	return func(d time.Duration) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.done[i] = d
		var sum time.Duration
		for _, v := range p.done {
			sum += v
		}
		p.f(min(sum, p.total), p.total)
	}
}

// window is one measured step of one strategy.
type window struct {
	sessions   int
	start, end mark
	unfinished int64 // cut at the end (rejections come from the marks)
	ttfbs      []float64
	censored   int64 // TTFBs counted with the wait they had at the end
}

// progressQuantum is how much simulated time passes between progress calls.
const progressQuantum = 5 * usPerSec

// runStrategy runs one strategy of e and returns its rows and, for tests,
// the run in its final state. e's driver (stepsDriver) runs its own steps.
func runStrategy(ctx context.Context, e Experiment, strategy string, progress func(time.Duration)) ([]Row, *run, error) {
	r, err := newRunLean(e.Farm, strategy, *e.Spill, e.lean, e.Seed)
	if err != nil {
		return nil, nil, err
	}
	if len(r.reps) > 0 && r.reps[0].pool.ever != nil {
		// A 1.5 M-id trace has some 200 k distinct: growing to them costs
		// a tenth of the run (rehashing and fresh memory).
		r.everHint = e.everHint
		r.reserveEver()
	}
	if e.Trace == nil {
		r.shared = e.Workload.SharedPrefixTokens() // the synthetic sessions' common system prompt
	}
	if e.Trace == nil && !keepEveryHash {
		// The synthetic sessions share their system prompt's full blocks
		// alone: every later block is one session's own (sessionOver).
		r.forgetOwn = true
	}
	if e.Requests != nil {
		r.log = newRequestLog(r.name)
	}
	if err := e.vllmFrontend(r, strategy); err != nil {
		return nil, nil, err
	}
	r.rec.store.Grow(expectedScrapes(e, r.scrapeUs))
	r.scrape()
	r.ev.push(r.scrapeUs, evScrape, 0)
	if iv := r.router.ScrapeInterval().Microseconds(); iv > 0 && iv < r.scrapeUs {
		// The policy reads the gauges more often than the farm is
		// scraped (llm-d: every 50 ms).
		r.refreshUs = iv
		r.ev.push(iv, evRefresh, 0)
	}
	st := &stepper{ctx: ctx, r: r, progress: progress, start: r.takeMark()}
	r.rt.ttfbs = r.rt.ttfbs[:0]
	d := e.newDriver(r)
	r.drv = d
	if err := d.steps(st, &e); err != nil {
		return nil, nil, err
	}
	ev := metrics.NewEvaluator()
	rows := make([]Row, 0, len(st.windows))
	for _, w := range st.windows {
		row, err := r.row(ctx, ev, r.name, w)
		if err != nil {
			return nil, nil, err
		}
		rows = append(rows, row)
	}
	return rows, r, nil
}

// vllmFrontend puts vLLM's data-parallel front end before r's replicas
// when the strategy is vLLM's own least-loaded balancer.
func (e Experiment) vllmFrontend(r *run, strategy string) error {
	if strategy != placement.StrategyLeastLoaded || e.Farm.Spec.Replicas <= 1 || e.Farm.Spec.Routing.Balancer != BalancerVLLM {
		return nil
	}
	if e.Farm.Model.IsMoE() {
		return &moeBalancerError{model: e.Farm.Model.Name}
	}
	v := e.Farm.Spec.VLLM
	mode := e.Workload.Connections
	if mode == "" {
		mode = traces.ConnectionsPool
	}
	r.front = newDPFrontend(e.Farm.Spec.Replicas, v.APIServerCount, time.Duration(v.StatsUpdateInterval).Microseconds(), e.Farm.Behaviour, mode, e.Seed)
	// The coordinator's first poll times out at once (its last
	// publication is at time 0), then every 5 s when nothing changed.
	r.ev.push(0, evPublish, publishRepublish)
	return nil
}

// stepsDriver is a driver that runs the steps of an experiment on a
// stepper: a closed loop one per sessions level, a replay one.
type stepsDriver interface {
	driver
	steps(st *stepper, e *Experiment) error
}

// newDriver returns the driver of e's load on r: synthetic sessions or a
// trace's in a closed loop, a session replay, or an open-loop replay.
func (e *Experiment) newDriver(r *run) stepsDriver {
	switch {
	case e.Trace == nil || e.ClosedLoop:
		return newClosedLoopFor(e, r)
	case e.SessionReplay:
		return newSessionReplay(e.Trace, e.Speed, micros(e.Workload.ClientTurnaround))
	default:
		return &openLoop{reqs: e.Trace.Requests, speed: e.Speed, homes: map[string]int{}}
	}
}

// stepper runs one strategy's run through the steps its driver gives it:
// it advances simulated time (reporting progress) and closes each step's
// measured window.
type stepper struct {
	ctx      context.Context
	r        *run
	progress func(time.Duration) // nil: none
	start    mark                // the open window's start
	windows  []window
}

// advance runs the events until until, or until the run stops or has no
// event left, calling progress every progressQuantum of simulated time.
func (st *stepper) advance(until int64) error {
	r := st.r
	for r.now < until && !r.stopped {
		next := until
		if st.progress != nil {
			next = min(until, r.now+progressQuantum)
		}
		if err := r.loop(st.ctx, next); err != nil {
			return err
		}
		if r.ev.len() == 0 {
			break
		}
		if !r.stopped {
			r.now = next
		}
		if st.progress != nil {
			st.progress(time.Duration(r.now) * time.Microsecond)
		}
	}
	return nil
}

// runFor runs until dur (0: until idle or the end of the trace) from
// now, with a stop event at the end.
func (st *stepper) runFor(dur int64) error {
	r := st.r
	until := int64(math.MaxInt64)
	if dur > 0 {
		until = r.now + dur
		r.ev.push(until, evStop, 0)
	}
	r.checkIdle()
	return st.advance(until)
}

// closeWindow ends the open window of a step at sessions, cut returning
// the requests the step's end cut, and opens the next.
func (st *stepper) closeWindow(sessions int, cut func() int) {
	r := st.r
	censored := r.censorTTFBs()
	if r.lastScrape != r.now {
		r.scrape()
	}
	end := r.takeMark()
	w := window{sessions: sessions, start: st.start, end: end, ttfbs: slices.Clone(r.rt.ttfbs), censored: censored}
	w.unfinished = int64(cut())
	st.windows = append(st.windows, w)
	r.rt.ttfbs = r.rt.ttfbs[:0]
	st.start = end
}

// rowKPIs are the KPIs of metrics/kpi.promql a Row holds. A lean
// recorder writes the series they read: vllm:prefix_cache_queries_total
// and _hits_total, warden_in_flight, warden_output_tokens_total,
// warden_sessions_completed_total, warden_later_turns_total and
// _home_total, warden_ttfb_seconds (TestLeanRunsAgree).
var rowKPIs = []string{"sessions_per_hour", "output_tokens_per_min", "ttfb_p50_s", "ttfb_p95_s", "replicas_busy", "prefix_hit_pct", "stayed_pct"}

// expectedScrapes is about how many scrape instants a run of e writes (a
// replay's is a guess: its last arrival), at most maxReservedScrapes:
// room the recorder reserves in every series up front.
func expectedScrapes(e Experiment, scrapeUs int64) int {
	us := micros(e.Duration) * int64(len(e.Sessions))
	if e.Trace != nil {
		us = micros(e.Duration)
		if us == 0 && len(e.Trace.Requests) > 0 && !e.ClosedLoop {
			us = int64(float64(e.Trace.Requests[len(e.Trace.Requests)-1].ArrivalMs) * usPerMs / e.Speed)
		}
	}
	n := us / max(scrapeUs, 1)
	if e.Trace != nil && e.Duration == 0 {
		n += n/4 + 16 // the requests still in flight at the last arrival drain after it
	}
	return int(min(n+2, maxReservedScrapes))
}

// maxReservedScrapes bounds the samples reserved per series (longer runs
// grow their series as they go).
const maxReservedScrapes = 1 << 12

// row computes one row: the KPIs by PromQL over the window, the rest (and
// the same columns again, for the tests) directly from the marks.
func (r *run) row(ctx context.Context, ev *metrics.Evaluator, strategy string, w window) (Row, error) {
	s, t := w.start, w.end
	winMs := (t.atUs - s.atUs) / usPerMs
	row := Row{
		Strategy:   strategy,
		Sessions:   w.sessions,
		DurationS:  Float(float64(winMs) / 1000),
		Finished:   t.router.finished - s.router.finished,
		Unfinished: w.unfinished + t.router.unfinished - s.router.unfinished,
		Censored:   w.censored,

		AdmissionWaits:   t.router.admissionWaits - s.router.admissionWaits,
		AdmissionRefused: t.router.admissionRefused - s.router.admissionRefused,
		AdmissionRetries: t.router.admissionRetries - s.router.admissionRetries,
	}
	if paused := t.router.pausedUs - s.router.pausedUs; paused > 0 {
		row.PausedPct = Float(pct(paused, paused+t.router.requestUs-s.router.requestUs))
	}
	d := &row.direct
	d.laterTurns = t.router.stay.Later - s.router.stay.Later
	d.home = t.router.stay.Home - s.router.stay.Home
	d.sessionsCompleted = t.router.sessionsCompleted - s.router.sessionsCompleted
	if n := t.samples - s.samples; n > 0 {
		d.busyMean = float64(t.busySum-s.busySum) / float64(n)
	}
	sorted := slices.Clone(w.ttfbs)
	slices.Sort(sorted)
	d.ttfbP50, d.ttfbP95 = num.Quantile(sorted, 0.5), num.Quantile(sorted, 0.95)
	var admitQ, admitH int64
	for i := range r.reps {
		a, b := s.engines[i], t.engines[i]
		d.queries += b.queries - a.queries
		d.hits += b.hits - a.hits
		admitQ += b.admitQueries - a.admitQueries
		admitH += b.admitHits - a.admitHits
		d.outputTokens += b.generationTokens - a.generationTokens
		d.prefillComputed += b.prefillComputed - a.prefillComputed
		d.prefillAbandoned += b.prefillAbandoned - a.prefillAbandoned
		d.preemptedQueries += b.preemptedQueries - a.preemptedQueries
		d.preemptedHits += b.preemptedHits - a.preemptedHits
		miss := b.miss.sub(a.miss)
		row.MissTokens.Cold += miss.Cold
		row.MissTokens.Evicted += miss.Evicted
		row.MissTokens.Elsewhere += miss.Elsewhere
		row.MissTokens.Partial += miss.Partial
		row.Preemptions += b.preemptions - a.preemptions

		rr := ReplicaRow{Replica: i, Preemptions: b.preemptions - a.preemptions}
		for reason := range numReasons {
			rr.Requests += t.requests[i][reason] - s.requests[i][reason]
		}
		rr.Sticky = t.requests[i][placement.ReasonSticky] - s.requests[i][placement.ReasonSticky]
		rr.SpilledIn = t.requests[i][placement.ReasonSpill] - s.requests[i][placement.ReasonSpill]
		kvMean := math.NaN()
		if n := t.samples - s.samples; n > 0 {
			kvMean = (t.kvSum[i] - s.kvSum[i]) / float64(n)
		}
		rr.KVUsageMean = Float(kvMean)
		rr.KVUsageMax = Float(t.kvMax[i])
		rr.SessionsMin, rr.SessionsMax = -1, -1
		if i < len(t.heldMin) && t.heldMin[i] >= 0 {
			rr.SessionsMin, rr.SessionsMax = int(t.heldMin[i]), int(t.heldMax[i])
		}
		hit := pct(b.hits-a.hits, b.queries-a.queries)
		rr.HitPct = Float(hit)
		d.replicaHitPct = append(d.replicaHitPct, hit)
		d.replicaKVUsageMean = append(d.replicaKVUsageMean, kvMean)
		row.Replicas = append(row.Replicas, rr)
	}

	row.AdmissionHitPct = Float(pct(admitH, admitQ))
	d.admitQ, d.admitH = admitQ, admitH
	if winMs <= 0 {
		nan := Float(math.NaN())
		row.SessionsPerHour, row.OutputTokensPerMin, row.TTFBP50, row.TTFBP95 = nan, nan, nan, nan
		row.ReplicasBusy, row.PrefixHitPct, row.StayedPct = nan, nan, nan
		return row, nil
	}
	kpi, err := ev.KPIValuesFor(ctx, r.rec.store, r.model, time.UnixMilli(t.atUs/usPerMs), time.Duration(winMs)*time.Millisecond, rowKPIs...)
	if err != nil {
		return row, err
	}
	row.SessionsPerHour = Float(kpi["sessions_per_hour"])
	row.OutputTokensPerMin = Float(kpi["output_tokens_per_min"])
	row.TTFBP50 = Float(kpi["ttfb_p50_s"])
	row.TTFBP95 = Float(kpi["ttfb_p95_s"])
	row.ReplicasBusy = Float(kpi["replicas_busy"])
	row.PrefixHitPct = Float(kpi["prefix_hit_pct"])
	row.StayedPct = Float(kpi["stayed_pct"])
	return row, nil
}
