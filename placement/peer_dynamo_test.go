package placement

import (
	"math/bits"
	"math/rand/v2"
	"testing"
	"time"
)

// Golden cases taken from ai-dynamo/dynamo lib/kv-router's own tests at
// 07a6c9c; the expected values are those tests' expectations.

// wyrand is fastrand 2's generator (fastrand::Rng::gen_u64), as a
// math/rand/v2 Source: Dynamo's seeded selector draws from it.
type wyrand uint64

func (w *wyrand) Uint64() uint64 {
	s := uint64(*w) + 0x2d358dccaa6c78a5
	*w = wyrand(s)
	hi, lo := bits.Mul64(s, s^0x8bb84b93962eacc9)
	return hi ^ lo
}

// dynamoQuery is a request of isl tokens with no prompt blocks, as the
// tests' base_request (token_seq None).
func dynamoQuery(isl int) Request {
	return Request{Pinned: NoPin, PromptTokens: isl, Prompt: Prompt{BlockTokens: 16}}
}

// selector/default.rs test_default_selector_randomizes_zero_temperature_ties:
// three workers at equal cost, 120 queries: more than one is selected.
func TestDynamo_DefaultSelectorRandomizesZeroTemperatureTies(t *testing.T) {
	d := NewDynamo(DynamoConfig{Seed: 1})
	s := farm(3, 32)
	r := dynamoQuery(16)
	seen := make([]bool, 3)
	for range 120 {
		i, _ := d.choose(&r, s, t0)
		seen[i] = true
	}
	n := 0
	for _, v := range seen {
		if v {
			n++
		}
	}
	if n <= 1 {
		t.Error("zero-temperature tie-breaking should not always select the same worker")
	}
}

// selector/default.rs seeded_selector_is_stable_for_ties_and_temperature_
// sampling, temperature 0: workers 10, 20, 30 (here 0, 1, 2, the ascending
// ids the seeded selector sorts them into) tied, fastrand seeded with 42.
func TestDynamo_SeededSelectorIsStableForTies(t *testing.T) {
	want := []int{10, 30, 10, 10, 30, 20, 10, 10, 10, 20, 10, 20, 30, 10, 20, 20}
	src := wyrand(42)
	d := NewDynamo(DynamoConfig{Rand: rand.New(&src)})
	s := farm(3, 32)
	r := dynamoQuery(16)
	for k, w := range want {
		i, _ := d.choose(&r, s, t0)
		if got := []int{10, 20, 30}[i]; got != w {
			t.Fatalf("selection %d: worker %d, want %d (sequence %v)", k, got, w, want)
		}
	}
}

// The cost of the formula line that Dynamo's own log parser test reads
// (parses_exact_kv_cost_formula): 32 cached blocks, raw prefill 56.5
// blocks, decode 56 blocks: 1 x max(56.5 - 32, 0) + 56 = 80.5.
func TestDynamo_CostFormula(t *testing.T) {
	d := NewDynamo(DynamoConfig{})
	if got := d.cost(904, 16, 32, 56); got != 80.5 {
		t.Errorf("cost = %v, want 80.5", got)
	}
	if got := d.cost(16, 16, 4, 0); got != 0 {
		t.Errorf("overlap beyond the prompt: cost %v, want 0 (clamped)", got)
	}
}

// approx.rs test_prune_manager_expiry: blocks routed at one instant expire
// together after the TTL; test_prune_manager_update_resets_ttl: routing a
// block again resets its TTL.
func TestDynamo_PruneManagerExpiry(t *testing.T) {
	const ttl = 50 * time.Millisecond
	d := NewDynamo(DynamoConfig{TTL: ttl})
	s := farm(1, 32)
	r := Request{ID: 1, Pinned: NoPin, PromptTokens: 3, Prompt: Prompt{BlockTokens: 1, Blocks: []uint64{1, 2, 3}}}
	pick(t, d, r, s, t0)
	w := d.worker(0)
	if len(w.approx) != 3 {
		t.Fatalf("%d blocks after insert, want 3", len(w.approx))
	}
	if got := d.prune(w, t0.Add(ttl).UnixNano()); got != 3 || len(w.approx) != 0 {
		t.Errorf("pop_expired at the expiry: %d expired, %d left; want 3, 0", got, len(w.approx))
	}
	// Update resets the TTL.
	pick(t, d, r, s, t0)
	r.ID = 2
	pick(t, d, r, s, t0.Add(30*time.Millisecond))
	if got := d.prune(w, t0.Add(ttl).UnixNano()); got != 0 || len(w.approx) != 3 {
		t.Errorf("after a re-insert: %d expired at the first TTL, %d left; want 0, 3", got, len(w.approx))
	}
}

// The worker that holds the prefix (KV events) wins until its active
// prefill outweighs the credit; a finished request frees its blocks.
func TestDynamo_OverlapAgainstLoad(t *testing.T) {
	d := NewDynamo(DynamoConfig{Seed: 1})
	s := farm(2, 32)
	p := Prompt{BlockTokens: 16, Blocks: []uint64{1, 2, 3, 4}, Held: []int{4, 0}}
	r := Request{ID: 1, Pinned: NoPin, PromptTokens: 64, Prompt: p}
	// Worker 0: max(4 - 4, 0) + 4 = 4; worker 1: 4 + 4 = 8.
	if got := pick(t, d, r, s, t0); got.Replica != 0 || got.Reason != ReasonPrefix {
		t.Fatalf("picked %+v, want 0 prefix", got)
	}
	// A second request with the same prompt: worker 0 holds its blocks in
	// an active request (decode 4 + 0 new) and no prefill (all cached):
	// 4 against 8.
	r.ID = 2
	if got := mustPick(t, d, r, s, t0); got != 0 {
		t.Fatalf("second request on %d, want 0", got)
	}
	// A cold prompt of 320 tokens: worker 0 carries 8 active blocks,
	// worker 1 none: 20 + 8 + 20 against 20 + 20.
	cold := Request{ID: 3, Pinned: NoPin, PromptTokens: 320, Prompt: Prompt{BlockTokens: 16, Blocks: seqIDs(100, 120), Held: []int{0, 0}}}
	if got := mustPick(t, d, cold, s, t0); got != 1 {
		t.Fatalf("cold prompt on %d, want 1", got)
	}
	d.FirstToken(&cold, 1, t0)
	d.Finished(&cold, 1, t0)
	r.ID = 1
	d.Finished(&r, 0, t0)
	r.ID = 2
	d.Finished(&r, 0, t0)
	for i := range 2 {
		if w := d.worker(i); len(w.blocks) != 0 || w.prefillTokens != 0 {
			t.Errorf("worker %d after every request finished: %d blocks, %d prefill tokens", i, len(w.blocks), w.prefillTokens)
		}
	}
}

func seqIDs(lo, hi uint64) []uint64 {
	var out []uint64
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}
