package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/lm-warden/warden/live"
)

// bodyChunk is the size of the StreamedBodyResponse chunks the request
// body is sent back in (FULL_DUPLEX_STREAMED): below Envoy's default
// 64 KiB buffer, as llm-d-router's EPP does.
const bodyChunk = 62000

// stream is the state of one ext_proc stream: one HTTP request.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer

	reqMode, respMode filterv3.ProcessingMode_BodySendMode
	modeKnown         bool // the first message said (protocol_config)

	header   http.Header
	path     string
	method   string
	subset   *subset // nil: no hint
	headers  bool    // request headers seen
	body     []byte  // the request body gathered so far; its capacity counted by live.TakeBodyBytes
	overflow bool    // the body passed limits.max_body_bytes: no more is kept
	decided  bool    // an endpoint was sent (or the request refused)
	// through: the request is no conversation turn (no body, or a path
	// that is no inference API): its endpoint was sent with the headers'
	// answer, by load, and its body passes through unkept.
	through  bool
	bodyDone bool // the request body ended (through)

	d        *live.Decision
	respSeen bool // response headers seen
}

// received is one message from the gateway, or the stream's end.
type received struct {
	req *extprocv3.ProcessingRequest
	err error
}

// Process serves one ext_proc stream (ExternalProcessorServer).
//
// The request phase, from the stream's start until the endpoint is sent,
// must end within timeouts.read, as a request's body must arrive within
// it on the proxy's listener: a gateway that sends a body and never its
// end gets 408 in the client's shape, and the body held is let go (issue
// 46, item 3). The gateway's messages are read on a goroutine of the
// stream's, so that the wait can be timed; it ends with the stream.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{s: s, srv: srv}
	defer st.end()
	msgs := make(chan received)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			req, err := srv.Recv()
			select {
			case msgs <- received{req, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var timeout <-chan time.Time // nil: none (timeouts.read below 0, as on the proxy's listener)
	if read := s.live.Timeouts().Read.D(); read > 0 {
		deadline := time.NewTimer(read)
		defer deadline.Stop()
		timeout = deadline.C
	}
	for {
		var m received
		select {
		case m = <-msgs:
		case <-timeout:
			return st.timedOut()
		}
		req, err := m.req, m.err
		if err == io.EOF || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
			return nil
		}
		if err != nil {
			return err
		}
		done, err := st.handle(req)
		if err != nil {
			s.log.Debug("ext_proc stream refused", "err", err)
			return err
		}
		if done {
			return nil
		}
		if st.decided {
			timeout = nil // the request phase is over: the response takes its time
		}
	}
}

// end lets go of what the stream holds: its request's in-flight counts
// and its body's share of the budget.
func (st *stream) end() {
	if st.d != nil {
		st.d.Finish()
	}
	st.freeBody()
}

// timedOut ends a stream whose request did not arrive whole within
// timeouts.read: 408 in the client's shape once its headers came, else
// the stream's own error.
func (st *stream) timedOut() error {
	st.freeBody()
	read := st.s.live.Timeouts().Read.D()
	if !st.headers {
		return status.Errorf(codes.DeadlineExceeded, "epp: no request headers within timeouts.read (%s)", read)
	}
	msg := fmt.Sprintf("the request body did not arrive whole within timeouts.read (%s)", read)
	return st.immediate(st.s.live.Refuse(st.path, st.header, live.RefuseReadTimeout, "read", msg))
}

// keepBody appends chunk to the body gathered, its capacity counted
// first against limits.max_body_bytes_in_flight, the budget of every
// request body the process holds (live's TakeBodyBytes); false when the
// budget cannot give it.
func (st *stream) keepBody(chunk []byte) bool {
	need := len(st.body) + len(chunk)
	if need > cap(st.body) {
		// Grow as append would (doubling), but never past the body limit
		// plus the byte that tells Decide it is too large.
		grown := min(max(need, 2*cap(st.body), 4<<10), st.s.live.MaxBodyBytes()+1)
		if !st.s.live.TakeBodyBytes(grown - cap(st.body)) {
			return false
		}
		b := make([]byte, len(st.body), grown)
		copy(b, st.body)
		st.body = b
	}
	st.body = append(st.body, chunk...)
	return true
}

// freeBody gives the body's capacity back to the budget.
func (st *stream) freeBody() {
	st.s.live.GiveBodyBytes(cap(st.body))
	st.body = nil
}

// protocolError is a stream that breaks the protocol: it ends with
// InvalidArgument, which Envoy's ext_proc filter reports (and handles by
// its failure_mode_allow).
func protocolError(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "epp: "+format, args...)
}

// handle takes one message; done ends the stream (an ImmediateResponse).
func (st *stream) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	if pc := req.GetProtocolConfig(); pc != nil && !st.modeKnown {
		st.modeKnown = true
		st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(req, v.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(v.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !st.headers {
			return false, protocolError("request trailers before the request headers")
		}
		if !st.decided {
			if done, err := st.decide(); done || err != nil {
				return done, err
			}
		}
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, st.responseHeaders(req, v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, st.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		if !st.respSeen {
			return false, protocolError("response trailers before the response headers")
		}
		if st.d != nil {
			st.d.Finish()
		}
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	case nil:
		return false, protocolError("a ProcessingRequest with no request (headers, body or trailers)")
	default:
		return false, protocolError("unexpected message %T", v)
	}
}

func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

func (st *stream) requestHeaders(req *extprocv3.ProcessingRequest, hs *extprocv3.HttpHeaders) (bool, error) {
	if st.headers {
		return false, protocolError("request headers twice in one stream")
	}
	st.headers = true
	st.header = http.Header{}
	for _, h := range hs.GetHeaders().GetHeaders() {
		k, v := strings.ToLower(h.GetKey()), headerValue(h)
		switch k {
		case ":path":
			st.path, _, _ = strings.Cut(v, "?")
		case ":method":
			st.method = v
		case HeaderDestination, KeySubset:
			// The picker's own headers: a client's are not believed.
		default:
			if !strings.HasPrefix(k, ":") {
				st.header.Add(k, v)
			}
		}
	}
	if st.path == "" {
		return false, protocolError("request headers without :path")
	}
	st.subset = subsetHint(req)
	if hs.GetEndOfStream() || !live.InferencePath(st.path) {
		// No conversation turn: a request without a body (a GET such as
		// /v1/models) or to a path that is no inference API (the GAIE
		// conformance tests POST to paths of their own). Any healthy
		// endpoint, by load, as llm-d-router's EPP does; nothing counted,
		// the body passes through unkept.
		st.decided, st.through = true, true
		st.bodyDone = hs.GetEndOfStream()
		ep := st.s.live.AnyEndpoint(st.subset.allowed())
		if ep == "" {
			return true, st.immediate(st.s.live.Refuse(st.path, st.header, live.RefuseUnavailable, "unavailable", "no endpoint can take the request now"))
		}
		return false, st.send(headersResponse(ep))
	}
	if st.buffered() {
		// BUFFERED: the gateway waits for this answer before it sends the
		// body; the endpoint goes with the body's answer.
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
	}
	return false, nil
}

// buffered reports a request body sent whole after the headers' answer.
func (st *stream) buffered() bool {
	return st.modeKnown && (st.reqMode == filterv3.ProcessingMode_BUFFERED || st.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL)
}

// subset is the gateway's subset hint: the endpoints the picker may
// choose from. An entry ip:port names that endpoint; an entry that is a
// bare IP (no port) names every port of that pod, as the reference
// pickers read the hint by address (llm-d-router
// pkg/epp/requestcontrol/candidates.go, DatastoreEndpointCandidates.Locate,
// and gateway-api-inference-extension's SubsetFilter keep the address of
// each entry and match pods by it).
type subset struct {
	endpoints map[string]bool // ip:port, the IP in its canonical form
	ips       map[string]bool // bare IPs, canonical
}

// allows reports whether the hint lets the picker choose ep (ip:port).
func (h *subset) allows(ep string) bool {
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return h.endpoints[ep]
	}
	host = canonicalIP(host)
	return h.endpoints[net.JoinHostPort(host, port)] || h.ips[host]
}

// allowed is the hint as Decide's Allowed: nil when there is none.
func (h *subset) allowed() func(string) bool {
	if h == nil {
		return nil
	}
	return h.allows
}

// canonicalIP is an IP address in Go's canonical form (IPv4 written as
// IPv6 made IPv4, IPv6 zeros compressed); anything else as it is.
func canonicalIP(s string) string {
	if ip := net.ParseIP(s); ip != nil {
		return ip.String()
	}
	return s
}

// subsetHint reads envoy.lb.subset_hint / x-gateway-destination-endpoint-subset
// (a list of ip:port or bare IPs, or one comma-separated string); nil when
// absent.
func subsetHint(req *extprocv3.ProcessingRequest) *subset {
	ns := req.GetMetadataContext().GetFilterMetadata()[NamespaceSubset]
	if ns == nil {
		return nil
	}
	v, ok := ns.GetFields()[KeySubset]
	if !ok {
		return nil
	}
	h := &subset{endpoints: map[string]bool{}, ips: map[string]bool{}}
	add := func(s string) {
		for e := range strings.SplitSeq(s, ",") {
			e = strings.TrimSpace(e)
			if e == "" {
				continue
			}
			if host, port, err := net.SplitHostPort(e); err == nil {
				h.endpoints[net.JoinHostPort(canonicalIP(host), port)] = true
			} else if ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(e, "["), "]")); ip != nil {
				h.ips[ip.String()] = true
			} else {
				h.endpoints[e] = true // a name: it matches no endpoint
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	case *structpb.Value_StringValue:
		add(k.StringValue)
	}
	return h // empty: nothing is eligible (the protocol: 503)
}

func (st *stream) requestBody(b *extprocv3.HttpBody) (bool, error) {
	if !st.headers {
		return false, protocolError("a request body before the request headers")
	}
	eos := b.GetEndOfStream() || b.GetEndOfStreamWithoutMessage()
	if st.through {
		if st.bodyDone {
			return false, protocolError("request body after the end of the request body")
		}
		st.bodyDone = eos
		if st.modeKnown && st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			// BUFFERED or STREAMED: the body passes unchanged.
			return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}})
		}
		return false, st.send(streamedBody(true, b.GetBody(), eos))
	}
	if st.decided {
		return false, protocolError("request body after the end of the request body")
	}
	if !st.overflow {
		chunk := b.GetBody()
		if limit := st.s.live.MaxBodyBytes(); len(st.body)+len(chunk) > limit {
			// Keep one byte past the limit: Decide answers 413.
			chunk = chunk[:limit+1-len(st.body)]
			st.overflow = true
		}
		if _, budget := st.s.live.BodyBytes(); int64(len(st.body)+len(chunk)) > budget {
			// limits.max_body_bytes_in_flight below max_body_bytes: a
			// body that alone will never fit is refused as too large,
			// not shed to be retried.
			st.freeBody()
			return true, st.immediate(st.s.live.Refuse(st.path, st.header, live.RefuseTooLarge, "too_large",
				fmt.Sprintf("request body is larger than the %d bytes the picker holds of all bodies at once (limits.max_body_bytes_in_flight)", budget)))
		}
		if !st.keepBody(chunk) {
			// The bodies held across streams are at the budget: shed
			// this one (the client retries) rather than grow past it.
			st.freeBody()
			_, budget := st.s.live.BodyBytes()
			return true, st.immediate(st.s.live.Refuse(st.path, st.header, live.RefuseOverloaded, "body_budget",
				fmt.Sprintf("the picker holds %d bytes of request bodies, its limit (limits.max_body_bytes_in_flight); retry shortly", budget)))
		}
	}
	if !eos {
		return false, nil
	}
	return st.decide()
}

// decide places the request once its body is whole and sends the answer.
func (st *stream) decide() (bool, error) {
	st.decided = true
	d, ref := st.s.live.Decide(live.DecideInput{Ctx: st.srv.Context(), Method: st.method, Path: st.path,
		Header: st.header, Body: st.body, Allowed: st.subset.allowed()})
	if ref != nil {
		st.freeBody()
		return true, st.immediate(ref)
	}
	st.d = d
	dest := strings.Join(append([]string{d.Endpoint()}, d.Fallbacks()...), ",")
	if st.buffered() {
		st.freeBody()
		r := headersResponse(dest)
		cr := r.GetRequestHeaders().GetResponse()
		return false, st.send(&extprocv3.ProcessingResponse{
			Response:        &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}},
			DynamicMetadata: r.DynamicMetadata,
		})
	}
	// FULL_DUPLEX_STREAMED: the headers' answer, then the body sent back.
	if err := st.send(headersResponse(dest)); err != nil {
		return false, err
	}
	body := st.body
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), bodyChunk)
		chunk := body[:n]
		body = body[n:]
		if err := st.send(streamedBody(true, chunk, len(body) == 0)); err != nil {
			return false, err
		}
	}
	st.freeBody()
	return false, nil
}

// headersResponse is the answer to the request headers that names the
// endpoints: the header (overwriting a client's) and the envoy.lb
// dynamic metadata, with the same value.
func headersResponse(dest string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				ClearRouteCache: true,
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
					Header:       &corev3.HeaderValue{Key: HeaderDestination, RawValue: []byte(dest)},
					AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
				}}},
			},
		}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			NamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				HeaderDestination: structpb.NewStringValue(dest),
			}}),
		}},
	}
}

// streamedBody is a body chunk sent back in FULL_DUPLEX_STREAMED.
func streamedBody(request bool, chunk []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos}},
	}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// immediate answers the client itself: the refusal's status, its body in
// the client's API shape, Retry-After when set.
func (st *stream) immediate(ref *live.Refusal) error {
	hs := []*corev3.HeaderValueOption{{
		Header:       &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}}
	if ref.RetryAfter > 0 {
		hs = append(hs, &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: "retry-after", RawValue: []byte(strconv.Itoa(ref.RetryAfter))},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		})
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: protocolStatus(ref)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: hs},
		Body:    ref.Body,
		Details: "warden_" + ref.Reason,
	}}})
}

// protocolStatus is the refusal's status as Envoy's HttpStatus can carry
// it: its StatusCode enum lists the registered HTTP statuses only, and
// Envoy validates an ImmediateResponse against it (defined_only), so
// Anthropic's 529, which the proxy sends in its own HTTP answers, goes as
// 429 for a request shed for load and 503 otherwise (issue 50, item 3).
// The body keeps the client's error type (overloaded_error).
func protocolStatus(ref *live.Refusal) typev3.StatusCode {
	if _, ok := typev3.StatusCode_name[int32(ref.Status)]; ok && ref.Status != 0 {
		return typev3.StatusCode(ref.Status)
	}
	if ref.Shed {
		return typev3.StatusCode_TooManyRequests
	}
	return typev3.StatusCode_ServiceUnavailable
}

func (st *stream) responseHeaders(req *extprocv3.ProcessingRequest, hs *extprocv3.HttpHeaders) error {
	if !st.decided {
		return protocolError("response headers before the request was decided")
	}
	if st.respSeen {
		return protocolError("response headers twice in one stream")
	}
	st.respSeen = true
	if st.d != nil {
		code, ctype := 0, ""
		for _, h := range hs.GetHeaders().GetHeaders() {
			switch strings.ToLower(h.GetKey()) {
			case ":status":
				code, _ = strconv.Atoi(headerValue(h))
			case "content-type":
				ctype = headerValue(h)
			}
		}
		if ns := req.GetMetadataContext().GetFilterMetadata()[NamespaceLB]; ns != nil {
			st.d.Served(ns.GetFields()[KeyServed].GetStringValue())
		}
		st.d.ResponseHeaders(code, ctype)
		if hs.GetEndOfStream() {
			st.d.Finish()
		}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
}

func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	if !st.respSeen {
		return protocolError("a response body before the response headers")
	}
	eos := b.GetEndOfStream() || b.GetEndOfStreamWithoutMessage()
	if st.d != nil {
		st.d.ResponseBody(b.GetBody())
		if eos {
			st.d.Finish()
		}
	}
	if st.modeKnown && st.respMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// BUFFERED or STREAMED: the body passes unchanged.
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
	}
	return st.send(streamedBody(false, b.GetBody(), eos))
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(r); err != nil {
		return status.Errorf(codes.Unavailable, "epp: sending to the gateway: %v", err)
	}
	return nil
}
