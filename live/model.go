package live

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/placement"
)

// Passive ejection and recovery (outlier detection as Envoy does it). A
// replica whose connection is refused is ejected at once; one that answers
// ejectConsecutive times in a row with a 5xx or a stream timeout
// (timeouts.first_token, timeouts.stream_idle) is ejected too. Either is
// ejected for a back-off that doubles with each consecutive failure
// (ejectBase, 2*ejectBase, ... up to ejectMax); at most half of a model's
// replicas (rounded down: never the only replica) are ejected at once, so a
// network blip cannot empty a farm. When its back-off ends the
// replica warms up for warmup: it is shown to the policy as healthy for a
// share of picks that grows linearly from warmStart to 100 %, so new
// conversations come back to it gradually instead of all at once.
const (
	ejectBase = time.Second
	ejectMax  = 30 * time.Second
	warmup    = 30 * time.Second
	warmStart = 0.1
	// ejectConsecutive is the number of consecutive 5xx answers or stream
	// timeouts that eject a replica. Envoy's consecutive_5xx default is 5;
	// 3 here because one stall timeout already costs its client
	// timeouts.stream_idle or timeouts.first_token.
	ejectConsecutive = 3
)

// numCounted is the number of reasons a replica counts: placement's
// reasons plus "retried".
const numCounted = 8

const reasonRetried = numCounted - 1 // index of "retried" in replica.byReason

// reasonName returns the metric label of a counted reason index.
func reasonName(i int) string {
	if i == reasonRetried {
		return "retried"
	}
	return placement.Reason(i).String()
}

// replica is one target of a model: its own server (URL layout) or one
// data-parallel rank of a shared server (DP layout).
type replica struct {
	id     int
	target *url.URL
	rank   string   // X-data-parallel-rank value; "" in the URL layout
	server *scraper // the server whose /metrics describe this replica
	engine int      // engine label to read; -1: sum the whole server

	inFlight atomic.Int64                // requests sent, response not finished
	byReason [numCounted]atomic.Int64    // requests served here, by reason
	upErrors atomic.Int64                // upstream failures seen here
	base     atomic.Pointer[EngineStats] // counters at the first good scrape, for since-start rates

	failures atomic.Int32 // consecutive ejections without a good response since
	strikes  atomic.Int32 // consecutive 5xx answers and stream timeouts

	// Ejection state, guarded by model.mu.
	ejectedUntil time.Time // zero: not ejected
	warmUntil    time.Time // after ejectedUntil: warming up until then
	warmPicks    uint64    // picks seen while warming
}

// stats returns the replica's scraped figures from r; false when r has
// none. A value, not a pointer: fill calls it on every pick.
func (rep *replica) stats(r *ScrapeResult) (EngineStats, bool) {
	if rep.engine < 0 {
		return r.total()
	}
	return r.engine(rep.engine)
}

// model is the routing state of one served model: its replicas, scrapers,
// placement policy and session table. The policy, the table and the
// ejection fields are guarded by mu; everything else on the request path is
// atomic.
type model struct {
	cfg      ModelCfg
	replicas []*replica
	servers  []*scraper
	interval time.Duration

	mu       sync.Mutex
	policy   placement.Policy
	table    *placement.Table // the affinity policy's table, or an observer table
	observer bool             // table is ours (records first-turn homes for stats)
	snap     placement.Snapshot

	laterTurns atomic.Int64 // requests of a session already known
	laterHome  atomic.Int64 // those served by the session's home

	cancel context.CancelFunc // stops the scrapers; nil until started

	hist *history // the last hour of token rates (history.go), fed by the scrapers

	gpuSeqs int          // vLLM's default max_num_seqs on cfg.GPU; 0: no GPU given
	warned  atomic.Bool  // the max_num_seqs warning was logged
	log     *slog.Logger // set by Server.build before the scrapers start; nil: no warnings
}

// newModel builds the state of one configured model.
func newModel(cfg ModelCfg, client *http.Client, interval, timeout time.Duration) (*model, error) {
	m := &model{cfg: cfg, interval: interval}
	if cfg.GPU != "" {
		g, err := hardware.LookupGPU(cfg.GPU)
		if err != nil {
			return nil, fmt.Errorf("model %q: gpu: %w", cfg.Name, err)
		}
		m.gpuSeqs = vllmDefaultMaxNumSeqs(g)
	}
	switch cfg.Layout() {
	case LayoutDP:
		u, err := url.Parse(cfg.URL)
		if err != nil {
			return nil, err
		}
		s := newScraper(cfg.URL, client, interval, timeout)
		m.servers = []*scraper{s}
		for i := range cfg.DataParallelSize {
			m.replicas = append(m.replicas, &replica{id: i, target: u, rank: strconv.Itoa(i), server: s, engine: i})
		}
	default:
		for i, raw := range cfg.Replicas {
			u, err := url.Parse(raw)
			if err != nil {
				return nil, err
			}
			s := newScraper(raw, client, interval, timeout)
			m.servers = append(m.servers, s)
			m.replicas = append(m.replicas, &replica{id: i, target: u, server: s, engine: -1})
		}
	}
	keys := make([]string, len(m.replicas))
	for i, rep := range m.replicas {
		keys[i] = rep.target.String()
		if rep.rank != "" {
			keys[i] += "#" + rep.rank
		}
	}
	m.hist = newHistory(keys)
	for _, s := range m.servers {
		s.onResult = func(r *ScrapeResult) {
			m.baseline(s, r)
			m.record(s, r)
			if m.log != nil {
				m.warnMaxNumSeqs(m.log)
			}
		}
	}
	if err := m.newPolicy(); err != nil {
		return nil, err
	}
	m.snap.Replicas = make([]placement.Replica, len(m.replicas))
	return m, nil
}

// baseline keeps, per replica of server s, the prefix-cache counters of
// the first successful scrape (again after a counter reset: a restarted
// vLLM), from which Status computes hit rates since start.
func (m *model) baseline(s *scraper, r *ScrapeResult) {
	if r.OK.IsZero() {
		return
	}
	for _, rep := range m.replicas {
		if rep.server != s {
			continue
		}
		e, ok := rep.stats(r)
		if !ok {
			continue
		}
		if b := rep.base.Load(); b == nil || e.PrefixQueries < b.PrefixQueries || e.PrefixHits < b.PrefixHits {
			rep.base.Store(&e)
		}
	}
}

// record adds a successful scrape of server s to the history of each of
// its replicas.
func (m *model) record(s *scraper, r *ScrapeResult) {
	if r.Err != "" || r.OK.IsZero() || !r.OK.Equal(r.Attempt) {
		return
	}
	for i, rep := range m.replicas {
		if rep.server != s {
			continue
		}
		if e, ok := rep.stats(r); ok {
			m.hist.observe(m.hist.rows[i].key, e, r.OK)
		}
	}
}

// newPolicy makes the model's placement policy from its configuration.
func (m *model) newPolicy() error {
	pc := placement.Config{
		SessionTTL:   m.cfg.SessionTTL.D(),
		MaxSessions:  m.cfg.MaxSessions,
		ActiveWindow: m.cfg.ActiveWindow.D(),
	}
	if !m.cfg.SpillThreshold.Auto {
		pc.Spill = placement.SpillAt(m.cfg.SpillThreshold.N)
	}
	strategy := m.cfg.EffectiveStrategy()
	if strategy == placement.StrategyLeastLoaded {
		// Affinity switched off runs vLLM's balancer through the same type.
		strategy, pc.Disabled = placement.StrategyAffinity, true
	}
	p, err := placement.New(strategy, pc)
	if err != nil {
		return fmt.Errorf("model %q: %w", m.cfg.Name, err)
	}
	m.policy = p
	if a, ok := p.(*placement.Affinity); ok && !pc.Disabled {
		m.table, m.observer = a.Table(), false
	} else {
		m.table, m.observer = placement.NewTableWindow(pc.SessionTTL, pc.MaxSessions, pc.ActiveWindow), true
	}
	return nil
}

// sameBackends reports whether o reaches the same replicas the same way, so
// that m's state (sessions, counters, scrapers) can be kept across a reload.
func (m *model) sameBackends(o ModelCfg) bool {
	a := m.cfg
	if a.URL != o.URL || a.DataParallelSize != o.DataParallelSize || len(a.Replicas) != len(o.Replicas) {
		return false
	}
	for i := range a.Replicas {
		if a.Replicas[i] != o.Replicas[i] {
			return false
		}
	}
	return true
}

// samePolicy reports whether o asks for the policy m already runs.
func (m *model) samePolicy(o ModelCfg) bool {
	a := m.cfg
	return a.EffectiveStrategy() == o.EffectiveStrategy() && a.SpillThreshold == o.SpillThreshold &&
		a.SessionTTL == o.SessionTTL && a.MaxSessions == o.MaxSessions && a.ActiveWindow == o.ActiveWindow &&
		a.MaxNumSeqs == o.MaxNumSeqs && a.GPU == o.GPU
}

// start launches one scrape loop per server.
func (m *model) start(ctx context.Context) {
	ctx, m.cancel = context.WithCancel(ctx)
	for _, s := range m.servers {
		go s.run(ctx)
	}
}

// stop ends the scrape loops and waits for them.
func (m *model) stop() {
	if m.cancel == nil {
		return
	}
	m.cancel()
	for _, s := range m.servers {
		<-s.stopped
	}
}

// maxNumSeqs is the configured max_num_seqs, else the server's, else
// vLLM's default for the configured GPU, else vLLM's default 256; source
// says which ("config", "server", "gpu", "default").
func (m *model) maxNumSeqs() (n int, source string) {
	if m.cfg.MaxNumSeqs > 0 {
		return m.cfg.MaxNumSeqs, "config"
	}
	for _, s := range m.servers {
		for _, e := range s.last.Load().Engines {
			if e.MaxNumSeqs > 0 {
				return e.MaxNumSeqs, "server"
			}
		}
	}
	if m.gpuSeqs > 0 {
		return m.gpuSeqs, "gpu"
	}
	return DefaultMaxNumSeqs, "default"
}

// vllmDefaultMaxNumSeqs is vLLM's default max_num_seqs for online serving
// on g: 1024 on GPUs of at least 70 GiB other than the A100, else 256. It is
// the rule of hardware's VLLMSchedulerDefaults and of sim's farm defaults
// (hardware keeps it unexported; TestGPUDefaultMaxNumSeqs holds the three
// to the same table).
func vllmDefaultMaxNumSeqs(g hardware.GPU) int {
	if g.MemoryBytes >= 70*hardware.GiB && !strings.Contains(strings.ToUpper(g.Name), "A100") {
		return 1024
	}
	return DefaultMaxNumSeqs
}

// maxNumSeqsWarning says, when nobody stated max_num_seqs (the config does
// not set it and the server does not expose it), what is assumed; "" when
// it is known.
func (m *model) maxNumSeqsWarning() string {
	n, src := m.maxNumSeqs()
	auto := ""
	if m.cfg.SpillThreshold.Auto {
		auto = fmt.Sprintf(", auto spill threshold %d", max(1, n/4))
	}
	switch src {
	case "gpu":
		return fmt.Sprintf("max_num_seqs is not exposed by the server: assumed %d, vLLM's default on %s%s; set models[].max_num_seqs if the server runs another value", n, m.cfg.GPU, auto)
	case "default":
		return fmt.Sprintf("max_num_seqs is not exposed by the server (llm-d-inference-sim and other engines do not) and neither max_num_seqs nor gpu is configured: assumed vLLM's default %d%s; set models[].max_num_seqs (or gpu)", n, auto)
	}
	return ""
}

// warnMaxNumSeqs logs maxNumSeqsWarning once, after the first successful
// scrape of every server (before it, the server may still expose it).
func (m *model) warnMaxNumSeqs(log *slog.Logger) {
	for _, s := range m.servers {
		if s.last.Load().OK.IsZero() {
			return
		}
	}
	if w := m.maxNumSeqsWarning(); w != "" && m.warned.CompareAndSwap(false, true) {
		log.Warn(w, "model", m.cfg.Name)
	}
}

// fill refreshes m.snap for a pick at now. Called with m.mu held.
//
// Scraped fields come from the latest scrape when it is fresh (see
// ScrapeResult.fresh). When it is stale or failed, the replica is described
// by the proxy's own counts instead: Running = min(InFlight, max_num_seqs),
// Waiting = the rest, KVUsage = the mean of the replicas with fresh data
// (0 when none has): neither idle nor saturated, so the policy neither
// floods nor shuns it.
//
// sticky says the pick is for a conversation the table already homes:
// warm-up throttles new conversations only, so a warming replica is healthy
// for a known one (see admit).
func (m *model) fill(now time.Time, sticky bool) {
	maxSeqs, _ := m.maxNumSeqs()
	s := &m.snap
	s.MaxNumSeqs = maxSeqs
	var gen uint64
	var kvSum float64
	var kvN int
	stale := make([]bool, len(m.replicas))
	for i, rep := range m.replicas {
		r := rep.server.last.Load()
		gen += r.Seq
		inFlight := int(rep.inFlight.Load())
		pr := placement.Replica{ID: i, InFlight: inFlight, Healthy: r.Healthy && m.admit(rep, now, sticky)}
		if st, ok := rep.stats(r); ok && r.fresh(now, m.interval) {
			pr.Running, pr.Waiting, pr.KVUsage = int(st.Running), int(st.Waiting), st.KVUsage
			kvSum += st.KVUsage
			kvN++
		} else {
			stale[i] = true
			pr.Running = min(inFlight, maxSeqs)
			pr.Waiting = inFlight - pr.Running
		}
		s.Replicas[i] = pr
	}
	for i := range s.Replicas {
		if stale[i] && kvN > 0 {
			s.Replicas[i].KVUsage = kvSum / float64(kvN)
		}
	}
	s.Generation = gen
	m.table.Advance(now)
	m.table.Fill(s) // the active conversations, which is what placement balances
}

// admit applies ejection and warm-up to one pick. A warming replica takes
// every pick of a known conversation (sticky: its sessions come home, their
// prefix is cached there) and a growing share of the others, so that only
// new conversations are throttled. Called with m.mu held.
func (m *model) admit(rep *replica, now time.Time, sticky bool) bool {
	if now.Before(rep.ejectedUntil) {
		return false
	}
	if sticky || !now.Before(rep.warmUntil) {
		return true
	}
	elapsed := now.Sub(rep.ejectedUntil)
	share := warmStart + (1-warmStart)*float64(elapsed)/float64(warmup)
	n := rep.warmPicks
	rep.warmPicks++
	// Admit when the running share crosses an integer: deterministic, no rand.
	return int(float64(n+1)*share) > int(float64(n)*share)
}

// picked is the outcome of model.pick.
type picked struct {
	placement.Decision
	rep  *replica
	home int // the session's home before the pick; -1: a new session
}

// pick asks the policy for a replica and counts the request in flight
// there. exclude (-1 for none) is shown to the policy as unhealthy: the
// replica a failed first attempt went to.
func (m *model) pick(r *placement.Request, exclude int, now time.Time) (picked, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	home, known := -1, false
	if r.Session != "" {
		home, known = m.table.Home(r.Session, now)
	}
	// Least-loaded places every turn afresh: nothing is sticky there.
	m.fill(now, known && m.cfg.EffectiveStrategy() != placement.StrategyLeastLoaded)
	if exclude >= 0 {
		m.snap.Replicas[exclude].Healthy = false
		r.Failed = append(r.Failed[:0], exclude) // the session keeps its home
	}
	d, err := m.policy.Pick(r, &m.snap, now)
	if err != nil {
		return picked{}, err
	}
	if d.Replica < 0 || d.Replica >= len(m.replicas) {
		return picked{}, fmt.Errorf("placement picked replica %d of %d", d.Replica, len(m.replicas))
	}
	if m.observer && r.Session != "" {
		if known {
			m.table.Assign(r.Session, home, now) // keep the first turn's replica, refresh last seen
		} else {
			m.table.Assign(r.Session, d.Replica, now)
		}
	}
	if known && exclude < 0 {
		m.laterTurns.Add(1)
		if d.Replica == home {
			m.laterHome.Add(1)
		}
	}
	rep := m.replicas[d.Replica]
	rep.inFlight.Add(1)
	if !known {
		home = -1
	}
	return picked{Decision: d, rep: rep, home: home}, nil
}

// connectFailed records a refused connection to rep and ejects it unless
// that would eject more than half of the model's replicas. It reports
// whether rep was ejected.
func (m *model) connectFailed(rep *replica, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.eject(rep, now)
}

// outlier records a 5xx answer or a stream timeout of rep and ejects it
// (under the same rule as connectFailed) at the ejectConsecutive-th in a
// row. It reports whether rep was ejected.
func (m *model) outlier(rep *replica, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rep.strikes.Add(1) < ejectConsecutive || now.Before(rep.ejectedUntil) {
		return false
	}
	if !m.eject(rep, now) {
		return false
	}
	rep.strikes.Store(0)
	return true
}

// eject ejects rep for its back-off unless that would eject more than half
// of the model's replicas. Called with m.mu held.
func (m *model) eject(rep *replica, now time.Time) bool {
	failures := rep.failures.Add(1)
	if failures > 1<<20 {
		rep.failures.Store(1 << 20) // the back-off is capped long before; never wrap
	}
	ejected := 0
	for _, o := range m.replicas {
		if o != rep && now.Before(o.ejectedUntil) {
			ejected++
		}
	}
	if (ejected+1)*2 > len(m.replicas) {
		return false
	}
	backoff := ejectBase << min(failures-1, 10)
	backoff = min(backoff, ejectMax)
	rep.ejectedUntil = now.Add(backoff)
	rep.warmUntil = rep.ejectedUntil.Add(warmup)
	rep.warmPicks = 0
	return true
}

// succeeded resets rep's failure counts after a good response (a stream:
// once it ended properly).
func (m *model) succeeded(rep *replica) {
	if rep.failures.Load() != 0 {
		rep.failures.Store(0)
	}
	if rep.strikes.Load() != 0 {
		rep.strikes.Store(0)
	}
}

// state names a replica's routing state for Status.
func (m *model) state(rep *replica, r *ScrapeResult, now time.Time) string {
	switch {
	case !r.Healthy:
		return "down"
	case now.Before(rep.ejectedUntil):
		return "ejected"
	case now.Before(rep.warmUntil):
		return "warming"
	}
	return "healthy"
}
