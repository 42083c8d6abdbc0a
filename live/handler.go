package live

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"github.com/lm-warden/warden/live/jsonscan"
	"github.com/lm-warden/warden/live/upstream"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
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
// conversation turn (see model.pickCountTokens).
const countTokensPath = "/v1/messages/count_tokens"

// ServeHTTP is the client-facing handler: the HTTP front end of admit. It
// routes by path and method, answers /v1/models, hands a conversation
// request to admit (check, extract, place, admit) and forwards the call it
// gets (forward.go), or answers admit's refusal in the client's shape.
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
	api, ok := apiOf(r.URL.Path, r.Header)
	if n, limit := headerBytes(r), int(rt.cfg.Limits.MaxHeaderBytes); n > limit {
		s.reject(w, api, &refusal{kind: errHeadersTooLarge, reason: "header_too_large",
			msg: fmt.Sprintf("request headers of %d bytes exceed the limit of %d bytes", n, limit)})
		return
	}
	if r.URL.Path == "/v1/models" {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			s.reject(w, api, &refusal{kind: errMethod, reason: "method", msg: fmt.Sprintf("%s %s: only GET and HEAD are allowed", r.Method, r.URL.Path)})
			return
		}
		if !s.authorized(rt, r.Header) {
			s.reject(w, api, invalidKey)
			return
		}
		s.serveModels(w, r, rt)
		return
	}
	if !ok {
		s.reject(w, api, &refusal{kind: errNoRoute, reason: "path", msg: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.reject(w, api, &refusal{kind: errMethod, reason: "method", msg: fmt.Sprintf("%s %s: only POST is allowed", r.Method, r.URL.Path)})
		return
	}
	// http.MaxBytesReader, given w, also closes the connection after the
	// 413: the rest of the body is not read.
	body := http.MaxBytesReader(w, r.Body, int64(rt.cfg.Limits.MaxBodyBytes))
	c, ref := s.admit(rt, &inbound{
		ctx: r.Context(), api: api, path: r.URL.Path, header: r.Header,
		body: body, length: r.ContentLength, conn: connArrivals(r),
	})
	if ref != nil {
		if ref.drain {
			// Refused for want of room for a body within max_body_bytes
			// (limits.max_body_bytes_in_flight): the rest is read and dropped (no memory kept), so that the
			// client, still sending, gets the answer instead of a reset
			// connection (net/http closes one with an unread body over
			// 256 KiB, and a client that has not finished its write
			// reads no answer then). timeouts.read bounds it.
			_, _ = io.Copy(io.Discard, body)
		}
		s.reject(w, api, ref)
		return
	}
	defer c.finish()
	c.in = r
	s.forward(w, r, c)
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
func (s *Server) reject(w http.ResponseWriter, api API, ref *refusal) {
	if ref.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ref.retryAfter))
	}
	s.obs.rejected.WithLabelValues(ref.reason).Inc()
	writeError(w, api, ref.kind, ref.msg)
}

// inbound is a client request as admit reads it: what any front end has,
// and no way to answer it.
type inbound struct {
	ctx    context.Context // the client's: done when it goes away
	api    API
	path   string // the endpoint; countTokensPath is no conversation turn
	header http.Header
	// body is read whole by admit. The front end bounds it at
	// limits.max_body_bytes with http.MaxBytesReader (its ResponseWriter
	// nil where it has none), whose *http.MaxBytesError admit answers
	// with 413.
	body io.Reader
	// whole, when read is set, is the body a front end read whole itself
	// (Decide), counted by it against limits.max_body_bytes_in_flight and
	// held by it until the call finishes: admit reads it in place.
	whole  []byte
	read   bool
	length int64             // the declared Content-Length; -1: unknown (chunked)
	conn   upstream.Arrivals // what has arrived on the client's socket; nil: unknown
}

// refusal is a request the proxy answers itself: the error's kind (its
// status and type in the client's shape), the reason it is counted under
// (warden_rejected_total), the message, and a Retry-After in seconds
// when retryAfter > 0.
type refusal struct {
	kind       errKind
	reason     string
	msg        string
	retryAfter int
	drain      bool // the rest of the body is to be read before the answer (see ServeHTTP)
}

// invalidKey refuses a request without a valid API key.
var invalidKey = &refusal{kind: errAuth, reason: "auth", msg: "invalid API key"}

// admit is the request path's "check, extract, place, admit", apart from
// HTTP so that another front end can reuse it: it checks the API key and
// the Content-Type, counts the request against limits.max_in_flight, reads
// and checks the body, finds the model and the session, and places the
// request (after its admission wait, for a model with admission: kv). It
// returns the call, which the front end forwards and then finishes
// (call.finish, which gives the in-flight count back), or the refusal to
// answer.
func (s *Server) admit(rt *routing, in *inbound) (*call, *refusal) {
	if !s.authorized(rt, in.header) {
		return nil, invalidKey
	}
	if ct := in.header.Values("Content-Type"); !isJSONContentType(ct) {
		return nil, &refusal{kind: errMediaType, reason: "content_type",
			msg: fmt.Sprintf("Content-Type %s is not JSON: send application/json (or no Content-Type)", jsonString(strings.Join(ct, ", ")))}
	}
	// Count the request before its body is read: the body is what an
	// overload fills memory with.
	if n, limit := s.inFlight.Add(1), int64(rt.cfg.Limits.MaxInFlight); n > limit {
		s.inFlight.Add(-1)
		return nil, &refusal{kind: errOverloaded, reason: "overloaded", retryAfter: 1,
			msg: fmt.Sprintf("the proxy holds %d requests, its limit (limits.max_in_flight); retry shortly", limit)}
	}
	c, ref := s.admitCounted(rt, in)
	if ref != nil {
		s.inFlight.Add(-1)
	}
	return c, ref
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

// authorized checks the client's API key: OpenAI clients send
// Authorization: Bearer KEY, Anthropic clients x-api-key: KEY (either is
// accepted on every path). With auth: passthrough every request passes.
func (s *Server) authorized(rt *routing, h http.Header) bool {
	if rt.cfg.Auth == "passthrough" {
		return true
	}
	key := h.Get("x-api-key")
	if a := h.Get("Authorization"); key == "" && len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
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

// admitCounted is admit once the request is counted: it reads the body.
func (s *Server) admitCounted(rt *routing, in *inbound) (*call, *refusal) {
	start := time.Now()
	limit := int64(rt.cfg.Limits.MaxBodyBytes)
	if in.length > limit {
		return nil, &refusal{kind: errTooLarge, reason: "too_large", msg: fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", in.length, limit)}
	}
	budget := int64(rt.cfg.Limits.MaxBodyBytesInFlight)
	if in.length > budget {
		return nil, &refusal{kind: errTooLarge, reason: "too_large", drain: true, msg: fmt.Sprintf("request body of %d bytes is larger than the %d bytes the proxy holds of all bodies at once (limits.max_body_bytes_in_flight)", in.length, budget)}
	}
	rb, ref := s.readInbound(in, limit, budget)
	if ref != nil {
		return nil, ref
	}
	c, ref := s.newCall(rt, in, rb, start)
	if ref == nil {
		ref = s.placeCall(in, c)
	}
	if ref != nil {
		rb.Release()
		return nil, ref
	}
	return c, nil
}

// readInbound reads in's body whole into a buffer counted against
// limits.max_body_bytes_in_flight (budget), within limits.max_body_bytes
// (limit), or takes the body a front end read (in.read) as it is.
func (s *Server) readInbound(in *inbound, limit, budget int64) (*upstream.Body, *refusal) {
	if in.read {
		return upstream.BodyOf(in.whole), nil
	}
	rb, err := upstream.ReadBody(in.body, in.length, in.conn, upstream.BodyLimits{Budget: &s.bodies, InFlight: budget, Max: limit})
	if err == nil {
		return rb, nil
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, &refusal{kind: errTooLarge, reason: "too_large", msg: fmt.Sprintf("request body exceeds the limit of %d bytes", limit)}
	}
	var ob *upstream.OverBudgetError
	if errors.As(err, &ob) {
		if ob.Alone {
			return nil, &refusal{kind: errTooLarge, reason: "too_large", msg: ob.Error(), drain: true}
		}
		return nil, &refusal{kind: errOverloaded, reason: "body_budget", retryAfter: 1, msg: ob.Error(), drain: true}
	}
	kind, msg := bodyReadError(err)
	s.log.Debug("reading a request body failed", "err", err)
	return nil, &refusal{kind: kind, reason: "read", msg: msg}
}

// newCall checks and decodes the body, finds the model and the session.
func (s *Server) newCall(rt *routing, in *inbound, rb *upstream.Body, start time.Time) (*call, *refusal) {
	data := rb.Bytes()
	if !jsonscan.ValidUTF8(data) {
		return nil, &refusal{kind: errInvalid, reason: "utf8", msg: "request body is not valid UTF-8"}
	}
	b, err := decodeBody(data)
	if err != nil {
		reason := "json"
		if errors.Is(err, jsonscan.ErrDuplicateKey) {
			reason = "duplicate_key"
		}
		return nil, &refusal{kind: errInvalid, reason: reason, msg: err.Error()}
	}
	if b.Model == "" {
		return nil, &refusal{kind: errInvalid, reason: "model", msg: "missing required field: model"}
	}
	m := rt.models[b.Model]
	if m == nil {
		return nil, &refusal{kind: errNotFound, reason: "unknown_model", msg: "model " + quotedExcerpt(b.Model, maxEchoed) + " is not served here (see /v1/models)"}
	}
	id, err := extractFrom(in.header, &b, in.api, rt.cfg.Limits.MaxSessionID)
	if err != nil {
		return nil, &refusal{kind: errInvalid, reason: "session_id", msg: err.Error()}
	}
	c := &call{
		srv: s, m: m, api: in.api, path: in.path, rb: rb, stream: b.Stream, start: start,
		source: id.Source, status: http.StatusOK, usage: unknownUsage(), countTokens: in.path == countTokensPath,
		lastTurn: sessionEnds(in.header),
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
		if v := in.header.Get(h); v != "" {
			if n, err := strconv.Atoi(v); err == nil && n >= 0 && n < len(m.replicas) {
				c.req.Pinned = n
			}
		}
	}
	return c, nil
}

// placeCall places c's first attempt: through the admission queue when
// its model has one, and counts the placement.
func (s *Server) placeCall(in *inbound, c *call) *refusal {
	m := c.m
	s.awaitFirstProbe(in.ctx, m)
	var (
		p   picked
		err error
	)
	c.fillPrompt() // what the held prefix reads, if the model's policy does
	if !c.countTokens && m.admissionOn() {
		p, err = m.placeAdmitted(in.ctx, &c.req, c.start, m.cfg.AdmissionTimeout.D(), time.Now)
	} else {
		p, err = c.place(in.ctx, -1, c.start)
	}
	if errors.Is(err, errAdmissionTimeout) {
		return &refusal{kind: errOverloaded, reason: "admission", retryAfter: admissionRetryAfter,
			msg: "model " + c.req.Model + ": " + err.Error() + "; retry later"}
	}
	if err != nil {
		return &refusal{kind: errUnavailable, reason: "unavailable", msg: "no replica of " + c.req.Model + " can take the request now: " + err.Error()}
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
	if p.Reason == placement.ReasonRehome && p.home >= 0 && p.home < len(p.m.replicas) {
		// Counted on the replica the conversation left: it was cold there.
		p.m.replicas[p.home].rehomes.Add(1)
		s.obs.rehomes.WithLabelValues(m.cfg.Name, strconv.Itoa(p.home)).Inc()
	}
	if s.journal != nil && !c.countTokens {
		c.jt = s.journal.begin()
	}
	return nil
}

// maxFirstProbeWait caps awaitFirstProbe: a probe that hangs (a backend
// that accepts and never answers, up to timeouts.health) must not hold the
// first clients that long; a dial to it is bounded by timeouts.connect.
const maxFirstProbeWait = 2 * time.Second

// awaitFirstProbe holds a request that arrives before every server of m
// has been scraped and probed once (the first milliseconds after start, or
// after a reload added the model) until they have been. Until then a
// replica is only presumed healthy: a request sent to one that is down
// would get 502 (or the backend's own 503) where the same request a moment
// later gets the proxy's 503/529 "no replica available". The wait is
// bounded by the client, by one scrape round (/metrics and /health, each
// within its timeout) and by maxFirstProbeWait; past that the presumption
// stands.
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
