package live

import (
	"bytes"
	"context"
	"fmt"
	"net"
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

// DecideInput is one client request as a front end that has no
// http.ResponseWriter sees it.
type DecideInput struct {
	Ctx    context.Context // done when the client (or the gateway's stream) goes away
	Method string          // "" is POST
	Path   string          // the request path, without its query
	Header http.Header     // the client's headers (canonical or lower-case keys)
	Body   []byte          // the whole request body
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
}

func (s *Server) refusalOf(api API, ref *refusal) *Refusal {
	s.obs.rejected.WithLabelValues(ref.reason).Inc()
	return &Refusal{Status: ref.kind.status(api), Body: errorBody(api, ref.kind, ref.msg), RetryAfter: ref.retryAfter, Reason: ref.reason}
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
	api, ok := endpoints[in.Path]
	if !ok && in.Header.Get("anthropic-version") != "" {
		api = APIAnthropic
	}
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
		body: bytes.NewReader(in.Body), length: int64(len(in.Body))})
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

// AnyEndpoint is the endpoint for a request that carries no body (a GET
// such as /v1/models): the healthy replica with the fewest requests in
// flight over every model, not counted; "" when none is healthy.
func (s *Server) AnyEndpoint() string {
	rt := s.state.Load()
	best, bestN := "", int64(-1)
	for _, name := range rt.names {
		m := rt.models[name].current()
		for _, rep := range m.replicas {
			if !rep.server.last.Load().Healthy {
				continue
			}
			if n := rep.inFlight.Load(); bestN < 0 || n < bestN {
				best, bestN = rep.target.Host, n
			}
		}
	}
	return best
}

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
// adminLn (nil: none), until ctx is done. Decide may be called before Run
// and after it returns; while Run runs, the first request of a model waits
// for its first scrape (awaitFirstProbe).
func (s *Server) Run(ctx context.Context, adminLn net.Listener) error {
	stopLoops, storeDone, _, err := s.startLoops(ctx, "Run")
	if err != nil {
		return err
	}

	errc := make(chan error, 1)
	var admin *http.Server
	if adminLn != nil {
		admin = &http.Server{Handler: s.Admin(), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- admin.Serve(adminLn) }()
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
	}
	s.endStreams()
	return s.stopLoops(stopLoops, storeDone, err, "run")
}

// DrainTimeout is timeouts.drain of the current configuration.
func (s *Server) DrainTimeout() time.Duration { return s.state.Load().cfg.Timeouts.Drain.D() }

// Models names the configured models, sorted.
func (s *Server) Models() []string { return slices.Clone(s.state.Load().names) }

// MaxBodyBytes is limits.max_body_bytes of the current configuration: a
// front end that gathers a body in pieces stops gathering past it (Decide
// answers 413).
func (s *Server) MaxBodyBytes() int { return int(s.state.Load().cfg.Limits.MaxBodyBytes) }
