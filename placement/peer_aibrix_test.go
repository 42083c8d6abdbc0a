package placement

import (
	"testing"
	"time"
)

// Golden cases taken from vllm-project/aibrix's own tests at e3e10f9
// (pkg/plugins/gateway/algorithms/prefix_cache_test.go Test_PrefixCacheE2E);
// each 4-character block of that test is a token here.

// The 4-character blocks of the test's inputs.
const (
	abcd = 1
	egfh = 2 // "abcdegfh": the test's first input has "egfh", not "efgh"
	efgh = 3
	ijkl = 4
	wxyz = 5
)

func TestAIBrix_PrefixCacheE2E(t *testing.T) {
	a := NewAIBrix(AIBrixConfig{Seed: 1})
	s := farm(4, 32)
	route := func(p Prompt) int {
		t.Helper()
		d := pick(t, a, preq("x", p), s, t0)
		s.Replicas[d.Replica].InFlight++ // c.AddRequestCount
		return d.Replica
	}
	// No prefix match: a least-request pod.
	p4 := route(tokenPrompt(abcd, egfh))
	// No prefix match: another least-request pod.
	p3 := route(tokenPrompt(wxyz))
	if p3 == p4 {
		t.Fatalf("wxyz went to %d, the pod of abcdegfh", p3)
	}
	// Prefix match, load balanced: the cached pod.
	if got := route(tokenPrompt(abcd, egfh)); got != p4 {
		t.Fatalf("abcdegfh again: %d, want %d", got, p4)
	}
	// Prefix match on p4 (running 2 > mean + std = 1.71): a least-request
	// pod, not p4.
	p2 := route(tokenPrompt(abcd))
	if p2 == p4 || p2 == p3 {
		t.Fatalf("abcd: %d, want neither %d nor %d", p2, p4, p3)
	}
	// abcdefghijkl matches abcd on p2 and p4: p2 (within the deviation).
	if got := route(tokenPrompt(abcd, efgh, ijkl)); got != p2 {
		t.Fatalf("abcdefghijkl: %d, want %d", got, p2)
	}
	// abcdefgh: p2 holds it all.
	if got := route(tokenPrompt(abcd, efgh)); got != p2 && got != p4 {
		t.Fatalf("abcdefgh: %d, want %d or %d", got, p2, p4)
	}
	// Six more requests on that pod: running spread 9 > 8: only the least
	// loaded pod (p1) is a candidate, and it matches nothing.
	s.Replicas[p2].InFlight += 6
	var p1 int
	for i := range 4 {
		if i != p2 && i != p3 && i != p4 {
			p1 = i
		}
	}
	if got := route(tokenPrompt(abcd, efgh)); got != p1 {
		t.Errorf("imbalanced: %d, want the idle pod %d", got, p1)
	}
}

// The store: capacity in 4-byte blocks, the least recently put entry out
// first, and idle entries dropped after 20 minutes.
func TestAIBrix_StoreCapacityAndIdle(t *testing.T) {
	a := NewAIBrix(AIBrixConfig{Blocks: 4})
	s := farm(1, 32)
	pick(t, a, preq("a", tokenPrompt(1, 2, 3)), s, t0)
	pick(t, a, preq("b", tokenPrompt(9, 8)), s, t0.Add(time.Second))
	if a.store.weight != 4 || a.store.idx.len() != 4 {
		t.Fatalf("store weight %d with %d entries, want 4 of 4", a.store.weight, a.store.idx.len())
	}
	a.ready[0], a.pct[0] = true, -1
	if a.match(&Request{PromptTokens: 3, Prompt: tokenPrompt(1, 2, 3), Model: "test-model"}) {
		// The first block of [1 2 3] was evicted: no match can pass it.
		t.Errorf("[1 2 3] still matches %d%%", a.pct[0])
	}
	a.ready[0] = true
	if !a.match(&Request{PromptTokens: 2, Prompt: tokenPrompt(9, 8), Model: "test-model"}) || a.pct[0] != 100 {
		t.Errorf("[9 8] matches %d%%, want 100", a.pct[0])
	}
	pick(t, a, preq("c", tokenPrompt(7)), s, t0.Add(21*time.Minute+time.Second))
	if a.store.idx.len() != 1 {
		t.Errorf("after 20 idle minutes %d entries, want 1 (the new one)", a.store.idx.len())
	}
}
