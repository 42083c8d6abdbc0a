package live

import (
	"encoding/json"
	"github.com/lm-warden/warden/live/sessionstore"
	"math"
	"net/http"
	"time"

	"github.com/lm-warden/warden/kvevents"
	"github.com/lm-warden/warden/placement"
)

// StatusReport is the body of GET /api/status on the admin listener: the
// data of the dashboard's routing panel, one Status per model, sorted by
// model name.
type StatusReport struct {
	Time   time.Time `json:"time"`
	Models []Status  `json:"models"`
	// SessionStore is the shared session store's state; absent without one.
	SessionStore *sessionstore.Status `json:"session_store,omitempty"`
}

// Status is the routing state of one model.
type Status struct {
	Model          string `json:"model"`
	Layout         string `json:"layout"`   // "urls" or "data-parallel"
	Strategy       string `json:"strategy"` // affinity, least-loaded or hash
	Affinity       bool   `json:"affinity"`
	SpillThreshold int    `json:"spill_threshold"` // in flight on the home above which a turn spills
	SpillAuto      bool   `json:"spill_auto"`      // threshold follows max_num_seqs/4
	// SpillPriced: spill_threshold priced, a later turn leaves home when
	// its expected time to first token there exceeds the one elsewhere
	// (SpillThreshold still bounds a subagent on its parent's home).
	SpillPriced      bool   `json:"spill_priced"`
	MaxNumSeqs       int    `json:"max_num_seqs"`
	MaxNumSeqsSource string `json:"max_num_seqs_source"` // config, server, gpu or default
	// Warnings are the assumptions routing makes that an operator should
	// know of, e.g. a max_num_seqs nobody stated (see maxNumSeqsWarning).
	Warnings            []string `json:"warnings,omitempty"`
	InFlight            int64    `json:"in_flight"`
	Sessions            int      `json:"sessions"`              // conversations remembered (homes kept for the TTL)
	ActiveSessions      int      `json:"active_sessions"`       // of those, seen within the active window: what placement balances
	ActiveWindowSec     float64  `json:"active_window_s"`       // the active window
	ActiveWindowLearned bool     `json:"active_window_learned"` // active_window unset: learned from the conversations' gaps
	SessionCap          int      `json:"session_cap"`
	LaterTurns          int64    `json:"later_turns"`      // requests of known sessions since start
	LaterTurnsHome      int64    `json:"later_turns_home"` // of those, served by the session's first replica (placement.Stay)
	StickyPct           *float64 `json:"sticky_pct"`       // 100*home/later; null before any later turn
	// Admission is the admission: kv queue; absent when admission is off.
	Admission *AdmissionStatus `json:"admission,omitempty"`
	// SpillReasons are the last few later turns that left their home and
	// why, newest first (no session ids).
	SpillReasons []SpillReason `json:"spill_reasons,omitempty"`
	// KVEventsListen is the socket the replicas' KV-event publishers
	// connect to (kv_events.listen): what it bound, the publishers
	// connected, and those refused or of an unknown topic.
	KVEventsListen *kvevents.ListenStatus `json:"kv_events_listen,omitempty"`
	Replicas       []ReplicaStatus        `json:"replicas"`
}

// AdmissionStatus is a model's admission queue (admission: kv).
type AdmissionStatus struct {
	Waiting    int     `json:"waiting"`   // new conversations waiting for KV headroom now
	Waits      int64   `json:"waits"`     // requests that waited, since start
	Timeouts   int64   `json:"timeouts"`  // of those, refused after admission_timeout
	TimeoutSec float64 `json:"timeout_s"` // admission_timeout
}

// ReplicaStatus is one row of the routing panel. Counters run since the
// process started; they follow the backend across reloads (a reload that
// renumbers the replicas moves them with it).
type ReplicaStatus struct {
	ID    int    `json:"id"`
	URL   string `json:"url"`
	Rank  *int   `json:"rank"`  // X-data-parallel-rank; null in the URL layout
	State string `json:"state"` // healthy, warming, ejected or down

	InFlight int64 `json:"in_flight"`
	Sessions int   `json:"sessions"`        // conversations homed here (within the TTL)
	Active   int   `json:"active_sessions"` // of those, seen within the active window
	// Held is how many of the active ones count against the KV headroom: a
	// request in flight, or back within their return timeout (placement's
	// "Held conversations").
	Held         int   `json:"held_sessions"`
	New          int64 `json:"new"`
	Sticky       int64 `json:"sticky"`
	SpilledIn    int64 `json:"spilled_in"`
	ClientPinned int64 `json:"client_pinned"`
	Parent       int64 `json:"parent"`   // subagents placed with their parent
	Balanced     int64 `json:"balanced"` // least-loaded and hash decisions
	Retried      int64 `json:"retried"`  // served after another replica failed
	// Rehomes counts the conversations that left this replica because it
	// was found cold for them (rehome: cold); RehomedIn the turns placed
	// here as re-homed ones (reason rehome).
	Rehomes   int64 `json:"rehomes"`
	RehomedIn int64 `json:"rehomed_in"`
	// ObservedPromptTokens and ObservedCachedTokens sum, over the turns
	// this replica served as their conversation's home, the prompt tokens
	// and those its answers reported served from cache (placement's
	// observed hits; 0 when vLLM does not report cached tokens).
	ObservedPromptTokens int64 `json:"observed_prompt_tokens"`
	ObservedCachedTokens int64 `json:"observed_cached_tokens"`

	Requests     int64 `json:"requests"`
	UpstreamErrs int64 `json:"upstream_errors"`

	// Scraped from vLLM; null until the first successful scrape.
	Running       *float64 `json:"running"`
	Waiting       *float64 `json:"waiting"`
	KVUsage       *float64 `json:"kv_usage"`       // 0..1
	PrefixHitPct  *float64 `json:"prefix_hit_pct"` // since start: delta hits / delta queries
	PrefixHits    *float64 `json:"prefix_hits"`    // vLLM's counter, tokens
	PrefixQueries *float64 `json:"prefix_queries"` // vLLM's counter, tokens
	ScrapeAgeSec  *float64 `json:"scrape_age_s"`   // since the last successful scrape
	ScrapeState   string   `json:"scrape_state"`   // ok, stale, failed or pending
	ScrapeError   string   `json:"scrape_error,omitempty"`
	HealthError   string   `json:"health_error,omitempty"`

	// KV cache, in tokens: the capacity from vllm:cache_config_info
	// (num_gpu_blocks x block_size; null when the server does not expose
	// it), the resident footprint (the last prompt + answer tokens of each
	// held conversation homed here, what admission counts) and the
	// headroom between them (null without a capacity; negative when the
	// footprint exceeds it).
	KVCapacityTokens *int `json:"kv_capacity_tokens"`
	FootprintTokens  int  `json:"footprint_tokens"`
	HeadroomTokens   *int `json:"kv_headroom_tokens"`

	// The priced spill's inputs (prefill.go): the replica's prefill rate
	// in tokens per second (null: unknown) and its source, config
	// (prefill_tokens_per_s) or metrics (measured); and the uncached
	// prompt tokens of the requests sent here before their first token.
	PrefillTokensPerSec *float64 `json:"prefill_tokens_per_s"`
	PrefillSource       string   `json:"prefill_source,omitempty"`
	PrefillQueueTokens  int64    `json:"prefill_queue_tokens"`

	// KVEvents is what the replica's vLLM KV-cache events say (kv_events):
	// the blocks its prefix cache holds (stored minus removed; what
	// kv_usage, which counts running requests only, does not show) and
	// the tokens of the blocks it computed by why (cold, evicted,
	// elsewhere, as warden sim classifies misses). Absent without
	// kv_events.
	KVEvents *kvevents.ReplicaStatus `json:"kv_events,omitempty"`
}

// Status returns the current routing state of every model.
func (s *Server) Status() StatusReport {
	rt := s.state.Load()
	now := time.Now()
	rep := StatusReport{Time: now.UTC(), Models: make([]Status, 0, len(rt.names))}
	for _, name := range rt.names {
		rep.Models = append(rep.Models, rt.models[name].status(now))
	}
	if s.store != nil {
		rep.SessionStore = ptr(s.store.State())
	}
	return rep
}

func ptr[T any](v T) *T { return &v }

// fptr returns a pointer to v, or nil when v is NaN or infinite (JSON has
// no such numbers).
func fptr(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func (m *model) status(now time.Time) Status {
	maxSeqs, src := m.maxNumSeqs()
	st := Status{
		Model:            m.cfg.Name,
		Layout:           "urls",
		Strategy:         m.cfg.EffectiveStrategy(),
		SpillAuto:        m.cfg.SpillThreshold.Auto,
		SpillPriced:      m.cfg.SpillThreshold.Priced,
		MaxNumSeqs:       maxSeqs,
		MaxNumSeqsSource: src,
		LaterTurns:       m.laterTurns.Load(),
		LaterTurnsHome:   m.laterHome.Load(),
	}
	st.Affinity = st.Strategy == placement.StrategyAffinity
	if w := m.maxNumSeqsWarning(); w != "" {
		st.Warnings = append(st.Warnings, w)
	}
	if w := m.prefillWarning(); w != "" {
		st.Warnings = append(st.Warnings, w)
	}
	if m.cfg.Layout() == LayoutDP {
		st.Layout = "data-parallel"
	}
	st.SpillThreshold = m.cfg.SpillThreshold.N
	if st.SpillAuto {
		st.SpillThreshold = max(1, maxSeqs/4)
	}
	if st.LaterTurns > 0 {
		st.StickyPct = ptr(placement.StayCount{Later: st.LaterTurns, Home: st.LaterTurnsHome}.Pct())
	}
	m.mu.Lock()
	m.table.Advance(now) // retire conversations that went quiet since the last request
	counts := m.table.Counters()
	st.Sessions, st.SessionCap = m.table.Len(), m.table.MaxSessions()
	st.ActiveWindowSec = m.table.ActiveWindow().Seconds()
	st.ActiveWindowLearned = m.table.LearnsWindow()
	for _, c := range counts {
		st.ActiveSessions += c.Active
	}
	if m.admissionOn() {
		st.Admission = &AdmissionStatus{Waiting: m.adm.waiting.Len(), Waits: m.adm.waits, Timeouts: m.adm.timeouts,
			TimeoutSec: m.cfg.AdmissionTimeout.D().Seconds()}
	}
	st.SpillReasons = m.adm.spills.last()
	states := make([]string, len(m.replicas))
	for i, r := range m.replicas {
		states[i] = m.state(r, r.server.last.Load(), now)
	}
	m.mu.Unlock()
	var kvs []kvevents.ReplicaStatus
	if f := m.kv.Load(); f != nil {
		kvs = f.farm.Snapshot()
		if f.listen != nil {
			ls := f.listen.Status()
			st.KVEventsListen = &ls
		}
	}
	for i, r := range m.replicas {
		sr := r.server.last.Load()
		rs := ReplicaStatus{
			ID: i, URL: r.target.Redacted(), State: states[i],
			InFlight:     r.inFlight.Load(),
			New:          r.byReason[placement.ReasonNew].Load(),
			Sticky:       r.byReason[placement.ReasonSticky].Load(),
			SpilledIn:    r.byReason[placement.ReasonSpill].Load(),
			Balanced:     r.byReason[placement.ReasonHash].Load() + r.byReason[placement.ReasonLeastLoaded].Load(),
			ClientPinned: r.byReason[placement.ReasonPinned].Load(),
			Parent:       r.byReason[placement.ReasonParent].Load(),
			Retried:      r.byReason[reasonRetried].Load(),
			Rehomes:      r.rehomes.Load(),
			RehomedIn:    r.byReason[placement.ReasonRehome].Load(),
			UpstreamErrs: r.upErrors.Load(),
			HealthError:  sr.HealthErr,
		}
		for k := range r.byReason {
			rs.Requests += r.byReason[k].Load()
		}
		st.InFlight += rs.InFlight
		if r.rank != "" {
			rs.Rank = ptr(r.engine)
		}
		if i < len(counts) {
			rs.Sessions, rs.Active, rs.Held = counts[i].Sessions, counts[i].Active, counts[i].Held
			rs.FootprintTokens = counts[i].HeldFootprint
			rs.ObservedPromptTokens, rs.ObservedCachedTokens = counts[i].AskedTokens, counts[i].CachedTokens
		}
		if c, ok := kvCapacity(r, sr); ok {
			rs.KVCapacityTokens, rs.HeadroomTokens = ptr(c), ptr(c-rs.FootprintTokens)
		}
		if rate, src := m.prefillRate(r); rate > 0 {
			rs.PrefillTokensPerSec, rs.PrefillSource = ptr(rate), src
		}
		rs.PrefillQueueTokens = max(r.prefillQueue.Load(), 0)
		rs.KVEvents = m.kvStatus(kvs, i)
		switch {
		case sr.OK.IsZero() && sr.Err == "":
			rs.ScrapeState = "pending"
		case sr.Err != "":
			rs.ScrapeState, rs.ScrapeError = "failed", sr.Err
		case !sr.fresh(now, m.interval):
			rs.ScrapeState = "stale"
		default:
			rs.ScrapeState = "ok"
		}
		if !sr.OK.IsZero() {
			rs.ScrapeAgeSec = fptr(now.Sub(sr.OK).Seconds())
		}
		if e, ok := r.stats(sr); ok {
			rs.Running, rs.Waiting, rs.KVUsage = fptr(e.Running), fptr(e.Waiting), fptr(e.KVUsage)
			rs.PrefixHits, rs.PrefixQueries = fptr(e.PrefixHits), fptr(e.PrefixQueries)
			if base := r.base.Load(); base != nil {
				if dq := e.PrefixQueries - base.PrefixQueries; dq > 0 {
					rs.PrefixHitPct = fptr(100 * (e.PrefixHits - base.PrefixHits) / dq)
				}
			}
		}
		st.Replicas = append(st.Replicas, rs)
	}
	return st
}

// kvCapacity is replica r's KV cache size in tokens from its last scrape
// (vllm:cache_config_info); ok is false when the server does not expose it.
func kvCapacity(r *replica, sr *ScrapeResult) (int, bool) {
	if st, ok := r.stats(sr); ok && st.NumGPUBlocks > 0 && st.BlockSize > 0 {
		return st.NumGPUBlocks * st.BlockSize, true
	}
	return 0, false
}

func (s *Server) serveStatus(w http.ResponseWriter, _ *http.Request) {
	b, err := json.Marshal(s.Status())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}
