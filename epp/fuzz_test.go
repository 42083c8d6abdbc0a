package epp

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lm-warden/warden/live"
)

// fakeStream is the server side of one ext_proc stream without a network,
// for fault injection: it hands out msgs, then io.EOF.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*extprocv3.ProcessingRequest
	sent []*extprocv3.ProcessingResponse
}

func (f *fakeStream) Context() context.Context { return f.ctx }

func (f *fakeStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(f.msgs) == 0 {
		return nil, io.EOF
	}
	m := f.msgs[0]
	f.msgs = f.msgs[1:]
	return m, nil
}

func (f *fakeStream) Send(r *extprocv3.ProcessingResponse) error {
	f.sent = append(f.sent, r)
	return nil
}

// offlinePicker is a picker over endpoints nothing listens on, not
// serving: its replicas are presumed healthy, so requests are placed.
func offlinePicker(t testing.TB) *Server {
	t.Helper()
	cfg, err := live.ParseConfig("epp.yaml", []byte("listen: 127.0.0.1:0\n"+pickerYAML("", "", "127.0.0.1:1", "127.0.0.1:2")))
	if err != nil {
		t.Fatal(err)
	}
	ls, err := live.NewServer(cfg, live.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return New(ls, WithLogger(slog.New(slog.DiscardHandler)))
}

// encodeStream writes messages as the fuzz input's framing: a 2-byte
// length, then the marshalled ProcessingRequest.
func encodeStream(msgs ...*extprocv3.ProcessingRequest) []byte {
	var out []byte
	for _, m := range msgs {
		b, _ := proto.Marshal(m)
		out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
		out = append(out, b...)
	}
	return out
}

func decodeStream(data []byte) []*extprocv3.ProcessingRequest {
	var msgs []*extprocv3.ProcessingRequest
	for len(data) >= 2 && len(msgs) < 64 {
		n := int(binary.BigEndian.Uint16(data))
		data = data[2:]
		n = min(n, len(data))
		m := new(extprocv3.ProcessingRequest)
		if proto.Unmarshal(data[:n], m) == nil {
			msgs = append(msgs, m)
		}
		data = data[n:]
	}
	return msgs
}

func reqHeaders(path string, eos bool, mode filterv3.ProcessingMode_BodySendMode, kv ...string) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(path)}}
	for i := 0; i+1 < len(kv); i += 2 {
		hs = append(hs, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: eos}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: mode},
	}
}

func reqBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func respHeaders(status string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(status)}}}}}}
}

func respBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

const fuzzChat = `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}],"usage":{}}`

// FuzzProcess feeds arbitrary message sequences to one ext_proc stream:
// every stream ends, either cleanly or with an InvalidArgument that names
// what was wrong ("epp: ..."), never a panic; and whatever the stream did,
// no request stays counted in flight afterwards. Goroutines are checked by
// TestMain (goleak).
func FuzzProcess(f *testing.F) {
	full, buf := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED
	f.Add(encodeStream(reqHeaders("/v1/chat/completions", false, full), reqBody(fuzzChat[:20], false), reqBody(fuzzChat[20:], true),
		respHeaders("200"), respBody(`{"usage":{"prompt_tokens":3}}`, true)))
	f.Add(encodeStream(reqHeaders("/v1/chat/completions", false, buf), reqBody(fuzzChat, true), respHeaders("200"), respBody("", true)))
	f.Add(encodeStream(reqHeaders("/v1/models", true, full), respHeaders("200")))
	f.Add(encodeStream(reqBody("x", true)))
	f.Add(encodeStream(respHeaders("200")))
	f.Add(encodeStream(reqHeaders("/v1/chat/completions", false, full), reqHeaders("/v1/chat/completions", false, full)))
	f.Add(encodeStream(reqHeaders("/v1/chat/completions", false, full), reqBody("{", true)))
	f.Add(encodeStream(reqHeaders("/nope", false, full), reqBody(fuzzChat, true)))
	f.Add([]byte{0, 3, 1, 2, 3})
	s := offlinePicker(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		st := &fakeStream{ctx: context.Background(), msgs: decodeStream(data)}
		err := s.Process(st)
		if err != nil {
			c := status.Code(err)
			if c != codes.InvalidArgument || !strings.Contains(err.Error(), "epp: ") {
				t.Fatalf("stream ended with %v: want nil or InvalidArgument naming the fault", err)
			}
		}
		for _, m := range s.router.(*live.Server).Status().Models {
			for _, r := range m.Replicas {
				if r.InFlight != 0 {
					t.Fatalf("replica %s: %d in flight after the stream ended", r.URL, r.InFlight)
				}
			}
		}
	})
}

// TestMalformedStreams: each broken sequence ends with a clear error.
func TestMalformedStreams(t *testing.T) {
	full := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	s := offlinePicker(t)
	for _, tt := range []struct {
		name string
		msgs []*extprocv3.ProcessingRequest
		want string // "" : ends cleanly
	}{
		{"body first", []*extprocv3.ProcessingRequest{reqBody("x", true)}, "a request body before the request headers"},
		{"response first", []*extprocv3.ProcessingRequest{respHeaders("200")}, "response headers before the request was decided"},
		{"headers twice", []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false, full), reqHeaders("/v1/chat/completions", false, full)}, "request headers twice"},
		{"no path", []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}}}, "without :path"},
		{"empty", []*extprocv3.ProcessingRequest{{}}, "no request"},
		{"body after decided", []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false, full), reqBody(fuzzChat, true), reqBody("x", true)}, "request body after the end"},
		{"response body first", []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false, full), reqBody(fuzzChat, true), respBody("x", true)}, "a response body before the response headers"},
		{"good", []*extprocv3.ProcessingRequest{reqHeaders("/v1/chat/completions", false, full), reqBody(fuzzChat, true), respHeaders("200"), respBody("{}", true)}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Process(&fakeStream{ctx: context.Background(), msgs: tt.msgs})
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("got %v, want a clean end", err)
			case tt.want != "" && (status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("got %v, want InvalidArgument %q", err, tt.want)
			}
		})
	}
}

// TestBadRequestsInClientShape: a bad body is answered by the picker
// itself, in the client's API shape.
func TestBadRequestsInClientShape(t *testing.T) {
	full := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	s := offlinePicker(t)
	for _, tt := range []struct {
		name, path, body string
		hdr              []string
		status           int
		want             string
	}{
		{"bad json", "/v1/chat/completions", "{", nil, 400, `"type":"invalid_request_error"`},
		{"unknown model", "/v1/chat/completions", `{"model":"nope","messages":[]}`, nil, 404, `"code":"model_not_found"`},
		{"anthropic", "/v1/messages", `{"model":"nope","messages":[]}`, []string{"anthropic-version", "2023-06-01"}, 404, `"type":"not_found_error"`},
		{"too large", "/v1/chat/completions", `{"model":"` + strings.Repeat("x", 17<<20) + `"}`, nil, 413, `exceeds the limit of 16777216 bytes`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := &fakeStream{ctx: context.Background(), msgs: []*extprocv3.ProcessingRequest{reqHeaders(tt.path, false, full, tt.hdr...), reqBody(tt.body, true)}}
			if err := s.Process(st); err != nil {
				t.Fatal(err)
			}
			if len(st.sent) != 1 || st.sent[0].GetImmediateResponse() == nil {
				t.Fatalf("sent %v, want one ImmediateResponse", st.sent)
			}
			ir := st.sent[0].GetImmediateResponse()
			if int(ir.GetStatus().GetCode()) != tt.status || !strings.Contains(string(ir.GetBody()), tt.want) {
				t.Errorf("%d %s, want %d with %s", ir.GetStatus().GetCode(), ir.GetBody(), tt.status, tt.want)
			}
		})
	}
}
