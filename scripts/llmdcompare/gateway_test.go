package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lm-warden/warden/emulator"
	"github.com/lm-warden/warden/epp"
	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testModel = "Qwen/Qwen3-4B-Instruct-2507"

// serve runs f until the test ends (its context cancelled), failing the
// test on its error.
func serve(t *testing.T, f func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestGatewayThroughAnExtProcPicker drives the gateway against a real
// ext_proc endpoint picker, warden's own (`warden epp`), in front of two
// emulated replicas: each turn is picked, forwarded, answered and streamed
// back through the response phase, the stream ending cleanly; the answers
// feed the next turns; the gauges scrape.
func TestGatewayThroughAnExtProcPicker(t *testing.T) {
	f, err := sim.ParseFarm([]byte("model: "+testModel+"\ngpu: RTX A4000\nreplicas: 2\nvllm: {max_num_seqs: 8, max_model_len: 32768}\n"), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e, err := emulator.New(f, emulator.Options{Speed: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r0, r1 := listen(t), listen(t)
	replicas := []string{r0.Addr().String(), r1.Addr().String()}
	serve(t, func(ctx context.Context) error { return e.Serve(ctx, []net.Listener{r0, r1}) })

	cfg, err := live.ParseConfig("epp.yaml", []byte("listen: 127.0.0.1:0\nauth: passthrough\nscrape_interval: 50ms\n"+
		"models:\n  - name: "+testModel+"\n    replicas: [http://"+replicas[0]+", http://"+replicas[1]+"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ls, err := live.NewServer(cfg, live.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	pickerLn, adminLn := listen(t), listen(t)
	serve(t, func(ctx context.Context) error {
		return epp.New(ls, epp.WithLogger(slog.New(slog.DiscardHandler))).Serve(ctx, epp.Listeners{ExtProc: pickerLn, Admin: adminLn})
	})
	conn, err := grpc.NewClient(pickerLn.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	gw := &gateway{client: extprocv3.NewExternalProcessorClient(conn), http: hc, chunk: 1 << 10}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := waitReplicas(ctx, hc, replicas); err != nil {
		t.Fatal(err)
	}
	if _, err := scrapeAll(ctx, hc, replicas); err != nil {
		t.Fatal(err)
	}

	w := workload{seed: 1, model: testModel, sessions: 2, turns: 3, systemBytes: 3000, taskBytes: 500,
		toolMinBytes: 100, toolMaxBytes: 3000, maxTokens: 16}
	for _, c := range w.conversations() {
		for turn := range w.turns {
			body := w.body(c)
			var got pick
			ex, err := gw.do(ctx, "/v1/chat/completions", c.id, body, func(p pick) { got = p })
			if err != nil {
				t.Fatalf("%s turn %d: %v", c.id, turn, err)
			}
			if ex.status != http.StatusOK || got.endpoint != ex.pick.endpoint || !strings.Contains(strings.Join(replicas, " "), got.endpoint) {
				t.Fatalf("%s turn %d: HTTP %d from %q (picked %q), want 200 from one of %v", c.id, turn, ex.status, ex.pick.endpoint, got.endpoint, replicas)
			}
			answer, err := answerText(ex.body)
			if err != nil || answer == "" {
				t.Fatalf("%s turn %d: the answer %q: %v", c.id, turn, answer, err)
			}
			w.advance(c, answer)
		}
		if n := len(c.msgs); n != 2+2*w.turns {
			t.Errorf("%s: %d messages after %d turns, want %d", c.id, n, w.turns, 2+2*w.turns)
		}
	}
}
