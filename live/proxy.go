package live

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lm-warden/warden/placement"
)

// endpoints maps the paths the proxy serves to their dialect.
var endpoints = map[string]API{
	"/v1/chat/completions": APIOpenAI,
	"/v1/completions":      APIOpenAI,
	"/v1/responses":        APIResponses,
	"/v1/messages":         APIAnthropic,
	countTokensPath:        APIAnthropic,
}

// countTokensPath counts a prompt's tokens (Anthropic): it is no
// conversation turn (see model.pickAux).
const countTokensPath = "/v1/messages/count_tokens"

// maxUsageBody bounds how much of a non-streamed response is kept to read
// its usage.
const maxUsageBody = 1 << 20

// callKey carries the *call of a request through the ReverseProxy.
type callKey struct{}

// call is one client request on its way through the proxy.
type call struct {
	srv       *Server
	m         *model
	api       API
	path      string
	in        *http.Request // the client's request (with the call in its context), for a retry's outgoing one
	rb        *reqBody      // the request body (rb.data), given back at finish
	stream    bool
	req       placement.Request // Session/Parent are keyed hashes
	source    string            // where the session id came from
	turnKnown bool              // the session was known before this request (for the journal)
	aux       bool              // not a conversation turn (count_tokens): no session, turn or journal record
	start     time.Time

	cur      *attempt    // the attempt whose response is being served
	reason   string      // reason of cur: a placement reason or "retried"
	attempts int         // attempts made
	noRep    atomic.Bool // a retry found no replica

	ttfb     atomic.Int64 // ns from start to first output token; 0: none
	usage    Usage
	status   int
	finished atomic.Bool
	jt       journalTicket // place in the journal's arrival order
}

// attempt is one try of a call on one replica; it holds one in-flight count
// and gives it back exactly once.
type attempt struct {
	m        *model
	rep      *replica
	released atomic.Bool
	uncached int64       // its share of rep's prefill queue (Decision.Uncached)
	queued   atomic.Bool // the share is still counted (see prefilled)
}

func (a *attempt) release() {
	if a != nil && a.released.CompareAndSwap(false, true) {
		a.prefilled()
		a.rep.inFlight.Add(-1)
	}
}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// ServeHTTP is the client-facing handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt := s.state.Load()
	if len(r.TransferEncoding) > 0 {
		// RFC 9112 6.1: a request with both Transfer-Encoding and
		// Content-Length must be followed by the connection's close, so
		// that what a front proxy took for the rest of its body is not
		// served as the next request. Go's parser drops the Content-Length
		// before a handler sees the request, so every request with a
		// Transfer-Encoding (the SDKs send Content-Length) closes its
		// connection after the answer.
		w.Header().Set("Connection", "close")
	}
	api, ok := endpoints[r.URL.Path]
	if !ok && r.Header.Get("anthropic-version") != "" {
		api = APIAnthropic
	}
	if n, limit := headerBytes(r), int(rt.cfg.Limits.MaxHeaderBytes); n > limit {
		s.reject(w, api, errHeadersTooLarge, "header_too_large",
			fmt.Sprintf("request headers of %d bytes exceed the limit of %d bytes", n, limit))
		return
	}
	if r.URL.Path == "/v1/models" {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			s.reject(w, api, errMethod, "method", fmt.Sprintf("%s %s: only GET and HEAD are allowed", r.Method, r.URL.Path))
			return
		}
		if !s.authorized(rt, r, api) {
			s.reject(w, api, errAuth, "auth", "invalid API key")
			return
		}
		s.serveModels(w, r, rt)
		return
	}
	if !ok {
		s.reject(w, api, errNoRoute, "path", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.reject(w, api, errMethod, "method", fmt.Sprintf("%s %s: only POST is allowed", r.Method, r.URL.Path))
		return
	}
	if !s.authorized(rt, r, api) {
		s.reject(w, api, errAuth, "auth", "invalid API key")
		return
	}
	if ct := r.Header.Values("Content-Type"); !isJSONContentType(ct) {
		s.reject(w, api, errMediaType, "content_type",
			fmt.Sprintf("Content-Type %s is not JSON: send application/json (or no Content-Type)", jsonString(strings.Join(ct, ", "))))
		return
	}
	// Count the request before its body is read: the body is what an
	// overload fills memory with.
	if n, limit := s.inFlight.Add(1), int64(rt.cfg.Limits.MaxInFlight); n > limit {
		s.inFlight.Add(-1)
		w.Header().Set("Retry-After", "1")
		s.reject(w, api, errOverloaded, "overloaded",
			fmt.Sprintf("the proxy holds %d requests, its limit (limits.max_in_flight); retry shortly", limit))
		return
	}
	defer s.inFlight.Add(-1)
	c, kind, reason, msg := s.admit(rt, w, r, api)
	if c == nil {
		s.reject(w, api, kind, reason, msg)
		return
	}
	defer c.finish()
	r = r.WithContext(context.WithValue(r.Context(), callKey{}, c))
	c.in = r
	s.forward(w, r, c)
}

// isJSONContentType reports whether a request's Content-Type values say
// its body is JSON, by the rule of FastAPI, which vLLM serves with: no
// Content-Type at all (some clients send none; the OpenAI and Anthropic
// SDKs send application/json), application/json or application/<x>+json,
// in any case, with any parameters. Several Content-Type headers, a
// malformed one, or another media type are not.
func isJSONContentType(values []string) bool {
	switch len(values) {
	case 0:
		return true
	case 1:
	default:
		return false
	}
	if strings.EqualFold(values[0], "application/json") { // what the SDKs send: no parse
		return true
	}
	if strings.TrimSpace(values[0]) == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(values[0])
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// bodyReadError is what the client is told when its body could not be
// read: a timeout (timeouts.read) is 408, anything else 400. It never
// carries a net.OpError's text, which names both socket addresses.
func bodyReadError(err error) (errKind, string) {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return errReadTimeout, "timed out reading the request body (timeouts.read)"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return errInvalid, "the connection failed while the request body was being read"
	}
	return errInvalid, "reading the request body: " + err.Error()
}

// headerBytes is the size of r's header block as a client sent it: the
// request line and each "Name: value\r\n" line.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// reject answers a request the proxy refuses itself, counted by reason.
func (s *Server) reject(w http.ResponseWriter, api API, k errKind, reason, msg string) {
	s.obs.rejected.WithLabelValues(reason).Inc()
	writeError(w, api, k, msg)
}

// authorized checks the client's API key: OpenAI clients send
// Authorization: Bearer KEY, Anthropic clients x-api-key: KEY (either is
// accepted on every path). With auth: passthrough every request passes.
func (s *Server) authorized(rt *routing, r *http.Request, api API) bool {
	if rt.cfg.Auth == "passthrough" {
		return true
	}
	key := r.Header.Get("x-api-key")
	if a := r.Header.Get("Authorization"); key == "" && len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		key = strings.TrimSpace(a[7:])
	}
	if key == "" {
		return false
	}
	ok := 0
	for _, k := range rt.clientKeys {
		ok |= subtle.ConstantTimeCompare([]byte(key), k)
	}
	return ok == 1
}

// admit reads and checks the body, finds the model and the session, and
// places the request. It returns nil and the error to answer on failure.
func (s *Server) admit(rt *routing, w http.ResponseWriter, r *http.Request, api API) (*call, errKind, string, string) {
	start := time.Now()
	limit := int64(rt.cfg.Limits.MaxBodyBytes)
	if r.ContentLength > limit {
		return nil, errTooLarge, "too_large", fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, limit)
	}
	rb, err := readBody(http.MaxBytesReader(w, r.Body, limit), r.ContentLength, connArrivals(r))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errTooLarge, "too_large", fmt.Sprintf("request body exceeds the limit of %d bytes", limit)
		}
		kind, msg := bodyReadError(err)
		s.log.Debug("reading a request body failed", "err", err)
		return nil, kind, "read", msg
	}
	c, kind, reason, msg := s.admitBody(rt, w, r, api, rb, start)
	if c == nil {
		rb.release()
	}
	return c, kind, reason, msg
}

// admitBody is admit once the body is read.
func (s *Server) admitBody(rt *routing, w http.ResponseWriter, r *http.Request, api API, rb *reqBody, start time.Time) (*call, errKind, string, string) {
	data := rb.data
	if !validUTF8(data) {
		return nil, errInvalid, "utf8", "request body is not valid UTF-8"
	}
	b, err := decodeBody(data)
	if err != nil {
		reason := "json"
		if errors.Is(err, errDuplicateKey) {
			reason = "duplicate_key"
		}
		return nil, errInvalid, reason, err.Error()
	}
	if b.Model == "" {
		return nil, errInvalid, "model", "missing required field: model"
	}
	m := rt.models[b.Model]
	if m == nil {
		return nil, errNotFound, "unknown_model", fmt.Sprintf("model %q is not served here (see /v1/models)", b.Model)
	}
	id, err := extractFrom(r.Header, &b, api, rt.cfg.Limits.MaxSessionID)
	if err != nil {
		return nil, errInvalid, "session_id", err.Error()
	}
	c := &call{
		srv: s, m: m, api: api, path: r.URL.Path, rb: rb, stream: b.Stream, start: start,
		source: id.Source, status: http.StatusOK, usage: unknownUsage(), aux: r.URL.Path == countTokensPath,
		req: placement.Request{
			Session: s.keyer.Sum(id.Session),
			Parent:  s.keyer.Sum(id.Parent),
			Model:   b.Model,
			// Approximate prompt size for policies that weigh it: ~4 bytes a token.
			PromptTokens: len(data) / 4,
			Pinned:       placement.NoPin,
		},
	}
	if h := rt.cfg.TrustedPinHeader; h != "" {
		if v := r.Header.Get(h); v != "" {
			if n, err := strconv.Atoi(v); err == nil && n >= 0 && n < len(m.replicas) {
				c.req.Pinned = n
			}
		}
	}
	s.awaitFirstProbe(r.Context(), m)
	var p picked
	if !c.aux && m.admissionOn() {
		p, err = m.placeAdmitted(r.Context(), &c.req, start, m.cfg.AdmissionTimeout.D(), time.Now)
	} else {
		p, err = c.place(r.Context(), -1, start)
	}
	if errors.Is(err, errAdmissionTimeout) {
		w.Header().Set("Retry-After", strconv.Itoa(admissionRetryAfter))
		return nil, errOverloaded, "admission", "model " + b.Model + ": " + err.Error() + "; retry later"
	}
	if err != nil {
		return nil, errUnavailable, "unavailable", "no replica of " + b.Model + " can take the request now: " + err.Error()
	}
	c.m = p.m // m, or its successor if a reload replaced m meanwhile
	c.cur = newAttempt(p)
	c.reason = p.Reason.String()
	c.attempts = 1
	c.turnKnown = p.home >= 0
	if p.later {
		s.obs.laterTurns.WithLabelValues(m.cfg.Name).Inc()
	}
	if p.stayed {
		s.obs.laterHome.WithLabelValues(m.cfg.Name).Inc()
	}
	if p.Reason == placement.ReasonSpill && p.home >= 0 {
		s.obs.spills.WithLabelValues(m.cfg.Name, strconv.Itoa(p.home)).Inc()
	}
	if s.journal != nil && !c.aux {
		c.jt = s.journal.begin()
	}
	return c, 0, "", ""
}

// awaitFirstProbe holds a request that arrives before every server of m
// has been scraped and probed once (the first milliseconds after start, or
// after a reload added the model) until they have been. Until then a
// replica is only presumed healthy: a request sent to one that is down
// would get 502 (or the backend's own 503) where the same request a moment
// later gets the proxy's 503/529 "no replica available". The wait is
// bounded by the client, by one scrape round (/metrics and /health, each
// within its timeout) and by maxFirstProbeWait; past that the presumption
// stands.
// maxFirstProbeWait caps awaitFirstProbe: a probe that hangs (a backend
// that accepts and never answers, up to timeouts.health) must not hold the
// first clients that long; a dial to it is bounded by timeouts.connect.
const maxFirstProbeWait = 2 * time.Second

func (s *Server) awaitFirstProbe(ctx context.Context, m *model) {
	if !s.serving.Load() {
		return // no scrape loops run: nothing to wait for
	}
	var deadline <-chan time.Time
	for _, sc := range m.servers {
		select {
		case <-sc.first:
			continue
		default:
		}
		if deadline == nil {
			t := time.NewTimer(min(2*sc.timeout+time.Second, maxFirstProbeWait))
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-sc.first:
		case <-ctx.Done():
			return
		case <-deadline:
			return
		}
	}
}

// place picks the replica of c's attempt (exclude: the replica a failed
// first attempt went to, or -1): a conversation turn through the policy, a
// count_tokens request apart from it (model.pickAux).
func (c *call) place(ctx context.Context, exclude int, now time.Time) (picked, error) {
	if c.aux {
		return c.m.pickAux(exclude, now)
	}
	if exclude < 0 {
		return c.m.place(ctx, &c.req, now) // the first attempt: through the session store, if any
	}
	return c.m.pick(&c.req, exclude, now)
}

// finish records a call once its response is over (or failed).
func (c *call) finish() {
	if !c.finished.CompareAndSwap(false, true) {
		return
	}
	defer c.rb.release() // after the journal's record, the body's last reader here
	c.cur.release()
	s, name := c.srv, c.m.cfg.Name
	now := time.Now()
	switch {
	case c.aux:
		c.m.observe("", 0, now) // no turn, but the request left: wake a waiter
	case c.status < 400:
		// The conversation's footprint: prompt + answer from the usage,
		// else the prompt estimated from the body size.
		fp := c.req.PromptTokens
		if c.usage.PromptTokens > 0 {
			fp = c.usage.PromptTokens
		}
		c.m.observe(c.req.Session, fp+max(c.usage.OutputTokens, 0), now)
	default:
		c.m.observe(c.req.Session, 0, now) // the turn ended, with no footprint to record
	}
	dur := now.Sub(c.start)
	if c.aux { // no turn: only its own counter
		s.obs.countTokens.WithLabelValues(name).Inc()
		s.log.Debug("count_tokens", "model", name, "replica", c.cur.rep.id, "status", c.status, "attempts", c.attempts, "duration", dur)
		return
	}
	s.obs.requests.WithLabelValues(name, strconv.Itoa(c.cur.rep.id), c.reason).Inc()
	c.cur.rep.byReason[reasonIndex(c.reason)].Add(1)
	s.obs.duration.WithLabelValues(name).Observe(dur.Seconds())
	if c.usage.OutputTokens > 0 {
		s.obs.outputTokens.WithLabelValues(name).Add(float64(c.usage.OutputTokens))
	}
	if c.usage.PromptTokens > 0 {
		s.obs.promptTokens.WithLabelValues(name).Add(float64(c.usage.PromptTokens))
	}
	if s.journal != nil {
		s.journal.record(c, dur)
	}
	s.log.Debug("request", "model", name, "replica", c.cur.rep.id, "reason", c.reason,
		"session", shortID(c.req.Session), "source", c.source, "status", c.status,
		"attempts", c.attempts, "duration", dur)
}

func reasonIndex(reason string) int {
	if reason == "retried" {
		return reasonRetried
	}
	r, err := placement.ParseReason(reason)
	if err != nil {
		return reasonRetried
	}
	return int(r)
}

// shortID abbreviates a keyed session hash for logs.
func shortID(h string) string { return h[:min(len(h), 12)] }

// transport sends each attempt, retries a failure that reached no client
// byte once on another replica, and wraps the response body.
type transport struct {
	srv *Server
	up  *upstream
}

// roundTrip sends c's attempt req, and once more on another replica when
// it failed before any response byte.
func (t *transport) roundTrip(c *call, req *http.Request) (*http.Response, error) {
	res, err := t.try(c, req)
	if !retryable(res, err) || req.Context().Err() != nil {
		return res, err
	}
	if res != nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		res.Body.Close()
	}
	prev := c.cur.rep
	p, perr := c.place(req.Context(), prev.id, time.Now())
	if perr != nil {
		c.noRep.Store(true)
		if err == nil {
			err = fmt.Errorf("replica %d answered %d and no other replica is available", prev.id, res.StatusCode)
		}
		return nil, err
	}
	c.m = p.m
	c.cur = newAttempt(p)
	c.reason = "retried"
	c.attempts++
	return t.try(c, t.srv.outgoing(c.in, c))
}

func joinPath(base, p string) string {
	return strings.TrimSuffix(base, "/") + p
}

// retryable reports a failure before any response byte: a transport error
// (connection refused, reset or not made in time, EOF before the headers)
// or a 502/503. Other timeouts (timeouts.response_header) are not retried.
// Go's timeout errors, a dial's included, match context.DeadlineExceeded,
// so a failed dial, which reached no replica, is told apart first; the
// client's own context is checked by RoundTrip.
func retryable(res *http.Response, err error) bool {
	if errors.Is(err, errReplicaDown) {
		return true
	}
	if errors.Is(err, errStalled) || errors.Is(err, errDraining) || errors.Is(err, errNoHeaders) {
		return false
	}
	if err != nil {
		return isConnectError(err) || !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	return res.StatusCode == http.StatusBadGateway || res.StatusCode == http.StatusServiceUnavailable
}

// Attempt failures of the proxy's own making.
var (
	// errReplicaDown: /health marked the replica down while the attempt
	// waited for its headers; no byte reached the client, so it is retried.
	errReplicaDown = errors.New("replica went down (health check) before answering")
	// errStalled: no first token within timeouts.first_token, before the
	// headers came; not retried (the replica may have been working on it).
	errStalled = errors.New("replica sent no first token in time")
	// errDraining: the drain deadline came before the headers.
	errDraining = errors.New("the proxy is shutting down")
	// errNoHeaders: no response headers within timeouts.response_header;
	// not retried (the replica may still be working on the request).
	errNoHeaders = errors.New("replica sent no response headers in time")
)

// Phases of a watchdog: the timeout it counts.
const (
	phaseHeaders    int32 = iota + 1 // sent -> reply headers (timeouts.response_header)
	phaseFirstToken                  // a stream: sent -> first token (timeouts.first_token)
	phaseIdle                        // an event stream: the wait for its next event (timeouts.stream_idle)
	phaseBody                        // any other reply: the time spent waiting for it (timeouts.stream_idle)
)

// watchdog bounds one phase of an attempt at a time; on expiry it cancels
// the attempt's context. Every attempt has one from the moment it is sent
// to the end of its reply (issue 35: a reply's body was untimed unless it
// was an event stream answering a streamed request). A nil watchdog never
// fires. Its methods other than the timer's own function are called on the
// request's goroutine.
type watchdog struct {
	t     *time.Timer
	fired atomic.Int32 // the phase it expired in; 0: it did not
	phase atomic.Int32
	limit time.Duration // the current phase's
	left  time.Duration // phaseBody: what is left of the wait allowed
	since time.Time     // phaseBody: when the current wait began; zero: none
}

func startWatchdog(phase int32, d time.Duration, cancel context.CancelFunc) *watchdog {
	w := &watchdog{limit: d}
	w.phase.Store(phase)
	w.t = time.AfterFunc(d, func() { w.fired.CompareAndSwap(0, w.phase.Load()); cancel() })
	return w
}

// enter switches to phase with the limit d: for phaseBody the timer runs
// only while a read waits (waiting, waited), for d in all.
func (w *watchdog) enter(phase int32, d time.Duration) {
	if w == nil || w.fired.Load() != 0 {
		return
	}
	w.phase.Store(phase)
	w.limit = d
	if phase == phaseBody {
		w.t.Stop()
		w.left = d
		return
	}
	w.t.Reset(d)
}

// streaming switches to (or restarts) the stream_idle phase.
func (w *watchdog) streaming(d time.Duration) { w.enter(phaseIdle, d) }

// waiting starts a wait for the replica in phaseBody: the timer runs with
// what is left of the limit.
func (w *watchdog) waiting() {
	if w == nil || w.fired.Load() != 0 || w.phase.Load() != phaseBody {
		return
	}
	w.since = time.Now()
	w.t.Reset(w.left)
}

// waited ends a wait started by waiting.
func (w *watchdog) waited() {
	if w == nil || w.since.IsZero() {
		return
	}
	w.t.Stop()
	w.left -= time.Since(w.since)
	w.since = time.Time{}
}

func (w *watchdog) stop() {
	if w != nil {
		w.t.Stop()
	}
}

func (w *watchdog) expired() bool { return w != nil && w.fired.Load() != 0 }

// what says which timeout expired, for the client and the log.
func (w *watchdog) what() string {
	switch w.fired.Load() {
	case phaseHeaders:
		return fmt.Sprintf("upstream replica sent no response headers within %s (timeouts.response_header)", w.limit)
	case phaseIdle:
		return fmt.Sprintf("upstream replica sent nothing for %s (timeouts.stream_idle)", w.limit)
	case phaseBody:
		return fmt.Sprintf("upstream replica kept its reply waiting for %s after its headers (timeouts.stream_idle)", w.limit)
	}
	return fmt.Sprintf("upstream replica sent no first token within %s (timeouts.first_token)", w.limit)
}

// cancelBody cancels an attempt's context when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// try sends one attempt on c.cur. The attempt runs under its own context:
// cancelled by its watchdogs, by the replica's server going down before
// the headers came, by the drain deadline, or when its body is closed.
// The reply is timed to its end (watchdog): the headers by
// timeouts.response_header, a stream's first token by timeouts.first_token,
// then the wait for each event of an event stream, and for the rest of any
// other reply, by timeouts.stream_idle.
func (t *transport) try(c *call, req *http.Request) (*http.Response, error) {
	a := c.cur
	s, name, id := t.srv, c.m.cfg.Name, strconv.Itoa(a.rep.id)
	clientCtx := req.Context()
	ctx, cancel := context.WithCancel(clientCtx)
	var dog *watchdog
	to := s.state.Load().cfg.Timeouts
	if c.stream {
		dog = startWatchdog(phaseFirstToken, to.FirstToken.D(), cancel)
	}
	var down atomic.Bool
	stopDown := context.AfterFunc(a.rep.server.downCtx(), func() { down.Store(true); cancel() })
	drained := new(atomic.Bool)
	stopDrain := context.AfterFunc(s.drained, func() { drained.Store(true); cancel() })
	// timeouts.response_header, per attempt so that a reload applies it;
	// then, unless the reply is the event stream a stream asked for, the
	// reply's own timeout.
	hdog := startWatchdog(phaseHeaders, to.ResponseHeader.D(), cancel)
	res, err := t.up.do(req.WithContext(ctx), c.rb)
	stopDown()
	if err == nil && (res.StatusCode < 100 || res.StatusCode > 599) {
		res.Body.Close()
		err = fmt.Errorf("%w: status %d", errBadReply, res.StatusCode)
	}
	if err != nil {
		hdog.stop()
		dog.stop()
		stopDrain()
		cancel()
		a.release()
		if clientCtx.Err() != nil {
			return nil, err
		}
		a.rep.upErrors.Add(1)
		kind := "reset"
		switch {
		case dog.expired():
			kind = "timeout"
			err = fmt.Errorf("%w: %s", errStalled, dog.what())
			s.log.Warn("upstream timed out", "model", name, "replica", a.rep.id, "err", err)
			t.strike(c, a.rep)
		case drained.Load():
			kind = "drain"
			err = errDraining
		case hdog.expired():
			kind = "timeout"
			err = fmt.Errorf("%w: %s", errNoHeaders, hdog.what())
			s.log.Warn("upstream timed out", "model", name, "replica", a.rep.id, "err", err)
		case down.Load():
			kind = "down"
			err = fmt.Errorf("replica %d: %w", a.rep.id, errReplicaDown)
		case errors.Is(err, errBadReply):
			kind = "protocol"
			s.log.Warn("bad reply from a replica", "model", name, "replica", a.rep.id, "err", err)
			t.strike(c, a.rep)
		case isConnectError(err):
			kind = "connect"
			if c.m.connectFailed(a.rep, time.Now()) {
				s.obs.ejections.WithLabelValues(name, id).Inc()
				s.log.Warn("replica ejected", "model", name, "replica", a.rep.id, "err", err)
			}
		}
		s.obs.upstreamErrors.WithLabelValues(name, id, kind).Inc()
		return nil, err
	}
	if res.StatusCode >= 500 {
		a.rep.upErrors.Add(1)
		s.obs.upstreamErrors.WithLabelValues(name, id, "status").Inc()
		t.strike(c, a.rep)
		if (res.StatusCode == http.StatusBadGateway || res.StatusCode == http.StatusServiceUnavailable) && c.attempts == 1 {
			hdog.stop()
			dog.stop()
			stopDrain()
			a.release()
			res.Body = cancelBody{res.Body, cancel}
			return res, nil // RoundTrip retries; the body is discarded there
		}
	}
	c.status = res.StatusCode
	base := bodyBase{rc: res.Body, c: c, a: a, ctx: clientCtx, cancel: cancel, drained: drained, stopDrain: stopDrain}
	sse := strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream")
	// A body the replica encoded (Content-Encoding: gzip, ...) passes
	// through as it is: its events cannot be read, so neither are its
	// usage and its end; it is timed by its bytes.
	encoded := false
	if ce := res.Header["Content-Encoding"]; len(ce) > 0 && !(len(ce) == 1 && strings.EqualFold(ce[0], "identity")) {
		encoded = true
	}
	switch {
	case sse && c.stream:
		hdog.stop()
		base.dog = dog // first_token, then stream_idle
	case sse:
		// An event stream the request did not ask for: each event
		// within stream_idle from the headers on.
		dog.stop()
		hdog.enter(phaseIdle, to.StreamIdle.D())
		base.dog = hdog
	default:
		dog.stop()
		hdog.enter(phaseBody, to.StreamIdle.D())
		base.dog = hdog
	}
	if sse && !encoded {
		res.Body = newStreamBody(base, to.StreamIdle.D())
	} else {
		res.Body = &plainBody{bodyBase: base, gaps: sse, idle: to.StreamIdle.D(), usageOver: encoded}
	}
	return res, nil
}

// strike counts a 5xx or a timeout of rep towards its ejection.
func (t *transport) strike(c *call, rep *replica) { t.srv.transportStrike(c, rep) }

func (s *Server) transportStrike(c *call, rep *replica) {
	if c.m.outlier(rep, time.Now()) {
		name := c.m.cfg.Name
		s.obs.ejections.WithLabelValues(name, strconv.Itoa(rep.id)).Inc()
		s.log.Warn("replica ejected", "model", name, "replica", rep.id, "after", fmt.Sprintf("%d consecutive 5xx/timeouts", ejectConsecutive))
	}
}

// isConnectError reports a failure to establish the connection at all.
func isConnectError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// errorHandler answers a request that got no response at all.
func (s *Server) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	c := callFrom(r.Context())
	if c == nil {
		writeError(w, APIOpenAI, errUpstream, "upstream error")
		return
	}
	if r.Context().Err() != nil {
		c.status = 499 // client closed the request; nobody reads an answer
		return
	}
	kind := errUpstream
	switch {
	case errors.Is(err, errStalled), errors.Is(err, errNoHeaders):
		kind = errTimeout
	case errors.Is(err, errBadReply):
		// A replica broke HTTP (a reply head over the proxy's bounds, a
		// status outside 100-599): 502, even when no other replica was
		// there to retry on.
	case c.noRep.Load() || isConnectError(err) || errors.Is(err, errReplicaDown) || errors.Is(err, errDraining):
		kind = errUnavailable
	}
	c.status = kind.status(c.api)
	s.log.Warn("upstream failed", "model", c.m.cfg.Name, "replica", c.cur.rep.id, "attempts", c.attempts, "err", err)
	msg := fmt.Sprintf("upstream replica failed before responding (%d attempt(s))", c.attempts)
	switch {
	case kind == errTimeout:
		msg = strings.TrimPrefix(strings.TrimPrefix(err.Error(), errStalled.Error()+": "), errNoHeaders.Error()+": ")
	case errors.Is(err, errBadReply):
		msg = fmt.Sprintf("upstream replica sent a reply the proxy does not take (%d attempt(s)): %s", c.attempts,
			strings.TrimPrefix(err.Error(), errBadReply.Error()+": "))
	}
	writeError(w, c.api, kind, msg)
}

// bodyBase is what both kinds of response body share: closing one
// releases the attempt (its in-flight count, its context, its timers) and
// records the usage and the time to the first byte or token.
type bodyBase struct {
	rc     io.ReadCloser
	c      *call
	a      *attempt
	ctx    context.Context    // the client's
	cancel context.CancelFunc // the attempt's context
	dog    *watchdog          // streamed requests: first_token, then stream_idle; nil otherwise

	drained   *atomic.Bool // the drain deadline cancelled the attempt
	stopDrain func() bool  // stops watching for the drain deadline
}

func (b *bodyBase) upstreamFailed(kind string) {
	b.a.rep.upErrors.Add(1)
	b.c.srv.obs.upstreamErrors.WithLabelValues(b.c.m.cfg.Name, strconv.Itoa(b.a.rep.id), kind).Inc()
}

// close closes the backend's body and releases the attempt.
func (b *bodyBase) close() error {
	err := b.rc.Close()
	b.dog.stop()
	b.stopDrain()
	b.cancel()
	b.a.release()
	return err
}

func (b *bodyBase) observeTTFB() {
	if t := b.c.ttfb.Load(); t > 0 && !b.c.aux { // count_tokens is in no TTFB series
		b.c.srv.obs.ttfb.WithLabelValues(b.c.m.cfg.Name).Observe(time.Duration(t).Seconds())
	}
}

// plainBody is a response that is not an event stream, or one encoded by
// the replica (Content-Encoding): it passes through as it comes, and an
// identity-encoded one is kept (up to maxUsageBody) for its usage. It is
// timed by its watchdog: the time spent waiting for the replica after the
// headers (phaseBody) or, for an encoded event stream (gaps), the wait
// for each read (the first token's timeout before the first byte). A
// timeout counts against the replica (a strike) and fails the read with
// errStalled, which forward answers with 504 in the client's shape if
// nothing was sent yet.
type plainBody struct {
	bodyBase
	usageBuf  []byte // the body so far, while whole and at most maxUsageBody
	usageOver bool   // the body outgrew maxUsageBody, or is encoded: usage unknown
	first     bool
	gaps      bool          // an encoded event stream: each read within idle
	idle      time.Duration // timeouts.stream_idle
	failed    bool          // the failure was counted
}

func (b *plainBody) Read(p []byte) (int, error) {
	b.dog.waiting()
	n, err := b.rc.Read(p)
	b.dog.waited()
	if n > 0 {
		if !b.first {
			b.first = true
			b.c.ttfb.CompareAndSwap(0, int64(max(time.Since(b.c.start), 1)))
			b.a.prefilled() // the answer is being sent: its prefill is done
		}
		if b.gaps {
			b.dog.streaming(b.idle)
		}
		// Keep the body only while it is whole: a skipped chunk would
		// leave a gap that could still parse.
		if !b.usageOver && len(b.usageBuf)+n <= maxUsageBody {
			b.usageBuf = append(b.usageBuf, p[:n]...)
		} else {
			b.usageOver, b.usageBuf = true, nil
		}
	}
	switch {
	case err == io.EOF:
		if b.c.status < 500 && !b.failed {
			b.c.m.succeeded(b.a.rep) // the whole reply came
		}
	case err != nil && b.ctx.Err() == nil && !b.failed:
		b.failed = true
		if b.dog.expired() {
			b.upstreamFailed("timeout")
			b.c.srv.transportStrike(b.c, b.a.rep)
			err = fmt.Errorf("%w: %s", errStalled, b.dog.what())
			b.c.srv.log.Warn("upstream timed out", "model", b.c.m.cfg.Name, "replica", b.a.rep.id, "err", err)
		} else {
			b.upstreamFailed("stream")
		}
	}
	return n, err
}

func (b *plainBody) Close() error {
	err := b.close()
	if len(b.usageBuf) > 0 && !b.usageOver {
		b.c.usage = bodyUsage(b.c.api, b.usageBuf)
	}
	b.observeTTFB()
	return err
}

// streamBody is an event stream. It notes the first output token and the
// usage, and it passes on only whole events, so that if the backend fails
// mid-stream it can end the stream with the API's own error event (and no
// [DONE] or message_stop) instead of a torn event.
type streamBody struct {
	bodyBase
	watch *streamWatch
	idle  time.Duration // timeouts.stream_idle

	rbuf  []byte // read buffer
	held  []byte // bytes after the last complete event
	obuf  []byte // out's own buffer, when out is not a slice of rbuf
	out   []byte // bytes ready for the client
	final bool   // no more bytes after out
	err   error  // returned after out when final
	torn  bool   // out ended inside an event (an overlong event passed on in part)
}

func newStreamBody(base bodyBase, idle time.Duration) *streamBody {
	c := base.c
	a := base.a
	return &streamBody{bodyBase: base, idle: idle, rbuf: copyBuffers.Get(),
		watch: newStreamWatch(c.api, func() {
			c.ttfb.CompareAndSwap(0, int64(max(time.Since(c.start), 1)))
			a.prefilled()
		})}
}

// copyBufferSize is the size of the buffers that carry response bodies:
// forward's copy to the client and a stream's reads.
const copyBufferSize = 32 << 10

// bufferPool hands out the copy buffers (32 KB a response otherwise),
// kept with the request bodies' (freeBodies).
type bufferPool struct{}

func (bufferPool) Get() []byte {
	bp := getBodyBuf(copyBufferSize)
	return (*bp)[:copyBufferSize]
}

func (bufferPool) Put(buf []byte) {
	if cap(buf) == copyBufferSize {
		buf = buf[:0]
		putBodyBuf(&buf)
	}
}

var copyBuffers bufferPool

func (b *streamBody) Read(p []byte) (int, error) {
	for {
		if len(b.out) > 0 {
			n := copy(p, b.out)
			b.out = b.out[n:]
			return n, nil
		}
		if b.final {
			return 0, b.err
		}
		n, err := b.rc.Read(b.rbuf)
		if n > 0 {
			b.take(b.rbuf[:n])
		}
		if err != nil {
			b.end(err)
		}
	}
}

// take watches a chunk from the backend and moves what ends in a whole
// event to out; the rest waits in held.
func (b *streamBody) take(chunk []byte) {
	_, _ = b.watch.Write(chunk)
	cut := b.watch.frame.LastEnd()
	// Progress is a whole event: a replica trickling bytes that never
	// end one does not hold the stream open.
	if cut >= 0 && (b.watch.firstToken || !b.c.stream) {
		b.dog.streaming(b.idle)
	}
	switch {
	case cut >= 0 && len(b.held) == 0:
		b.out = chunk[:cut] // rbuf is not read into again before out is drained
		b.held = append(b.held, chunk[cut:]...)
		b.torn = false
	case cut >= 0:
		b.obuf = append(append(b.obuf[:0], b.held...), chunk[:cut]...)
		b.out = b.obuf
		b.held = append(b.held[:0], chunk[cut:]...)
		b.torn = false
	default:
		b.held = append(b.held, chunk...)
		if len(b.held) > maxSSELine {
			b.obuf, b.held = b.held, b.obuf[:0]
			b.out = b.obuf
			b.torn = true
		}
	}
}

// end handles the backend's body ending with err: a clean end passes the
// rest on; anything else ends the stream with the API's error event.
func (b *streamBody) end(err error) {
	switch {
	case b.ctx.Err() != nil:
		b.final, b.err = true, err // the client is gone
	case err == io.EOF && (b.watch.terminal || b.watch.upstreamErr):
		b.out = append(b.out, b.held...) // a clean end
		b.held = nil
		b.final, b.err = true, io.EOF
		if b.watch.terminal {
			b.c.m.succeeded(b.a.rep)
		}
	default:
		// Died mid-stream, stalled, or ended without its final event.
		msg := "upstream replica failed mid-stream"
		switch {
		case b.drained.Load():
			msg = "the proxy is shutting down: its drain deadline (timeouts.drain) ended the stream"
		case b.dog.expired():
			msg = b.dog.what()
			b.upstreamFailed("timeout")
			b.c.srv.transportStrike(b.c, b.a.rep)
		case err == io.EOF:
			msg = "upstream replica ended the stream early"
			b.upstreamFailed("stream")
		default:
			b.upstreamFailed("stream")
		}
		b.c.srv.log.Warn("stream broken", "model", b.c.m.cfg.Name, "replica", b.a.rep.id, "err", err)
		switch {
		case b.torn:
			// The client holds part of an event: end it, or the error
			// event would be read as more of its last line.
			b.out = append(b.out, "\n\n"...)
		case b.watch.frame.PendingLF() && len(b.held) == 0:
			// The client's last event ended in a CR: a LF makes it a
			// CRLF, for clients that split lines at LF only.
			b.out = append(b.out, '\n')
		}
		b.out = append(b.out, streamErrorEvent(b.c.api, msg)...)
		b.held = nil
		b.final, b.err = true, io.EOF
	}
}

func (b *streamBody) Close() error {
	err := b.close()
	if b.rbuf != nil {
		copyBuffers.Put(b.rbuf) // out may be a slice of it: nothing reads after Close
		b.rbuf, b.out = nil, nil
	}
	b.c.usage = b.watch.usage
	b.observeTTFB()
	return err
}

// serveModels answers GET /v1/models with the configured models, in
// Anthropic's shape when the client sent anthropic-version.
func (s *Server) serveModels(w http.ResponseWriter, r *http.Request, rt *routing) {
	var buf bytes.Buffer
	if r.Header.Get("anthropic-version") != "" {
		buf.WriteString(`{"data":[`)
		for i, name := range rt.names {
			if i > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"type":"model","id":%s,"display_name":%s,"created_at":"1970-01-01T00:00:00Z"}`, jsonString(name), jsonString(name))
		}
		first, last := "null", "null"
		if len(rt.names) > 0 {
			first, last = jsonString(rt.names[0]), jsonString(rt.names[len(rt.names)-1])
		}
		fmt.Fprintf(&buf, `],"has_more":false,"first_id":%s,"last_id":%s}`, first, last)
	} else {
		buf.WriteString(`{"object":"list","data":[`)
		for i, name := range rt.names {
			if i > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"id":%s,"object":"model","created":0,"owned_by":"warden"}`, jsonString(name))
		}
		buf.WriteString(`]}`)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
}

// logWriter adapts the http.Server's log.Logger to slog at debug level
// (it reports client disconnects, which are routine).
type logWriter struct{ log *slog.Logger }

func (l logWriter) Write(p []byte) (int, error) {
	l.log.Debug(strings.TrimSpace(string(p)))
	return len(p), nil
}
