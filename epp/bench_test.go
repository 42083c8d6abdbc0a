package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lm-warden/warden/live"
)

// benchBody is an OpenAI chat request of about 64 KiB of session s.
func benchBody(s int) []byte {
	b, _ := json.Marshal(map[string]any{"model": testModel, "stream": true, "messages": []map[string]string{
		{"role": "system", "content": strings.Repeat("You are a careful coding agent. ", 2040)},
		{"role": "user", "content": fmt.Sprintf("first message of session %d", s)},
	}})
	return b
}

const benchSessions = 256

// BenchmarkExtProcDecision is one ext_proc request as a gateway in
// FULL_DUPLEX_STREAMED sends it, over real gRPC on loopback: the request
// headers and a 64 KiB body in 16 KiB chunks, read back as the picked
// endpoint and the body, then the response phase's headers and end (which
// gives the in-flight count back). 256 sessions in turn, so most picks
// are later turns of a known session, as in an agent farm.
func BenchmarkExtProcDecision(b *testing.B) {
	s := offlinePicker(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = s.grpc.Serve(ln) }()
	defer s.grpc.Stop()
	// Envoy's stream window is 256 MiB by default: the gateway's side
	// does not wait for window updates either.
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	full := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	bodies := make([][]byte, benchSessions)
	for i := range bodies {
		bodies[i] = benchBody(i)
	}
	b.SetBytes(int64(len(bodies[0])))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		body := bodies[i%benchSessions]
		i++
		st, err := client.Process(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		send := func(m *extprocv3.ProcessingRequest) {
			if err := st.Send(m); err != nil {
				b.Fatal(err)
			}
		}
		send(reqHeaders("/v1/chat/completions", false, full, "x-session-id", fmt.Sprint(i%benchSessions)))
		for off := 0; off < len(body); off += 16 << 10 {
			end := min(off+16<<10, len(body))
			send(reqBody(string(body[off:end]), end == len(body)))
		}
		res, err := st.Recv()
		if err != nil || res.GetRequestHeaders() == nil {
			b.Fatalf("%v %v", res, err)
		}
		for {
			res, err := st.Recv()
			if err != nil {
				b.Fatal(err)
			}
			if res.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
				break
			}
		}
		send(respHeaders("200"))
		if _, err := st.Recv(); err != nil {
			b.Fatal(err)
		}
		send(respBody("data: [DONE]\n\n", true))
		if _, err := st.Recv(); err != nil {
			b.Fatal(err)
		}
		_ = st.CloseSend()
		if _, err := st.Recv(); err != io.EOF {
			b.Fatal(err)
		}
	}
}

// BenchmarkProxyDecision is the proxy's own decision on the same
// request, without a network: live's check, extract, place, admit
// (Server.Decide, the step `warden proxy` runs before it forwards), then
// the request's end (Finish).
func BenchmarkProxyDecision(b *testing.B) {
	s := offlinePicker(b)
	bodies := make([][]byte, benchSessions)
	for i := range bodies {
		bodies[i] = benchBody(i)
	}
	b.SetBytes(int64(len(bodies[0])))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		h := http.Header{"Content-Type": {"application/json"}, "X-Session-Id": {fmt.Sprint(i % benchSessions)}}
		d, ref := s.live.Decide(live.DecideInput{Path: "/v1/chat/completions", Header: h, Body: bodies[i%benchSessions]})
		i++
		if ref != nil {
			b.Fatalf("%d %s", ref.Status, ref.Body)
		}
		d.ResponseHeaders(200, "text/event-stream")
		d.ResponseBody([]byte("data: [DONE]\n\n"))
		d.Finish()
	}
}
