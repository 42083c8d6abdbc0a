package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-zeromq/zmq4 v0.17.0's PUB socket never stops its writer goroutine
	// (the emulator's KV events publisher; see emulator's TestMain).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

const testKey = "sk-test"

// harness is a running proxy on 127.0.0.1:0 listeners.
type harness struct {
	t      testing.TB
	srv    *Server
	url    string // client listener
	admin  string // admin listener
	client *http.Client
	stop   func() error // cancels Serve and waits for it to drain and return
}

// startProxy parses yamlText (with listen set for it), starts the proxy
// and stops it when the test ends.
func startProxy(t testing.TB, yamlText string) *harness {
	t.Helper()
	cfg, err := ParseConfig("test.yaml", []byte("listen: 127.0.0.1:0\n"+yamlText))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(cfg, WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return serveHarness(t, srv)
}

// serveHarness serves srv on 127.0.0.1:0 listeners and stops it when the
// test ends.
func serveHarness(t testing.TB, srv *Server) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, aln) }()
	h := &harness{t: t, srv: srv, url: "http://" + ln.Addr().String(), admin: "http://" + aln.Addr().String(),
		client: &http.Client{Timeout: 20 * time.Second}}
	h.stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() {
		if err := h.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
		h.client.CloseIdleConnections()
	})
	return h
}

// modelsYAML renders a models section and the common settings.
func modelsYAML(extra string, model string) string {
	return "client_api_keys: [" + testKey + "]\nscrape_interval: 50ms\ntimeouts: {drain: 5s, health: 1s}\n" + extra + "models:\n" + model
}

type resp struct {
	status int
	header http.Header
	body   string
}

// do sends a request to the proxy.
func (h *harness) do(method, path, body string, hdr map[string]string) resp {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	res, err := h.client.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		h.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: string(b)}
}

// chatBody is an OpenAI chat request of a conversation at turn (0-based):
// a shared system prompt, the session's own first message and turn
// follow-ups, so later turns extend earlier ones.
func chatBody(model, session string, turn int, stream bool) string {
	msgs := []map[string]string{
		{"role": "system", "content": strings.Repeat("You are a careful coding agent. ", 40)},
		{"role": "user", "content": "first message of " + session + strings.Repeat(" context", 100)},
	}
	for i := 1; i <= turn; i++ {
		msgs = append(msgs, map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d", i)})
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("follow-up %d", i)})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "stream": stream})
	return string(b)
}

// anthropicBody is an Anthropic messages request.
func anthropicBody(model, session string, turn int, stream bool) string {
	msgs := []map[string]string{{"role": "user", "content": "first message of " + session}}
	for i := 1; i <= turn; i++ {
		msgs = append(msgs, map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d", i)})
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("follow-up %d", i)})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 64, "system": "be brief", "messages": msgs, "stream": stream})
	return string(b)
}

// status fetches /api/status.
func (h *harness) status() StatusReport {
	h.t.Helper()
	res, err := h.client.Get(h.admin + "/api/status")
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	var st StatusReport
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		h.t.Fatal(err)
	}
	return st
}

// metrics fetches /metrics as text.
func (h *harness) metrics() string {
	h.t.Helper()
	res, err := h.client.Get(h.admin + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// waitMetrics polls /metrics until it contains every line of want: a
// request is counted just after its response went out.
func (h *harness) waitMetrics(want ...string) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := h.metrics()
		missing := ""
		for _, w := range want {
			if !strings.Contains(m, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("/metrics lacks %s", missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor polls cond until it holds, failing the test after a generous
// deadline (it asserts an outcome, never a speed).
func (h *harness) waitFor(what string, cond func(StatusReport) bool) StatusReport {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := h.status()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(st, "", "  ")
			h.t.Fatalf("timed out waiting for %s; status:\n%s", what, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// scraped waits until every replica of every model has fresh scrape data.
func (h *harness) scraped() StatusReport {
	return h.waitFor("a first scrape", func(st StatusReport) bool {
		for _, m := range st.Models {
			for _, r := range m.Replicas {
				if r.ScrapeState != "ok" {
					return false
				}
			}
		}
		return true
	})
}

// isOpenAIError reports whether body is an OpenAI error object.
func isOpenAIError(body string) bool {
	var v openAIError
	return json.Unmarshal([]byte(body), &v) == nil && v.Error.Type != "" && v.Error.Message != ""
}

// anthropicErrorType returns the error type of an Anthropic error body, or "".
func anthropicErrorType(body string) string {
	var v anthropicError
	if json.Unmarshal([]byte(body), &v) != nil || v.Type != "error" {
		return ""
	}
	return v.Error.Type
}

// sum adds up ints.
func sum(xs ...[]int) int {
	n := 0
	for _, x := range xs {
		for _, v := range x {
			n += v
		}
	}
	return n
}

var _ = bytes.NewReader
