package live

import (
	"context"
	"errors"
	"fmt"
	"github.com/lm-warden/warden/live/upstream"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// attempt is one try of a call on one replica; it holds one in-flight count
// and gives it back exactly once.
type attempt struct {
	m        *model
	rep      *replica
	released atomic.Bool
	uncached int64       // its share of rep's prefill queue (Decision.Uncached)
	queued   atomic.Bool // the share is still counted (see prefilled)
}

// newAttempt is the attempt of a pick: its in-flight count and its prefill
// queue share (both added by pick) are the attempt's to give back.
func newAttempt(p picked) *attempt {
	a := &attempt{m: p.m, rep: p.rep, uncached: int64(p.Uncached)}
	a.queued.Store(a.uncached > 0)
	return a
}

// release gives back the attempt's in-flight count and prefill share, once.
func (a *attempt) release() {
	if a != nil && a.released.CompareAndSwap(false, true) {
		a.prefilled()
		a.rep.inFlight.Add(-1)
	}
}

// transport sends each attempt, retries a failure that reached no client
// byte once on another replica, and wraps the response body.
type transport struct {
	srv *Server
	up  *upstream.Client
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
	clientCtx := req.Context()
	ctx, cancel := context.WithCancel(clientCtx)
	var dog *watchdog
	to := t.srv.state.Load().cfg.Timeouts
	if c.stream {
		dog = startWatchdog(phaseFirstToken, to.FirstToken.D(), cancel)
	}
	var down atomic.Bool
	stopDown := context.AfterFunc(a.rep.server.downCtx(), func() { down.Store(true); cancel() })
	drained := new(atomic.Bool)
	stopDrain := context.AfterFunc(t.srv.drained, func() { drained.Store(true); cancel() })
	// timeouts.response_header, per attempt so that a reload applies it;
	// then, unless the reply is the event stream a stream asked for, the
	// reply's own timeout.
	hdog := startWatchdog(phaseHeaders, to.ResponseHeader.D(), cancel)
	res, err := t.up.Do(req.WithContext(ctx), c.rb)
	stopDown()
	if err == nil && (res.StatusCode < 100 || res.StatusCode > 599) {
		res.Body.Close()
		err = fmt.Errorf("%w: status %d", upstream.ErrBadReply, res.StatusCode)
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
		return nil, t.failed(c, a, err, dog, hdog, drained.Load(), down.Load())
	}
	if res.StatusCode >= 500 {
		a.rep.upErrors.Add(1)
		t.srv.obs.upstreamErrors.WithLabelValues(c.m.cfg.Name, strconv.Itoa(a.rep.id), "status").Inc()
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
	res.Body = replyBody(res.Header, base, to, dog, hdog)
	return res, nil
}

// failed counts and names the failure err of attempt a, which got no
// response: a watchdog that expired (dog: first_token, hdog:
// response_header), the drain deadline, the replica marked down, a bad
// reply, a failed dial (which may eject the replica) or a reset. It
// returns the error the call goes on with.
func (t *transport) failed(c *call, a *attempt, err error, dog, hdog *watchdog, drained, down bool) error {
	s, name, id := t.srv, c.m.cfg.Name, strconv.Itoa(a.rep.id)
	a.rep.upErrors.Add(1)
	kind := "reset"
	switch {
	case dog.expired():
		kind = "timeout"
		err = fmt.Errorf("%w: %s", errStalled, dog.what())
		s.log.Warn("upstream timed out", "model", name, "replica", a.rep.id, "err", err)
		t.strike(c, a.rep)
	case drained:
		kind = "drain"
		err = errDraining
	case hdog.expired():
		kind = "timeout"
		err = fmt.Errorf("%w: %s", errNoHeaders, hdog.what())
		s.log.Warn("upstream timed out", "model", name, "replica", a.rep.id, "err", err)
	case down:
		kind = "down"
		err = fmt.Errorf("replica %d: %w", a.rep.id, errReplicaDown)
	case errors.Is(err, upstream.ErrBadReply):
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
	return err
}

// replyBody wraps a reply's body (headers h) to pass it on: a streamBody
// for an event stream, a plainBody for anything else, each timed by the
// watchdog of its kind of reply (see try); the other one is stopped.
func replyBody(h http.Header, base bodyBase, to Timeouts, dog, hdog *watchdog) io.ReadCloser {
	sse := strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
	// A body the replica encoded (Content-Encoding: gzip, ...) passes
	// through as it is: its events cannot be read, so neither are its
	// usage and its end; it is timed by its bytes.
	encoded := false
	if ce := h["Content-Encoding"]; len(ce) > 0 && !(len(ce) == 1 && strings.EqualFold(ce[0], "identity")) {
		encoded = true
	}
	switch {
	case sse && base.c.stream:
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
		return newStreamBody(base, to.StreamIdle.D())
	}
	return &plainBody{bodyBase: base, gaps: sse, idle: to.StreamIdle.D(), usageOver: encoded}
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
