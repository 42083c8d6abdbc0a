package emulator

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/lm-warden/warden/live"
)

// TestBehindProxy runs the real `warden proxy` (live.NewServer) in front of
// a 4-replica emulated farm: every session's turns stay on one replica
// and, from the second turn on, hit the blocks of the previous turn.
func TestBehindProxy(t *testing.T) {
	r := start(t, testFarm(t, 4, ""), Options{})
	var reps strings.Builder
	for _, u := range r.urls {
		fmt.Fprintf(&reps, "      - %s\n", u)
	}
	cfg, err := live.ParseConfig("proxy.yaml", []byte(`listen: 127.0.0.1:0
auth: passthrough
scrape_interval: 50ms
timeouts: {drain: 2s, health: 1s}
models:
  - name: `+testModel+`
    max_num_seqs: 32
    replicas:
`+reps.String()))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := live.NewServer(cfg, live.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
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
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy: %v", err)
		}
	}()
	proxy := "http://" + ln.Addr().String()

	system := strings.Repeat("You are a coding agent with tools. ", 100)
	const sessions, turns = 6, 3
	for s := range sessions {
		var users, answers []string
		id := fmt.Sprintf("session-%d", s)
		for turn := range turns {
			users = append(users, fmt.Sprintf("Turn %d of %s: ", turn, id)+strings.Repeat("details ", 200))
			var a answer
			if s%2 == 0 {
				a = ask(t, proxy, "/v1/chat/completions", chatBody(system, users, answers, 64, true), "X-Claude-Code-Session-Id", id)
			} else {
				a = ask(t, proxy, "/v1/messages", anthropicBody(system, users, answers, 64, true), "X-Claude-Code-Session-Id", id)
			}
			if turn > 0 && a.cached < a.promptTokens/2 {
				t.Errorf("%s turn %d: %d of %d prompt tokens cached", id, turn, a.cached, a.promptTokens)
			}
			answers = append(answers, a.text)
		}
	}
	// Each replica served whole sessions: a multiple of `turns` requests.
	total, used := 0.0, 0
	for i, u := range r.urls {
		n := value(scrape(t, u), "vllm:request_success_total")
		if int(n)%turns != 0 {
			t.Errorf("replica %d served %g requests: a session moved", i, n)
		}
		if n > 0 {
			used++
		}
		total += n
	}
	if used < 2 {
		t.Errorf("%d replicas served the %d sessions: the proxy did not spread new sessions", used, sessions)
	}
	if total != sessions*turns {
		t.Errorf("%g requests served, want %d", total, sessions*turns)
	}
}
