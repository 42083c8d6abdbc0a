package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/emulator"
	"github.com/lm-warden/warden/kvevents"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// The held prefix (placement/prefix.go) in the proxy: what each replica
// holds of a prompt, from the emulator's KV events, decides before the
// turn is sent, and the simulator, reading its block pools, decides the
// same.

// prefixFarm is two replicas of 1,904 tokens of KV cache each (120 blocks
// of 16, one the null block), so that one growing conversation evicts
// another from its replica.
const prefixFarm = "model: " + emulatedModel + "\ngpu: RTX A4000\nreplicas: 2\nscrape_interval: 1s\n" +
	"vllm: {max_num_seqs: 32, num_gpu_blocks: 120, block_size: 16, max_model_len: 1900}\n"

// prefixTurn is one request of the shared trace: its conversation, its
// parent (a subagent's), its prompt as canonical text (a completions
// prompt is its own canonical text) and one answer token.
type prefixTurn struct {
	session, parent string
	text            string
}

// prefixText is n tokens of text of conversation s, from word w on: 4
// bytes a token exactly (so that the emulator's block ids and the
// proxy's agree to the last block) and never a last token that completes
// a block during the one-token answer (n % 16 != 15).
func prefixText(s string, w, n int) string {
	var b strings.Builder
	for i := w; b.Len() < 4*n; i++ {
		fmt.Fprintf(&b, "%s%03d ", s[:1], i%1000) // 5 bytes
	}
	return b.String()[:4*n]
}

// prefixTrace: A and B start on the two replicas, C joins A's and grows
// until it has evicted A there; A's next turn finds its home lost, and a
// subagent of A whose prompt extends C's context starts where that is
// held; then everyone goes on where they are.
func prefixTrace() []prefixTurn {
	a0 := prefixText("alpha", 0, 600)
	b0 := prefixText("bravo", 0, 600)
	c0 := prefixText("charlie", 0, 600)
	c1 := c0 + prefixText("charlie", 600, 700)
	c2 := c1 + prefixText("charlie", 1300, 496)
	a1 := a0 + prefixText("alpha", 600, 100)
	return []prefixTurn{
		{"A", "", a0},
		{"B", "", b0},
		{"C", "", c0},
		{"C", "", c1},
		{"C", "", c2},
		{"A", "", a1},
		{"S", "A", c2 + prefixText("sub", 0, 50)},
		{"B", "", b0 + prefixText("bravo", 600, 100)},
		{"A", "", a1 + prefixText("alpha", 700, 100)},
	}
}

// decision is one placement: replica and reason.
type decision struct {
	replica int
	reason  string
}

func (d decision) String() string { return fmt.Sprintf("%d %s", d.replica, d.reason) }

// simDecisions replays turns in the simulator with strategy, one request
// every 3 s (each is long done before the next, and a scrape between
// them shows the replicas idle, as the proxy's does), and returns each
// request's placement.
func simDecisions(t *testing.T, turns []prefixTurn, strategy string) []decision {
	t.Helper()
	f, err := sim.ParseFarm([]byte(prefixFarm), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	key := []byte(traces.EmulatorBlockKey)
	tr := &sim.Trace{Name: "prefix", Header: traces.Header{Format: traces.Format, Version: traces.Version, BlockSize: traces.TextBlockTokens}}
	turnOf := map[string]int{}
	for i, p := range turns {
		n := traces.TextTokens([]byte(p.text))
		tr.Requests = append(tr.Requests, &traces.Request{
			ArrivalMs: int64(i) * 3000, Session: p.session, Parent: p.parent, Turn: turnOf[p.session],
			PromptTokens: n, OutputTokens: 1, CachedTokens: -1, Replica: -1,
			HashIDs: traces.TextBlockIDs(key, []byte(p.text), n),
		})
		turnOf[p.session]++
	}
	var out bytes.Buffer
	if _, err := sim.Run(context.Background(), sim.Experiment{Farm: f, Trace: tr, Strategies: []string{strategy}, Seed: 1, Requests: &out}); err != nil {
		t.Fatal(err)
	}
	recs := map[string][]sim.RequestRecord{} // by session, in turn order
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r sim.RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		recs[r.Session] = append(recs[r.Session], r)
	}
	var ds []decision
	seen := map[string]int{}
	for _, p := range turns {
		rs := recs[p.session]
		k := seen[p.session]
		seen[p.session]++
		if k >= len(rs) || !rs[k].Finished {
			t.Fatalf("sim %s: %s's turn %d missing or unfinished: %+v", strategy, p.session, k, rs)
		}
		ds = append(ds, decision{rs[k].Replica, rs[k].Reason})
	}
	return ds
}

// startPrefixEmulator serves prefixFarm with KV events until the test
// ends: its replicas' URLs and PUB and replay endpoints.
func startPrefixEmulator(t *testing.T) (urls, pubs, replays []string) {
	t.Helper()
	e, urls := serveEmulator(t, prefixFarm, emulator.Options{Speed: 1000, Seed: 1, KVEvents: emulator.KVEventsOptions{
		Form: kvevents.FormMap, Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}})
	pubs, replays = e.KVEndpoints()
	return urls, pubs, replays
}

// serveEmulator serves the emulated farm of farmYAML with opts, one
// listener a replica on 127.0.0.1, until the test ends, and returns it
// with its replicas' URLs.
func serveEmulator(t *testing.T, farmYAML string, opts emulator.Options) (*emulator.Emulator, []string) {
	t.Helper()
	f, err := sim.ParseFarm([]byte(farmYAML), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e, err := emulator.New(f, opts)
	if err != nil {
		t.Fatal(err)
	}
	var lns []net.Listener
	var urls []string
	for range e.Listeners() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		urls = append(urls, "http://"+ln.Addr().String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Serve(ctx, lns) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("emulator: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return e, urls
}

// startKVProxy starts a proxy in front of the emulated replicas urls that
// follows their KV events (PUB and replay endpoints), with the model's
// routing keys extra, once it has scraped them and its subscribers are
// connected.
func startKVProxy(t *testing.T, urls, pubs, replays []string, extra string) *harness {
	t.Helper()
	model := "  - name: " + emulatedModel + "\n    replicas: [" + strings.Join(urls, ", ") + "]\n" + extra +
		"    kv_events:\n      endpoints: [" + strings.Join(pubs, ", ") + "]\n      replay_endpoints: [" + strings.Join(replays, ", ") + "]\n"
	h := startProxy(t, modelsYAML("", model))
	h.scraped()
	h.waitFor("kv events connected", func(r StatusReport) bool {
		for _, rs := range r.Models[0].Replicas {
			if rs.KVEvents == nil || !rs.KVEvents.Connected {
				return false
			}
		}
		return true
	})
	return h
}

// requestCounts reads warden_requests_total by replica and reason.
var requestsLine = regexp.MustCompile(`^warden_requests_total\{model="[^"]*",reason="([^"]+)",replica="(\d+)"\} (\d+)`)

func requestCounts(h *harness) map[decision]int {
	out := map[decision]int{}
	for _, line := range strings.Split(h.metrics(), "\n") {
		if m := requestsLine.FindStringSubmatch(line); m != nil {
			rep, _ := strconv.Atoi(m[2])
			n, _ := strconv.Atoi(m[3])
			out[decision{rep, m[1]}] = n
		}
	}
	return out
}

// proxyDecisions sends turns through a proxy with routing extra in front
// of the emulator, one at a time, each once the proxy has counted the
// previous one, its KV events have arrived and a scrape has seen the
// replicas idle; it returns each request's placement.
func proxyDecisions(t *testing.T, turns []prefixTurn, extra string) []decision {
	t.Helper()
	urls, pubs, replays := startPrefixEmulator(t)
	h := startKVProxy(t, urls, pubs, replays, extra)
	var ds []decision
	for i, p := range turns {
		before := requestCounts(h)
		body, _ := json.Marshal(map[string]any{"model": emulatedModel, "prompt": p.text, "max_tokens": 1})
		hdr := map[string]string{"x-session-id": p.session}
		if p.parent != "" {
			hdr["x-parent-session-id"] = p.parent
		}
		if r := h.do("POST", "/v1/completions", string(body), hdr); r.status != 200 {
			t.Fatalf("request %d (%s): status %d %s", i, p.session, r.status, r.body)
		}
		var d decision
		deadline := time.Now().Add(10 * time.Second)
		for d.reason == "" {
			for k, n := range requestCounts(h) {
				if n > before[k] {
					d = k
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("request %d: never counted", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
		ds = append(ds, d)
		settleKV(t, h)
	}
	return ds
}

// settleKV waits until a scrape made after the last answer has seen every
// replica idle, and the KV events of what was served have reached the
// proxy (no batch arrives for three polls).
func settleKV(t *testing.T, h *harness) {
	t.Helper()
	t0 := time.Now()
	h.waitFor("a scrape of idle replicas after the answer", func(st StatusReport) bool {
		for _, rs := range st.Models[0].Replicas {
			if rs.Running == nil || *rs.Running != 0 || rs.ScrapeAgeSec == nil ||
				st.Time.Add(-time.Duration(*rs.ScrapeAgeSec*float64(time.Second))).Before(t0) {
				return false
			}
		}
		return true
	})
	batches := func() (n int64) {
		for _, rs := range h.status().Models[0].Replicas {
			n += rs.KVEvents.Batches
		}
		return n
	}
	last := batches()
	for quiet := 0; quiet < 3; {
		time.Sleep(30 * time.Millisecond)
		if n := batches(); n != last {
			quiet, last = 0, n
		} else {
			quiet++
		}
	}
}

// TestPrefixHeldSimAndProxyAgree drives one trace through the simulator
// and through the proxy in front of `warden emulate --kv-events`, with
// affinity's held prefix (routing prefix: held) in both, and compares
// every decision: the same replica for the same reason. The trace makes
// the signal decide (A's home evicted while A thought: moved before its
// turn, reason rehome; a subagent whose prompt is held on C's replica:
// placed there, reason prefix), where plain affinity keeps A home and
// sends the subagent to its parent's.
func TestPrefixHeldSimAndProxyAgree(t *testing.T) {
	turns := prefixTrace()
	want := simDecisions(t, turns, "affinity+prefix")
	plain := simDecisions(t, turns, placement.StrategyAffinity)
	reasons := map[string]bool{}
	for _, d := range want {
		reasons[d.reason] = true
	}
	if !reasons[placement.ReasonRehome.String()] || !reasons[placement.ReasonPrefix.String()] {
		t.Fatalf("the trace does not exercise the held prefix in the simulator: %v", want)
	}
	if fmt.Sprint(plain) == fmt.Sprint(want) {
		t.Fatalf("plain affinity decides as the held prefix does (%v): the comparison would prove nothing", plain)
	}
	for _, tc := range []struct {
		name, extra string
		want        []decision
	}{
		{"prefix held", "    prefix: held\n", want},
		{"plain affinity", "", plain}, // the proxy before the held prefix: A stays on its evicted home
	} {
		got := proxyDecisions(t, turns, tc.extra)
		for i := range turns {
			if got[i] != tc.want[i] {
				t.Errorf("%s: request %d (%s): proxy %v, simulator %v", tc.name, i, turns[i].session, got[i], tc.want[i])
			}
		}
	}
	t.Logf("decisions (simulator = proxy): %v; plain affinity: %v", want, plain)
}

// TestConfigPrefixHeld: prefix: held reads the KV events, so it needs
// kv_events, and it is affinity's.
func TestConfigPrefixHeld(t *testing.T) {
	base := "listen: :1\nauth: passthrough\nmodels:\n  - name: m\n    replicas: [http://a:1]\n"
	events := "    kv_events: {endpoint: \"tcp://127.0.0.1:5557\"}\n"
	for _, tt := range []struct{ extra, want string }{
		{"    prefix: held\n" + events, ""},
		{"    prefix: off\n", ""},
		{"    prefix: held\n", "t.yaml:6: models[0].prefix: held reads what each replica holds from its KV events: set models[0].kv_events"},
		{"    prefix: held\n    strategy: hash\n" + events, "models[0].prefix: held needs strategy affinity, got hash"},
		{"    prefix: yes\n", `models[0].prefix: want off or held, got "yes"`},
	} {
		_, err := ParseConfig("t.yaml", []byte(base+tt.extra))
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: %v", tt.extra, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: error %v, want %q", tt.extra, err, tt.want)
		}
	}
}

// TestKVHeldBlocks: the proxy's held index reads the KV events' ledgers in
// the engine's blocks: a prompt's 16-token text blocks regrouped to the
// replicas' block_size (the last text block of each engine block names
// it, as the emulator's ids do), counted back in text blocks. It says it
// cannot tell until some prompt block was found in some ledger: against
// vLLM, which hashes token ids the proxy cannot compute, nothing ever
// matches, and the held prefix must then change nothing rather than read
// every home as lost.
func TestKVHeldBlocks(t *testing.T) {
	m := testModelState(t, 2)
	f := &kvFollower{farm: kvevents.NewFarm(2, 0, 0)}
	m.kv.Store(f)
	h := &kvHeld{m: m}
	blocks := []uint64{11, 12, 13, 14, 15, 16}
	ev := func(hashes ...uint64) *kvevents.Batch {
		return &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: hashes, BlockSize: 32}}}
	}
	// Engine blocks of 32 tokens (no scrape yet: 16 assumed, then 32).
	f.farm.Replica(0).Batch(0, ev(901, 902)) // another prompt's blocks: nothing of ours
	f.farm.Replica(1).Batch(0, ev(902))
	if held, ok := h.Held(blocks, 16, nil); ok {
		t.Fatalf("no prompt block ever found, yet the index says %v", held)
	}
	f.farm.Replica(1).Batch(1, ev(11, 12))
	held, ok := h.Held(blocks, 16, nil)
	if !ok || fmt.Sprint(held) != "[0 2]" {
		t.Fatalf("16-token engine blocks: %v %v, want [0 2]", held, ok)
	}
	for _, rep := range m.replicas {
		rep.server.last.Store(&ScrapeResult{OK: time.Now(), Engines: []EngineStats{{BlockSize: 32}}})
	}
	f.farm.Replica(0).Batch(1, ev(12, 14)) // engine blocks 0 and 1: text blocks 0-1 and 2-3
	held, ok = h.Held(blocks, 16, nil)
	if !ok || fmt.Sprint(held) != "[4 2]" {
		t.Errorf("32-token engine blocks: %v %v, want [4 2] (replica 1's 12 names engine block 0, its 11 nothing)", held, ok)
	}
	f.farm.Replica(1).Lost(2, 3)
	if held, ok := h.Held(blocks, 16, nil); ok {
		t.Errorf("a ledger that lost batches still says %v", held)
	}
}
