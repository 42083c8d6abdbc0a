package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// The Gateway API Inference Extension's endpoint picker protocol, as the
// EPP at llm-d/llm-d-router ebab687 speaks it (pkg/epp/handlers/request.go
// generateRequestHeaderResponse, generateMetadata; pkg/epp/metadata).
const (
	// headerDestination carries the picked endpoint, "ip:port".
	headerDestination = "x-gateway-destination-endpoint"
	// namespaceLB is the dynamic metadata namespace of the pick.
	namespaceLB = "envoy.lb"
	// keyScores holds, with --emit-endpoint-scores, the scheduler's total
	// weighted score of every candidate endpoint, keyed "ip:port".
	keyScores = "x-gateway-destination-endpoint-scores"
	// headerRequestID keys the EPP's per-request state and its log lines.
	headerRequestID = "x-request-id"
)

// gateway plays Envoy's side of ext_proc as the Gateway API Inference
// Extension configures it (request and response bodies
// FULL_DUPLEX_STREAMED): it streams a request's headers and body to the EPP,
// reads the endpoint picked and the candidates' scores, forwards the body
// the EPP gave back to that endpoint, and streams the response back
// through the response phase, as a gateway would.
type gateway struct {
	client extprocv3.ExternalProcessorClient
	http   *http.Client
	chunk  int // body chunk size (Envoy's buffer)
}

// pick is the EPP's answer for one request.
type pick struct {
	endpoint  string             // "ip:port", the first of the list the EPP answered
	fallbacks []string           // the rest of the list, in order (the protocol allows "ip:port,ip:port")
	scores    map[string]float64 // candidates' total scores; nil without --emit-endpoint-scores
}

// exchange is one request through the gateway: the pick and the answer.
type exchange struct {
	pick   pick
	status int
	body   []byte
}

// do sends body to path through the EPP and the endpoint it picks;
// picked, when not nil, is called with the pick before the request is
// forwarded.
func (g *gateway) do(ctx context.Context, path, requestID string, body []byte, picked func(pick)) (exchange, error) {
	st, err := g.client.Process(ctx)
	if err != nil {
		return exchange{}, fmt.Errorf("ext_proc: %w", err)
	}
	defer func() { _ = st.CloseSend() }()
	hs := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte(http.MethodPost)},
		{Key: ":path", RawValue: []byte(path)},
		{Key: ":authority", RawValue: []byte("gateway")},
		{Key: "content-type", RawValue: []byte("application/json")},
		{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))},
		{Key: headerRequestID, RawValue: []byte(requestID)},
	}
	mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if err := st.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: hs}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: mode},
	}); err != nil {
		return exchange{}, fmt.Errorf("ext_proc: request headers: %w", err)
	}
	for off := 0; off < len(body); off += g.chunk {
		end := min(off+g.chunk, len(body))
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}}); err != nil {
			return exchange{}, fmt.Errorf("ext_proc: request body: %w", err)
		}
	}
	res, err := st.Recv()
	if err != nil {
		return exchange{}, fmt.Errorf("ext_proc: the pick: %w", err)
	}
	if ir := res.GetImmediateResponse(); ir != nil {
		return exchange{}, fmt.Errorf("the EPP answered the request itself: HTTP %d: %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	if res.GetRequestHeaders() == nil {
		return exchange{}, fmt.Errorf("ext_proc: want the request headers' answer first, got %T", res.GetResponse())
	}
	p, err := readPick(res)
	if err != nil {
		return exchange{}, err
	}
	// The body comes back (the EPP may rewrite it); the gateway sends on
	// what it got.
	sent, err := recvBody(st, "request", (*extprocv3.ProcessingResponse).GetRequestBody)
	if err != nil {
		return exchange{}, err
	}
	if picked != nil {
		picked(p)
	}
	ex := exchange{pick: p}
	// As Envoy's retry over the picked list: the next endpoint on a
	// refused connection.
	var resp *http.Response
	var lastErr error
	for _, ep := range append([]string{p.endpoint}, p.fallbacks...) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ep+path, bytes.NewReader(sent))
		if err != nil {
			return exchange{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(headerRequestID, requestID)
		if resp, err = g.http.Do(req); err == nil {
			break
		}
		lastErr = err
		if ctx.Err() != nil {
			return exchange{}, fmt.Errorf("the picked endpoint %s: %w", ep, err)
		}
	}
	if resp == nil {
		return exchange{}, fmt.Errorf("no picked endpoint of %s answered: %w", strings.Join(append([]string{p.endpoint}, p.fallbacks...), ","), lastErr)
	}
	defer resp.Body.Close()
	ex.status = resp.StatusCode
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte(strconv.Itoa(resp.StatusCode))},
			{Key: "content-type", RawValue: []byte(resp.Header.Get("Content-Type"))},
		}}}}}); err != nil {
		return exchange{}, fmt.Errorf("ext_proc: response headers: %w", err)
	}
	if res, err := st.Recv(); err != nil || res.GetResponseHeaders() == nil {
		return exchange{}, fmt.Errorf("ext_proc: response headers' answer: %v %v", res.GetResponse(), err)
	}
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return exchange{}, fmt.Errorf("the picked endpoint %s: reading the answer: %w", p.endpoint, err)
	}
	for off := 0; ; off += g.chunk {
		end := min(off+g.chunk, len(answer))
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: answer[off:end], EndOfStream: end == len(answer)}}}); err != nil {
			return exchange{}, fmt.Errorf("ext_proc: response body: %w", err)
		}
		if end == len(answer) {
			break
		}
	}
	if ex.body, err = recvBody(st, "response", (*extprocv3.ProcessingResponse).GetResponseBody); err != nil {
		return exchange{}, err
	}
	_ = st.CloseSend()
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return exchange{}, fmt.Errorf("ext_proc: after the response, want the stream's end, got %v", err)
	}
	return ex, nil
}

// recvBody receives a body the EPP streams back (FULL_DUPLEX_STREAMED:
// streamed body mutations up to end of stream); which names it in errors,
// get picks the request's or the response's body answer.
func recvBody(st extprocv3.ExternalProcessor_ProcessClient, which string,
	get func(*extprocv3.ProcessingResponse) *extprocv3.BodyResponse) ([]byte, error) {
	var body []byte
	for {
		res, err := st.Recv()
		if err != nil {
			return nil, fmt.Errorf("ext_proc: %s body's answer: %w", which, err)
		}
		sb := get(res).GetResponse().GetBodyMutation().GetStreamedResponse()
		if sb == nil {
			return nil, fmt.Errorf("ext_proc: want the %s body back, got %T", which, res.GetResponse())
		}
		body = append(body, sb.GetBody()...)
		if sb.GetEndOfStream() {
			return body, nil
		}
	}
}

// readPick reads the endpoint (header and envoy.lb metadata, which must
// agree) and the candidates' scores from the request headers' answer.
func readPick(res *extprocv3.ProcessingResponse) (pick, error) {
	var hdr string
	for _, h := range res.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == headerDestination {
			hdr = string(h.GetHeader().GetRawValue())
		}
	}
	lb := res.GetDynamicMetadata().GetFields()[namespaceLB].GetStructValue().GetFields()
	md := lb[headerDestination].GetStringValue()
	if hdr == "" || hdr != md {
		return pick{}, fmt.Errorf("the EPP's pick: header %s %q and %s metadata %q: want the same endpoint", headerDestination, hdr, namespaceLB, md)
	}
	eps := strings.Split(hdr, ",")
	p := pick{endpoint: eps[0], fallbacks: eps[1:]}
	if sc := lb[keyScores].GetStructValue(); sc != nil {
		p.scores = make(map[string]float64, len(sc.GetFields()))
		for ep, v := range sc.GetFields() {
			p.scores[ep] = v.GetNumberValue()
		}
	}
	return p, nil
}
