package epp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/lm-warden/warden/emulator"
	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testModel = "Qwen/Qwen3-4B-Instruct-2507"

// startReplica serves one emulated vLLM replica (warden emulate) on
// 127.0.0.1 and returns its address and a function that kills it (also
// called when the test ends).
func startReplica(t testing.TB, vllm string) (addr string, kill func()) {
	t.Helper()
	return startReplicaOn(t, "127.0.0.1", vllm)
}

// startReplicaOn is startReplica listening on host (another loopback
// address: a pod of its own IP).
func startReplicaOn(t testing.TB, host, vllm string) (addr string, kill func()) {
	t.Helper()
	f, err := sim.ParseFarm([]byte("model: "+testModel+"\ngpu: RTX A4000\nreplicas: 1\nvllm: {max_num_seqs: 32, max_model_len: 32768"+vllm+"}\n"), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e, err := emulator.New(f, emulator.Options{Speed: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Serve(ctx, []net.Listener{ln}) }()
	kill = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("emulator: %v", err)
		}
	})
	t.Cleanup(kill)
	return ln.Addr().String(), kill
}

// picker is a running `warden epp` on 127.0.0.1.
type picker struct {
	s      *Server
	ls     *live.Server
	addr   string // ext_proc
	admin  string
	health string // the health port
	client extprocv3.ExternalProcessorClient
	conn   *grpc.ClientConn
	stop   func() error
}

// startPicker parses yamlText as the EPP's configuration (listen set for
// it), serves it on 127.0.0.1:0 and stops it when the test ends.
func startPicker(t testing.TB, yamlText string, opts ...Option) *picker {
	t.Helper()
	return startPickerOn(t, yamlText, nil, opts...)
}

// startPickerOn is startPicker serving ext_proc on ln (nil: a new
// listener on 127.0.0.1:0).
func startPickerOn(t testing.TB, yamlText string, ln net.Listener, opts ...Option) *picker {
	t.Helper()
	cfg, err := live.ParseConfig("epp.yaml", []byte("listen: 127.0.0.1:0\n"+yamlText))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckConfig(cfg); err != nil {
		t.Fatal(err)
	}
	ls, err := live.NewServer(cfg, live.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	s := New(ls, append([]Option{WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if ln == nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, Listeners{ExtProc: ln, Admin: aln, Health: hln}) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p := &picker{s: s, ls: ls, addr: ln.Addr().String(), admin: "http://" + aln.Addr().String(), health: hln.Addr().String(),
		client: extprocv3.NewExternalProcessorClient(conn), conn: conn}
	p.stop = sync.OnceValue(func() error {
		_ = conn.Close()
		cancel()
		return <-done
	})
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return p
}

// pickerOver starts n emulated replicas and a picker over them (model
// options modelExtra) and waits for their first scrape.
func pickerOver(t testing.TB, n int, modelExtra string) (*picker, []string) {
	t.Helper()
	eps := make([]string, n)
	for i := range eps {
		eps[i], _ = startReplica(t, "")
	}
	p := startPicker(t, pickerYAML("", modelExtra, eps...))
	p.waitScraped(t)
	return p, eps
}

// pickerYAML is an EPP configuration of one model over the endpoints:
// extra's settings, else timeouts {drain: 5s, health: 1s} and
// scrape_interval 50ms.
func pickerYAML(extra, modelExtra string, endpoints ...string) string {
	urls := make([]string, len(endpoints))
	for i, e := range endpoints {
		urls[i] = "http://" + e
	}
	if !strings.Contains(extra, "timeouts:") {
		extra = "timeouts: {drain: 5s, health: 1s}\n" + extra
	}
	if !strings.Contains(extra, "scrape_interval:") {
		extra = "scrape_interval: 50ms\n" + extra
	}
	return "auth: passthrough\n" + extra +
		"models:\n  - name: " + testModel + "\n    replicas: [" + strings.Join(urls, ", ") + "]\n" + modelExtra
}

// waitScraped waits until every replica of the picker has been scraped.
func (p *picker) waitScraped(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st := p.ls.Status()
		ok := len(st.Models) > 0
		for _, m := range st.Models {
			for _, r := range m.Replicas {
				ok = ok && r.ScrapeState == "ok"
			}
		}
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("replicas not scraped within 10s")
}

// gateway plays Envoy's side of ext_proc: it streams a request's headers
// and body in its body mode, reads the endpoints picked, forwards the
// request to them in order (retrying the next on a refused connection or
// a 502/503, as Envoy's retry policy over the picked list does), and
// streams the response back through the response phase, reporting the
// endpoint that served it.
type gateway struct {
	p    *picker
	mode filterv3.ProcessingMode_BodySendMode // request and response body mode
	http *http.Client
	// chunk is the size of the body chunks sent (Envoy: its buffer).
	chunk int
}

func newGateway(p *picker, mode filterv3.ProcessingMode_BodySendMode) *gateway {
	return &gateway{p: p, mode: mode, chunk: 16 << 10, http: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true}}}
}

// answer is what the client got.
type answer struct {
	status     int
	header     http.Header
	body       []byte
	endpoints  []string // picked, in order
	served     string   // the endpoint that answered; "" for an immediate response
	retryAfter string
}

// request is one client request through the gateway.
type request struct {
	path   string
	header map[string]string
	body   []byte
	subset []string // nil: no hint
	// hold, when not nil, is called after the endpoint is picked and
	// before the request is forwarded: the request stays in flight until
	// it returns.
	hold func()
}

func (g *gateway) do(t testing.TB, r request) answer {
	t.Helper()
	a, err := g.try(r)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (g *gateway) try(r request) (answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := g.p.client.Process(ctx)
	if err != nil {
		return answer{}, err
	}
	defer func() { _ = st.CloseSend() }()
	// What Envoy's ext_proc filter sends (source/extensions/filters/http/
	// ext_proc/ext_proc.cc): every message carries the forwarded dynamic
	// metadata (addDynamicMetadata in buildHeaderRequest, setupBodyChunk
	// and sendTrailers), the protocol_config goes on the stream's first
	// message only (encodeProtocolConfig, protocol_config_encoded_), and
	// header values go as raw_value (mutation_utils.cc headersToProto,
	// envoy.reloadable_features.send_header_raw_value).
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	if r.subset != nil {
		vals := make([]any, len(r.subset))
		for i, s := range r.subset {
			vals[i] = s
		}
		hint, err := structpb.NewStruct(map[string]any{KeySubset: vals})
		if err != nil {
			return answer{}, err
		}
		md.FilterMetadata[NamespaceSubset] = hint
	}
	first := true
	send := func(m *extprocv3.ProcessingRequest) error {
		m.MetadataContext = proto.Clone(md).(*corev3.Metadata)
		if first {
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: g.mode, ResponseBodyMode: g.mode}
			first = false
		}
		return st.Send(m)
	}
	hs := []*corev3.HeaderValue{{Key: ":authority", RawValue: []byte("gateway")}, {Key: ":path", RawValue: []byte(r.path)},
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":scheme", RawValue: []byte("http")},
		{Key: "content-type", RawValue: []byte("application/json")}}
	if len(r.body) > 0 {
		hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: strconv.AppendInt(nil, int64(len(r.body)), 10)})
	}
	for k, v := range r.header {
		hs = append(hs, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
	}
	hs = append(hs, &corev3.HeaderValue{Key: "x-forwarded-proto", RawValue: []byte("http")},
		&corev3.HeaderValue{Key: "x-request-id", RawValue: fmt.Appendf(nil, "%016x", time.Now().UnixNano())})
	if err := send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: len(r.body) == 0}},
	}); err != nil {
		return answer{}, err
	}
	var dest string
	var echoed []byte
	immediate := func(res *extprocv3.ProcessingResponse) (answer, bool) {
		ir := res.GetImmediateResponse()
		if ir == nil {
			return answer{}, false
		}
		a := answer{status: int(ir.GetStatus().GetCode()), header: http.Header{}, body: ir.GetBody()}
		for _, h := range ir.GetHeaders().GetSetHeaders() {
			a.header.Set(h.GetHeader().GetKey(), string(h.GetHeader().GetRawValue()))
		}
		a.retryAfter = a.header.Get("Retry-After")
		return a, true
	}
	readDest := func(res *extprocv3.ProcessingResponse, cr *extprocv3.CommonResponse) error {
		var hdr string
		for _, h := range cr.GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == HeaderDestination {
				hdr = string(h.GetHeader().GetRawValue())
			}
		}
		md := res.GetDynamicMetadata().GetFields()[NamespaceLB].GetStructValue().GetFields()[HeaderDestination].GetStringValue()
		if hdr == "" || hdr != md {
			return fmt.Errorf("destination header %q and envoy.lb metadata %q: want the same, not empty", hdr, md)
		}
		if !cr.GetClearRouteCache() {
			return errors.New("the destination's answer does not clear the route cache")
		}
		dest = hdr
		return nil
	}
	switch g.mode {
	case filterv3.ProcessingMode_BUFFERED:
		res, err := st.Recv()
		if err != nil {
			return answer{}, err
		}
		if a, ok := immediate(res); ok {
			return a, nil
		}
		if res.GetRequestHeaders() == nil {
			return answer{}, fmt.Errorf("buffered: want the headers' answer first, got %T", res.GetResponse())
		}
		if cr := res.GetRequestHeaders().GetResponse(); cr.GetHeaderMutation() != nil {
			// No conversation turn: the endpoint comes with the headers.
			if err := readDest(res, cr); err != nil {
				return answer{}, err
			}
		}
		if err := send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: r.body, EndOfStream: true}}}); err != nil {
			return answer{}, err
		}
		res, err = st.Recv()
		if err != nil {
			return answer{}, err
		}
		if a, ok := immediate(res); ok {
			return a, nil
		}
		if res.GetRequestBody() == nil {
			return answer{}, fmt.Errorf("buffered: want the body's answer, got %T", res.GetResponse())
		}
		if dest == "" {
			if err := readDest(res, res.GetRequestBody().GetResponse()); err != nil {
				return answer{}, err
			}
		}
		echoed = r.body
	default: // FULL_DUPLEX_STREAMED: the body follows without waiting
		for off := 0; off < len(r.body); off += g.chunk {
			end := min(off+g.chunk, len(r.body))
			err := send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: r.body[off:end], EndOfStream: end == len(r.body)}}})
			if errors.Is(err, io.EOF) {
				// The picker answered (an ImmediateResponse, such as 413
				// over the body budget) and ended the stream while the
				// body was still going: gRPC's Send says so with io.EOF,
				// the answer waits in Recv. Envoy stops sending then too.
				break
			}
			if err != nil {
				return answer{}, err
			}
		}
		res, err := st.Recv()
		if err != nil {
			return answer{}, err
		}
		if a, ok := immediate(res); ok {
			return a, nil
		}
		if res.GetRequestHeaders() == nil {
			return answer{}, fmt.Errorf("full duplex: want the headers' answer, got %T", res.GetResponse())
		}
		if err := readDest(res, res.GetRequestHeaders().GetResponse()); err != nil {
			return answer{}, err
		}
		for len(r.body) > 0 {
			res, err := st.Recv()
			if err != nil {
				return answer{}, err
			}
			sb := res.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sb == nil {
				return answer{}, fmt.Errorf("full duplex: want the body back, got %T", res.GetResponse())
			}
			echoed = append(echoed, sb.GetBody()...)
			if sb.GetEndOfStream() {
				break
			}
		}
	}
	if !bytes.Equal(echoed, r.body) {
		return answer{}, fmt.Errorf("the body sent on is %d bytes, not the %d sent", len(echoed), len(r.body))
	}
	if r.hold != nil {
		r.hold()
	}
	a := answer{endpoints: strings.Split(dest, ",")}
	var res *http.Response
	for _, ep := range a.endpoints {
		req, err := http.NewRequest(http.MethodPost, "http://"+ep+r.path, bytes.NewReader(r.body))
		if err != nil {
			return answer{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range r.header {
			req.Header.Set(k, v)
		}
		res, err = g.http.Do(req)
		if err != nil {
			continue // refused: the next endpoint of the list
		}
		if res.StatusCode == http.StatusBadGateway || res.StatusCode == http.StatusServiceUnavailable {
			res.Body.Close()
			res = nil
			continue
		}
		a.served = ep
		break
	}
	if res == nil {
		return answer{}, fmt.Errorf("no endpoint of %q answered", dest)
	}
	defer res.Body.Close()
	a.status, a.header = res.StatusCode, res.Header
	rh := []*corev3.HeaderValue{{Key: ":status", RawValue: fmt.Appendf(nil, "%d", res.StatusCode)},
		{Key: "content-type", RawValue: []byte(res.Header.Get("Content-Type"))}}
	// The picker's envoy.lb metadata, with the endpoint that served, is
	// forwarded from now on with every message.
	served, _ := structpb.NewStruct(map[string]any{HeaderDestination: dest, KeyServed: a.served})
	md.FilterMetadata[NamespaceLB] = served
	if err := send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: rh}}},
	}); err != nil {
		return answer{}, err
	}
	if res, err := st.Recv(); err != nil || res.GetResponseHeaders() == nil {
		return answer{}, fmt.Errorf("response headers' answer: %v %v", res, err)
	}
	buf := make([]byte, 8<<10)
	for {
		n, rerr := res.Body.Read(buf)
		eos := rerr != nil
		if n == 0 && !eos {
			continue
		}
		if err := send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: bytes.Clone(buf[:n]), EndOfStream: eos}}}); err != nil {
			return answer{}, err
		}
		back, err := st.Recv()
		if err != nil {
			return answer{}, err
		}
		rb := back.GetResponseBody()
		if rb == nil {
			return answer{}, fmt.Errorf("want the response body's answer, got %T", back.GetResponse())
		}
		if g.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			a.body = append(a.body, rb.GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		} else {
			a.body = append(a.body, buf[:n]...)
		}
		if eos {
			if !errors.Is(rerr, io.EOF) {
				return answer{}, rerr
			}
			break
		}
	}
	_ = st.CloseSend()
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return answer{}, fmt.Errorf("after the response: want the stream's end, got %v", err)
	}
	return a, nil
}

// chatBody is an OpenAI chat request of a conversation at turn (0-based),
// about size bytes: later turns extend earlier ones.
func chatBody(session string, turn, size int, stream bool) []byte {
	msgs := []map[string]string{
		{"role": "system", "content": strings.Repeat("You are a careful coding agent. ", max(size/32, 1))},
		{"role": "user", "content": "first message of " + session},
	}
	for i := 1; i <= turn; i++ {
		msgs = append(msgs, map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d", i)},
			map[string]string{"role": "user", "content": fmt.Sprintf("follow-up %d", i)})
	}
	v := map[string]any{"model": testModel, "messages": msgs, "stream": stream, "max_tokens": 8}
	if stream {
		v["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(v)
	return b
}

func sessionHeader(s string) map[string]string { return map[string]string{"x-session-id": s} }
