package sim

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// TestDPFrontendGolden walks vLLM 0.26's own front end of a 4-engine
// data-parallel server by hand: 4 API servers (vllm/entrypoints/cli/
// serve.py: api_server_count = data_parallel_size), each running
// DPLBAsyncMPClient.get_core_engine_for_request (vllm/v1/engine/
// core_client.py) from its fixed eng_start_index with local increments of
// client_count, on the counts DPCoordinator (vllm/v1/engine/coordinator.py)
// publishes when they changed. The transcript is compared with
// testdata/frontend/dplb.golden (-update rewrites it).
func TestDPFrontendGolden(t *testing.T) {
	var out strings.Builder
	f := newDPFrontend(4, 4, 100_000, traces.ConnectionsRequest, 1)
	req := &placement.Request{Pinned: placement.NoPin}
	pick := func(server int32, note string) int {
		d, err := f.pick(server, req, 0)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&out, "server %d -> engine %d   %s\n", server, d.Replica, note)
		return d.Replica
	}
	fmt.Fprintln(&out, "# all engines idle: each server starts its scan at its own index (4 x k / 4 = k)")
	for k := range int32(4) {
		if got := pick(k, "idle: its start index"); got != int(k) {
			t.Errorf("server %d picked %d on idle engines, want its start index %d", k, got, k)
		}
	}
	fmt.Fprintln(&out, "# before an update, server 0's own pick weighs 4 x client_count (16): its next request goes elsewhere")
	if got := pick(0, "local increment on engine 0"); got != 1 {
		t.Errorf("server 0's second pick = %d, want 1", got)
	}
	fmt.Fprintln(&out, "# the engines' steps end with engine 2 busy (2 running) and the rest idle; the coordinator publishes")
	rep := func(id, waiting, running int) {
		f.reported[id].Waiting, f.reported[id].Running = waiting, running
		f.dirty = true
	}
	rep(2, 0, 2)
	f.publish(0)
	if got := pick(2, "published counts replace the local ones: engine 2 scores 2"); got != 3 {
		t.Errorf("server 2 after the update = %d, want 3 (first lowest from its start)", got)
	}
	fmt.Fprintln(&out, "# no change since: a publication is not sent, local increments stay")
	gen := f.published.Generation
	f.publish(50_000)
	if f.published.Generation != gen {
		t.Error("an unchanged count was published again")
	}
	pick(2, "engine 3 carries server 2's increment")
	fmt.Fprintln(&out, "# a change 50 ms after a publication waits until that one is 100 ms old; the next, 200 ms later, goes at once")
	busy := &replica{id: 1}
	busy.running = []*seq{{}}
	if at := f.stepEnded(busy, 50_000); at != 100_000 {
		t.Errorf("a change at 50 ms is published at %d µs, want 100000", at)
	}
	f.publish(100_000)
	busy.running = nil
	if at := f.stepEnded(busy, 300_000); at != -1 || f.lastUs != 300_000 {
		t.Errorf("a change at 300 ms: queued at %d, last publication %d; want published at once", at, f.lastUs)
	}
	pick(1, "engine 1 idle again, published at once: server 1's own start")

	checkGolden(t, filepath.Join("testdata", "frontend", "dplb.golden"), out.String())
}

// TestConnectionModels checks how requests map onto API servers: a
// session's own connection keeps one server, a new connection per request
// is hashed afresh, and a pool reuses the most recently returned one.
func TestConnectionModels(t *testing.T) {
	for _, mode := range []string{traces.ConnectionsSession, traces.ConnectionsRequest, traces.ConnectionsPool} {
		f := newDPFrontend(4, 4, 100_000, mode, 3)
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
	f := newDPFrontend(4, 4, 100_000, traces.ConnectionsPool, 3)
	a, b := int32(-1), int32(-1)
	f.connect(&a)
	f.connect(&b)
	if len(f.idle) != 0 {
		t.Errorf("idle pool %v after two concurrent requests, want empty", f.idle)
	}
}
