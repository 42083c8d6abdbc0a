package live

import (
	"github.com/lm-warden/warden/live/sessionstore"
	"github.com/lm-warden/warden/live/upstream"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/lm-warden/warden/metrics/names"
)

// Series names of warden's own metrics that the shared vocabulary
// (package metrics) does not define, because only live mode has them.
const (
	seriesSpills          = "warden_spills_total"
	seriesUpstreamErrors  = "warden_upstream_errors_total"
	seriesRejected        = "warden_rejected_total"
	seriesEjections       = "warden_ejections_total"
	seriesDuration        = "warden_request_duration_seconds"
	seriesPromptTokens    = "warden_prompt_tokens_total"
	seriesScrapeAge       = "warden_scrape_age_seconds"
	seriesReplicaHealthy  = "warden_replica_healthy"
	seriesSessionCapacity = "warden_session_capacity"
	seriesCountTokens     = "warden_count_tokens_total"
	seriesJournalErrors   = "warden_journal_write_errors_total"
	seriesJournalDropped  = "warden_journal_dropped_total"
	seriesJournalLate     = "warden_journal_late_total"
	seriesRehomes         = "warden_rehomes_total"
)

// observer holds the proxy's Prometheus metrics in a private registry
// (no global state). Per-request series are updated on the request path;
// per-replica gauges (in flight, sessions, scrape age, health) are read from
// the routing state when scraped, by stateCollector.
type observer struct {
	reg            *prometheus.Registry
	requests       *prometheus.CounterVec // model, replica, reason
	spills         *prometheus.CounterVec // model, replica (the home that overflowed)
	rehomes        *prometheus.CounterVec // model, replica (the home found cold)
	upstreamErrors *prometheus.CounterVec // model, replica, kind
	rejected       *prometheus.CounterVec // reason
	ejections      *prometheus.CounterVec // model, replica
	laterTurns     *prometheus.CounterVec // model
	laterHome      *prometheus.CounterVec // model
	outputTokens   *prometheus.CounterVec // model
	promptTokens   *prometheus.CounterVec // model
	countTokens    *prometheus.CounterVec // model
	journalErrors  prometheus.Counter
	journalDropped prometheus.Counter
	journalLate    prometheus.Counter
	// The clients' and the admin address's listeners and connections
	// (listener.go).
	connRefused         prometheus.Counter
	connWaits           prometheus.Counter
	acceptErrors        prometheus.Counter
	adminRefused        prometheus.Counter
	clientWriteTimeouts prometheus.Counter
	ttfb                *prometheus.HistogramVec
	duration            *prometheus.HistogramVec
}

func newObserver(state func() *routing) *observer {
	o := &observer{reg: prometheus.NewRegistry()}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		o.reg.MustRegister(c)
		return c
	}
	o.requests = counter(names.WardenRequests, "Requests forwarded, by the replica that served them and why it was chosen ("+reasonList()+").", "model", "replica", "reason")
	o.spills = counter(seriesSpills, "Later turns that left their home because it was over the spill threshold, by home replica.", "model", "replica")
	o.rehomes = counter(seriesRehomes, "Conversations moved away from their home because its last answer to them served (nearly) none of the prefix they had there from cache (rehome: cold), by the home they left.", "model", "replica")
	o.upstreamErrors = counter(seriesUpstreamErrors, "Upstream failures by kind: connect, reset, status (a 5xx answer), stream (after the first byte), timeout (timeouts.first_token, stream_idle or response_header), protocol (a reply head over the proxy's bounds, malformed, or a status outside 100-599), down, drain.", "model", "replica", "kind")
	o.rejected = counter(seriesRejected, "Requests the proxy answered itself with an error, by reason.", "reason")
	o.ejections = counter(seriesEjections, "Passive ejections of a replica after a refused connection.", "model", "replica")
	o.laterTurns = counter(names.WardenLaterTurns, "Requests of a session already known (turn > 0).", "model")
	o.laterHome = counter(names.WardenLaterTurnsHome, "Later turns served by the replica of the session's first turn (a re-homed session's are not).", "model")
	o.outputTokens = counter(names.WardenOutputTokens, "Output tokens reported in responses' usage.", "model")
	jc := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		o.reg.MustRegister(c)
		return c
	}
	o.journalErrors = jc(seriesJournalErrors, "Failed writes of the request journal (each also logged).")
	o.journalDropped = jc(seriesJournalDropped, "Requests not journaled: lost with a failed write, or finished while the journal could not write.")
	o.journalLate = jc(seriesJournalLate, "Requests journaled out of arrival order: held back past the journal's memory bound, written when they ended.")
	o.connWaits = jc("warden_connection_limit_waits_total", "Times a client listener that does not answer over its bound (warden epp's gRPC) had limits.max_connections open and waited for one to close before accepting another.")
	o.connRefused = jc("warden_connections_refused_total", "Client connections that came while limits.max_connections were open: answered at once with 429/529 and Retry-After (also counted in warden_rejected_total{reason=\"max_connections\"}), or closed at once when many were being refused already.")
	o.acceptErrors = jc("warden_accept_errors_total", "Failed accepts of a client (or admin) connection (too many open files and the like), each retried after a back-off.")
	o.adminRefused = jc("warden_admin_connections_refused_total", "Connections to the admin address that came while it served 64, its bound: a GET /healthz answered as the admin handler does, any other request 503 with Retry-After, or closed at once when many were being refused already.")
	o.clientWriteTimeouts = jc("warden_client_write_timeouts_total", "Writes to a client cut after timeouts.client_write without progress (a client that stopped reading): the exchange ends and the backend request is cancelled.")
	o.countTokens = counter(seriesCountTokens, "Token-count requests (/v1/messages/count_tokens) forwarded: no conversation turn, so in no session, turn, request or TTFB series.", "model")
	o.promptTokens = counter(seriesPromptTokens, "Prompt tokens reported in responses' usage.", "model")
	// Classic buckets and a native histogram in one: a Prometheus scraping
	// with native histograms enabled (protobuf) stores the native one, which
	// the TTFB KPIs read for quantiles within about 0.5%; any other reads
	// the classic buckets. The simulator writes the same two
	// (metrics.Histogram.WithNative).
	native := names.WardenTTFBNative()
	o.ttfb = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:                           names.WardenTTFB,
		Help:                           "Time from receiving a request to forwarding its first output token (streams) or first body byte.",
		Buckets:                        names.WardenTTFBBuckets(),
		NativeHistogramBucketFactor:    native.BucketFactor,
		NativeHistogramMaxBucketNumber: uint32(native.MaxBuckets),
	}, []string{"model"})
	o.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    seriesDuration,
		Help:    "Time from receiving a request to the end of its response.",
		Buckets: names.WardenTTFBBuckets(),
	}, []string{"model"})
	for _, r := range rejectReasons {
		o.rejected.WithLabelValues(r)
	}
	o.reg.MustRegister(o.ttfb, o.duration,
		&stateCollector{state: state},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return o
}

// reasonList names the reason label's values: placement's reasons and
// "retried".
func reasonList() string {
	names := make([]string, numCounted)
	for i := range names {
		names[i] = reasonName(i)
	}
	return strings.Join(names, ", ")
}

// rejectReasons are the values of warden_rejected_total's reason label.
var rejectReasons = []string{"header_too_large", "auth", "path", "method", "too_large", "read", "utf8", "json", "duplicate_key", "content_type", "model", "unknown_model", "session_id", "unavailable", "body_budget", "max_connections"}

// upstreamKinds are the values of warden_upstream_errors_total's kind label.
var upstreamKinds = []string{"connect", "reset", "status", "stream"}

// initModel creates a model's series at zero, so that they exist before
// their first event (PromQL's increase() misses a counter's first step).
func (o *observer) initModel(m *model) {
	name := m.cfg.Name
	for _, v := range []*prometheus.CounterVec{o.laterTurns, o.laterHome, o.outputTokens, o.promptTokens, o.countTokens} {
		v.WithLabelValues(name)
	}
	o.ttfb.WithLabelValues(name)
	o.duration.WithLabelValues(name)
	for _, rep := range m.replicas {
		id := strconv.Itoa(rep.id)
		for i := range numCounted {
			o.requests.WithLabelValues(name, id, reasonName(i))
		}
		o.spills.WithLabelValues(name, id)
		o.rehomes.WithLabelValues(name, id)
		o.ejections.WithLabelValues(name, id)
		for _, k := range upstreamKinds {
			o.upstreamErrors.WithLabelValues(name, id, k)
		}
	}
}

// dropModel deletes a model's series (a reload removed it).
func (o *observer) dropModel(name string) {
	l := prometheus.Labels{"model": name}
	for _, v := range []*prometheus.CounterVec{o.requests, o.spills, o.rehomes, o.upstreamErrors, o.ejections, o.laterTurns, o.laterHome, o.outputTokens, o.promptTokens, o.countTokens} {
		v.DeletePartialMatch(l)
	}
	o.ttfb.DeletePartialMatch(l)
	o.duration.DeletePartialMatch(l)
}

// dropReplicas deletes the per-replica series of model name whose index
// no longer names the backend it named in prev (m replaced prev in a
// reload): their counts belong to another backend, or to none.
func (o *observer) dropReplicas(name string, prev, m *model) {
	for j, old := range prev.replicas {
		if j < len(m.replicas) && m.replicas[j].replicaState == old.replicaState {
			continue
		}
		l := prometheus.Labels{"model": name, "replica": strconv.Itoa(j)}
		for _, v := range []*prometheus.CounterVec{o.requests, o.spills, o.rehomes, o.upstreamErrors, o.ejections} {
			v.DeletePartialMatch(l)
		}
	}
}

var (
	descInFlight = prometheus.NewDesc(names.WardenInFlight, "Requests sent to the replica whose response has not finished.", []string{"model", "replica"}, nil)
	descSessions = prometheus.NewDesc(names.WardenSessions, "Conversations homed on the replica (the session table).", []string{"model", "replica"}, nil)
	descActive   = prometheus.NewDesc(names.WardenActiveSessions, "Conversations homed on the replica and seen within the active window: what placement balances.", []string{"model", "replica"}, nil)
	descAge      = prometheus.NewDesc(seriesScrapeAge, "Seconds since the replica's server was last scraped successfully (+Inf: never).", []string{"model", "replica"}, nil)
	descHealthy  = prometheus.NewDesc(seriesReplicaHealthy, "1 if the replica may receive requests (health probe passing, not ejected).", []string{"model", "replica"}, nil)
	descCapacity = prometheus.NewDesc(seriesSessionCapacity, "The session table's cap for the model.", []string{"model"}, nil)
	descHeadroom = prometheus.NewDesc(names.WardenKVHeadroomTokens, "KV cache capacity (vllm:cache_config_info) minus the resident footprint of the held conversations homed on the replica (a request in flight, or back within their return timeout), in tokens; absent when the server does not expose its cache size.", []string{"model", "replica"}, nil)
	descAdmWait  = prometheus.NewDesc(names.WardenAdmissionWaiting, "New conversations waiting at the proxy for KV headroom (admission: kv).", []string{"model"}, nil)
	descAdmTOut  = prometheus.NewDesc(names.WardenAdmissionTimeouts, "New conversations refused after waiting admission_timeout for KV headroom (admission: kv).", []string{"model"}, nil)
)

// stateCollector exports the per-replica gauges from the live routing state.
type stateCollector struct{ state func() *routing }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descInFlight
	ch <- descSessions
	ch <- descActive
	ch <- descAge
	ch <- descHealthy
	ch <- descCapacity
	ch <- descHeadroom
	ch <- descAdmWait
	ch <- descAdmTOut
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	rt := c.state()
	if rt == nil {
		return
	}
	now := time.Now()
	for _, name := range rt.names {
		m := rt.models[name]
		m.mu.Lock()
		m.table.Advance(now)
		counts := m.table.Counters()
		capacity := m.table.MaxSessions()
		admission := m.admissionOn()
		waiting, timeouts := m.adm.waiting.Len(), m.adm.timeouts
		states := make([]string, len(m.replicas))
		for i, rep := range m.replicas {
			states[i] = m.state(rep, rep.server.last.Load(), now)
		}
		m.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(capacity), name)
		if admission {
			ch <- prometheus.MustNewConstMetric(descAdmWait, prometheus.GaugeValue, float64(waiting), name)
			ch <- prometheus.MustNewConstMetric(descAdmTOut, prometheus.CounterValue, float64(timeouts), name)
		}
		for i, rep := range m.replicas {
			id := strconv.Itoa(i)
			sessions, active := 0, 0
			if i < len(counts) {
				sessions, active = counts[i].Sessions, counts[i].Active
			}
			age := inf
			if r := rep.server.last.Load(); !r.OK.IsZero() {
				age = now.Sub(r.OK).Seconds()
			}
			healthy := 0.0
			if states[i] == "healthy" || states[i] == "warming" {
				healthy = 1
			}
			ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(rep.inFlight.Load()), name, id)
			ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(sessions), name, id)
			ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(active), name, id)
			ch <- prometheus.MustNewConstMetric(descAge, prometheus.GaugeValue, age, name, id)
			ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, healthy, name, id)
			if c, ok := kvCapacity(rep, rep.server.last.Load()); ok {
				fp := 0
				if i < len(counts) {
					fp = counts[i].HeldFootprint
				}
				ch <- prometheus.MustNewConstMetric(descHeadroom, prometheus.GaugeValue, float64(c-fp), name, id)
			}
		}
	}
}

var inf = math.Inf(1)

// clientConns registers warden_client_connections: the client connections
// open now (limits.max_connections bounds them), read from the listener
// Serve runs (none before).
func (o *observer) clientConns(ln func() *clientListener) {
	o.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "warden_client_connections",
		Help: "Client connections open, idle keep-alive ones included (bounded by limits.max_connections).",
	}, func() float64 {
		if l := ln(); l != nil {
			return float64(l.open.Load())
		}
		return 0
	}))
}

// bodyBytes registers warden_request_body_bytes: the bytes of request
// body buffers held now (limits.max_body_bytes_in_flight bounds them).
func (o *observer) bodyBytes(b *upstream.Budget) {
	o.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "warden_request_body_bytes",
		Help: "Bytes of request body buffers the proxy holds now (bounded by limits.max_body_bytes_in_flight; beyond, requests get 429/529).",
	}, func() float64 { return float64(b.Held()) }))
}

// storeUp registers warden_session_store_up: 1 while the session store is
// up, 0 while it is not; and warden_session_store_bad_keys_total.
func (o *observer) storeUp(st sessionstore.Store) {
	o.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "warden_session_store_up",
		Help: "1 while the session store (session_store) answers, 0 while the proxy serves from its own table without it.",
	}, func() float64 { return float64(boolInt(st.Up())) }))
	o.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "warden_session_store_bad_keys_total",
		Help: "Keys of the session store of the wrong type or size skipped, once per sync or claim that met one (/api/status session_store.bad_key names the last).",
	}, func() float64 { return float64(st.State().BadKeysTotal) }))
}
