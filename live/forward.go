package live

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/lm-warden/warden/live/upstream"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"strings"
)

// forward sends an admitted call to its replica (transport: the retry,
// the timeouts, the bodies) and copies the answer to the client. It does
// what httputil.ReverseProxy did here without what the proxy does not
// need, which was a tenth of its CPU a request (issue 13, item 12): no deep
// copy of the request (the outgoing one shares the client's header
// values, which neither side changes), no client trace, no flush after
// each write of a body whose length is known (an event stream, or a body
// of unknown length, is still flushed as it comes).
//
// The status of a reply that is not an event stream is sent with its
// first bytes, 32 KiB of them (a copy buffer) or all when its length is
// known to be less: a replica that sends headers and then nothing, or
// stalls within those bytes (timeouts.stream_idle), is answered with 504
// in the client's shape. A
// client that stops reading is cut after timeouts.client_write (see
// upstream.WrapClient): the exchange ends and the replica's request is cancelled.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, c *call) {
	res, err := s.tr.roundTrip(c, s.outgoing(r, c))
	if err != nil {
		s.upstreamError(w, r, c, err)
		return
	}
	if s.journal == nil && c.cur.rep.target.Scheme == "http" {
		// The replica has answered: no attempt is made again, and the
		// proxy's own client wrote the body before it read the answer
		// (net/http's Transport, for https, may still be writing it; the
		// journal reads it when the call ends). Its buffer goes back now,
		// not when a stream that may last minutes ends, and with it its
		// share of limits.max_body_bytes_in_flight.
		c.rb.Release()
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		res.Body.Close()
		s.upstreamError(w, r, c, errors.New("replica switched protocols (101), which the proxy does not forward"))
		return
	}
	buf := upstream.CopyBuffers.Get()
	defer upstream.CopyBuffers.Put(buf)
	sse := strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream")
	n := 0
	var rerr error
	if !sse {
		// Nothing is sent before the reply's first bytes, and for a body
		// of known length nothing before the copy buffer is full or the
		// body whole: what is written to w without a flush stays in the
		// server's buffers, so a JSON answer that stalled (or failed)
		// midway ended with an empty reply (issue 46 item 8). Until then
		// the client has had nothing, and gets a status.
		full := len(buf)
		if cl := res.ContentLength; cl >= 0 && cl < int64(full) {
			full = int(cl)
		}
		for rerr == nil && (n == 0 || res.ContentLength >= 0 && n < full) {
			var k int
			k, rerr = res.Body.Read(buf[n:])
			n += k
		}
		if rerr != nil && rerr != io.EOF {
			res.Body.Close()
			s.upstreamError(w, r, c, rerr)
			return
		}
		if c.api == APIAnthropic && res.StatusCode == http.StatusNotFound && rerr == io.EOF && !anthropicShaped(buf[:n]) {
			// A route the replica does not have answers in FastAPI's
			// shape ({"detail":"Not Found"}), which the Anthropic SDKs do
			// not read: say it in theirs (issue 50 item 4).
			res.Body.Close()
			c.status = http.StatusNotFound
			msg := fmt.Sprintf("the replica has no route for POST %s", c.path)
			if c.countTokens {
				msg += " (vLLM serves it since its pull request 35588: upgrade the replica)"
			}
			writeError(w, APIAnthropic, errNoRoute, msg)
			return
		}
	}
	removeHopByHop(res.Header)
	h := w.Header()
	for k, vv := range res.Header {
		h[k] = append(h[k], vv...)
	}
	if len(res.Trailer) > 0 {
		keys := make([]string, 0, len(res.Trailer))
		for k := range res.Trailer {
			keys = append(keys, k)
		}
		h.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(res.StatusCode)
	flush := res.ContentLength < 0 || sse
	err = copyBody(w, res.Body, flush, buf, n, rerr)
	if err == nil && len(res.Trailer) == 0 {
		// The answer is whole: send it now, not when the handler returns,
		// after the body's bookkeeping (usage, metrics, the journal), which
		// the client need not wait for.
		err = flushError(w)
	}
	res.Body.Close() // before the trailers: the body's end reads them
	if err != nil {
		var cw *clientWriteError
		if errors.As(err, &cw) && errors.Is(cw.err, os.ErrDeadlineExceeded) {
			s.log.Warn("client stopped reading: the exchange is cut and the replica's request cancelled",
				"model", c.m.cfg.Name, "replica", c.cur.rep.id, "timeout", s.state.Load().cfg.Timeouts.ClientWrite.D())
		}
		// The client holds part of an answer: end its connection, so that
		// it is not taken for a whole one. A handler called outside a
		// server (a test's recorder) just returns.
		if r.Context().Value(http.ServerContextKey) != nil {
			panic(http.ErrAbortHandler)
		}
		return
	}
	for k, vv := range res.Trailer {
		h[http.TrailerPrefix+k] = vv
	}
}

// anthropicShaped reports whether body is an error in the Anthropic
// shape, {"type":"error","error":{...}}, as vLLM's Anthropic routes answer
// (vllm/entrypoints/anthropic/api_router.py, translate_error_response).
func anthropicShaped(body []byte) bool {
	var v struct {
		Type  string          `json:"type"`
		Error json.RawMessage `json:"error"`
	}
	return json.Unmarshal(body, &v) == nil && v.Type == "error" && len(v.Error) > 0 && v.Error[0] == '{'
}

// clientWriteError is a failed write (or flush) to the client, told apart
// from a failed read of the replica's body.
type clientWriteError struct{ err error }

func (e *clientWriteError) Error() string { return "writing to the client: " + e.err.Error() }
func (e *clientWriteError) Unwrap() error { return e.err }

// flushError flushes w, with the error where the writer reports one
// (net/http's does: a client that stopped reading shows here).
func flushError(w http.ResponseWriter) error {
	switch f := w.(type) {
	case interface{ FlushError() error }:
		if err := f.FlushError(); err != nil {
			return &clientWriteError{err}
		}
	case http.Flusher:
		f.Flush()
	}
	return nil
}

// copyBody copies a response body to the client through buf, flushing
// after each write when flush is set, starting with buf[:n] and rerr, a
// read already made (n 0 and rerr nil: none). It returns the first error
// other than the body's end; a failed write or flush is a
// *clientWriteError.
func copyBody(w http.ResponseWriter, body io.Reader, flush bool, buf []byte, n int, rerr error) error {
	for {
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return &clientWriteError{werr}
			}
			if flush {
				if err := flushError(w); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
		n, rerr = body.Read(buf)
	}
}

// hopByHop are the headers of one connection (RFC 9110 7.6.1), never
// forwarded, with Proxy-Connection and Keep-Alive of old.
var hopByHop = map[string]bool{
	"Connection":          true,
	"Proxy-Connection":    true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// connectionNamed reports whether the Connection header values name k as
// hop-by-hop too.
func connectionNamed(conn []string, k string) bool {
	for _, v := range conn {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" && http.CanonicalHeaderKey(f) == k {
				return true
			}
		}
	}
	return false
}

// removeHopByHop deletes a response's hop-by-hop headers.
func removeHopByHop(h http.Header) {
	conn := h["Connection"]
	for k := range h {
		if hopByHop[k] || (len(conn) > 0 && connectionNamed(conn, k)) {
			delete(h, k)
		}
	}
}

// joinPath is a replica's base path with the client's path.
func joinPath(base, p string) string {
	return strings.TrimSuffix(base, "/") + p
}

// outgoing is the request for c's attempt on its replica (c.cur): the
// replica's URL with the client's path and query, the client's headers
// less the hop-by-hop ones and those the proxy owns, and the proxy's:
// X-Forwarded-For/-Host/-Proto, X-data-parallel-rank (only ever the
// proxy's), the backend credentials. The body is the call's (rb).
func (s *Server) outgoing(r *http.Request, c *call) *http.Request {
	rt := s.state.Load()
	rep := c.cur.rep
	u := &url.URL{Scheme: rep.target.Scheme, Host: rep.target.Host, Path: joinPath(rep.target.Path, c.path)}
	switch {
	case rep.target.RawQuery == "":
		u.RawQuery = r.URL.RawQuery
	case r.URL.RawQuery == "":
		u.RawQuery = rep.target.RawQuery
	default:
		u.RawQuery = rep.target.RawQuery + "&" + r.URL.RawQuery
	}
	h := make(http.Header, len(r.Header)+4)
	conn := r.Header["Connection"]
	dropAuth := rt.cfg.Auth != "passthrough" || rt.cfg.BackendAPIKey != ""
	pin := ""
	if p := rt.cfg.TrustedPinHeader; p != "" {
		pin = http.CanonicalHeaderKey(p)
	}
	for k, vv := range r.Header {
		switch {
		case hopByHop[k], len(conn) > 0 && connectionNamed(conn, k):
		case k == "X-Data-Parallel-Rank", k == "Content-Length", k == pin,
			k == "X-Forwarded-For", k == "X-Forwarded-Host", k == "X-Forwarded-Proto":
		case dropAuth && (k == "Authorization" || k == "X-Api-Key"):
		default:
			h[k] = vv
		}
	}
	for _, v := range r.Header["Te"] {
		if strings.EqualFold(textproto.TrimString(v), "trailers") {
			h["Te"] = []string{"trailers"} // says the client takes trailers: end to end
		}
	}
	if _, ok := r.Header["User-Agent"]; !ok {
		h["User-Agent"] = []string{""} // none: not Go's own
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		h["X-Forwarded-For"] = []string{ip}
	}
	h["X-Forwarded-Host"] = []string{r.Host}
	if r.TLS == nil {
		h["X-Forwarded-Proto"] = []string{"http"}
	} else {
		h["X-Forwarded-Proto"] = []string{"https"}
	}
	if rep.rank != "" {
		h["X-Data-Parallel-Rank"] = []string{rep.rank}
	}
	if rt.cfg.BackendAPIKey != "" {
		h["Authorization"] = []string{"Bearer " + rt.cfg.BackendAPIKey}
	}
	out := &http.Request{
		Method: r.Method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: c.rb.Reader(), ContentLength: int64(len(c.rb.Bytes())), Host: u.Host,
	}
	return out.WithContext(r.Context())
}

// upstreamError answers c's request r, which got no response at all.
func (s *Server) upstreamError(w http.ResponseWriter, r *http.Request, c *call, err error) {
	if r.Context().Err() != nil {
		c.status = 499 // client closed the request; nobody reads an answer
		return
	}
	kind := errUpstream
	switch {
	case errors.Is(err, errStalled), errors.Is(err, errNoHeaders):
		kind = errTimeout
	case errors.Is(err, upstream.ErrBadReply):
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
	case errors.Is(err, upstream.ErrBadReply):
		msg = fmt.Sprintf("upstream replica sent a reply the proxy does not take (%d attempt(s)): %s", c.attempts,
			strings.TrimPrefix(err.Error(), upstream.ErrBadReply.Error()+": "))
	}
	writeError(w, c.api, kind, msg)
}
