package live

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/lm-warden/warden/live/sessionstore"
	"github.com/lm-warden/warden/live/upstream"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// routing is the immutable routing state: a configuration and the models
// built from it. A reload builds a new one and swaps the pointer; requests
// in progress keep the one they loaded.
type routing struct {
	cfg        *Config
	models     map[string]*model
	names      []string // model names, sorted
	clientKeys [][]byte
}

// Server is the proxy: a client-facing handler (ServeHTTP) and an admin
// handler (Admin) over one routing state. Make it with NewServer, run it
// with Serve, reconfigure it with Reload.
type Server struct {
	log     *slog.Logger
	keyer   *Keyer
	store   sessionstore.Store // session_store; nil: none
	obs     *observer
	tr      *transport
	base    *http.Transport  // to the backends
	up      *upstream.Client // to the backends: the proxied calls (base for what it does not handle)
	scrapeC *http.Client     // for /metrics and /health
	journal *Journal         // nil: none

	state    atomic.Pointer[routing]
	inFlight atomic.Int64    // client requests being served (limits.max_in_flight)
	bodies   upstream.Budget // request body buffers held (limits.max_body_bytes_in_flight)
	serving  atomic.Bool     // Serve started the scrape loops (see awaitFirstProbe)

	clientWrite atomic.Int64                   // timeouts.client_write in ns, read by the client connections
	clientLn    atomic.Pointer[clientListener] // Serve's; nil before (healthz, metrics)
	hostname    string                         // this machine's, lower case: an admin Host name

	// drained is cancelled at the drain deadline: every attempt still
	// running is cancelled then, and a stream ends with its API's error
	// event instead of a torn body.
	drained    context.Context
	endStreams context.CancelFunc

	adminExtra []adminRoute // WithAdminHandler

	mu        sync.Mutex      // serialises Reload and Serve's start/stop
	runCtx    context.Context // scrapers' parent while serving; nil before
	stopped   bool
	boot      *Config // NewServer's: the session key and the journal come from it
	listening *Config // Serve's: the listeners' settings come from it; nil before
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the server's logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// adminRoute is one handler added to the admin mux.
type adminRoute struct {
	pattern string
	h       http.Handler
}

// WithAdminHandler mounts h on the admin listener at pattern (an
// http.ServeMux pattern, e.g. "/" or "GET /dashboard/"), next to /metrics,
// /api/status and /healthz, which stay more specific and keep precedence.
// cmd/warden uses it for the dashboard, which live does not import. Admin
// panics, as http.ServeMux.Handle does, if pattern conflicts with another.
func WithAdminHandler(pattern string, h http.Handler) Option {
	return func(s *Server) { s.adminExtra = append(s.adminExtra, adminRoute{pattern, h}) }
}

// NewServer builds a server for cfg. It starts nothing: Serve starts the
// scrape loops and the listeners.
func NewServer(cfg *Config, opts ...Option) (*Server, error) {
	if cfg.KeyToCome() {
		return nil, errors.New("live: session_store without session_key: give it with --session-key-file")
	}
	s := &Server{log: slog.Default()}
	s.drained, s.endStreams = context.WithCancel(context.Background())
	for _, o := range opts {
		o(s)
	}
	key := []byte(cfg.SessionKey)
	if len(key) == 0 {
		key = make([]byte, 32)
		_, _ = rand.Read(key) // crypto/rand.Read never fails
	}
	s.keyer = NewKeyer(key)
	// The dial timeout is read at each dial, so that a reload applies it;
	// timeouts.response_header is applied per attempt (transport.try).
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: s.state.Load().cfg.Timeouts.Connect.D(), KeepAlive: 30 * time.Second}
		// A dial outlives its request in http.Transport (it may fill the
		// pool): the end of the drain cancels it, so none outlives Serve.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(s.drained, cancel)()
		return d.DialContext(ctx, network, addr)
	}
	// net/http's defaults (TLS handshake timeout and the rest), tuned.
	s.base = http.DefaultTransport.(*http.Transport).Clone()
	s.base.DialContext = dial
	s.base.Proxy = nil               // the replicas are reached directly, whatever HTTP_PROXY says
	s.base.ForceAttemptHTTP2 = false // HTTP/1.1, a connection per stream, as before
	s.base.MaxIdleConns = 1024
	s.base.MaxIdleConnsPerHost = 256
	s.base.IdleConnTimeout = 90 * time.Second
	s.base.ExpectContinueTimeout = time.Second
	s.base.DisableCompression = true // bodies pass through untouched: no transparent gzip
	s.base.MaxResponseHeaderBytes = upstream.MaxReplyHeadBytes
	s.up = upstream.New(dial, s.base)
	s.scrapeC = &http.Client{Transport: &http.Transport{
		DialContext:            dial,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: upstream.MaxReplyHeadBytes,
	}}
	s.tr = &transport{srv: s, up: s.up}
	s.obs = newObserver(s.state.Load)
	s.obs.clientConns(s.clientLn.Load)
	s.obs.bodyBytes(&s.bodies)
	s.clientWrite.Store(int64(cfg.Timeouts.ClientWrite.D()))
	if h, err := os.Hostname(); err == nil {
		s.hostname = strings.ToLower(h)
	}
	if cfg.SessionStore != "" {
		st, err := sessionstore.OpenRedis(cfg.SessionStore, cfg.SessionStorePasswordEnv, cfg.SessionStoreTimeout.D(), s.log)
		if err != nil {
			return nil, err
		}
		s.store = st
		s.obs.storeUp(st)
	}
	rt, _, err := s.build(cfg, nil)
	if err != nil {
		return nil, err
	}
	for _, name := range rt.names {
		s.obs.initModel(rt.models[name])
	}
	s.boot = cfg
	if cfg.Journal.Path != "" {
		j, err := openJournal(cfg.Journal, journalOptions{log: s.log, obs: s.obs})
		if err != nil {
			return nil, err
		}
		if cfg.SessionKey != "" {
			j.SetKey([]byte(cfg.SessionKey))
		}
		s.journal = j
	}
	s.state.Store(rt)
	return s, nil
}

// build makes a routing state for cfg. A model of old whose backends and
// policy are unchanged is reused as it is (its sessions, counters and
// scrape loops carry over); a changed one gets a successor built after it,
// returned in succeeds (new model -> the old one it replaces) for Reload to
// hand the sessions over once the whole state is built.
func (s *Server) build(cfg *Config, old *routing) (rt *routing, succeeds map[*model]*model, err error) {
	rt = &routing{cfg: cfg, models: map[string]*model{}}
	succeeds = map[*model]*model{}
	for _, k := range cfg.ClientAPIKeys {
		rt.clientKeys = append(rt.clientKeys, []byte(k))
	}
	for _, mc := range cfg.Models {
		var prev *model
		if old != nil {
			prev = old.models[mc.Name]
		}
		if prev != nil && prev.sameBackends(mc) && prev.samePolicy(mc) && prev.sameKVEvents(mc) &&
			old.cfg.ScrapeInterval == cfg.ScrapeInterval && old.cfg.Timeouts.Health == cfg.Timeouts.Health {
			rt.models[mc.Name] = prev
			rt.names = append(rt.names, mc.Name)
			continue
		}
		m, err := newModelAfter(mc, s.scrapeC, cfg.ScrapeInterval.D(), cfg.Timeouts.Health.D(), prev)
		if err != nil {
			return nil, nil, err
		}
		m.log = s.log
		if prev != nil {
			succeeds[m] = prev
			m.hist.adopt(prev.hist) // the last hour of tokens stays
		}
		m.store = s.store
		rt.models[mc.Name] = m
		rt.names = append(rt.names, mc.Name)
	}
	slices.Sort(rt.names)
	return rt, succeeds, nil
}

// Reload switches to cfg without dropping connections or affinity. A model
// whose replicas and placement settings are unchanged is kept as it is. A
// changed one (spill threshold, TTL, cap, active window, max_num_seqs,
// gpu, strategy, replica list, kv_events, scrape interval, health
// timeout) is
// replaced by a successor that inherits its session table, renumbered to
// the new replica list and reconfigured: every session whose home is
// still configured keeps it, the sessions of a removed replica are placed
// afresh on their next turn, and a replica added takes new sessions only.
// A kept backend keeps its in-flight count, request counts and ejection
// state at whatever index it now has, so streams running across the reload
// count in the new routing and give their count back there. The per-replica
// Prometheus series of an index that now names another backend start
// afresh.
//
// Everything read per request applies to the requests that start after the
// reload: the models, client and backend keys, the pin header, admin_hosts,
// the limits (max_body_bytes, max_session_id, max_in_flight,
// max_header_bytes up to four times its value at start) and the timeouts
// first_token, stream_idle, connect, response_header, health, client_write
// (at the next write that waits), and drain (read when the drain starts).
// What the listeners and the process hold (listen, admin, timeouts
// read_header, read and idle, limits.max_connections, session_key, journal)
// takes effect on restart only: a reload that changes them says which in
// its warning.
func (s *Server) Reload(cfg *Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.state.Load()
	rt, succeeds, err := s.build(cfg, old)
	if err != nil {
		return err
	}
	if keys := s.restartOnly(cfg); len(keys) > 0 {
		s.log.Warn("reload: these settings take effect on restart only", "keys", strings.Join(keys, ", "))
	}
	now := time.Now()
	var kept, forgotten int
	for _, name := range rt.names {
		m := rt.models[name]
		if old.models[name] == m {
			continue
		}
		if prev := succeeds[m]; prev != nil {
			k, f := m.handover(prev, now)
			kept, forgotten = kept+k, forgotten+f
			s.obs.dropReplicas(name, prev, m)
		}
		s.obs.initModel(m)
		if s.runCtx != nil && !s.stopped {
			m.start(s.runCtx)
		}
	}
	s.state.Store(rt)
	s.clientWrite.Store(int64(cfg.Timeouts.ClientWrite.D()))
	for _, name := range old.names {
		if m := old.models[name]; rt.models[name] != m {
			m.stop()
			if rt.models[name] == nil {
				s.obs.dropModel(name)
			}
		}
	}
	// Sessions of unchanged models are kept as they are and not counted.
	s.log.Info("configuration reloaded", "models", len(rt.names), "sessions_kept", kept, "sessions_forgotten", forgotten)
	return nil
}

// restartOnly names the settings of cfg that differ from those the running
// process holds and that a reload cannot apply.
func (s *Server) restartOnly(cfg *Config) []string {
	var keys []string
	add := func(changed bool, key string) {
		if changed {
			keys = append(keys, key)
		}
	}
	add(cfg.Listen != s.boot.Listen, "listen")
	add(cfg.Admin != s.boot.Admin, "admin")
	if l := s.listening; l != nil {
		add(cfg.Timeouts.ReadHeader != l.Timeouts.ReadHeader, "timeouts.read_header")
		add(cfg.Timeouts.Read != l.Timeouts.Read, "timeouts.read")
		add(cfg.Timeouts.Idle != l.Timeouts.Idle, "timeouts.idle")
		add(cfg.Limits.MaxConnections != l.Limits.MaxConnections, "limits.max_connections")
		if backstop := headerBackstop(l); int(cfg.Limits.MaxHeaderBytes) > backstop {
			keys = append(keys, fmt.Sprintf("limits.max_header_bytes above %d (4x its value at start)", backstop))
		}
	}
	add(cfg.SessionKey != s.boot.SessionKey, "session_key")
	add(cfg.SessionStore != s.boot.SessionStore, "session_store")
	add(cfg.SessionStorePasswordEnv != s.boot.SessionStorePasswordEnv, "session_store_password_env")
	add(cfg.SessionStoreTimeout != s.boot.SessionStoreTimeout, "session_store_timeout")
	add(cfg.Journal != s.boot.Journal, "journal")
	return keys
}

// headerBackstop is the http.Server's MaxHeaderBytes for cfg: the handler
// answers headers over limits.max_header_bytes in the client's API shape;
// Go's own plain-text 431 is only a backstop well above it.
func headerBackstop(cfg *Config) int { return 4 * int(cfg.Limits.MaxHeaderBytes) }

// Admin returns the admin handler: /metrics (Prometheus), /api/status
// (JSON, see Status), /api/history (JSON, the last hour of token rates,
// see History), /healthz and the handlers of WithAdminHandler.
func (s *Server) Admin() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.obs.reg, promhttp.HandlerOpts{Registry: s.obs.reg}))
	mux.HandleFunc("GET /api/status", s.serveStatus)
	mux.HandleFunc("GET /api/history", s.serveHistory)
	mux.HandleFunc("GET /healthz", s.serveHealthz)
	mux.HandleFunc("DELETE /v1/sessions/{id}", s.serveEndSession)
	for _, r := range s.adminExtra {
		mux.Handle(r.pattern, r.h)
	}
	return s.adminHostCheck(mux)
}

// serveEndSession answers DELETE /v1/sessions/{id} on the admin address:
// the conversation whose session id (as the client sends it, e.g. its
// X-Claude-Code-Session-Id) is id has ended; every model forgets it at
// once and frees its footprint (see HeaderSessionEnd). 204 when a model
// knew it, 404 when none did; the id is never echoed or logged in clear.
// A shared session store (Redis) keeps its record until its TTL: the
// other proxies still send a returning conversation home.
func (s *Server) serveEndSession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	rt := s.state.Load()
	if id == "" || len(id) > int(rt.cfg.Limits.MaxSessionID) {
		http.Error(w, fmt.Sprintf("session id: want 1 to %d bytes", rt.cfg.Limits.MaxSessionID), http.StatusBadRequest)
		return
	}
	key := s.keyer.Sum(id)
	found := false
	for _, name := range rt.names {
		if rt.models[name].endSession(key) {
			found = true
		}
	}
	if !found {
		http.Error(w, "no conversation with this session id", http.StatusNotFound)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// serveHealthz answers /healthz: 200 "ok", or 503 with the reason while
// the client listener cannot take a new client (at
// limits.max_connections, or accepting fails: out of file descriptors).
func (s *Server) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	code, body := s.healthz()
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// healthz is /healthz's answer: its status and body.
func (s *Server) healthz() (int, []byte) {
	if l := s.clientLn.Load(); l != nil {
		if msg := l.trouble(); msg != "" {
			return http.StatusServiceUnavailable, []byte(msg + "\n")
		}
	}
	return http.StatusOK, []byte("ok\n")
}

// The admin address is bounded as the clients' listener is (issue 46
// follow-up: a flood of connections to it took file descriptors without
// bound): at most adminMaxConns connections are served at once, idle
// keep-alive ones included, each idle one closed after adminIdle and a
// request's head due within adminReadHeader; its writes are cut, as a
// client's, after timeouts.client_write without progress. Its readers
// are few: Prometheus (one connection per scraper), a kubelet's or load
// balancer's probe of /healthz, an operator's dashboard (a browser opens
// at most six per host). A connection over the bound is answered by
// refuse: a GET /healthz as the admin handler answers it (a probe that
// comes during a flood still learns how the clients' listener fares),
// any other request 503 with Retry-After: 1; while maxRefusing
// connections are being refused, each for at most refuseWait, one more
// is closed at once, a probe's too (a kubelet probes again after its
// period). warden epp's probes go to its gRPC health port, a listener of
// its own.
const (
	adminMaxConns   = 64
	adminIdle       = 30 * time.Second
	adminReadHeader = 10 * time.Second
)

// adminServer is the HTTP server of the admin address, to be served on
// adminListener.
func (s *Server) adminServer() *http.Server {
	return &http.Server{Handler: s.Admin(), ReadHeaderTimeout: adminReadHeader, IdleTimeout: adminIdle,
		MaxHeaderBytes: DefaultMaxHeaderBytes, ErrorLog: log.New(logWriter{s.log}, "", 0)}
}

// adminListener bounds the admin address's listener ln at adminMaxConns.
func (s *Server) adminListener(ln net.Listener) *clientListener {
	role := &listenerRole{conns: "admin connections", bound: fmt.Sprintf("the admin address's bound (%d)", adminMaxConns),
		refused: s.obs.adminRefused, over: s.overAdmin}
	return newClientListener(ln, adminMaxConns, role, &s.clientWrite, s.log, s.obs)
}

// overAdmin answers a request over adminMaxConns: GET /healthz as the
// admin handler does (its Host header checked as there), any other 503.
func (s *Server) overAdmin(req *http.Request, max int) overAnswer {
	if req.Method == http.MethodGet && req.URL.Path == "/healthz" && s.adminHostAllowed(req.Host) {
		code, body := s.healthz()
		return overAnswer{code: code, ctype: "text/plain", body: body}
	}
	msg := fmt.Sprintf("admin: %d connections open, the admin address's bound; retry shortly\n", max)
	return overAnswer{code: http.StatusServiceUnavailable, ctype: "text/plain", body: []byte(msg), retry: true}
}

// adminHostCheck refuses, with 403, a request whose Host header is not a
// name of the admin address: else a page in a local browser could read
// /api/status (and the dashboard) through DNS rebinding, its own name
// made to resolve to 127.0.0.1. Accepted: any IP address, localhost and
// *.localhost, the host of the admin setting, this machine's host name,
// and admin_hosts.
func (s *Server) adminHostCheck(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.adminHostAllowed(r.Host) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte("admin: the Host header names none of this address's names: add it to admin_hosts\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// adminHostAllowed reports whether host (a Host header, with or without a
// port) names the admin address.
func (s *Server) adminHostAllowed(host string) bool {
	if host == "" {
		return true // HTTP/1.0 without Host: no browser sends that
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")), ".")
	if net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if host == s.hostname {
		return true
	}
	if h, _, err := net.SplitHostPort(s.boot.Admin); err == nil && strings.EqualFold(h, host) {
		return true
	}
	for _, n := range s.state.Load().cfg.AdminHosts {
		if strings.EqualFold(strings.TrimSuffix(n, "."), host) {
			return true
		}
	}
	return false
}

// Serve runs the proxy on ln and the admin handler on adminLn (nil: no
// admin listener) until ctx is done, then drains: it stops accepting, lets
// streams in progress finish for up to timeouts.drain, closes what is left,
// stops the scrape loops and closes the journal. It returns nil after a
// clean drain.
func (s *Server) Serve(ctx context.Context, ln, adminLn net.Listener) error {
	stopScrapers, storeDone, cfg, err := s.startLoops(ctx, "Serve")
	if err != nil {
		return err
	}
	srv := s.clientServer(cfg)
	servers := []*http.Server{srv}
	errc := make(chan error, 2)
	cl := newClientListener(ln, cfg.Limits.MaxConnections, clientRole(s.obs, true), &s.clientWrite, s.log, s.obs)
	s.clientLn.Store(cl)
	go func() { errc <- srv.Serve(cl) }()
	var aln *clientListener
	if adminLn != nil {
		admin := s.adminServer()
		aln = s.adminListener(adminLn)
		servers = append(servers, admin)
		go func() { errc <- admin.Serve(aln) }()
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	drain := s.state.Load().cfg.Timeouts.Drain.D() // the latest reload's
	s.log.Info("draining", "deadline", drain)
	if s.journal != nil {
		_ = s.journal.Flush() // now, not after the drain a supervisor may cut short; errors are logged and counted
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	for _, h := range servers {
		if e := h.Shutdown(drainCtx); e != nil {
			// End the streams still running with their API's error event,
			// give their handlers a moment to write it, then close.
			s.log.Warn("drain deadline passed; ending running streams", "err", e)
			s.endStreams()
			endCtx, endCancel := context.WithTimeout(context.Background(), drainGrace)
			if e := h.Shutdown(endCtx); e != nil {
				s.log.Warn("closing remaining connections", "err", e)
				_ = h.Close()
			}
			endCancel()
		}
	}
	s.endStreams()
	for range len(servers) - boolInt(err != nil) {
		if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) && err == nil {
			err = e
		}
	}
	cl.wait() // connections being refused over max_connections: within refuseWait
	if aln != nil {
		aln.wait()
	}
	return s.stopLoops(stopScrapers, storeDone, err, "serve")
}

// clientServer is the HTTP server of the clients' listener (served on a
// clientListener).
func (s *Server) clientServer(cfg *Config) *http.Server {
	return &http.Server{
		Handler:           s,
		ReadHeaderTimeout: cfg.Timeouts.ReadHeader.D(),
		ReadTimeout:       cfg.Timeouts.Read.D(),
		IdleTimeout:       cfg.Timeouts.Idle.D(),
		MaxHeaderBytes:    headerBackstop(cfg),
		ErrorLog:          log.New(logWriter{s.log}, "", 0),
		ConnContext:       withConn,
	}
}

// connKey carries a client's connection in its requests' contexts, for
// upstream.ReadBody to see how much of a body has arrived (upstream.Arrivals).
type connKey struct{}

func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// connArrivals is the upstream.Arrivals of r's connection, nil when it cannot tell.
func connArrivals(r *http.Request) upstream.Arrivals {
	a, _ := r.Context().Value(connKey{}).(upstream.Arrivals)
	return a
}

// drainGrace is how long, after the drain deadline, the streams that were
// ended get to write their error event before connections are closed.
const drainGrace = 2 * time.Second

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// logWriter adapts the http.Server's log.Logger to slog at debug level
// (it reports client disconnects, which are routine).
type logWriter struct{ log *slog.Logger }

func (l logWriter) Write(p []byte) (int, error) {
	l.log.Debug(strings.TrimSpace(string(p)))
	return len(p), nil
}

// startLoops starts what Serve and Run share: the scrape and health loops
// of every model and the session store's loop. caller names the method in
// the error of a second call.
func (s *Server) startLoops(ctx context.Context, caller string) (stop context.CancelFunc, storeDone chan struct{}, cfg *Config, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runCtx != nil {
		return nil, nil, nil, fmt.Errorf("live: %s called after Run or Serve", caller)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.runCtx = runCtx
	rt := s.state.Load()
	s.listening = rt.cfg
	for _, name := range rt.names {
		rt.models[name].start(runCtx)
	}
	s.serving.Store(true)
	storeDone = make(chan struct{})
	if s.store != nil {
		go func() {
			defer close(storeDone)
			s.store.Run(runCtx, s.storeLoads)
		}()
	} else {
		close(storeDone)
	}
	return stop, storeDone, rt.cfg, nil
}

// stopLoops ends what startLoops started, once the listeners are done:
// upstream connections, the loops, the store and the journal. err is the
// listeners' error; op names the method in the error returned.
func (s *Server) stopLoops(stop context.CancelFunc, storeDone <-chan struct{}, err error, op string) error {
	s.up.Close()
	s.base.CloseIdleConnections()
	s.mu.Lock()
	s.stopped = true
	stop()
	for _, name := range s.state.Load().names {
		s.state.Load().models[name].stop()
	}
	s.mu.Unlock()
	<-storeDone
	if s.store != nil {
		_ = s.store.Close()
	}
	if s.journal != nil {
		if e := s.journal.Close(); e != nil && err == nil {
			err = e
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("live: %s: %w", op, err)
	}
	return nil
}

// The lifecycle of a front end that brings its own listener (warden
// epp): ClientListener, Run, and what it reads of the configuration.

// Endpoints lists every configured replica's host:port, each once, in
// the order of the models (sorted by name) and their replicas.
func (s *Server) Endpoints() []string {
	rt := s.state.Load()
	var out []string
	for _, name := range rt.names {
		for _, rep := range rt.models[name].replicas {
			if !slices.Contains(out, rep.target.Host) {
				out = append(out, rep.target.Host)
			}
		}
	}
	return out
}

// Run serves what the proxy serves beside its client listener, for a
// front end that brings its own (warden epp): the scrape and health loops
// of every model, the session store's loop, and the admin handler on
// adminLn (nil: none; bounded as Serve bounds it, adminListener), until
// ctx is done. Decide may be called before Run
// and after it returns; while Run runs, the first request of a model waits
// for its first scrape (awaitFirstProbe).
func (s *Server) Run(ctx context.Context, adminLn net.Listener) error {
	stopLoops, storeDone, _, err := s.startLoops(ctx, "Run")
	if err != nil {
		return err
	}

	errc := make(chan error, 1)
	var (
		admin *http.Server
		aln   *clientListener
	)
	if adminLn != nil {
		admin, aln = s.adminServer(), s.adminListener(adminLn)
		go func() { errc <- admin.Serve(aln) }()
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	if admin != nil {
		sctx, cancel := context.WithTimeout(context.Background(), drainGrace)
		_ = admin.Shutdown(sctx)
		cancel()
		if err == nil {
			err = <-errc
		}
		aln.wait() // connections being refused over adminMaxConns: within refuseWait
	}
	s.endStreams()
	return s.stopLoops(stopLoops, storeDone, err, "run")
}

// ClientListener wraps ln as Serve wraps the clients' listener, for a
// front end that serves its own protocol on it (warden epp's gRPC): at
// most limits.max_connections connections open at once, idle ones
// included (at the bound Accept waits for one to close), an Accept that
// fails for want of a descriptor retried with back-off, each counted and
// shown on /healthz and warden_client_connections, and each connection's
// writes bounded by timeouts.client_write (see clientListener). Call it
// once, before Run.
func (s *Server) ClientListener(ln net.Listener) net.Listener {
	cl := newClientListener(ln, s.state.Load().cfg.Limits.MaxConnections, clientRole(s.obs, false), &s.clientWrite, s.log, s.obs)
	s.clientLn.Store(cl)
	return cl
}

// DrainTimeout is timeouts.drain of the current configuration.
func (s *Server) DrainTimeout() time.Duration { return s.state.Load().cfg.Timeouts.Drain.D() }

// Models names the configured models, sorted.
func (s *Server) Models() []string { return slices.Clone(s.state.Load().names) }

// Limits are the limits of the current configuration, defaults filled.
func (s *Server) Limits() Limits { return s.state.Load().cfg.Limits }
