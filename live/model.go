package live

import (
	"context"
	"fmt"
	"github.com/lm-warden/warden/live/sessionstore"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/placement"
)

// numCounted is the number of reasons a replica counts: placement's
// reasons (placement.NumReasons, in their order) plus "retried".
const numCounted = placement.NumReasons + 1

const reasonRetried = placement.NumReasons // index of "retried" in replica.byReason

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
	rank   string // X-data-parallel-rank value; "" in the URL layout
	name   string // target, plus "#rank" in the DP layout: the replica's name in the session store
	// nameHash is placement.NameKey(name): its Replica.Key, the weight of
	// rendezvous hashing.
	nameHash uint64
	server   *scraper // the server whose /metrics describe this replica
	engine   int      // engine label to read; -1: sum the whole server

	// The counts and the ejection state belong to the backend, not to one
	// configuration: a reload that keeps the backend (at any index) gives
	// the new replica the same *replicaState, so that a stream started
	// before the reload gives its in-flight count back where the new
	// routing sees it.
	*replicaState
}

// replicaState is what a replica keeps across reloads.
type replicaState struct {
	inFlight atomic.Int64                // requests sent, response not finished
	byReason [numCounted]atomic.Int64    // requests served here, by reason
	upErrors atomic.Int64                // upstream failures seen here
	rehomes  atomic.Int64                // conversations re-homed away from here: it was cold for them
	base     atomic.Pointer[EngineStats] // counters at the first good scrape, for since-start rates

	// reportsCached: an answer from here has carried cached tokens, so a
	// chat answer without prompt_tokens_details found none (vLLM leaves
	// the details out when num_cached_tokens is 0; the emulator does too).
	reportsCached atomic.Bool

	// prefillQueue is the uncached prompt tokens of the requests sent
	// here that have not produced a first token; meter measures the
	// replica's prefill rate (prefill_tokens_per_s: metrics). prefill.go.
	prefillQueue atomic.Int64
	meter        prefillMeter

	failures atomic.Int32 // consecutive ejections without a good response since
	strikes  atomic.Int32 // consecutive 5xx answers and stream timeouts

	// Ejection state, guarded by model.mu (shared by a model's successors).
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
	kv       atomic.Pointer[kvFollower] // kv_events; nil: none (kvevents.go)
	replicas []*replica
	servers  []*scraper
	interval time.Duration

	// mu is shared by a model and its successors (see handover): the table
	// and the ejection state pass from one to the next under it.
	mu     *sync.Mutex
	adm    *admissionQueue   // admission: kv waiters, guarded by mu, shared like it
	router *placement.Router // drives the placement policy, its session table and admission
	table  *placement.Table  // router.Table(): the policy's, or the router's observer table
	// readsHeld: the policy reads Prompt.Held (routing prefix: held), so a
	// request's prompt is described by its blocks (call.fillPrompt).
	readsHeld bool
	snap      placement.Snapshot
	next      *model // the successor a reload handed this model's sessions to; nil: m is current

	laterTurns atomic.Int64 // requests of a session already known
	laterHome  atomic.Int64 // those served by the session's home

	cancel context.CancelFunc // stops the scrapers; nil until started

	store sessionstore.Store // shared with other proxies; nil: this proxy's table only
	hist  *history           // the last hour of token rates (history.go), fed by the scrapers

	gpuSeqs int          // vLLM's default max_num_seqs on cfg.GPU; 0: no GPU given
	warned  atomic.Bool  // the max_num_seqs warning was logged
	log     *slog.Logger // set by Server.build before the scrapers start; nil: no warnings
}

// newModelAfter builds the state of one configured model that is to
// succeed prev (nil: none) on a reload. Each replica whose backend prev
// already has (the same URL, and rank in the DP layout) shares prev's
// replica state and starts from the last scrape of its server; prev's
// sessions pass over only at handover, once the reload is certain.
func newModelAfter(cfg ModelCfg, client *http.Client, interval, timeout time.Duration, prev *model) (*model, error) {
	m := &model{cfg: cfg, interval: interval, mu: new(sync.Mutex), adm: new(admissionQueue)}
	if prev != nil {
		m.mu, m.adm = prev.mu, prev.adm
	}
	if cfg.GPU != "" {
		g, err := hardware.LookupGPU(cfg.GPU)
		if err != nil {
			return nil, fmt.Errorf("model %q: gpu: %w", cfg.Name, err)
		}
		// vLLM's default for the GPU: the rule is hardware's, the one the
		// simulator and the planner size with.
		m.gpuSeqs, _ = hardware.VLLMSchedulerDefaults(g)
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
			m.replicas = append(m.replicas, &replica{id: i, target: u, rank: strconv.Itoa(i), name: cfg.URL + "#" + strconv.Itoa(i), server: s, engine: i})
		}
	default:
		for i, raw := range cfg.Replicas {
			u, err := url.Parse(raw)
			if err != nil {
				return nil, err
			}
			s := newScraper(raw, client, interval, timeout)
			m.servers = append(m.servers, s)
			m.replicas = append(m.replicas, &replica{id: i, target: u, name: raw, server: s, engine: -1})
		}
	}
	taken := map[*replicaState]bool{} // a backend listed twice is two replicas
	for _, rep := range m.replicas {
		rep.nameHash = placement.NameKey(rep.name)
		rep.replicaState = new(replicaState)
		if o := prev.sameBackend(rep, taken); o != nil {
			rep.replicaState = o.replicaState
			taken[o.replicaState] = true
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
		if o := prev.server(s.base); o != nil {
			s.last.Store(o.last.Load())
			s.down.Store(o.down.Load())
		}
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

// sameBackend returns the first of m's replicas not in taken that
// reaches the backend rep does, or nil (m nil included).
func (m *model) sameBackend(rep *replica, taken map[*replicaState]bool) *replica {
	if m == nil {
		return nil
	}
	for _, o := range m.replicas {
		if !taken[o.replicaState] && o.target.String() == rep.target.String() && o.rank == rep.rank {
			return o
		}
	}
	return nil
}

// server returns m's scraper of base, or nil (m nil included).
func (m *model) server(base string) *scraper {
	if m == nil {
		return nil
	}
	for _, s := range m.servers {
		if s.base == base {
			return s
		}
	}
	return nil
}

// index returns the index in m of the replica sharing rep's state, or -1.
func (m *model) index(rep *replica) int {
	for i, o := range m.replicas {
		if o.replicaState == rep.replicaState {
			return i
		}
	}
	return -1
}

// renumbering maps each replica index of prev to its index in m (-1: the
// backend is gone), and reports whether any index changed meaning: a
// replica kept at another index, or removed.
func (m *model) renumbering(prev *model) (to []int, changed bool) {
	to = make([]int, len(prev.replicas))
	for i, rep := range prev.replicas {
		to[i] = m.index(rep)
		if to[i] != i {
			changed = true
		}
	}
	return to, changed
}

// handover passes prev's sessions to m, which replaces it in a reload: the
// session table, renumbered to m's replicas (the sessions of a removed
// replica are forgotten, to be placed afresh on their next turn) and
// reconfigured to m's TTL, cap and active window, becomes m's; so do the
// later-turn counts. From then on prev's picks (requests that loaded the
// routing state before the swap, retries of attempts made before it) are
// made by m. Both share mu. It returns the sessions kept and those
// forgotten (homed on a removed replica, idle beyond a shorter TTL, or
// beyond a smaller cap).
func (m *model) handover(prev *model, now time.Time) (kept, forgotten int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev = prev.current()
	to, changed := m.renumbering(prev)
	t := prev.table
	if changed {
		forgotten = t.Renumber(to)
	}
	forgotten += t.Reconfigure(m.cfg.SessionTTL.D(), m.cfg.MaxSessions, m.cfg.ActiveWindow.D(), now)
	m.router = m.router.WithTable(t)
	m.table = t
	m.laterTurns.Store(prev.laterTurns.Load())
	m.laterHome.Store(prev.laterHome.Load())
	if m.cfg.MaxNumSeqs == prev.cfg.MaxNumSeqs && m.cfg.GPU == prev.cfg.GPU {
		m.warned.Store(prev.warned.Load())
	}
	prev.next = m
	return t.Len(), forgotten
}

// current returns the model that now makes m's picks: m, or the last of its
// successors. Called with m.mu held.
func (m *model) current() *model {
	for m.next != nil {
		m = m.next
	}
	return m
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
			rep.meter.observe(e, r.OK)
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
	switch {
	case m.cfg.SpillThreshold.Priced:
		pc.Spill = placement.SpillPriced()
	case !m.cfg.SpillThreshold.Auto:
		pc.Spill = placement.SpillAt(m.cfg.SpillThreshold.N)
	}
	pc.Balance, _ = placement.ParseBalance(m.cfg.Balance) // validated with the config
	pc.Admission, _ = placement.ParseAdmission(m.cfg.Admission)
	pc.Rehome, _ = placement.ParseRehome(m.cfg.Rehome)
	pc.Prefix, _ = placement.ParsePrefixUse(m.cfg.Prefix)
	strategy := m.cfg.EffectiveStrategy()
	if strategy == placement.StrategyLeastLoaded {
		// Affinity switched off runs vLLM's balancer through the same type.
		strategy, pc.Disabled = placement.StrategyAffinity, true
	}
	p, err := placement.New(strategy, pc)
	if err != nil {
		return fmt.Errorf("model %q: %w", m.cfg.Name, err)
	}
	// A policy that keeps no table (hash, least-loaded) gets an observer
	// table: the first-turn homes of the stayed KPI and the status counts.
	m.router = placement.NewRouter(p, placement.NewTableWindow(pc.SessionTTL, pc.MaxSessions, pc.ActiveWindow))
	m.router.TurnEnds = true // the proxy sees each request leave and end
	if m.readsHeld = m.router.ReadsHeld(); m.readsHeld {
		m.router.SetHeld(&kvHeld{m: m}) // what each replica holds, from the KV events
	}
	m.table = m.router.Table()
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
		a.MaxNumSeqs == o.MaxNumSeqs && a.GPU == o.GPU &&
		a.Balance == o.Balance && a.Admission == o.Admission && a.AdmissionTimeout == o.AdmissionTimeout && a.Rehome == o.Rehome &&
		a.Prefix == o.Prefix &&
		a.PrefillTokensPerS == o.PrefillTokensPerS
}

// start launches one scrape loop per server.
func (m *model) start(ctx context.Context) {
	ctx, m.cancel = context.WithCancel(ctx)
	for _, s := range m.servers {
		go s.run(ctx)
	}
	m.startKV(ctx)
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
	m.stopKV()
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

// spillThreshold is the in-flight count on a home above which a later
// turn spills: the configured number, or max_num_seqs/4 (auto).
func (m *model) spillThreshold() int {
	if !m.cfg.SpillThreshold.Auto {
		return m.cfg.SpillThreshold.N
	}
	n, _ := m.maxNumSeqs()
	return max(1, n/4)
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
