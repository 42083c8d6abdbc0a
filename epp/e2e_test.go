package epp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/lm-warden/warden/live/redistest"
)

var modes = []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED}

// TestSessionsStayHome: 16 sessions x 6 turns through the gateway and the
// picker over 4 emulated replicas, in each body mode, half of them
// streamed: every later turn is picked on the endpoint of its first, the
// answers are whole, and the usage read in the response phase reaches
// the picker's counters.
func TestSessionsStayHome(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			var eps []string
			for range 4 {
				a, _ := startReplica(t, "")
				eps = append(eps, a)
			}
			p := startPicker(t, pickerYAML("", "", eps...))
			p.waitScraped(t)
			g := newGateway(p, mode)
			const sessions, turns = 16, 6
			var mu sync.Mutex
			homes := map[string]string{}
			later, home := 0, 0
			used := map[string]bool{}
			var wg sync.WaitGroup
			for i := range sessions {
				s := fmt.Sprintf("session-%02d", i)
				wg.Go(func() {
					for turn := range turns {
						stream := i%2 == 0
						a, err := g.try(request{path: "/v1/chat/completions", header: sessionHeader(s), body: chatBody(s, turn, 2000, stream)})
						if err != nil {
							t.Errorf("%s turn %d: %v", s, turn, err)
							return
						}
						if a.status != 200 {
							t.Errorf("%s turn %d: status %d %s", s, turn, a.status, a.body)
							return
						}
						if stream && !strings.Contains(string(a.body), "data: [DONE]") {
							t.Errorf("%s turn %d: a stream without its end: %q", s, turn, a.body)
						}
						mu.Lock()
						used[a.endpoints[0]] = true
						if turn == 0 {
							homes[s] = a.endpoints[0]
						} else {
							later++
							if a.endpoints[0] == homes[s] {
								home++
							}
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			pct := 100 * float64(home) / float64(later)
			t.Logf("%s: %d of %d later turns on their home (%.1f %%), %d endpoints used", mode, home, later, pct, len(used))
			if home != later || later != sessions*(turns-1) {
				t.Errorf("%d of %d later turns on their home, want all %d", home, later, sessions*(turns-1))
			}
			if len(used) < 3 {
				t.Errorf("new sessions went to %d endpoints of 4: not balanced", len(used))
			}
			// Every request ended (the response phase gave back its count)
			// and its usage was read.
			st := p.ls.Status()
			for _, r := range st.Models[0].Replicas {
				if r.InFlight != 0 {
					t.Errorf("replica %s: %d in flight after every answer", r.URL, r.InFlight)
				}
			}
			waitMetric(t, p, `warden_prompt_tokens_total{model="`+testModel+`"}`)
		})
	}
}

// waitMetric waits until /metrics has a line starting with prefix whose
// value is above 0.
func waitMetric(t *testing.T, p *picker, prefix string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		res, err := http.Get(p.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		_, _ = fmt.Fprint(&b, readAll(res))
		last = b.String()
		for l := range strings.Lines(last) {
			if strings.HasPrefix(l, prefix+" ") && !strings.HasSuffix(strings.TrimSpace(l), " 0") {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("/metrics has no %s above 0", prefix)
}

func readAll(res *http.Response) string {
	defer res.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// TestSpill: with spill_threshold 1, a session whose home holds two of
// its requests in flight has its third placed on another endpoint; the
// one after, once those ended, is home again.
func TestSpill(t *testing.T) {
	p, _ := pickerOver(t, 2, "    spill_threshold: 1\n")
	g := newGateway(p, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	first := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("s"), body: chatBody("s", 0, 500, false)})
	home := first.endpoints[0]
	// Two turns held in flight at home (the second is sticky: 1 in flight
	// does not exceed 1), then a third.
	release := make(chan struct{})
	picked := make(chan string, 2)
	var wg sync.WaitGroup
	for turn := 1; turn <= 2; turn++ {
		wg.Go(func() {
			r := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("s"), body: chatBody("s", turn, 500, false),
				hold: func() { picked <- ""; <-release }})
			picked <- r.endpoints[0]
		})
		<-picked // this turn is picked and held before the next is sent
	}
	spilled := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("s"), body: chatBody("s", 3, 500, false)})
	close(release)
	wg.Wait()
	for range 2 {
		if ep := <-picked; ep != home {
			t.Errorf("a held turn went to %s, not home %s", ep, home)
		}
	}
	if spilled.endpoints[0] == home {
		t.Errorf("with 2 in flight at home over spill_threshold 1, the turn stayed home (%s)", home)
	}
	if back := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("s"), body: chatBody("s", 4, 500, false)}); back.endpoints[0] != home {
		t.Errorf("after the spill the session went to %s, not back home %s", back.endpoints[0], home)
	}
	t.Logf("spill: home %s, spilled turn to %s", home, spilled.endpoints[0])
}

// TestEndpointKilled: the home endpoint of a session is killed. The next
// turn, picked before the picker's probe saw it down, is retried by the
// gateway on the first fallback and attributed there; once the probe saw
// it, the picker names the other endpoint first. With every endpoint
// killed, the answer is the picker's own 503 in the client's shape.
func TestEndpointKilled(t *testing.T) {
	a, killA := startReplica(t, "")
	b, killB := startReplica(t, "")
	p := startPicker(t, pickerYAML("", "", a, b))
	p.waitScraped(t)
	g := newGateway(p, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	r := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("k"), body: chatBody("k", 0, 500, false)})
	killOf := map[string]func(){a: killA, b: killB}
	home, other := r.endpoints[0], b
	if home == b {
		other = a
	}
	if len(r.endpoints) != 2 || r.endpoints[1] != other {
		t.Fatalf("picked %v: want home then the other endpoint as fallback", r.endpoints)
	}
	killOf[home]()
	r = g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("k"), body: chatBody("k", 1, 500, false)})
	if r.status != 200 || r.served != other {
		t.Fatalf("after the home was killed: status %d served by %q, want 200 from %s", r.status, r.served, other)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r = g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("k"), body: chatBody("k", 2, 500, false)})
		if r.endpoints[0] == other {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed endpoint is still picked first: %v", r.endpoints)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(r.endpoints) != 1 {
		t.Errorf("picked %v: the killed endpoint is still a fallback", r.endpoints)
	}
	// Both killed: 503 in the OpenAI shape, once the probes saw it.
	killOf[other]()
	deadline = time.Now().Add(5 * time.Second)
	for {
		a, err := g.try(request{path: "/v1/chat/completions", header: sessionHeader("k"), body: chatBody("k", 3, 500, false)})
		if err == nil && a.status == 503 {
			var e struct {
				Error struct{ Type, Code string }
			}
			if err := json.Unmarshal(a.body, &e); err != nil || e.Error.Code != "service_unavailable" {
				t.Errorf("503 body %q: want the OpenAI error shape", a.body)
			}
			t.Logf("all endpoints down: %d %s", a.status, a.body)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with every endpoint killed: %+v %v, want an immediate 503", a, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAdmissionTimeout: with admission: kv over a replica whose KV cache
// holds one conversation, a second new conversation that arrives while
// the first is in flight waits admission_timeout and is shed with 429 and
// Retry-After; an Anthropic client gets overloaded_error, with 429 in the
// protocol (issue 50, item 3: 529 before, which Envoy's HttpStatus lacks).
func TestAdmissionTimeout(t *testing.T) {
	a, _ := startReplica(t, ", num_gpu_blocks: 60") // 960 tokens
	p := startPicker(t, pickerYAML("", "    admission: kv\n    admission_timeout: 300ms\n", a))
	p.waitScraped(t)
	g := newGateway(p, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	release, held := make(chan struct{}), make(chan struct{})
	done := make(chan answer)
	go func() {
		done <- g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("first"), body: chatBody("first", 0, 2400, false),
			hold: func() { close(held); <-release }})
	}()
	<-held
	start := time.Now()
	r := g.do(t, request{path: "/v1/chat/completions", header: sessionHeader("second"), body: chatBody("second", 0, 2400, false)})
	waited := time.Since(start)
	if r.status != http.StatusTooManyRequests || r.retryAfter == "" || !strings.Contains(string(r.body), "rate_limit_error") {
		t.Errorf("second conversation: %d Retry-After %q %s; want 429 with Retry-After in the OpenAI shape", r.status, r.retryAfter, r.body)
	}
	if waited < 300*time.Millisecond {
		t.Errorf("refused after %v, before admission_timeout", waited)
	}
	anth := g.do(t, request{path: "/v1/messages", header: map[string]string{"x-session-id": "third", "anthropic-version": "2023-06-01"},
		body: []byte(`{"model":"` + testModel + `","max_tokens":8,"system":"` + strings.Repeat("be brief ", 300) + `","messages":[{"role":"user","content":"hi"}]}`)})
	// 529, Anthropic's overloaded, is no value of Envoy's HttpStatus
	// enum: the protocol carries 429 (shed), the body stays Anthropic's.
	if anth.status != http.StatusTooManyRequests || !strings.Contains(string(anth.body), `"overloaded_error"`) {
		t.Errorf("anthropic: %d %s; want 429 overloaded_error", anth.status, anth.body)
	}
	close(release)
	if r := <-done; r.status != 200 {
		t.Errorf("the admitted conversation: %d %s", r.status, r.body)
	}
	t.Logf("admission: shed with %d after %v, Retry-After %s", r.status, waited.Round(time.Millisecond), r.retryAfter)
}

// TestTwoPickersAgree: two pickers sharing a Redis session store, the
// gateway alternating between them turn by turn: every session's turns
// are picked on one endpoint whichever picker answers.
//
// The homes come from the store, not from the scrapes, so the pickers
// scrape every second (a probe may take up to 3 s): at the default 50 ms
// the eight scrape loops (two pickers, four replicas) took most of the
// test's CPU under -race (14 % parsing vLLM's metrics, 14 % the
// emulators writing them, gzip included), a loaded machine missed the
// 150 ms scrape deadline and freshness window long enough for
// waitScraped to give up ("replicas not scraped within 10s"), and one
// picker could take a replica whose health probe timed out thrice for
// down and send its sessions elsewhere. 96 turns took 45 to 60 s under
// -race; now under 1 s.
func TestTwoPickersAgree(t *testing.T) {
	rs := redistest.Start(t)
	var eps []string
	for range 4 {
		a, _ := startReplica(t, "")
		eps = append(eps, a)
	}
	store := "scrape_interval: 1s\ntimeouts: {drain: 5s, health: 3s}\n" +
		"session_key: k3y-shared\nsession_store: " + rs.URL(0) + "\nsession_store_timeout: 200ms\n"
	p1 := startPicker(t, pickerYAML(store, "", eps...))
	// The second lists the endpoints in another order: homes are named,
	// not numbered.
	rev := []string{eps[3], eps[2], eps[1], eps[0]}
	p2 := startPicker(t, pickerYAML(store, "", rev...))
	p1.waitScraped(t)
	p2.waitScraped(t)
	gs := []*gateway{newGateway(p1, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), newGateway(p2, filterv3.ProcessingMode_BUFFERED)}
	const sessions, turns = 16, 6
	agree, total := 0, 0
	for i := range sessions {
		s := fmt.Sprintf("shared-%02d", i)
		var home string
		for turn := range turns {
			r := gs[(i+turn)%2].do(t, request{path: "/v1/chat/completions", header: sessionHeader(s), body: chatBody(s, turn, 800, false)})
			if r.status != 200 {
				t.Fatalf("%s turn %d: %d %s", s, turn, r.status, r.body)
			}
			if turn == 0 {
				home = r.endpoints[0]
				continue
			}
			total++
			if r.endpoints[0] == home {
				agree++
			}
		}
	}
	t.Logf("two pickers with Redis: %d of %d later turns on the home the other picker chose (%.1f %%)", agree, total, 100*float64(agree)/float64(total))
	if agree != total {
		t.Errorf("%d of %d later turns agree, want all", agree, total)
	}
}
