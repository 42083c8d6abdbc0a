package placement

import (
	"fmt"
	"testing"
	"time"
)

// Golden cases taken from vllm-project/production-stack's own tests at
// a6c01db (src/tests/test_session_router.py); the expected values are
// those tests'.

func engines(n int) ProductionStackConfig {
	var urls []string
	for i := range n {
		urls = append(urls, fmt.Sprintf("http://engine%d.com", i+1))
	}
	return ProductionStackConfig{URLs: urls}
}

// loadQPS makes replica i's window hold n requests sent at now.
func loadQPS(p *ProductionStack, i, n int, now time.Time) {
	for range n {
		p.record(i, now)
	}
}

// test_route_with_session_id and test_session_key_in_request_body: session
// "abc123" over engine1 and engine2 goes to engine1 (uhashring's md5
// ring), every time, whatever the QPS.
func TestProductionStack_SessionKey(t *testing.T) {
	p := NewProductionStack(engines(2))
	s := farm(2, 32)
	loadQPS(p, 0, 600, t0) // qps 10
	loadQPS(p, 1, 300, t0) // qps 5
	for range 2 {
		if d := pick(t, p, Request{Session: "abc123", Pinned: NoPin}, s, t0); d.Replica != 0 || d.Reason != ReasonHash {
			t.Fatalf("abc123: %+v, want engine1 (0) hash", d)
		}
	}
}

// test_route_without_session_id: qps 10 and 5, no session: engine2.
func TestProductionStack_RouteWithoutSessionID(t *testing.T) {
	p := NewProductionStack(engines(2))
	s := farm(2, 32)
	loadQPS(p, 0, 600, t0)
	loadQPS(p, 1, 300, t0)
	if q := p.QPS(0, t0); q != 10 {
		t.Fatalf("engine1 qps %v, want 10", q)
	}
	if d := pick(t, p, Request{Pinned: NoPin}, s, t0); d.Replica != 1 || d.Reason != ReasonLeastLoaded {
		t.Errorf("no session: %+v, want engine2 (1) least-loaded", d)
	}
	// 61 s later the window is empty on both: the first wins the tie.
	if got := mustPick(t, p, Request{Pinned: NoPin}, s, t0.Add(61*time.Second)); got != 0 {
		t.Errorf("empty windows: picked %d, want 0", got)
	}
	// An endpoint that never had a request is taken first.
	p3 := NewProductionStack(engines(3))
	loadQPS(p3, 0, 1, t0)
	loadQPS(p3, 2, 1, t0)
	if got := mustPick(t, p3, Request{Pinned: NoPin}, farm(3, 32), t0); got != 1 {
		t.Errorf("unseen endpoint: picked %d, want 1", got)
	}
}

// test_consistent_hashing_add_node / ..._remove_node: adding or removing
// an endpoint remaps fewer than all sessions, and only to and from it.
func TestProductionStack_ConsistentHashingAddRemove(t *testing.T) {
	p := NewProductionStack(engines(3))
	s := farm(3, 32)
	s.Replicas[2].Healthy = false
	var ids []string
	for k := range 100 {
		ids = append(ids, fmt.Sprintf("session_%d", k))
	}
	before := make([]int, len(ids))
	for k, id := range ids {
		before[k] = mustPick(t, p, Request{Session: id, Pinned: NoPin}, s, t0)
	}
	s.Replicas[2].Healthy = true
	remapped := 0
	for k, id := range ids {
		after := mustPick(t, p, Request{Session: id, Pinned: NoPin}, s, t0)
		if after != before[k] {
			remapped++
			if after != 2 {
				t.Errorf("%s moved from %d to %d, not to the added endpoint", id, before[k], after)
			}
		}
	}
	if remapped == 0 || remapped >= len(ids) {
		t.Errorf("adding an endpoint remapped %d of %d sessions", remapped, len(ids))
	}
}
