package live

import (
	"encoding/json"
	"math"
	"net/http"
	"sync"
	"time"
)

// The last hour of token rates, kept in the proxy so that the stats page
// draws it at once when opened: per model, a ring of historyPoints
// intervals of historyInterval, each holding, per replica, the growth of
// vLLM's counters scraped there (vllm:prompt_tokens_total,
// vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total,
// vllm:generation_tokens_total).
const (
	historyInterval = 10 * time.Second
	historyPoints   = 360
)

// tokenCounts are counter increases in tokens.
type tokenCounts struct {
	Prompt  float64 // vllm:prompt_tokens_total
	Queries float64 // vllm:prefix_cache_queries_total
	Hits    float64 // vllm:prefix_cache_hits_total
	Gen     float64 // vllm:generation_tokens_total
}

func (a *tokenCounts) add(b tokenCounts, f float64) {
	a.Prompt += b.Prompt * f
	a.Queries += b.Queries * f
	a.Hits += b.Hits * f
	a.Gen += b.Gen * f
}

// histBucket is one interval of one replica.
type histBucket struct {
	tokenCounts
	covered float64 // seconds of the interval that scrapes of the replica span
}

// histRow is the ring of one replica, or of the replicas a reload removed
// (key ""), whose tokens still count in the model's totals.
type histRow struct {
	key     string // the replica's URL, plus "#rank" in the data-parallel layout
	buckets []histBucket
	// Counters of the last observation, for the next increase.
	last  tokenCounts
	lastT time.Time
	seen  bool
	// Whether the server exposes the counter: a server that has looked
	// up prompt tokens but never counted one does not.
	prompt, gen bool
}

// history is the ring of one model. observe is called by the model's
// scrape loops (one per server: concurrently in the URL layout); report by
// admin handlers. mu guards everything.
type history struct {
	interval time.Duration
	points   int

	mu      sync.Mutex
	head    int64 // slot (unix time / interval) of the newest bucket
	rows    []*histRow
	byKey   map[string]*histRow
	removed *histRow // replicas that a reload removed; nil: none
}

func newHistory(keys []string) *history { return newHistorySized(keys, historyInterval, historyPoints) }

// newHistorySized makes a ring of points intervals (tests use short ones).
func newHistorySized(keys []string, interval time.Duration, points int) *history {
	h := &history{interval: interval, points: points, byKey: map[string]*histRow{}}
	for _, k := range keys {
		r := &histRow{key: k, buckets: make([]histBucket, h.points)}
		h.rows = append(h.rows, r)
		h.byKey[k] = r
	}
	return h
}

func (h *history) slot(t time.Time) int64 {
	return floorDiv(t.UnixNano(), int64(h.interval))
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func (h *history) index(slot int64) int {
	return int(((slot % int64(h.points)) + int64(h.points)) % int64(h.points))
}

// advance moves the ring's head to slot, clearing the buckets of the slots
// it passes. Called with h.mu held.
func (h *history) advance(slot int64) {
	if slot <= h.head {
		return
	}
	from := max(h.head+1, slot-int64(h.points)+1)
	for s := from; s <= slot; s++ {
		i := h.index(s)
		for _, r := range h.allRows() {
			r.buckets[i] = histBucket{}
		}
	}
	h.head = slot
}

// allRows returns the replicas' rows and the removed row. Called with h.mu
// held.
func (h *history) allRows() []*histRow {
	if h.removed == nil {
		return h.rows
	}
	return append(h.rows[:len(h.rows):len(h.rows)], h.removed)
}

// observe records the counters of replica key scraped at t. The increase
// since the previous observation is spread over the time between the two
// (so a scrape interval longer than the ring's interval leaves no holes).
// A counter lower than before means the server restarted: its counters
// began again from zero, so the increase is the new value (as PromQL's
// increase() counts it), never negative. The first observation of a
// replica only sets the baseline; one not later than the previous is
// ignored.
func (h *history) observe(key string, e EngineStats, t time.Time) {
	cur := tokenCounts{Prompt: e.PromptTokens, Queries: e.PrefixQueries, Hits: e.PrefixHits, Gen: e.GenerationTokens}
	for _, v := range []float64{cur.Prompt, cur.Queries, cur.Hits, cur.Gen} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return // not a counter
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.byKey[key]
	if r == nil {
		return
	}
	if cur.Prompt > 0 {
		r.prompt = true
	}
	if cur.Gen > 0 {
		r.gen = true
	}
	if !r.seen {
		r.last, r.lastT, r.seen = cur, t, true
		h.advance(h.slot(t))
		return
	}
	if !t.After(r.lastT) {
		return
	}
	d := tokenCounts{cur.Prompt - r.last.Prompt, cur.Queries - r.last.Queries, cur.Hits - r.last.Hits, cur.Gen - r.last.Gen}
	if d.Prompt < 0 || d.Queries < 0 || d.Hits < 0 || d.Gen < 0 {
		d = cur // a restart: every counter began again at zero
	}
	t0 := r.lastT
	r.last, r.lastT = cur, t
	h.advance(h.slot(t))
	h.spread(r, d, t0, t)
}

// spread adds d, observed over (t0, t1], to the buckets that interval
// overlaps, in proportion to the overlap. Called with h.mu held.
func (h *history) spread(r *histRow, d tokenCounts, t0, t1 time.Time) {
	span := t1.Sub(t0).Seconds()
	if span <= 0 {
		return
	}
	iv := int64(h.interval)
	first := max(h.slot(t0), h.head-int64(h.points)+1)
	for s := first; s <= h.slot(t1) && s <= h.head; s++ {
		lo := max(t0.UnixNano(), s*iv)
		hi := min(t1.UnixNano(), (s+1)*iv)
		if hi <= lo {
			continue
		}
		ov := float64(hi-lo) / 1e9
		b := &r.buckets[h.index(s)]
		b.add(d, ov/span)
		b.covered += ov
	}
}

// adopt takes over the ring of old, the history of the model a reload
// replaced: the rows of replicas that remain (matched by key) are copied
// with their last counters, so the first scrape of the new model continues
// where the old one stopped; the rows of replicas that went are added up in
// one row that counts in the model's totals only.
func (h *history) adopt(old *history) {
	if old == nil || old == h {
		return
	}
	old.mu.Lock()
	defer old.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if old.interval != h.interval || old.points != h.points {
		return
	}
	h.head = old.head
	for _, or := range old.allRows() {
		if r := h.byKey[or.key]; r != nil && or.key != "" {
			r.buckets = append(r.buckets[:0], or.buckets...)
			r.last, r.lastT, r.seen, r.prompt, r.gen = or.last, or.lastT, or.seen, or.prompt, or.gen
			continue
		}
		if h.removed == nil {
			h.removed = &histRow{buckets: make([]histBucket, h.points)}
		}
		for i := range or.buckets {
			h.removed.buckets[i].add(or.buckets[i].tokenCounts, 1)
			h.removed.buckets[i].covered = max(h.removed.buckets[i].covered, or.buckets[i].covered)
		}
		h.removed.prompt = h.removed.prompt || or.prompt
		h.removed.gen = h.removed.gen || or.gen
	}
}

// HistoryReport is the body of GET /api/history on the admin listener:
// the last hour of every model (or of ?model=NAME), for the stats page.
type HistoryReport struct {
	Time        time.Time      `json:"time"`
	IntervalSec float64        `json:"interval_s"` // the length of one point
	Points      int            `json:"points"`     // points per series: the ring's length
	Models      []ModelHistory `json:"models"`
}

// ModelHistory is one model's ring: a model's series are the sums of its
// replicas' (those a reload removed included).
type ModelHistory struct {
	Model string `json:"model"`
	// StartMs is the start of the first point (unix milliseconds); point i
	// covers [StartMs + i*interval, StartMs + (i+1)*interval). The last
	// point is the interval in progress (null for its first half).
	// A point is null where scrapes spanned less than half of it.
	StartMs int64 `json:"start_ms"`
	HistorySeries
	Replicas []ReplicaHistory `json:"replicas"`
}

// ReplicaHistory is one replica's ring.
type ReplicaHistory struct {
	ID   int    `json:"id"`
	URL  string `json:"url"`
	Rank *int   `json:"rank"` // null in the URL layout
	HistorySeries
}

// HistorySeries are token rates per point, in tokens per second over the
// part of the point that scrapes covered; null where none did. Prompt
// tokens are vLLM's prompt_tokens_total (prefix_cache_queries_total where
// a server does not expose it); cached tokens are prefix_cache_hits_total;
// computed = prompt - cached (not below 0); the hit % is
// hits / queries, as vLLM measures it.
type HistorySeries struct {
	PromptTPS     []*float64    `json:"prompt_tps"`
	CachedTPS     []*float64    `json:"cached_tps"`
	ComputedTPS   []*float64    `json:"computed_tps"`
	GenerationTPS []*float64    `json:"generation_tps"` // null throughout when no server exposes generation_tokens_total
	HitPct        []*float64    `json:"hit_pct"`        // 0..100
	Total         HistoryTotals `json:"total"`
}

// HistoryTotals add up a whole series: the last hour, or less when the
// proxy has run for less.
type HistoryTotals struct {
	Seconds          float64  `json:"seconds"` // covered by scrapes
	PromptTokens     float64  `json:"prompt_tokens"`
	CachedTokens     float64  `json:"cached_tokens"`
	ComputedTokens   float64  `json:"computed_tokens"`
	QueriedTokens    float64  `json:"queried_tokens"` // prefix_cache_queries_total
	GenerationTokens *float64 `json:"generation_tokens"`
	HitPct           *float64 `json:"hit_pct"` // null before any prompt token was looked up
}

// seriesFor fills a HistorySeries from rows (one replica, or all of a
// model's) for the ring's points ending at h.head. A replica's rate in a
// point needs scrapes spanning half of it at least: the point in progress
// gets rates once half of it has passed, and a point where scrapes failed
// stays null (not a rate over a second) until a later scrape spans it. The
// tokens count in the totals either way. Called with h.mu held.
func (h *history) seriesFor(rows []*histRow) HistorySeries {
	n := h.points
	half := h.interval.Seconds() / 2
	s := HistorySeries{
		PromptTPS: make([]*float64, n), CachedTPS: make([]*float64, n), ComputedTPS: make([]*float64, n),
		GenerationTPS: make([]*float64, n), HitPct: make([]*float64, n),
	}
	gen := false
	for _, r := range rows {
		gen = gen || r.gen
	}
	var tot tokenCounts
	covered := make([]float64, len(rows))
	for p := range n {
		i := h.index(h.head - int64(n-1) + int64(p))
		var rate, sum tokenCounts
		rated := false
		for ri, r := range rows {
			b := r.buckets[i]
			if b.covered <= 0 {
				continue
			}
			c := b.tokenCounts
			if !r.prompt {
				c.Prompt = c.Queries
			}
			tot.add(c, 1)
			covered[ri] += b.covered
			if b.covered >= half {
				rate.add(c, 1/b.covered)
				sum.add(c, 1)
				rated = true
			}
		}
		if !rated {
			continue
		}
		s.PromptTPS[p] = round1(rate.Prompt)
		s.CachedTPS[p] = round1(min(rate.Hits, rate.Prompt))
		s.ComputedTPS[p] = round1(max(0, rate.Prompt-rate.Hits))
		if gen {
			s.GenerationTPS[p] = round1(rate.Gen)
		}
		if sum.Queries > 0 {
			s.HitPct[p] = round1(100 * min(1, sum.Hits/sum.Queries))
		}
	}
	for _, c := range covered {
		s.Total.Seconds = max(s.Total.Seconds, c)
	}
	s.Total.Seconds = math.Round(s.Total.Seconds*10) / 10
	s.Total.PromptTokens = math.Round(tot.Prompt)
	s.Total.CachedTokens = math.Round(min(tot.Hits, tot.Prompt))
	s.Total.ComputedTokens = math.Round(max(0, tot.Prompt-tot.Hits))
	s.Total.QueriedTokens = math.Round(tot.Queries)
	if gen {
		s.Total.GenerationTokens = ptr(math.Round(tot.Gen))
	}
	if tot.Queries > 0 {
		s.Total.HitPct = round1(100 * min(1, tot.Hits/tot.Queries))
	}
	return s
}

func round1(v float64) *float64 { return fptr(math.Round(v*10) / 10) }

// report returns the model's ring up to now.
func (h *history) report(m *model, now time.Time) ModelHistory {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.advance(h.slot(now))
	mh := ModelHistory{
		Model:         m.cfg.Name,
		StartMs:       (h.head - int64(h.points) + 1) * int64(h.interval) / int64(time.Millisecond),
		HistorySeries: h.seriesFor(h.allRows()),
	}
	for i, rep := range m.replicas {
		rh := ReplicaHistory{ID: i, URL: rep.target.Redacted()}
		if rep.rank != "" {
			rh.Rank = ptr(rep.engine)
		}
		if i < len(h.rows) {
			rh.HistorySeries = h.seriesFor(h.rows[i : i+1])
		}
		mh.Replicas = append(mh.Replicas, rh)
	}
	return mh
}

// History returns the last hour of every model, or of the model named
// (false if there is none of that name).
func (s *Server) History(model string) (HistoryReport, bool) {
	rt := s.state.Load()
	now := time.Now()
	rep := HistoryReport{Time: now.UTC(), IntervalSec: historyInterval.Seconds(), Points: historyPoints, Models: []ModelHistory{}}
	for _, name := range rt.names {
		if model != "" && name != model {
			continue
		}
		m := rt.models[name]
		rep.Models = append(rep.Models, m.hist.report(m, now))
	}
	return rep, model == "" || len(rep.Models) > 0
}

func (s *Server) serveHistory(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("model")
	rep, ok := s.History(name)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "no model named " + name})
		return
	}
	b, err := json.Marshal(rep)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = w.Write(b)
}
