package live

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
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
	obs     *observer
	proxy   *httputil.ReverseProxy
	base    *http.Transport // to the backends
	scrapeC *http.Client    // for /metrics and /health
	journal *Journal        // nil: none

	state    atomic.Pointer[routing]
	inFlight atomic.Int64 // client requests being served (limits.max_in_flight)

	// drained is cancelled at the drain deadline: every attempt still
	// running is cancelled then, and a stream ends with its API's error
	// event instead of a torn body.
	drained    context.Context
	endStreams context.CancelFunc

	adminExtra []adminRoute // WithAdminHandler

	mu      sync.Mutex      // serialises Reload and Serve's start/stop
	runCtx  context.Context // scrapers' parent while serving; nil before
	stopped bool
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
	dialer := &net.Dialer{Timeout: cfg.Timeouts.Connect.D(), KeepAlive: 30 * time.Second}
	s.base = &http.Transport{
		DialContext:           dialer.DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: cfg.Timeouts.ResponseHeader.D(),
		ExpectContinueTimeout: time.Second,
		// Bodies pass through untouched: no transparent gzip.
		DisableCompression: true,
	}
	s.scrapeC = &http.Client{Transport: &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}}
	s.proxy = &httputil.ReverseProxy{
		Rewrite:       s.rewrite,
		Transport:     &transport{srv: s, base: s.base},
		FlushInterval: -1, // flush every write: each SSE event goes out as it arrives
		ErrorHandler:  s.errorHandler,
		ErrorLog:      log.New(logWriter{s.log}, "", 0),
	}
	s.obs = newObserver(s.state.Load)
	rt, err := s.build(cfg, nil)
	if err != nil {
		return nil, err
	}
	if cfg.Journal.Path != "" {
		j, err := OpenJournal(cfg.Journal)
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

// build makes a routing state for cfg, reusing the models of old whose
// backends and policy are unchanged (their sessions, counters and scrape
// loops carry over). Models of old that are not reused are returned for
// stopping.
func (s *Server) build(cfg *Config, old *routing) (*routing, error) {
	rt := &routing{cfg: cfg, models: map[string]*model{}}
	for _, k := range cfg.ClientAPIKeys {
		rt.clientKeys = append(rt.clientKeys, []byte(k))
	}
	for _, mc := range cfg.Models {
		if old != nil {
			if m := old.models[mc.Name]; m != nil && m.sameBackends(mc) && m.samePolicy(mc) &&
				old.cfg.ScrapeInterval == cfg.ScrapeInterval && old.cfg.Timeouts.Health == cfg.Timeouts.Health {
				rt.models[mc.Name] = m
				rt.names = append(rt.names, mc.Name)
				continue
			}
		}
		m, err := newModel(mc, s.scrapeC, cfg.ScrapeInterval.D(), cfg.Timeouts.Health.D())
		if err != nil {
			return nil, err
		}
		if old != nil && old.models[mc.Name] != nil {
			s.obs.dropModel(mc.Name)               // rebuilt: its counters start afresh
			m.hist.adopt(old.models[mc.Name].hist) // but the last hour of tokens stays
		}
		m.log = s.log
		s.obs.initModel(m)
		rt.models[mc.Name] = m
		rt.names = append(rt.names, mc.Name)
	}
	slices.Sort(rt.names)
	return rt, nil
}

// Reload switches to cfg without dropping connections: the routing state
// is swapped atomically; requests in progress finish on the old one.
// Models whose replicas and placement settings are unchanged keep their
// sessions and counters; a changed model starts afresh. Listener addresses,
// limits that the http.Server holds (header size, timeouts) and the journal
// are not changed by a reload (restart for those); they are logged.
func (s *Server) Reload(cfg *Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.state.Load()
	if old.cfg.Listen != cfg.Listen || old.cfg.Admin != cfg.Admin || old.cfg.Limits.MaxHeaderBytes != cfg.Limits.MaxHeaderBytes ||
		old.cfg.Timeouts != cfg.Timeouts || old.cfg.Journal != cfg.Journal {
		s.log.Warn("reload: listen, admin, limits.max_header_bytes, timeouts and journal take effect on restart only")
	}
	rt, err := s.build(cfg, old)
	if err != nil {
		return err
	}
	if s.runCtx != nil && !s.stopped {
		for _, name := range rt.names {
			if m := rt.models[name]; old.models[name] != m {
				m.start(s.runCtx)
			}
		}
	}
	s.state.Store(rt)
	for _, name := range old.names {
		if m := old.models[name]; rt.models[name] != m {
			m.stop()
			if rt.models[name] == nil {
				s.obs.dropModel(name)
			}
		}
	}
	s.log.Info("configuration reloaded", "models", len(rt.names))
	return nil
}

// Admin returns the admin handler: /metrics (Prometheus), /api/status
// (JSON, see Status), /api/history (JSON, the last hour of token rates,
// see History), /healthz and the handlers of WithAdminHandler.
func (s *Server) Admin() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.obs.reg, promhttp.HandlerOpts{Registry: s.obs.reg}))
	mux.HandleFunc("GET /api/status", s.serveStatus)
	mux.HandleFunc("GET /api/history", s.serveHistory)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	for _, r := range s.adminExtra {
		mux.Handle(r.pattern, r.h)
	}
	return mux
}

// Serve runs the proxy on ln and the admin handler on adminLn (nil: no
// admin listener) until ctx is done, then drains: it stops accepting, lets
// streams in progress finish for up to timeouts.drain, closes what is left,
// stops the scrape loops and closes the journal. It returns nil after a
// clean drain.
func (s *Server) Serve(ctx context.Context, ln, adminLn net.Listener) error {
	s.mu.Lock()
	if s.runCtx != nil {
		s.mu.Unlock()
		return errors.New("live: Serve called twice")
	}
	runCtx, stopScrapers := context.WithCancel(context.WithoutCancel(ctx))
	s.runCtx = runCtx
	rt := s.state.Load()
	for _, name := range rt.names {
		rt.models[name].start(runCtx)
	}
	s.mu.Unlock()

	cfg := rt.cfg
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: cfg.Timeouts.ReadHeader.D(),
		ReadTimeout:       cfg.Timeouts.Read.D(),
		IdleTimeout:       cfg.Timeouts.Idle.D(),
		// The handler answers headers over the limit in the client's API
		// shape; Go's own plain-text 431 is only a backstop well above it.
		MaxHeaderBytes: 4 * int(cfg.Limits.MaxHeaderBytes),
		ErrorLog:       log.New(logWriter{s.log}, "", 0),
	}
	servers := []*http.Server{srv}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if adminLn != nil {
		admin := &http.Server{Handler: s.Admin(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: srv.ErrorLog}
		servers = append(servers, admin)
		go func() { errc <- admin.Serve(adminLn) }()
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.log.Info("draining", "deadline", cfg.Timeouts.Drain.D())
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.Timeouts.Drain.D())
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
	s.mu.Lock()
	s.stopped = true
	stopScrapers()
	for _, name := range s.state.Load().names {
		s.state.Load().models[name].stop()
	}
	s.mu.Unlock()
	if s.journal != nil {
		if e := s.journal.Close(); e != nil && err == nil {
			err = e
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("live: serve: %w", err)
	}
	return nil
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
