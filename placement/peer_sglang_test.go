package placement

import (
	"testing"
	"time"
)

// Golden cases taken from lightseekorg/smg's own tests at 73da68c
// (model_gateway/src/policies/cache_aware.rs, crates/kv_index/src/
// string_tree.rs); the expected values are those tests' expectations. A
// character of those tests is a token here (TextBytesPerToken bytes).

// words: "hello world" as tokens; "hello" is its prefix.
var (
	helloWorld = tokenPrompt(seqTokens(1, 12)...)
	hello      = tokenPrompt(seqTokens(1, 6)...)
)

// cache_aware.rs test_cache_aware_with_balanced_load.
func TestSGLang_CacheAwareWithBalancedLoad(t *testing.T) {
	g := NewSGLang(SGLangConfig{})
	s := farm(2, 32)
	idx1 := mustPick(t, g, preq("a", helloWorld), s, t0)
	if idx2 := mustPick(t, g, preq("b", helloWorld), s, t0); idx2 != idx1 {
		t.Errorf("same request went to %d then %d (cache hit expected)", idx1, idx2)
	}
	if d := pick(t, g, preq("c", hello), s, t0); d.Replica != idx1 || d.Reason != ReasonPrefix {
		t.Errorf("similar request: %+v, want %d prefix", d, idx1)
	}
}

// cache_aware.rs test_cache_aware_with_imbalanced_load: threshold 0.5,
// abs 5, rel 2.0, worker 1 with 20 in flight: always worker 2.
func TestSGLang_CacheAwareWithImbalancedLoad(t *testing.T) {
	g := NewSGLang(SGLangConfig{CacheThreshold: 0.5, BalanceAbs: 5, BalanceRel: 2, MaxTreeChars: 10000})
	s := farm(2, 32)
	s.Replicas[0].InFlight = 20
	for range 5 {
		if d := pick(t, g, preq("a", tokenPrompt(7, 8, 9, 10)), s, t0); d.Replica != 1 || d.Reason != ReasonLeastLoaded {
			t.Fatalf("picked %+v, want 1 least-loaded", d)
		}
	}
}

// cache_aware.rs is_imbalanced_high_count_low_kv_caught_by_count (the
// count trigger; the KV triggers are off at their 1.0 default) and the
// abs AND rel rule.
func TestSGLang_IsImbalanced(t *testing.T) {
	for _, tc := range []struct {
		name     string
		abs      int
		rel      float64
		min, max int
		want     bool
	}{
		{"high count low kv caught by count", 5, 2, 0, 20, true},
		{"abs and rel over", 64, 1.5, 100, 170, true},
		{"abs over, rel not over", 64, 1.5, 200, 270, false},
		{"abs not over", 64, 1.5, 0, 64, false},
	} {
		g := NewSGLang(SGLangConfig{BalanceAbs: tc.abs, BalanceRel: tc.rel})
		if got := g.imbalanced(tc.min, tc.max); got != tc.want {
			t.Errorf("%s: imbalanced(%d, %d) = %v, want %v", tc.name, tc.min, tc.max, got, tc.want)
		}
	}
}

// string_tree.rs test_simple_eviction: "hello" for tenants 1 and 2, then
// "world" for tenant 2; trimming to 5 characters drops tenant 2's older
// leaf, "hello", and keeps "world" matched to tenant 2.
func TestSGLang_SimpleEviction(t *testing.T) {
	const c = TextBytesPerToken
	world := tokenPrompt(101, 102, 103, 104, 105)
	th := appendPromptText(nil, &hello, 5)
	tw := appendPromptText(nil, &world, 5)
	if th.first() == tw.first() {
		t.Fatal("the two words must start with different characters")
	}
	tree := newCharTree()
	tree.insert(th, 1)
	tree.insert(th, 2)
	tree.insert(tw, 2)
	if tree.tenantSize(1) != 5*c || tree.tenantSize(2) != 10*c {
		t.Fatalf("sizes before: %d, %d; want %d, %d", tree.tenantSize(1), tree.tenantSize(2), 5*c, 10*c)
	}
	tree.evict(5 * c)
	if tree.tenantSize(1) != 5*c || tree.tenantSize(2) != 5*c {
		t.Errorf("sizes after: %d, %d; want %d, %d", tree.tenantSize(1), tree.tenantSize(2), 5*c, 5*c)
	}
	if m := tree.match(tw); m.matched != 5*c || m.tenant != 2 {
		t.Errorf("world: matched %d with tenant %d, want %d with 2", m.matched, m.tenant, 5*c)
	}
	if m := tree.match(th); m.tenant != 1 {
		t.Errorf("hello: tenant %d, want 1", m.tenant)
	}
}

// string_tree.rs test_tenant_char_count / test_prefix_is_subset_of_existing:
// a split node keeps the characters counted once per tenant.
func TestSGLang_TenantCharCount(t *testing.T) {
	const c = TextBytesPerToken
	tree := newCharTree()
	a := appendPromptText(nil, &helloWorld, 11)
	b := appendPromptText(nil, &hello, 5)
	tree.insert(a, 0)
	tree.insert(b, 0) // a prefix of an existing text: a split, no new characters
	if got := tree.tenantSize(0); got != 11*c {
		t.Errorf("tenant 0 holds %d, want %d", got, 11*c)
	}
	tree.insert(b, 1)
	if got := tree.tenantSize(1); got != 5*c {
		t.Errorf("tenant 1 holds %d, want %d", got, 5*c)
	}
	if m := tree.match(a); m.matched != 11*c || m.total != 11*c {
		t.Errorf("match %d of %d, want all %d", m.matched, m.total, 11*c)
	}
}

// A miss goes to the least loaded by (load, processed, index): two idle
// workers take new prompts in turn (#1714's tie-break), not all on the
// first.
func TestSGLang_MissSpreadsByProcessed(t *testing.T) {
	g := NewSGLang(SGLangConfig{})
	s := farm(2, 32)
	var got []int
	for k := range 4 {
		got = append(got, mustPick(t, g, preq("s", tokenPrompt(uint64(1000*k+1), uint64(1000*k+2))), s, t0))
	}
	if want := []int{0, 1, 0, 1}; !equalInts(got, want) {
		t.Errorf("picks %v, want %v", got, want)
	}
}

// The eviction task runs every 120 s of the caller's clock.
func TestSGLang_EvictionInterval(t *testing.T) {
	g := NewSGLang(SGLangConfig{MaxTreeChars: 1})
	s := farm(1, 32)
	pick(t, g, preq("a", helloWorld), s, t0)
	pick(t, g, preq("a", helloWorld), s, t0.Add(119*time.Second))
	if g.trees["test-model"].tenantSize(0) == 0 {
		t.Fatal("evicted before 120 s")
	}
	pick(t, g, preq("b", tokenPrompt(500)), s, t0.Add(120*time.Second))
	// The eviction ran before this pick's insert: only its own text is left.
	if got := g.trees["test-model"].tenantSize(0); got != TextBytesPerToken {
		t.Errorf("after the 120 s tick tenant 0 holds %d, want %d (the last insert)", got, TextBytesPerToken)
	}
}
