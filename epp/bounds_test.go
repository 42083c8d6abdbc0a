package epp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// bodiesHeld are the bytes of request bodies the picker holds and its
// budget.
func bodiesHeld(p *picker) (held, limit int64) { return p.ls.BodyBytes() }

// heapInUse is the heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// TestBodiesHeldWithinBudget (issue 46, item 3): 40 streams each send
// their headers and 960 KiB of body, and never the body's end. The
// picker's budget for the bodies it holds is the proxy's,
// limits.max_body_bytes_in_flight, here 4 MiB: the streams past it are
// refused at once, 429 in the client's shape with Retry-After, and let
// go; what the picker holds stays within the budget, counted where the
// proxy counts its bodies (warden_request_body_bytes). Before, every body
// was kept: the heap grew by the 40 bodies (38 MiB here; 1.3 GB with
// 17 MiB bodies), and stayed so; then the budget was a second one, sized
// from limits.max_in_flight (1 MiB each), which ignored
// max_body_bytes_in_flight (none of the 40 refused here).
func TestBodiesHeldWithinBudget(t *testing.T) {
	p := startPicker(t, pickerYAML("limits: {max_body_bytes: 1MiB, max_body_bytes_in_flight: 4MiB, max_in_flight: 1000}\n", "", "127.0.0.1:1"))
	before := heapInUse()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const streams, chunks = 40, 15
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	full := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	var wg sync.WaitGroup
	var refused atomic.Int64
	bad := make(chan string, streams)
	for range streams {
		st, err := p.client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(reqHeaders("/v1/chat/completions", false, full)); err != nil {
			t.Fatal(err)
		}
		for range chunks {
			if st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk}}}) != nil {
				break // refused: the stream is over
			}
		}
		wg.Go(func() {
			res, err := st.Recv()
			if err != nil {
				return // the test's end
			}
			ir := res.GetImmediateResponse()
			retry := ""
			for _, h := range ir.GetHeaders().GetSetHeaders() {
				if h.GetHeader().GetKey() == "retry-after" {
					retry = string(h.GetHeader().GetRawValue())
				}
			}
			if ir.GetStatus().GetCode() != http.StatusTooManyRequests || retry == "" || !strings.Contains(string(ir.GetBody()), `"type":"rate_limit_error"`) {
				bad <- res.String()
			}
			refused.Add(1)
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for refused.Load() < streams-4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	held, budget := bodiesHeld(p)
	grown := heapInUse() - before
	t.Logf("40 bodies of 960 KiB without their end: %d refused, %d bytes held (budget %d), heap +%.1f MiB", refused.Load(), held, budget, float64(grown)/(1<<20))
	if budget != 4<<20 {
		t.Errorf("budget %d, want 4 MiB (limits.max_body_bytes_in_flight)", budget)
	}
	waitMetric(t, p, "warden_request_body_bytes")
	if refused.Load() < streams-4 || held > budget {
		t.Errorf("%d streams refused, %d bytes held: want at least %d refused and at most %d held", refused.Load(), held, streams-4, budget)
	}
	if grown > 16<<20 {
		t.Errorf("the heap grew by %d bytes holding bodies that never end; want under 16 MiB", grown)
	}
	select {
	case r := <-bad:
		t.Errorf("a refusal: %s; want 429 rate_limit_error with Retry-After", r)
	default:
	}
	cancel()
	wg.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if held, _ := bodiesHeld(p); held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still held after every stream ended", held)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBodyOverBudgetAlone: with limits.max_body_bytes_in_flight below
// max_body_bytes, a body that alone is larger than the budget is refused
// as too large (413 in the client's shape), as the proxy refuses it, not
// shed with 429 to be retried for ever; a body within it still passes.
func TestBodyOverBudgetAlone(t *testing.T) {
	ep, _ := startReplica(t, "")
	p := startPicker(t, pickerYAML("limits: {max_body_bytes: 1MiB, max_body_bytes_in_flight: 64KiB}\n", "", ep))
	g := newGateway(p, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if a := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("small"), body: chatBody("small", 0, 8<<10, false)}); a.status != http.StatusOK {
		t.Fatalf("a 8 KiB body: %d %s", a.status, a.body)
	}
	a := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("big"), body: chatBody("big", 0, 96<<10, false)})
	if a.status != http.StatusRequestEntityTooLarge || !strings.Contains(string(a.body), "limits.max_body_bytes_in_flight") {
		t.Errorf("a 96 KiB body over a 64 KiB budget: %d %s; want 413 naming limits.max_body_bytes_in_flight", a.status, a.body)
	}
	if held, _ := bodiesHeld(p); held != 0 {
		t.Errorf("%d bytes of body held after both", held)
	}
}

// TestBodyNeverEndsTimesOut (issue 46, item 3): a stream whose body
// never ends is answered 408 in the client's shape once timeouts.read
// passed since it began, and its body let go; a stream that never sends
// its headers ends with DeadlineExceeded. Before, the picker waited on
// them for ever (the client's own 10 s deadline ended the test's wait).
func TestBodyNeverEndsTimesOut(t *testing.T) {
	p := startPicker(t, pickerYAML("timeouts: {drain: 5s, health: 1s, read: 300ms}\n", "", "127.0.0.1:1"))
	full := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	for _, tt := range []struct {
		name, path string
		hdr        []string
		want       string
	}{
		{"openai", "/v1/chat/completions", nil, `"code":"request_timeout"`},
		{"anthropic", "/v1/messages", []string{"anthropic-version", "2023-06-01"}, `"type":"error","error":{"type":"invalid_request_error"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := p.client.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(reqHeaders(tt.path, false, full, tt.hdr...)); err != nil {
				t.Fatal(err)
			}
			if err := st.Send(reqBody(`{"model":"`+testModel+`","messages":[`, false)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res, err := st.Recv()
			if err != nil {
				t.Fatalf("after %v: %v; want an ImmediateResponse 408", time.Since(start).Round(time.Millisecond), err)
			}
			ir := res.GetImmediateResponse()
			if ir.GetStatus().GetCode() != http.StatusRequestTimeout || !strings.Contains(string(ir.GetBody()), tt.want) {
				t.Fatalf("%v %s; want 408 with %s", ir.GetStatus().GetCode(), ir.GetBody(), tt.want)
			}
			t.Logf("a body without its end: %d after %v: %s", ir.GetStatus().GetCode(), time.Since(start).Round(time.Millisecond), ir.GetBody())
			if held, _ := bodiesHeld(p); held != 0 {
				t.Errorf("%d bytes of body still held", held)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := p.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "epp: no request headers") {
		t.Errorf("a stream without headers: %v; want the picker's DeadlineExceeded", err)
	}
}

// countingListener counts the connections accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestConnectionCap (issue 46, item 4): 40 connections that never send
// gRPC's preface, against limits.max_connections 4. The picker accepts 4
// at a time (the others wait in the kernel's backlog), /healthz says it
// is at its bound, the health port and the admin page answer meanwhile,
// and each idle connection is closed once timeouts.read_header passed
// without its preface, so the backlog drains and a gateway's stream goes
// through. Before, every connection was accepted at once and held for
// gRPC's default 120 s (1,500 of them exhausted the picker's
// descriptors).
func TestConnectionCap(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: raw}
	a, _ := startReplica(t, "")
	p := startPickerOn(t, pickerYAML("limits: {max_connections: 4}\ntimeouts: {drain: 5s, health: 1s, read_header: 300ms}\n", "", a), ln)
	p.waitScraped(t)
	const idle = 40
	conns := make([]net.Conn, idle)
	for i := range conns {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	// While they are held: the probes' port answers, the admin page too,
	// and /healthz says why new connections wait.
	hc, err := grpc.NewClient(p.health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	r, err := healthpb.NewHealthClient(hc).Check(cctx, &healthpb.HealthCheckRequest{Service: ServiceInferenceExtension})
	ccancel()
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health port during the flood: %v %v, want SERVING", r.GetStatus(), err)
	}
	accepted := ln.n.Load()
	res, err := http.Get(p.admin + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	hz := readAll(res)
	t.Logf("%d idle connections against max_connections 4: %d accepted at once; /healthz %d %q", idle, accepted, res.StatusCode, strings.TrimSpace(hz))
	if accepted > 4 {
		t.Errorf("%d connections accepted at once, want at most limits.max_connections (4)", accepted)
	}
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(hz, "limits.max_connections") {
		t.Errorf("/healthz at the bound: %d %q, want 503 naming limits.max_connections", res.StatusCode, hz)
	}
	// Each is closed by the picker after timeouts.read_header.
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("idle connection %d: %v, want the picker to close it after timeouts.read_header", i, err)
		}
	}
	g := newGateway(p, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if r := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("after"), body: chatBody("after", 0, 200, false)}); r.status != http.StatusOK {
		t.Errorf("a stream after the flood: %d %s", r.status, r.body)
	}
}

// TestUnknownModelNotEchoed (issue 46, item 8): a model name of 1 MiB is
// answered 404 with a bounded, quoted excerpt of it and its length, in
// each client's shape. Before, the 404 sent the whole megabyte back.
func TestUnknownModelNotEchoed(t *testing.T) {
	s := offlinePicker(t)
	full := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	name := strings.Repeat("m", 1<<20)
	for _, tt := range []struct {
		path string
		hdr  []string
	}{{"/v1/chat/completions", nil}, {"/v1/messages", []string{"anthropic-version", "2023-06-01"}}} {
		st := &fakeStream{ctx: context.Background(), msgs: []*extprocv3.ProcessingRequest{
			reqHeaders(tt.path, false, full, tt.hdr...), reqBody(`{"model":"`+name+`","messages":[]}`, true)}}
		if err := s.Process(st); err != nil {
			t.Fatal(err)
		}
		ir := st.sent[0].GetImmediateResponse()
		var e struct {
			Error struct{ Message string }
		}
		if err := json.Unmarshal(ir.GetBody(), &e); err != nil {
			t.Fatalf("%s: %v in %.200s", tt.path, err, ir.GetBody())
		}
		t.Logf("%s: %d, %d bytes: %s", tt.path, ir.GetStatus().GetCode(), len(ir.GetBody()), e.Error.Message)
		if ir.GetStatus().GetCode() != http.StatusNotFound || len(ir.GetBody()) > 1024 ||
			!strings.HasPrefix(e.Error.Message, `model "mmm`) || !strings.Contains(e.Error.Message, `... (1048576 bytes) is not served here`) {
			t.Errorf("%s: %d, %d bytes; want 404 under 1 KiB quoting an excerpt and the length", tt.path, ir.GetStatus().GetCode(), len(ir.GetBody()))
		}
	}
}
