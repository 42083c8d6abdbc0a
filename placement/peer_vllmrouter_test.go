package placement

import (
	"fmt"
	"testing"
)

// Golden cases taken from vllm-project/router's own tests
// (src/policies/consistent_hash.rs @080589a, hash_key.rs @335c57e).

// consistent_hash.rs test_fbi_hash_consistency.
func TestVLLMRouterHash_FbiHashConsistency(t *testing.T) {
	if a, b := fbiHash("test_session_123"), fbiHash("test_session_123"); a != b {
		t.Errorf("fbi_hash not deterministic: %x then %x", a, b)
	}
	if f := furcHash([]byte("test_session_123"), furcModMax); f >= furcModMax {
		t.Errorf("furc_hash %d out of [0, %d)", f, furcModMax)
	}
	if furcHash([]byte("x"), 1) != 0 {
		t.Error("furc_hash into one bucket must be 0")
	}
}

// consistent_hash.rs test_consistent_hash_selection: three workers, the
// same session three times goes to one worker.
func TestVLLMRouterHash_ConsistentHashSelection(t *testing.T) {
	v := &VLLMRouterHash{}
	s := farm(3, 32)
	r := Request{Session: "consistent_test", Pinned: NoPin}
	i1, i2, i3 := mustPick(t, v, r, s, t0), mustPick(t, v, r, s, t0), mustPick(t, v, r, s, t0)
	if i1 != i2 || i2 != i3 {
		t.Errorf("same session on %d, %d, %d", i1, i2, i3)
	}
}

// hash_key.rs: the header key is "header:x-session-id:VALUE"; the ring
// spreads sessions over every worker (160 points each) and an unhealthy
// target falls to the first healthy worker.
func TestVLLMRouterHash_RingAndFallback(t *testing.T) {
	v := &VLLMRouterHash{}
	s := farm(3, 32)
	counts := make([]int, 3)
	target := -1
	for k := range 300 {
		i := mustPick(t, v, Request{Session: fmt.Sprintf("s%d", k), Pinned: NoPin}, s, t0)
		counts[i]++
		if i == 2 && target < 0 {
			target = k
		}
	}
	for i, n := range counts {
		if n < 50 {
			t.Errorf("worker %d got %d of 300 sessions (%v)", i, n, counts)
		}
	}
	s.Replicas[2].Healthy = false
	s.Replicas[0].Healthy = false
	if got := mustPick(t, v, Request{Session: fmt.Sprintf("s%d", target), Pinned: NoPin}, s, t0); got != 1 {
		t.Errorf("target unhealthy: picked %d, want 1 (the first healthy)", got)
	}
}
