package live

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lm-warden/warden/placement"
)

// This file exposes the request path's "check, extract, place, admit"
// (admit, handler.go) to a second front end that forwards nothing itself:
// `warden epp`, the Gateway API Inference Extension endpoint picker, where
// a gateway (Envoy) sends the request's headers and body over ext_proc,
// forwards the request to the endpoint picked here and reports the
// response back. A Decision is one admitted call: its in-flight counts are
// held until Finish, exactly as the proxy holds them until its response
// ends.

// Decider is the decision port: everything a front end asks of the router
// for one request, and nothing of its lifecycle (NewServer, Serve or Run,
// Reload: server.go). *Server is the one implementation. Its two front
// ends are ServeHTTP, which runs the same step as Decide (admit) inline
// and forwards the request itself, and warden epp (package epp), which
// holds a Decider and lets the gateway forward.
type Decider interface {
	// Decide admits one request, or refuses it in the client's shape.
	Decide(in DecideInput) (*Decision, *Refusal)
	// Refuse is a refusal the front end makes itself, before Decide.
	Refuse(path string, h http.Header, k RefusalKind, reason, msg string) *Refusal
	// AnyEndpoint is the endpoint for a request that is no conversation
	// turn; "" when none is healthy.
	AnyEndpoint(allowed func(endpoint string) bool) string
	// TakeBodyBytes, GiveBodyBytes and BodyBytes count the body bytes the
	// front end holds itself against limits.max_body_bytes_in_flight;
	// MaxBodyBytes is limits.max_body_bytes.
	TakeBodyBytes(n int) bool
	GiveBodyBytes(n int)
	BodyBytes() (held, limit int64)
	MaxBodyBytes() int
	// Timeouts are the current configuration's timeouts (a front end
	// bounds its own reads by timeouts.read).
	Timeouts() Timeouts
}

var _ Decider = (*Server)(nil)

// DecideInput is one client request as a front end that has no
// http.ResponseWriter sees it.
type DecideInput struct {
	Ctx    context.Context // done when the client (or the gateway's stream) goes away
	Method string          // "" is POST
	Path   string          // the request path, without its query
	Header http.Header     // the client's headers (canonical or lower-case keys)
	// Body is the whole request body, read in place: the caller holds it,
	// counted against limits.max_body_bytes_in_flight (TakeBodyBytes), and
	// leaves it unchanged until the Decision's Finish.
	Body []byte
	// Allowed, when not nil, restricts the endpoints (host:port) that may
	// serve the request: the gateway's subset hint. When the policy picks
	// outside it, the request goes to the subset's healthy replica with
	// the fewest requests in flight; none there gives a 503.
	Allowed func(endpoint string) bool
}

// Refusal is a request the router answers itself: the HTTP status, the
// body in the client's API error shape, and Retry-After in seconds when
// above 0.
type Refusal struct {
	Status     int
	Body       []byte
	RetryAfter int
	Reason     string // the warden_rejected_total reason
	// Shed is a request refused for load (limits.max_in_flight, admission,
	// a front end's memory budget): retry later. Where Status is 529
	// (Anthropic's overloaded, no registered HTTP status), a protocol that
	// carries registered statuses only says 429 for a shed request and
	// 503 for the others.
	Shed bool
}

func (s *Server) refusalOf(api API, ref *refusal) *Refusal {
	s.obs.rejected.WithLabelValues(ref.reason).Inc()
	return &Refusal{Status: ref.kind.status(api), Body: errorBody(api, ref.kind, ref.msg), RetryAfter: ref.retryAfter,
		Reason: ref.reason, Shed: ref.kind == errOverloaded}
}

// apiOf is the dialect of a request to path with header h: the path's,
// else Anthropic's when the client sends anthropic-version, else OpenAI's.
func apiOf(path string, h http.Header) (API, bool) {
	api, ok := endpoints[path]
	if !ok && h.Get("anthropic-version") != "" {
		api = APIAnthropic
	}
	return api, ok
}

// InferencePath reports whether path is an inference API that Decide
// places (chat and text completions, responses, messages and
// count_tokens); any other path is no conversation turn.
func InferencePath(path string) bool {
	_, ok := endpoints[path]
	return ok
}

// RefusalKind is a refusal a front end makes itself, before Decide.
type RefusalKind uint8

const (
	// RefuseReadTimeout: the request did not arrive whole within
	// timeouts.read (408).
	RefuseReadTimeout RefusalKind = iota
	// RefuseOverloaded: the front end sheds the request for load (429
	// OpenAI, 529 Anthropic, Retry-After 1).
	RefuseOverloaded
	// RefuseUnavailable: no endpoint can take it (503 OpenAI, 529
	// Anthropic).
	RefuseUnavailable
	// RefuseTooLarge: the request body alone is larger than the front end
	// may hold (413).
	RefuseTooLarge
)

// Refuse is a refusal that a front end makes itself for a request to path
// with header h, in the client's API shape, counted in
// warden_rejected_total under reason.
func (s *Server) Refuse(path string, h http.Header, k RefusalKind, reason, msg string) *Refusal {
	api, _ := apiOf(path, h)
	ref := &refusal{reason: reason, msg: msg}
	switch k {
	case RefuseReadTimeout:
		ref.kind = errReadTimeout
	case RefuseOverloaded:
		ref.kind, ref.retryAfter = errOverloaded, 1
	case RefuseTooLarge:
		ref.kind = errTooLarge
	default:
		ref.kind = errUnavailable
	}
	return s.refusalOf(api, ref)
}

// Decision is an admitted request: the endpoint it goes to, its fallbacks,
// and the counts it holds until Finish.
type Decision struct {
	c        *call
	mu       sync.Mutex // Served and Finish may come from the stream's goroutine only, but be safe
	endpoint string
	fallback []string
	watch    *streamWatch // a streamed response's usage; nil until ResponseBody sees one
	body     []byte       // a JSON response body, up to maxDecideUsageBody
	tooLong  bool
}

// maxDecideUsageBody bounds the bytes of a non-streamed response kept to read
// its usage: a larger answer's usage is not read.
const maxDecideUsageBody = 1 << 20

// Decide admits one request: it checks the API key, the Content-Type and
// the body, extracts the model and the session, and places the request as
// the proxy would (admission wait included). A refusal is in the client's
// API shape (the path and anthropic-version headers decide it).
func (s *Server) Decide(in DecideInput) (*Decision, *Refusal) {
	rt := s.state.Load()
	api, ok := apiOf(in.Path, in.Header)
	if !ok {
		return nil, s.refusalOf(api, &refusal{kind: errNoRoute, reason: "path", msg: fmt.Sprintf("no route for %s %s", method(in.Method), in.Path)})
	}
	if m := method(in.Method); m != http.MethodPost {
		return nil, s.refusalOf(api, &refusal{kind: errMethod, reason: "method", msg: fmt.Sprintf("%s %s: only POST is allowed", m, in.Path)})
	}
	ctx := in.Ctx
	if ctx == nil {
		ctx = context.Background()
	}
	c, ref := s.admit(rt, &inbound{ctx: ctx, api: api, path: in.Path, header: in.Header,
		whole: in.Body, read: true, length: int64(len(in.Body))})
	if ref != nil {
		return nil, s.refusalOf(api, ref)
	}
	d := &Decision{c: c}
	if in.Allowed != nil && !in.Allowed(c.cur.rep.target.Host) {
		// The policy picked outside the gateway's subset (the session's
		// home is not in it, or spills): the request goes to the healthy
		// replica of the subset with the fewest requests in flight. The
		// session table keeps what the policy recorded, so a home outside
		// the subset stays the home for requests without the hint.
		fb := c.m.fallbacks(c.cur.rep, in.Allowed)
		if len(fb) == 0 {
			c.status = http.StatusServiceUnavailable
			c.finish()
			return nil, s.refusalOf(api, &refusal{kind: errUnavailable, reason: "subset",
				msg: "no replica of " + c.req.Model + " in the gateway's endpoint subset can take the request now"})
		}
		d.move(fb[0], placement.ReasonLeastLoaded.String())
	}
	d.endpoint = c.cur.rep.target.Host
	d.fallback = d.c.m.fallbacks(c.cur.rep, in.Allowed)
	if s.journal == nil {
		// The gateway sends the body itself: the call lets go of it now,
		// not when the response ends (the journal reads it then).
		c.rb.Release()
	}
	return d, nil
}

func method(m string) string {
	if m == "" {
		return http.MethodPost
	}
	return m
}

// Endpoint is the picked replica's host:port.
func (d *Decision) Endpoint() string { return d.endpoint }

// Fallbacks are the other replicas of the model that may take the request
// if the picked one fails (healthy and not ejected, fewest requests in
// flight first), as host:port.
func (d *Decision) Fallbacks() []string { return d.fallback }

// Reason is the placement's reason for the pick (new, sticky, spill, ...).
func (d *Decision) Reason() string { return d.c.reason }

// Stream reports whether the client asked for a streamed answer.
func (d *Decision) Stream() bool { return d.c.stream }

// Served attributes the request to the endpoint that served it (the
// gateway's x-gateway-destination-endpoint-served, after it retried on a
// fallback): its in-flight count moves there. An endpoint the model does
// not have, or the picked one, changes nothing.
func (d *Decision) Served(endpoint string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c.finished.Load() || endpoint == "" || endpoint == d.c.cur.rep.target.Host {
		return
	}
	d.move(endpoint, "retried")
}

// move counts the request on the model's replica at endpoint instead of
// where it was placed, with reason; an endpoint the model lacks changes
// nothing.
func (d *Decision) move(endpoint, reason string) {
	c := d.c
	m := c.m.current()
	for _, rep := range m.replicas {
		if rep.target.Host == endpoint {
			c.cur.release()
			rep.inFlight.Add(1)
			c.m, c.cur = m, &attempt{m: m, rep: rep}
			c.reason = reason
			if reason == "retried" {
				c.attempts++
			}
			return
		}
	}
}

// ResponseHeaders records the response's status and whether it is an
// event stream.
func (d *Decision) ResponseHeaders(status int, contentType string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if status > 0 {
		d.c.status = status
	}
	if strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "text/event-stream") {
		d.watch = newStreamWatch(d.c.api, nil)
	}
}

// ResponseBody reads one chunk of the response body for its usage
// (prompt, answer and cached tokens: the conversation's footprint and its
// home's cache hits).
func (d *Decision) ResponseBody(chunk []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.watch != nil {
		_, _ = d.watch.Write(chunk)
		return
	}
	if d.tooLong || len(d.body)+len(chunk) > maxDecideUsageBody {
		d.tooLong, d.body = true, nil
		return
	}
	d.body = append(d.body, chunk...)
}

// Finish ends the request: it gives back its in-flight counts, records
// the conversation's footprint from the usage read, and counts it. Safe
// to call more than once; only the first counts.
func (d *Decision) Finish() {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.c
	switch {
	case d.watch != nil:
		c.usage = d.watch.usage
	case len(d.body) > 0 && !d.tooLong:
		c.usage = bodyUsage(c.api, d.body)
	}
	d.body = nil
	c.finish()
}

// fallbacks lists the model's replicas other than picked that may take a
// request now (healthy by their last probe, not ejected, in allowed when
// it is set), fewest in flight first, as host:port, each endpoint once.
func (m *model) fallbacks(picked *replica, allowed func(string) bool) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	m = m.current()
	now := time.Now()
	type cand struct {
		host     string
		inFlight int64
		id       int
	}
	var cs []cand
	for _, rep := range m.replicas {
		h := rep.target.Host
		if rep == picked || h == picked.target.Host || !rep.server.last.Load().Healthy || now.Before(rep.ejectedUntil) {
			continue
		}
		if allowed != nil && !allowed(h) {
			continue
		}
		if slices.ContainsFunc(cs, func(c cand) bool { return c.host == h }) {
			continue
		}
		cs = append(cs, cand{h, rep.inFlight.Load(), rep.id})
	}
	slices.SortStableFunc(cs, func(a, b cand) int {
		if a.inFlight != b.inFlight {
			return int(a.inFlight - b.inFlight)
		}
		return a.id - b.id
	})
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.host
	}
	return out
}

// AnyEndpoint is the endpoint for a request that is no conversation turn
// (a GET such as /v1/models, a path that is no inference API): the
// healthy replica with the fewest requests in flight over every model,
// in allowed when it is set, not counted; "" when none is healthy.
func (s *Server) AnyEndpoint(allowed func(endpoint string) bool) string {
	rt := s.state.Load()
	best, bestN := "", int64(-1)
	for _, name := range rt.names {
		m := rt.models[name].current()
		for _, rep := range m.replicas {
			if !rep.server.last.Load().Healthy || (allowed != nil && !allowed(rep.target.Host)) {
				continue
			}
			if n := rep.inFlight.Load(); bestN < 0 || n < bestN {
				best, bestN = rep.target.Host, n
			}
		}
	}
	return best
}

// MaxBodyBytes is limits.max_body_bytes of the current configuration: a
// front end that gathers a body in pieces stops gathering past it (Decide
// answers 413).
func (s *Server) MaxBodyBytes() int { return int(s.state.Load().cfg.Limits.MaxBodyBytes) }

// TakeBodyBytes counts n more bytes of request body that a front end
// holds itself (warden epp gathers each body from the gateway's chunks)
// against limits.max_body_bytes_in_flight: the one budget of the request
// bodies a process holds, the proxy's own included, shown by
// warden_request_body_bytes. False, counting nothing, when the bodies
// held would pass it. GiveBodyBytes gives them back.
func (s *Server) TakeBodyBytes(n int) bool {
	return s.bodies.Take(int64(n), int64(s.state.Load().cfg.Limits.MaxBodyBytesInFlight))
}

// GiveBodyBytes gives back n bytes that TakeBodyBytes counted.
func (s *Server) GiveBodyBytes(n int) {
	if n > 0 {
		s.bodies.Give(int64(n))
	}
}

// BodyBytes are the bytes of request body held now and their bound,
// limits.max_body_bytes_in_flight.
func (s *Server) BodyBytes() (held, limit int64) {
	return s.bodies.Held(), int64(s.state.Load().cfg.Limits.MaxBodyBytesInFlight)
}

// Timeouts are the timeouts of the current configuration, defaults
// filled.
func (s *Server) Timeouts() Timeouts { return s.state.Load().cfg.Timeouts }
