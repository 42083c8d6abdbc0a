package live

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
	"github.com/lm-warden/warden/placement"
)

// reloadModel renders the test model on the fakes at idx with extra lines
// (indented under the model).
func reloadModel(fakes []*fakevllm.Server, idx []int, extra string) string {
	urls := make([]string, len(idx))
	for i, j := range idx {
		urls[i] = fakes[j].URL()
	}
	return urlsModel(urls...) + extra
}

// reload parses yamlText as the harness's config does and reloads the
// proxy with it.
func (h *harness) reload(yamlText string) {
	h.t.Helper()
	cfg, err := ParseConfig("reload.yaml", []byte("listen: 127.0.0.1:0\n"+yamlText))
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.srv.Reload(cfg); err != nil {
		h.t.Fatal(err)
	}
}

// turnOn sends one non-streamed turn of session and returns the index of
// the fake that served it.
func turnOn(t *testing.T, h *harness, fakes []*fakevllm.Server, session string, turn int) int {
	t.Helper()
	before := make([]int, len(fakes))
	for i, f := range fakes {
		before[i] = sum(f.Served())
	}
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, session, turn, false), sessionHdr(session)); r.status != 200 {
		t.Fatalf("session %s turn %d: %d %s", session, turn, r.status, r.body)
	}
	got := -1
	for i, f := range fakes {
		if sum(f.Served()) != before[i] {
			if got >= 0 {
				t.Fatalf("session %s turn %d served twice", session, turn)
			}
			got = i
		}
	}
	if got < 0 {
		t.Fatalf("session %s turn %d reached no fake", session, turn)
	}
	return got
}

// TestReloadKeepsHomes: a reload that changes one placement key or the
// replica list keeps every session whose home still exists (issue 13,
// fault 2: 10/16 sessions moved on a spill change, 14/16 on adding a 5th
// replica). Sessions of a removed replica are re-placed on their next
// turn; a replica added takes new sessions only.
func TestReloadKeepsHomes(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after []int // replicas: indices into the five fakes
		extraBefore   string
		extraAfter    string
	}{
		{name: "spill_threshold", before: []int{0, 1, 2, 3}, after: []int{0, 1, 2, 3}, extraBefore: "    spill_threshold: 8\n", extraAfter: "    spill_threshold: 2\n"},
		{name: "session_ttl", before: []int{0, 1, 2, 3}, after: []int{0, 1, 2, 3}, extraAfter: "    session_ttl: 10m\n    active_window: 1m\n"},
		{name: "max_num_seqs", before: []int{0, 1, 2, 3}, after: []int{0, 1, 2, 3}, extraAfter: "    max_num_seqs: 64\n"},
		{name: "strategy hash to affinity", before: []int{0, 1, 2, 3}, after: []int{0, 1, 2, 3}, extraBefore: "    strategy: hash\n", extraAfter: "    strategy: affinity\n"},
		{name: "strategy least-loaded to affinity", before: []int{0, 1, 2, 3}, after: []int{0, 1, 2, 3}, extraBefore: "    strategy: least-loaded\n", extraAfter: "    strategy: affinity\n"},
		{name: "replica added", before: []int{0, 1, 2, 3}, after: []int{0, 1, 2, 3, 4}},
		{name: "replica removed", before: []int{0, 1, 2, 3}, after: []int{0, 2, 3}},
		{name: "replicas reordered", before: []int{0, 1, 2, 3}, after: []int{3, 2, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakes := make([]*fakevllm.Server, 5)
			for i := range fakes {
				fakes[i] = fakevllm.New(t, 1)
			}
			h := startProxy(t, modelsYAML("", reloadModel(fakes, tc.before, tc.extraBefore)))
			h.scraped()
			const n = 16
			home := make([]int, n)
			for i := range n {
				home[i] = turnOn(t, h, fakes, fmt.Sprintf("s%d", i), 0)
			}
			if st := h.status(); st.Models[0].Sessions != n {
				t.Fatalf("before the reload: %d sessions, want %d", st.Models[0].Sessions, n)
			}
			h.reload(modelsYAML("", reloadModel(fakes, tc.after, tc.extraAfter)))

			kept := map[int]bool{}
			for _, j := range tc.after {
				kept[j] = true
			}
			wantKept := 0
			for _, hm := range home {
				if kept[hm] {
					wantKept++
				}
			}
			if st := h.status(); st.Models[0].Sessions != wantKept {
				t.Errorf("after the reload: %d sessions in the table, want the %d whose home is still configured", st.Models[0].Sessions, wantKept)
			}
			moved, rehomed := 0, 0
			for i := range n {
				got := turnOn(t, h, fakes, fmt.Sprintf("s%d", i), 1)
				switch {
				case !kept[home[i]]:
					rehomed++
					if !kept[got] {
						t.Errorf("session s%d re-placed on fake %d, which is no longer configured", i, got)
					}
				case got != home[i]:
					moved++
				}
			}
			if moved != 0 {
				t.Errorf("%d of %d sessions whose home is still configured moved on reload, want 0", moved, wantKept)
			}
			// The turn after the re-placement stays on the new home.
			if rehomed > 0 {
				for i := range n {
					if !kept[home[i]] {
						a := turnOn(t, h, fakes, fmt.Sprintf("s%d", i), 2)
						b := turnOn(t, h, fakes, fmt.Sprintf("s%d", i), 3)
						if a != b {
							t.Errorf("re-placed session s%d went to fake %d then %d, want one new home", i, a, b)
						}
					}
				}
			}
			if added := len(tc.after) > len(tc.before); added {
				newFake := tc.after[len(tc.after)-1]
				h.scraped()
				onNew := 0
				for i := range n {
					if turnOn(t, h, fakes, fmt.Sprintf("new%d", i), 0) == newFake {
						onNew++
					}
				}
				if onNew == 0 {
					t.Errorf("the added replica took none of %d new sessions, want some", n)
				}
			}
		})
	}
}

// TestReloadKeepsRunningStreams: a stream started before a reload and
// finishing after it counts in the new routing's in-flight while it runs
// (/api/status and warden_in_flight) and gives its count back to the right
// replica when it ends.
func TestReloadKeepsRunningStreams(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after func(a, b *fakevllm.Server) string // the model section after the reload
	}{
		{"policy changed", func(a, b *fakevllm.Server) string { return urlsModel(a.URL(), b.URL()) + "    spill_threshold: 3\n" }},
		{"replica before it removed", func(a, b *fakevllm.Server) string { return urlsModel(b.URL()) }},
		{"replica added", func(a, b *fakevllm.Server) string { return urlsModel(a.URL(), b.URL(), fakevllm.RefusingURL(t)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
			b.Hold = make(chan struct{})
			h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())))
			h.scraped()
			// The first session goes to replica 0 (a), the stream's to b.
			if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "w", 0, false), sessionHdr("w")); r.status != 200 {
				t.Fatalf("warm-up: %d %s", r.status, r.body)
			}
			got := h.doAsync("/v1/chat/completions", chatBody(testModel, "s", 0, true), sessionHdr("s"))
			h.waitFor("the stream on b", func(st StatusReport) bool { return b.Hits.Load() == 1 && st.Models[0].InFlight == 1 })

			h.reload(modelsYAML("", tc.after(a, b)))
			st := h.status()
			idx := -1
			for i, r := range st.Models[0].Replicas {
				if r.URL == b.URL() {
					idx = i
					if r.InFlight != 1 {
						t.Errorf("after the reload b (replica %d) has %d in flight, want the running stream", i, r.InFlight)
					}
				}
			}
			if idx < 0 {
				t.Fatalf("b is not in the status after the reload: %+v", st.Models[0].Replicas)
			}
			if st.Models[0].InFlight != 1 {
				t.Errorf("after the reload the model has %d in flight, want 1", st.Models[0].InFlight)
			}
			if m, want := h.metrics(), fmt.Sprintf("warden_in_flight{model=%q,replica=\"%d\"} 1\n", testModel, idx); !strings.Contains(m, want) {
				t.Errorf("/metrics lacks %q", want)
			}

			close(b.Hold)
			if r := <-got; r.status != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
				t.Fatalf("the stream across the reload: %d %q, want a complete stream", r.status, r.body)
			}
			h.waitFor("no request in flight", func(st StatusReport) bool {
				for _, r := range st.Models[0].Replicas {
					if r.InFlight != 0 {
						return false
					}
				}
				return st.Models[0].InFlight == 0
			})
			if m, want := h.metrics(), fmt.Sprintf("warden_in_flight{model=%q,replica=\"%d\"} 0\n", testModel, idx); !strings.Contains(m, want) {
				t.Errorf("/metrics lacks %q after the stream ended", want)
			}
		})
	}
}

// recordHandler keeps the messages and attributes of every record.
type recordHandler struct {
	mu   sync.Mutex
	recs []string
}

func (r *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recordHandler) WithGroup(string) slog.Handler            { return r }
func (r *recordHandler) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	r.mu.Lock()
	r.recs = append(r.recs, b.String())
	r.mu.Unlock()
	return nil
}

func (r *recordHandler) warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.recs {
		if strings.HasPrefix(s, "WARN ") {
			out = append(out, s)
		}
	}
	return out
}

// TestReloadNamesRestartOnlyKeys: the reload warning names exactly the
// changed keys that wait for a restart; keys a reload applies (the stream
// timeouts, connect, response_header, drain, the limits read per request)
// are not in it.
func TestReloadNamesRestartOnlyKeys(t *testing.T) {
	a := fakevllm.New(t, 1)
	base := "client_api_keys: [" + testKey + "]\nscrape_interval: 50ms\n"
	models := "models:\n" + urlsModel(a.URL())
	for _, tc := range []struct {
		name, before, after string
		want                string // the warning; "" for none
	}{
		{"applied on reload", "timeouts: {health: 1s}\nlimits: {max_in_flight: 100}\n",
			"timeouts: {health: 1s, first_token: 30s, stream_idle: 20s, connect: 1s, response_header: 1m, drain: 5s}\nlimits: {max_in_flight: 50, max_body_bytes: 1MiB, max_session_id: 100, max_header_bytes: 128KiB}\n", ""},
		{"server timeouts", "timeouts: {health: 1s}\n", "timeouts: {health: 1s, read: 30s, idle: 10s}\n",
			"WARN reload: these settings take effect on restart only keys=timeouts.read, timeouts.idle"},
		{"header backstop", "timeouts: {health: 1s}\nlimits: {max_header_bytes: 8KiB}\n", "timeouts: {health: 1s}\nlimits: {max_header_bytes: 64KiB}\n",
			"WARN reload: these settings take effect on restart only keys=limits.max_header_bytes above 32768 (4x its value at start)"},
		{"session key and journal", "timeouts: {health: 1s}\n", "timeouts: {health: 1s}\nsession_key: k2\njournal: {path: " + t.TempDir() + "/j.jsonl}\n",
			"WARN reload: these settings take effect on restart only keys=session_key, journal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig("a.yaml", []byte("listen: 127.0.0.1:0\n"+base+tc.before+models))
			if err != nil {
				t.Fatal(err)
			}
			rec := &recordHandler{}
			srv, err := NewServer(cfg, WithLogger(slog.New(rec)))
			if err != nil {
				t.Fatal(err)
			}
			h := serveHarness(t, srv)
			h.status() // Serve has started: the listeners' settings are known
			next, err := ParseConfig("b.yaml", []byte("listen: 127.0.0.1:0\n"+base+tc.after+models))
			if err != nil {
				t.Fatal(err)
			}
			if err := h.srv.Reload(next); err != nil {
				t.Fatal(err)
			}
			var got string
			for _, w := range rec.warnings() {
				if strings.HasPrefix(w, "WARN reload") {
					got = w
				}
			}
			if got != tc.want {
				t.Errorf("reload warning %q, want %q", got, tc.want)
			}
		})
	}
}

// TestReloadAppliesTimeouts: timeouts.response_header and timeouts.drain
// changed by a reload bound the requests and the drain that follow.
func TestReloadAppliesTimeouts(t *testing.T) {
	t.Run("response_header", func(t *testing.T) {
		b := fakevllm.New(t, 1)
		b.Stall = fakevllm.StallNoHeaders
		common := "client_api_keys: [" + testKey + "]\nscrape_interval: 50ms\nmodels:\n" + urlsModel(b.URL())
		h := startProxy(t, "timeouts: {drain: 5s, health: 1s}\n"+common)
		h.reload("timeouts: {drain: 5s, health: 1s, response_header: 300ms}\n" + common)
		got := h.doAsync("/v1/chat/completions", chatBody(testModel, "rh", 0, false), sessionHdr("rh"))
		select {
		case r := <-got:
			if r.status != 504 || !isOpenAIError(r.body) || !strings.Contains(r.body, "timeouts.response_header") {
				t.Errorf("no headers within the reloaded response_header: %d %s, want 504 naming timeouts.response_header", r.status, r.body)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the request outlived the reloaded timeouts.response_header of 300ms by 10s")
		}
	})
	t.Run("connect", func(t *testing.T) {
		addr := blackhole(t)
		// Scrapes every 10s with a 30s probe timeout: the first probe hangs
		// on the same dial, and the replica stays presumed healthy meanwhile.
		common := "client_api_keys: [" + testKey + "]\nscrape_interval: 10s\nmodels:\n" + urlsModel("http://"+addr)
		h := startProxy(t, "timeouts: {drain: 5s, health: 30s, connect: 1m}\n"+common)
		h.reload("timeouts: {drain: 5s, health: 30s, connect: 300ms}\n" + common)
		got := h.doAsync("/v1/chat/completions", chatBody(testModel, "cn", 0, false), sessionHdr("cn"))
		select {
		case r := <-got:
			if r.status != 503 || !isOpenAIError(r.body) {
				t.Errorf("a replica that never completes the connection: %d %s, want 503", r.status, r.body)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the dial outlived the reloaded timeouts.connect of 300ms by 10s")
		}
	})
	t.Run("drain", func(t *testing.T) {
		a := fakevllm.New(t, 1)
		a.Hold = make(chan struct{})
		defer close(a.Hold)
		h := startProxy(t, "client_api_keys: ["+testKey+"]\nscrape_interval: 50ms\ntimeouts: {drain: 60s, health: 1s}\nmodels:\n"+urlsModel(a.URL()))
		h.status() // Serve has started with a drain of 60s
		h.reload("client_api_keys: [" + testKey + "]\nscrape_interval: 50ms\ntimeouts: {drain: 200ms, health: 1s}\nmodels:\n" + urlsModel(a.URL()))
		got := h.doAsync("/v1/chat/completions", chatBody(testModel, "dr", 0, true), sessionHdr("dr"))
		h.waitFor("a stream at the backend", func(StatusReport) bool { return a.Hits.Load() == 1 })
		stopped := make(chan error, 1)
		go func() { stopped <- h.stop() }()
		select {
		case r := <-got:
			if err := <-stopped; err != nil {
				t.Logf("Serve: %v", err)
			}
			if !strings.Contains(r.body, `data: {"error":{`) {
				t.Errorf("stream at the reloaded drain deadline: %d %q, want the error event", r.status, r.body)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("the stream did not end at the reloaded drain deadline of 200ms (the one at start was 60s)")
		}
	})
}

// TestReplacedModelPicksThroughItsSuccessor: a request that loaded the
// routing state before a reload swapped it, or the retry of an attempt made
// before it, picks on the model the reload replaced. That model hands the
// pick to its successor: the session keeps its home in the new table, the
// excluded replica is the same backend at its new index, and the in-flight
// count lands on the replica the new routing shows.
func TestReplacedModelPicksThroughItsSuccessor(t *testing.T) {
	cfg := ModelCfg{Name: "m", SpillThreshold: Spill{Auto: true}, SessionTTL: Duration(time.Hour),
		ActiveWindow: Duration(2 * time.Minute), MaxSessions: 100,
		Replicas: []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}}
	old, err := newModel(cfg, http.DefaultClient, time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	pick := func(m *model, session string, exclude int) picked {
		t.Helper()
		r := placement.Request{Session: session, Pinned: placement.NoPin}
		p, err := m.pick(&r, exclude, now)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	homes := map[string]string{}
	for _, s := range []string{"a", "b", "c"} {
		p := pick(old, s, -1)
		p.rep.inFlight.Add(-1)
		homes[s] = p.rep.target.String()
	}
	next := cfg
	next.Replicas = []string{"http://127.0.0.1:3", "http://127.0.0.1:2"} // 1 removed, the others swapped
	next.SpillThreshold = Spill{N: 5}
	m, err := newModelAfter(next, http.DefaultClient, time.Second, time.Second, old)
	if err != nil {
		t.Fatal(err)
	}
	if kept, forgotten := m.handover(old, now); kept+forgotten != 3 {
		t.Errorf("handover kept %d and forgot %d sessions, want 3 in all", kept, forgotten)
	}
	for s, home := range homes {
		if home == "http://127.0.0.1:1" {
			continue
		}
		p := pick(old, s, -1)
		if p.m != m {
			t.Fatalf("session %s: the replaced model picked itself, want its successor", s)
		}
		if got := p.rep.target.String(); got != home {
			t.Errorf("session %s went to %s, want its home %s", s, got, home)
		}
		if n := m.replicas[p.Replica].inFlight.Load(); n != 1 {
			t.Errorf("session %s: the successor's replica %d has %d in flight, want 1", s, p.Replica, n)
		}
		p.rep.inFlight.Add(-1)
		// A retry of an attempt made on the old home before the reload
		// excludes that backend at its new index.
		homeIdx := slices.IndexFunc(old.replicas, func(r *replica) bool { return r.target.String() == home })
		if p := pick(old, s, homeIdx); p.rep.target.String() == home {
			t.Errorf("session %s: the retry excluding its home went home", s)
		} else {
			p.rep.inFlight.Add(-1)
		}
	}
}

// blackhole returns the address of a loopback listener whose accept queue
// is full and never drained: a connection to it never completes (its SYN
// is dropped), as to a host that is gone.
func blackhole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// A backlog of 0 holds one connection: fill it.
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if c2, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c2.Close()
		t.Skip("this kernel completes connections beyond a full accept queue")
	}
	return addr
}

// TestSamePolicyPerKey: a reload that changes any key the model's routing
// reads is not taken for the same policy (a kept model keeps its old
// configuration); admission_timeout and prefill_tokens_per_s included.
func TestSamePolicyPerKey(t *testing.T) {
	base := ModelCfg{Name: "m", SpillThreshold: Spill{Auto: true}, SessionTTL: Duration(time.Hour),
		ActiveWindow: Duration(2 * time.Minute), MaxSessions: 100, AdmissionTimeout: Duration(30 * time.Second),
		Replicas: []string{"http://127.0.0.1:1"}}
	m, err := newModel(base, http.DefaultClient, time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !m.samePolicy(base) {
		t.Fatal("samePolicy of its own configuration: false")
	}
	for _, tt := range []struct {
		key    string
		change func(*ModelCfg)
	}{
		{"strategy", func(c *ModelCfg) { c.Strategy = "hash" }},
		{"spill_threshold", func(c *ModelCfg) { c.SpillThreshold = Spill{N: 3} }},
		{"spill_threshold priced", func(c *ModelCfg) { c.SpillThreshold = Spill{Auto: true, Priced: true} }},
		{"session_ttl", func(c *ModelCfg) { c.SessionTTL = Duration(time.Minute) }},
		{"max_sessions", func(c *ModelCfg) { c.MaxSessions = 7 }},
		{"active_window", func(c *ModelCfg) { c.ActiveWindow = Duration(time.Minute) }},
		{"max_num_seqs", func(c *ModelCfg) { c.MaxNumSeqs = 8 }},
		{"gpu", func(c *ModelCfg) { c.GPU = "H100" }},
		{"balance", func(c *ModelCfg) { c.Balance = "kv" }},
		{"admission", func(c *ModelCfg) { c.Admission = "kv" }},
		{"admission_timeout", func(c *ModelCfg) { c.AdmissionTimeout = Duration(time.Second) }},
		{"prefill_tokens_per_s", func(c *ModelCfg) { c.PrefillTokensPerS = PrefillRate{PerS: 1000} }},
		{"prefill_tokens_per_s metrics", func(c *ModelCfg) { c.PrefillTokensPerS = PrefillRate{Metrics: true} }},
	} {
		c := base
		tt.change(&c)
		if m.samePolicy(c) {
			t.Errorf("%s changed: samePolicy true, want false (the reload would keep the old value)", tt.key)
		}
	}
}
