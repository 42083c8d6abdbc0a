package epp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

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
	subset   map[string]bool // nil: no hint
	headers  bool            // request headers seen
	body     []byte
	overflow bool // the body passed limits.max_body_bytes: no more is kept
	decided  bool // an endpoint was sent (or the request refused)

	d        *live.Decision
	respSeen bool // response headers seen
}

// Process serves one ext_proc stream (ExternalProcessorServer).
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{s: s, srv: srv}
	defer func() {
		if st.d != nil {
			st.d.Finish()
		}
	}()
	for {
		req, err := srv.Recv()
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
	}
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
	if hs.GetEndOfStream() {
		// No body (a GET such as /v1/models): any healthy endpoint, as
		// llm-d-router's EPP does; no conversation, nothing counted.
		ep := st.s.live.AnyEndpoint()
		if st.subset != nil && !st.subset[ep] {
			ep = ""
			for _, e := range st.s.live.Endpoints() {
				if st.subset[e] {
					ep = e
					break
				}
			}
		}
		if ep == "" {
			return true, st.immediate(&live.Refusal{Status: http.StatusServiceUnavailable,
				Body: []byte(`{"error":{"message":"no endpoint can take the request now","type":"server_error","param":null,"code":"service_unavailable"}}`)})
		}
		st.decided = true
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

// subsetHint reads envoy.lb.subset_hint / x-gateway-destination-endpoint-subset
// (a list of ip:port, or one comma-separated string); nil when absent.
func subsetHint(req *extprocv3.ProcessingRequest) map[string]bool {
	ns := req.GetMetadataContext().GetFilterMetadata()[NamespaceSubset]
	if ns == nil {
		return nil
	}
	v, ok := ns.GetFields()[KeySubset]
	if !ok {
		return nil
	}
	set := map[string]bool{}
	add := func(s string) {
		for e := range strings.SplitSeq(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				set[e] = true
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
	return set // empty: nothing is eligible (the protocol: 503)
}

func (st *stream) requestBody(b *extprocv3.HttpBody) (bool, error) {
	if !st.headers {
		return false, protocolError("a request body before the request headers")
	}
	if st.decided {
		return false, protocolError("request body after the end of the request body")
	}
	if !st.overflow {
		if len(st.body)+len(b.GetBody()) > st.s.live.MaxBodyBytes() {
			// Keep one byte past the limit: Decide answers 413.
			st.body = append(st.body, b.GetBody()[:st.s.live.MaxBodyBytes()+1-len(st.body)]...)
			st.overflow = true
		} else {
			st.body = append(st.body, b.GetBody()...)
		}
	}
	if !b.GetEndOfStream() && !b.GetEndOfStreamWithoutMessage() {
		return false, nil
	}
	return st.decide()
}

// decide places the request once its body is whole and sends the answer.
func (st *stream) decide() (bool, error) {
	st.decided = true
	var allowed func(string) bool
	if st.subset != nil {
		allowed = func(ep string) bool { return st.subset[ep] }
	}
	d, ref := st.s.live.Decide(live.DecideInput{Ctx: st.srv.Context(), Method: st.method, Path: st.path,
		Header: st.header, Body: st.body, Allowed: allowed})
	if ref != nil {
		return true, st.immediate(ref)
	}
	st.d = d
	dest := strings.Join(append([]string{d.Endpoint()}, d.Fallbacks()...), ",")
	if st.buffered() {
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
	st.body = nil
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
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(ref.Status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: hs},
		Body:    ref.Body,
		Details: "warden_" + ref.Reason,
	}}})
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
