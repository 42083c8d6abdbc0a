package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// balancerSources name, for each balancer, the vLLM code and pull requests
// its transcript walks.
var balancerSources = map[DPBalancer][]string{
	DPPublishedFixed: {
		"vllm/v1/engine/core.py DPEngineCoreProc._maybe_publish_request_counts (every DP rank before PR #30739; MoE ranks since)",
		"vllm/v1/engine/coordinator.py CoordinatorProc.process_input_socket (a change at most every stats_update_interval, 100 ms)",
		"vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request (waiting * 4 + running, fixed eng_start_index)",
	},
	DPBlindFixed: {
		"vllm/v1/engine/core.py EngineCoreProc.run_engine_core: a dense model's ranks as EngineCoreProc, no counts published (PR #30739, 0.14)",
		"vllm/v1/engine/coordinator.py CoordinatorProc.process_input_socket (republishes its counts, all zero, every 5 s)",
		"vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request (local += client_count, fixed eng_start_index)",
	},
	DPBlindRotating: {
		"vllm/v1/engine/core.py EngineCoreProc.run_engine_core: a dense model's ranks as EngineCoreProc, no counts published (PR #30739, fixed by #49204 after 0.26.0)",
		"vllm/v1/engine/coordinator.py CoordinatorProc.process_input_socket (republishes its counts, all zero, every 5 s)",
		"vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request (eng_start_index advances after every pick: PR #47420, 0.25)",
	},
	DPPublishedInFlight: {
		"vllm/v1/engine/core.py EngineCoreProc._maybe_publish_request_counts (PR #49204, 0.27)",
		"vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request (max(client_count * engine_inflight, waiting + running) + waiting * 6 * max(0, kv_cache_usage - 0.5); PR #49204)",
	},
}

// frontendHarness drives a 4-engine front end with 4 API servers (vllm/
// entrypoints/cli/serve.py: api_server_count = data_parallel_size) and
// writes a transcript of its picks.
type frontendHarness struct {
	t   *testing.T
	f   *dpFrontend
	out strings.Builder
}

func newFrontendHarness(t *testing.T, title string, b DPBalancer) *frontendHarness {
	h := &frontendHarness{t: t}
	bh := VLLMBehaviour{Balancer: b, RepublishIntervalUs: DefaultRepublishInterval}
	h.f = newDPFrontend(4, 4, 100_000, bh, traces.ConnectionsRequest, 1)
	fmt.Fprintf(&h.out, "# %s\n# balancer: %s\n", title, b)
	for _, line := range balancerSources[b] {
		fmt.Fprintf(&h.out, "# vllm: %s\n", line)
	}
	return h
}

func (h *frontendHarness) note(format string, args ...any) {
	fmt.Fprintf(&h.out, "# "+format+"\n", args...)
}

// pick places one request through server k and checks the engine.
func (h *frontendHarness) pick(server int32, want int, why string) {
	h.t.Helper()
	d, err := h.f.pick(server, &placement.Request{Pinned: placement.NoPin})
	if err != nil {
		h.t.Fatal(err)
	}
	fmt.Fprintf(&h.out, "server %d -> engine %d   %s\n", server, d.Replica, why)
	if d.Replica != want {
		h.t.Errorf("server %d picked engine %d, want %d (%s)", server, d.Replica, want, why)
	}
}

// step ends a step of engine id with these counts at nowUs and returns
// when the coordinator publishes them (-1: not queued).
func (h *frontendHarness) step(id, waiting, running int, kv float64, nowUs int64) int64 {
	rep := &replica{id: id}
	for range running {
		rep.running = append(rep.running, &seq{})
	}
	for range waiting {
		rep.waiting.pushBack(&seq{})
	}
	rep.pool = newBlockPool(101)                     // 100 usable blocks
	rep.pool.numFree = 100 - int(math.Round(kv*100)) // kv of them in use
	return h.f.stepEnded(rep, nowUs)
}

func (h *frontendHarness) golden(name string) {
	h.t.Helper()
	checkGolden(h.t, filepath.Join("testdata", "frontend", name), h.out.String())
}

// TestDPFrontendPublishedFixed walks vLLM before 0.14 (and every MoE model
// today): the engines publish their counts (DPEngineCoreProc
// _maybe_publish_request_counts), the coordinator forwards a change at most
// every 100 ms (coordinator.py process_input_socket), and each API server
// scores 4 x waiting + running from its fixed eng_start_index with local
// increments of client_count (core_client.py DPLBAsyncMPClient
// get_core_engine_for_request). Golden: testdata/frontend/dplb.golden.
func TestDPFrontendPublishedFixed(t *testing.T) {
	h := newFrontendHarness(t, "published counts, fixed start (vLLM < 0.14)", DPPublishedFixed)
	h.note("all engines idle: each server starts its scan at its own index (4 x k / 4 = k)")
	for k := range int32(4) {
		h.pick(k, int(k), "idle: its start index")
	}
	h.note("before an update, server 0's own pick weighs 4 x client_count (16): its next request goes elsewhere")
	h.pick(0, 1, "local increment on engine 0")
	h.note("the engines' steps end with engine 2 busy (2 running) and the rest idle; the coordinator publishes at once")
	if at := h.step(2, 0, 2, 0, 0); at != -1 {
		t.Errorf("a first change is queued for %d µs, want published at once", at)
	}
	h.pick(2, 3, "published counts replace the local ones: engine 2 scores 2")
	h.note("no change since: nothing is published, local increments stay")
	gen := h.f.gen
	h.f.publish(50_000)
	if h.f.gen != gen {
		t.Error("an unchanged count was published again")
	}
	h.pick(2, 0, "engine 3 carries server 2's increment")
	h.note("a change 50 ms after a publication waits until that one is 100 ms old; the next, 200 ms later, goes at once")
	if at := h.step(1, 0, 1, 0, 50_000); at != 100_000 {
		t.Errorf("a change at 50 ms is published at %d µs, want 100000", at)
	}
	h.f.publish(100_000)
	if at := h.step(1, 0, 0, 0, 300_000); at != -1 || h.f.lastUs != 300_000 {
		t.Errorf("a change at 300 ms: queued at %d, last publication %d; want published at once", at, h.f.lastUs)
	}
	h.pick(1, 1, "engine 1 idle again, published at once: server 1's own start")
	h.note("the scan start never moves: server 1 with every engine tied goes to engine 1 again after the next publication")
	h.step(3, 0, 1, 0, 500_000)
	h.step(3, 0, 0, 0, 700_000)
	h.f.publish(700_000)
	h.pick(1, 1, "fixed start")
	h.golden("dplb.golden")
}

// TestDPFrontendBlind walks vLLM 0.14 to 0.26 with a dense model: the
// ranks are plain EngineCoreProc (core.py run_engine_core, PR #30739),
// which never publish, so whatever the engines hold the coordinator's
// idle republication (every 5 s) carries zeros, and each server balances
// on its own increments: a rotation. From 0.25 (PR #47420) the scan start
// advances after every pick. Goldens: testdata/frontend/dplb-blind-*.golden.
func TestDPFrontendBlind(t *testing.T) {
	for _, c := range []struct {
		name  string
		b     DPBalancer
		after []int // server 0's picks after the republication at 5 s
	}{
		{"fixed", DPBlindFixed, []int{0, 1, 2}},       // 0.14-0.24: back to its start
		{"rotating", DPBlindRotating, []int{1, 2, 3}}, // 0.25-0.26: the start moved on
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newFrontendHarness(t, "no counts published: the coordinator republishes zeros every 5 s", c.b)
			if at := h.f.republish(0); at != DefaultRepublishInterval {
				t.Errorf("first republication at 0, next at %d µs, want %d", at, DefaultRepublishInterval)
			}
			h.note("engine 0 is full (10 running, 5 waiting): no engine reports it")
			if at := h.step(0, 5, 10, 0.9, 10_000); at != -1 {
				t.Errorf("a blind engine's step queued a publication at %d", at)
			}
			h.note("server 0 sends four requests: its own increments spread them round the engines, the busy one too")
			for i := range 4 {
				h.pick(0, i, "blind: its local increments only")
			}
			h.pick(0, 0, "all four carry 4: the first scanned")
			h.note("nothing changed for 5 s: the coordinator republishes its zeros, which drops server 0's increments")
			if at := h.f.republish(4_000_000); at != DefaultRepublishInterval {
				t.Errorf("republish at 4 s: next look at %d, want %d", at, DefaultRepublishInterval)
			}
			h.f.republish(DefaultRepublishInterval)
			for _, e := range c.after {
				h.pick(0, e, "after the republication")
			}
			h.golden("dplb-blind-" + c.name + ".golden")
		})
	}
}

// TestDPFrontendInFlight walks vLLM 0.27 (PR #49204): EngineCoreProc
// publishes its counts, with kv_cache_usage, and each server scores
// max(client_count x its own unfinished requests on the engine, waiting +
// running) + waiting x 6 x max(0, kv_cache_usage - 0.5), scanning from a
// start that rotates after every pick (core_client.py
// DPLBAsyncMPClient.get_core_engine_for_request at the PR).
func TestDPFrontendInFlight(t *testing.T) {
	h := newFrontendHarness(t, "published counts and own in-flight, rotating start (vLLM >= 0.27)", DPPublishedInFlight)
	h.note("idle engines: server 0 rotates, each pick's in-flight floor (4 x 1) keeps it off the engine it just used")
	h.pick(0, 0, "start 0")
	h.pick(0, 1, "engine 0 scores max(4 x 1, 0) = 4")
	h.note("engine 0's request finishes: its floor drops back to 0")
	h.f.finished(0, 0)
	h.note("engine 2 publishes 2 waiting at 90 %% KV: 2 + 2 x 6 x 0.4 = 6.8; engine 3 1 running: 1")
	h.step(2, 2, 0, 0.9, 0)
	h.step(3, 0, 1, 0.3, 20_000)
	h.f.publish(100_000)
	h.pick(0, 0, "start 2, scores [0, 4, 6.8, 1]: engine 0 (a publication reset the local waiting increments, not the in-flight count)")
	h.pick(1, 1, "server 1 (start 1) sees neither server 0's in-flight nor its increments: engine 1 scores 0")
	h.golden("dplb-inflight.golden")
}

// TestFrontendRotationSpreadsASession: behind 0.26's blind front end, a
// session's turns through one server land on every engine in turn, which
// is what sends its prompts to engines that never saw them; with published
// counts and a fixed start an idle farm sends them back to one engine.
func TestFrontendRotationSpreadsASession(t *testing.T) {
	for _, c := range []struct {
		b       DPBalancer
		engines int
	}{
		{DPPublishedFixed, 1},
		{DPBlindRotating, 4},
	} {
		f := newDPFrontend(4, 4, 100_000, VLLMBehaviour{Balancer: c.b, RepublishIntervalUs: DefaultRepublishInterval}, traces.ConnectionsSession, 1)
		seen := map[int]bool{}
		for turn := range 6 {
			now := int64(turn) * 20_000_000 // a turn every 20 s, answers long done
			f.republish(now)
			d, err := f.pick(2, &placement.Request{Pinned: placement.NoPin})
			if err != nil {
				t.Fatal(err)
			}
			seen[d.Replica] = true
			f.finished(2, d.Replica)
			if f.publishes() {
				// The engine's step ends with the turn done: back to idle.
				f.reported[d.Replica] = engineCounts{}
				f.dirty = true
				f.publish(now + 1)
			}
		}
		if len(seen) != c.engines {
			t.Errorf("%s: one session's 6 turns reached %d engines, want %d", c.b, len(seen), c.engines)
		}
	}
}

// TestConnectionModels checks how requests map onto API servers: a
// session's own connection keeps one server, a new connection per request
// is hashed afresh, and a pool reuses the most recently returned one.
func TestConnectionModels(t *testing.T) {
	bh := VLLMBehaviour{Balancer: DPBlindRotating, RepublishIntervalUs: DefaultRepublishInterval}
	for _, mode := range []string{traces.ConnectionsSession, traces.ConnectionsRequest, traces.ConnectionsPool} {
		f := newDPFrontend(4, 4, 100_000, bh, mode, 3)
		conn := int32(-1)
		seen := map[int32]bool{}
		for range 40 {
			s := f.connect(&conn)
			seen[s] = true
			f.release(s)
		}
		switch mode {
		case traces.ConnectionsSession, traces.ConnectionsPool:
			if len(seen) != 1 {
				t.Errorf("%s: one client's sequential requests reached %d servers, want 1", mode, len(seen))
			}
		case traces.ConnectionsRequest:
			if len(seen) < 3 {
				t.Errorf("%s: 40 new connections reached only %d of 4 servers", mode, len(seen))
			}
		}
	}
	// A pool under concurrency dials a new connection when none is idle.
	f := newDPFrontend(4, 4, 100_000, bh, traces.ConnectionsPool, 3)
	a, b := int32(-1), int32(-1)
	f.connect(&a)
	f.connect(&b)
	if len(f.idle) != 0 {
		t.Errorf("idle pool %v after two concurrent requests, want empty", f.idle)
	}
}

// TestMoEBalancerRefused: vLLM runs a MoE model's ranks in lockstep waves,
// which the simulator does not model; least-loaded behind vLLM's own front
// end says so by name instead of answering.
func TestMoEBalancerRefused(t *testing.T) {
	cfg := filepath.Join("..", "hardware", "testdata", "qwen3-30b-a3b.config.json")
	m, err := hardware.LoadHFConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !m.IsMoE() {
		t.Fatalf("%s: not read as a MoE model", cfg)
	}
	f, err := Resolve(FarmSpec{ModelConfig: cfg, GPU: "H100 SXM", Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	w := traces.DefaultWorkload()
	_, err = Run(t.Context(), Experiment{Farm: f, Workload: w, Strategies: []string{placement.StrategyLeastLoaded}, Sessions: []int{2}, Duration: 10 * time.Second, Seed: 1})
	if err == nil || !strings.Contains(err.Error(), "lockstep") || !strings.Contains(err.Error(), m.Name) {
		t.Errorf("least-loaded on a MoE model: err = %v, want one naming the model and vLLM's lockstep waves", err)
	}
}

// TestPooledConnectionReturnsWhenRead: a client's keep-alive connection is
// idle again only once the client has read the answer's end, half a round
// trip after the engine sent it, so a session that sends its next turn
// right away takes its own connection back (the most recently returned
// one) and stays on its API server. Returned at the engine's end instead,
// the connections of sessions whose answers end within a round trip of
// each other were swapped, which moved sessions between API servers.
func TestPooledConnectionReturnsWhenRead(t *testing.T) {
	f := mustDefaultFarm(t)
	w := traces.DefaultWorkload()
	w.Connections = traces.ConnectionsPool
	w.ThinkTime = 0
	w.NetworkRTT = 200 * time.Millisecond
	var buf strings.Builder
	_, err := Run(t.Context(), Experiment{Farm: f, Workload: w, Strategies: []string{placement.StrategyLeastLoaded},
		Sessions: []int{8}, Duration: 2 * time.Minute, Seed: 2, Requests: &buf})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	same, later := 0, 0
	for line := range strings.Lines(buf.String()) {
		var rec RequestRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.APIServer == nil {
			t.Fatalf("no api_server in %s", line)
		}
		if k, ok := last[rec.Session]; ok {
			later++
			if k == *rec.APIServer {
				same++
			}
		}
		last[rec.Session] = *rec.APIServer
	}
	if later < 50 || float64(same) < 0.95*float64(later) {
		t.Errorf("%d of %d later turns went through their previous turn's API server, want >= 95 %%", same, later)
	}
}
