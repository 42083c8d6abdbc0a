package sim

import (
	"fmt"
	"testing"
)

// The cases below mirror vLLM 0.26's waiting loop (vllm/v1/core/sched/
// scheduler.py, Scheduler.schedule) calling KVCacheManager.allocate_slots
// (vllm/v1/core/kv_cache_manager.py) with full_sequence_must_fit =
// scheduler_reserve_full_isl, and get_computed_blocks' prefix-cache stats
// before and after PR #48860. Each is worked by hand, then its transcript
// is compared with a golden file (go test ./sim -run TestAdmission -update).

// admissionCase: 7 usable blocks of 4 tokens and a budget of 4 tokens a
// step (chunked prefill). A (16 tokens, 8 to generate) holds 4 blocks and
// grows to 6; B (16 tokens) arrives while A runs.
func admissionCase(t *testing.T, title string, gate, everyLookup bool) *poolHarness {
	h := newPoolHarness(t, title, 4, 8, 8, 4)
	h.r.cfg.reserveFullISL = gate
	h.r.cfg.countEveryLookup = everyLookup
	fmt.Fprintf(&h.out, "# scheduler_reserve_full_isl %v, stats on every lookup %v\n", gate, everyLookup)
	h.add("A", 16, 8, []string{"a1", "a2", "a3", "a4"}, nil)
	for range 4 {
		h.step() // A's prefill, 4 tokens a step
	}
	h.add("B", 16, 2, []string{"b1", "b2", "b3", "b4"}, nil)
	for range 12 {
		h.step()
	}
	return h
}

func TestAdmissionFullSequenceGate(t *testing.T) {
	h := admissionCase(t, "full-ISL gate: B waits until its whole prompt fits; nothing is preempted", true, false)
	// B needs 4 blocks; while A holds 5 or 6 of the 7, B is not admitted
	// (the loop stops), so no step ever runs out of blocks.
	if h.r.stats.preemptions != 0 {
		t.Errorf("preemptions = %d, want 0 with the gate", h.r.stats.preemptions)
	}
	if q := h.r.stats.queries; q != 32 {
		t.Errorf("queries = %d, want 32: A and B counted once each, at admission", q)
	}
	h.golden("admission_gate")
}

func TestAdmissionFirstChunkOnly(t *testing.T) {
	h := admissionCase(t, "no gate (before 0.22): B is admitted on its first chunk and A's decode later preempts it", false, false)
	if h.r.stats.preemptions == 0 {
		t.Error("no preemption without the gate: the case does not show the difference")
	}
	h.golden("admission_first_chunk")
}

func TestAdmissionStatsOnEveryLookup(t *testing.T) {
	h := admissionCase(t, "stats before PR #48860: the blocked head request B is counted at every step it is looked up", true, true)
	if h.r.stats.queries <= 32 || h.r.stats.admitQueries != 32 {
		t.Errorf("queries %d (want > 32: B counted at every failed lookup), admission queries %d (want 32)", h.r.stats.queries, h.r.stats.admitQueries)
	}
	h.golden("admission_every_lookup")
}
