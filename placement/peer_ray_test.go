package placement

import (
	"testing"
	"time"
)

// Golden cases taken from Ray's own tests (python/ray/llm/tests/serve/cpu/
// deployments/routers/test_prefix_aware_router.py); r1 and r2 are replicas
// 0 and 1, a character of those tests a token here.

func rayText(p Prompt) vtext { return appendPromptText(nil, &p, len(p.Blocks)) }

// TestPow2FallbackBehavior.test_fallback_when_imbalanced: threshold 2,
// queues 0 and 10, "hello world" on r2: r1 every time.
func TestRayPrefix_FallbackWhenImbalanced(t *testing.T) {
	p := NewRayPrefix(RayPrefixConfig{ImbalancedThreshold: 2})
	p.tree.insert(rayText(helloWorld), 1)
	if m, node := p.tree.matchAvail(rayText(helloWorld), func(int32) bool { return true }); m != 11*TextBytesPerToken || p.tree.nodes[node].tenantAt(1) < 0 {
		t.Fatalf("prefix_match(hello world): %d characters", m)
	}
	s := farm(2, 32)
	s.Replicas[1].InFlight = 10
	for range 10 {
		if got := mustPick(t, p, preq("a", helloWorld), s, t0); got != 0 {
			t.Fatalf("picked %d, want r1 (0): the load is imbalanced", got)
		}
		// The cache now says 1 for r1; its request ends at once.
	}
}

// TestPrefixAwareLogic.test_high_match_rate_selects_matching_replica:
// "Hello" on r2, "Hello world" (5/11 > 0.1): r2.
func TestRayPrefix_HighMatchRateSelectsMatchingReplica(t *testing.T) {
	p := NewRayPrefix(RayPrefixConfig{})
	p.tree.insert(rayText(hello), 1)
	if p.tree.tenantSize(0) != 0 || p.tree.tenantSize(1) != 5*TextBytesPerToken {
		t.Fatalf("tenant counts %d, %d", p.tree.tenantSize(0), p.tree.tenantSize(1))
	}
	s := farm(2, 32)
	for range 10 {
		if d := pick(t, p, preq("a", helloWorld), s, t0); d.Replica != 1 || d.Reason != ReasonPrefix {
			t.Fatalf("picked %+v, want r2 (1) prefix", d)
		}
	}
}

// TestPrefixAwareLogic.test_low_match_rate_uses_smallest_tree: "hi" on r1,
// "longtext" on r2, "z": r1 (the smaller tree).
func TestRayPrefix_LowMatchRateUsesSmallestTree(t *testing.T) {
	p := NewRayPrefix(RayPrefixConfig{})
	p.tree.insert(rayText(tokenPrompt(50, 51)), 0)
	p.tree.insert(rayText(tokenPrompt(60, 61, 62, 63, 64, 65, 66, 67)), 1)
	s := farm(2, 32)
	z := tokenPrompt(90)
	for range 10 {
		// Both 0 % matches; r1 stays the smaller tenant even with "z"
		// inserted for it each time (2 + k < 8 for k < 6).
		if got := mustPick(t, p, preq("z", z), s, t0); got != 0 {
			t.Fatalf("picked %d, want r1 (0)", got)
		}
		p.tree = newCharTree()
		p.tree.insert(rayText(tokenPrompt(50, 51)), 0)
		p.tree.insert(rayText(tokenPrompt(60, 61, 62, 63, 64, 65, 66, 67)), 1)
	}
}

// TestLoadCheck.test_default_threshold_skips_queue_length_probes: no
// cached text: both replicas are the smallest tenants, and the queue
// decides (here r2's shorter queue).
func TestRayPrefix_DefaultThresholdSmallestTenants(t *testing.T) {
	p := NewRayPrefix(RayPrefixConfig{})
	s := farm(2, 32)
	s.Replicas[0].InFlight = 3
	pick(t, p, preq("a", hello), s, t0)
	if !equalInts(p.cand, []int{0, 1}) {
		t.Errorf("candidates %v, want both", p.cand)
	}
	if p.cache[1].n != 1 {
		t.Errorf("r2's cached queue after the send: %d, want 1", p.cache[1].n)
	}
}

// The queue-length cache: a send sets the replica's count; its end is
// not seen for 10 s, then a probe reads the count again.
func TestRayPrefix_QueueLenCache(t *testing.T) {
	p := NewRayPrefix(RayPrefixConfig{})
	s := farm(2, 32)
	first := mustPick(t, p, preq("a", tokenPrompt(1)), s, t0) // both smallest: r1
	if first != 0 {
		t.Fatalf("first pick %d, want 0", first)
	}
	// The request ended (InFlight back to 0), but the cache says 1: a new
	// prompt goes to r2 until the entry is 10 s old.
	if got := mustPick(t, p, preq("b", tokenPrompt(2)), s, t0.Add(5*time.Second)); got != 1 {
		t.Errorf("within 10 s: picked %d, want 1", got)
	}
	if got := mustPick(t, p, preq("c", tokenPrompt(3)), s, t0.Add(11*time.Second)); got != 0 {
		t.Errorf("after 10 s: picked %d, want 0 (probed again, ties to the first)", got)
	}
}
