package epp

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/lm-warden/warden/live"
)

// TestProtocolStatus (issue 50, item 3): every status an ImmediateResponse
// carries is a value of Envoy's HttpStatus enum; Anthropic's 529 goes as
// 429 when the request was shed and 503 otherwise.
func TestProtocolStatus(t *testing.T) {
	for _, tt := range []struct {
		ref  live.Refusal
		want typev3.StatusCode
	}{
		{live.Refusal{Status: 529, Shed: true}, typev3.StatusCode_TooManyRequests},
		{live.Refusal{Status: 529}, typev3.StatusCode_ServiceUnavailable},
		{live.Refusal{Status: 429, Shed: true}, typev3.StatusCode_TooManyRequests},
		{live.Refusal{Status: 408}, typev3.StatusCode_RequestTimeout},
		{live.Refusal{Status: 413}, typev3.StatusCode_PayloadTooLarge},
		{live.Refusal{Status: 0}, typev3.StatusCode_ServiceUnavailable},
	} {
		if got := protocolStatus(&tt.ref); got != tt.want {
			t.Errorf("%+v: %v, want %v", tt.ref, got, tt.want)
		}
	}
}

// TestHealthPort (issue 50, item 3): the health port serves liveness,
// readiness and inference-extension (the name the llm-d chart and GAIE's
// conformance manifests probe on 9003), SERVING while the picker serves,
// and no ext_proc.
func TestHealthPort(t *testing.T) {
	p := startPicker(t, pickerYAML("", "", "127.0.0.1:1"))
	conn, err := grpc.NewClient(p.health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{ServiceInferenceExtension, ServiceLiveness, ServiceReadiness} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		cancel()
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s on the health port: %v %v, want SERVING", svc, r.GetStatus(), err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("ext_proc on the health port: %v, want Unimplemented", err)
	}
}

// TestSubsetHint: the hint's entries, ip:port or a bare IP (every port of
// that pod, as llm-d-router and GAIE read it), IPv4 and IPv6.
func TestSubsetHint(t *testing.T) {
	hint := func(v *structpb.Value) *subset {
		return subsetHint(&extprocv3.ProcessingRequest{MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			NamespaceSubset: {Fields: map[string]*structpb.Value{KeySubset: v}}}}})
	}
	list := func(s ...string) *structpb.Value {
		vs := make([]any, len(s))
		for i, e := range s {
			vs[i] = e
		}
		v, _ := structpb.NewList(vs)
		return structpb.NewListValue(v)
	}
	for _, tt := range []struct {
		name  string
		v     *structpb.Value
		allow []string
		deny  []string
	}{
		{"ip:port", list("10.0.0.1:8000"), []string{"10.0.0.1:8000"}, []string{"10.0.0.1:8001", "10.0.0.2:8000"}},
		{"bare ip", list("10.0.0.1"), []string{"10.0.0.1:8000", "10.0.0.1:8001"}, []string{"10.0.0.2:8000"}},
		{"string", structpb.NewStringValue("10.0.0.2, 10.0.0.1:8001"), []string{"10.0.0.2:8000", "10.0.0.1:8001"}, []string{"10.0.0.1:8000"}},
		{"ipv6 bare", list("fd00::1"), []string{"[fd00::1]:8000", "[fd00:0::1]:8001"}, []string{"[fd00::2]:8000"}},
		{"ipv6 bracketed", list("[fd00::1]"), []string{"[fd00::1]:8000"}, []string{"[fd00::2]:8000"}},
		{"ipv6 port", list("[fd00:0:0::1]:8000"), []string{"[fd00::1]:8000"}, []string{"[fd00::1]:8001"}},
		{"name", list("vllm-0:8000"), nil, []string{"10.0.0.1:8000"}},
		{"empty", list(), nil, []string{"10.0.0.1:8000"}},
	} {
		h := hint(tt.v)
		for _, ep := range tt.allow {
			if !h.allows(ep) {
				t.Errorf("%s: %s refused", tt.name, ep)
			}
		}
		for _, ep := range tt.deny {
			if h.allows(ep) {
				t.Errorf("%s: %s allowed", tt.name, ep)
			}
		}
	}
	if subsetHint(&extprocv3.ProcessingRequest{}).allowed() != nil {
		t.Error("no hint: want no restriction")
	}
}

// TestSubsetBareIP (issue 50, item 3): a gateway's subset hint that names
// a pod by its IP alone picks that pod's endpoint, in each body mode.
// Before, a bare IP matched no endpoint: 503.
func TestSubsetBareIP(t *testing.T) {
	a, _ := startReplicaOn(t, "127.0.0.1", "")
	b, _ := startReplicaOn(t, "127.0.0.2", "")
	p := startPicker(t, pickerYAML("", "", a, b))
	p.waitScraped(t)
	for _, mode := range modes {
		g := newGateway(p, mode)
		for i := range 4 {
			s := "bare-" + mode.String() + string(rune('a'+i))
			r := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader(s), body: chatBody(s, 0, 300, false), subset: []string{"127.0.0.2"}})
			if r.status != http.StatusOK || r.endpoints[0] != b || slices.Contains(r.endpoints, a) {
				t.Fatalf("%s: hint 127.0.0.2: %d picked %v, want %s only", mode, r.status, r.endpoints, b)
			}
		}
	}
}

// TestNotInferencePath (issue 50, item 3): a POST to a path that is no
// inference API (the GAIE conformance tests POST to paths such as
// /primary-gateway-test) goes to the endpoint with the fewest requests in
// flight, its body passed through unkept and nothing counted, in each
// body mode; within a subset hint when there is one. Before, the picker
// answered 404 itself.
func TestNotInferencePath(t *testing.T) {
	p, _ := pickerOver(t, 2, "")
	g := newGateway(p, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	// One conversation turn held in flight on its endpoint.
	held, release := make(chan string), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("busy"), body: chatBody("busy", 0, 300, false),
			hold: func() { held <- ""; <-release }})
	})
	<-held
	busy := p.ls.Status().Models[0].Replicas
	var hot, cold string
	for _, r := range busy {
		ep := strings.TrimPrefix(r.URL, "http://")
		if r.InFlight > 0 {
			hot = ep
		} else {
			cold = ep
		}
	}
	body := []byte(`{"model":"conformance-fake-model","prompt":"Write as if you were a critic: San Francisco"}`)
	for _, mode := range modes {
		g := newGateway(p, mode)
		r := g.do(t, request{path: "/primary-gateway-test", body: body})
		if r.served == "" || r.endpoints[0] != cold {
			t.Errorf("%s: picked %v served by %q; want the idle endpoint %s (%s holds a request)", mode, r.endpoints, r.served, cold, hot)
		}
		r = g.do(t, request{path: "/primary-gateway-test", body: body, subset: []string{hot}})
		if r.endpoints[0] != hot {
			t.Errorf("%s: with the hint %s picked %v", mode, hot, r.endpoints)
		}
	}
	close(release)
	wg.Wait()
	for _, r := range p.ls.Status().Models[0].Replicas {
		if r.InFlight != 0 {
			t.Errorf("%s: %d in flight after every answer", r.URL, r.InFlight)
		}
	}
}

// recorder keeps every message the picker received, by stream.
type recorder struct {
	mu      sync.Mutex
	streams [][]*extprocv3.ProcessingRequest
}

type recordingStream struct {
	grpc.ServerStream
	r *recorder
	i int
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*extprocv3.ProcessingRequest); ok && err == nil {
		s.r.mu.Lock()
		s.r.streams[s.i] = append(s.r.streams[s.i], req)
		s.r.mu.Unlock()
	}
	return err
}

func (r *recorder) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	r.mu.Lock()
	r.streams = append(r.streams, nil)
	i := len(r.streams) - 1
	r.mu.Unlock()
	return h(srv, &recordingStream{ServerStream: ss, r: r, i: i})
}

// TestGatewaySpeaksEnvoy (issue 50, item 5): the tests' gateway sends
// what Envoy's ext_proc filter sends (source/extensions/filters/http/
// ext_proc/ext_proc.cc): the protocol_config on the stream's first
// message only (Filter::encodeProtocolConfig), the forwarded metadata on
// every message, request and response, headers, bodies and trailers
// alike (Filter::addDynamicMetadata in buildHeaderRequest,
// setupBodyChunk, sendTrailers), and header values as raw_value
// (mutation_utils.cc MutationUtils::headersToProto). Checked on what
// reaches the picker, in each body mode. Before, the metadata went on the
// first message and the response headers only.
func TestGatewaySpeaksEnvoy(t *testing.T) {
	a, _ := startReplica(t, "")
	rec := &recorder{}
	p := startPicker(t, pickerYAML("", "", a), withServerOptions(grpc.StreamInterceptor(rec.intercept)))
	p.waitScraped(t)
	for _, mode := range modes {
		g := newGateway(p, mode)
		g.chunk = 200
		r := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("envoy"), body: chatBody("envoy", 0, 600, true), subset: []string{a}})
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", mode, r.status, r.body)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.streams) != len(modes) {
		t.Fatalf("%d streams recorded, want %d", len(rec.streams), len(modes))
	}
	for i, msgs := range rec.streams {
		kinds := map[string]int{}
		for j, m := range msgs {
			kind := fmtType(m.GetRequest())
			kinds[kind]++
			if (m.GetProtocolConfig() != nil) != (j == 0) {
				t.Errorf("stream %d message %d (%s): protocol_config %v; want it on the first message only", i, j, kind, m.GetProtocolConfig())
			}
			if m.GetMetadataContext().GetFilterMetadata()[NamespaceSubset] == nil {
				t.Errorf("stream %d message %d (%s): no %s metadata; Envoy forwards it with every message", i, j, kind, NamespaceSubset)
			}
			if strings.HasPrefix(kind, "Response") && m.GetMetadataContext().GetFilterMetadata()[NamespaceLB].GetFields()[KeyServed].GetStringValue() != a {
				t.Errorf("stream %d message %d (%s): no %s in %s", i, j, kind, KeyServed, NamespaceLB)
			}
			for _, h := range append(m.GetRequestHeaders().GetHeaders().GetHeaders(), m.GetResponseHeaders().GetHeaders().GetHeaders()...) {
				if h.GetValue() != "" || len(h.GetRawValue()) == 0 {
					t.Errorf("stream %d message %d: header %s in value %q, raw_value %q; Envoy sends raw_value", i, j, h.GetKey(), h.GetValue(), h.GetRawValue())
				}
			}
		}
		if kinds["RequestHeaders"] != 1 || kinds["RequestBody"] < 1 || kinds["ResponseHeaders"] != 1 || kinds["ResponseBody"] < 1 {
			t.Errorf("stream %d: messages %v", i, kinds)
		}
		t.Logf("stream %d: %d messages %v, metadata on each, protocol_config on the first", i, len(msgs), kinds)
	}
}

func fmtType(v any) string {
	switch v.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return "RequestHeaders"
	case *extprocv3.ProcessingRequest_RequestBody:
		return "RequestBody"
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return "RequestTrailers"
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return "ResponseHeaders"
	case *extprocv3.ProcessingRequest_ResponseBody:
		return "ResponseBody"
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return "ResponseTrailers"
	}
	return "none"
}
