package placement

import (
	"math"
	"testing"
)

// Golden cases taken from llm-d/llm-d-router's own tests at ebab687; the
// expected values are those tests' expectations.

// scorer/queuedepth/queue_test.go TestQueueScorer.
func TestLLMD_QueueScorer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting []int
		want    []float64
	}{
		{"Different queue sizes", []int{10, 5, 0}, []float64{0, 0.5, 1}},
		{"Same queue sizes", []int{5, 5}, []float64{1, 1}},
		{"Zero queue sizes", []int{0, 0}, []float64{1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := math.MaxInt, math.MinInt
			for _, w := range tc.waiting {
				lo, hi = min(lo, w), max(hi, w)
			}
			for i, w := range tc.waiting {
				if got := llmdQueueScore(w, lo, hi); math.Abs(got-tc.want[i]) > 1e-4 {
					t.Errorf("endpoint %d (waiting %d): score %v, want %v", i, w, got, tc.want[i])
				}
			}
			// The same through Pick: queue only, the longest queue scores 0.
			l := NewLLMD(LLMDConfig{QueueWeight: 1})
			s := farm(len(tc.waiting), 32)
			for i, w := range tc.waiting {
				s.Replicas[i].Waiting = w
			}
			pick(t, l, Request{Pinned: NoPin}, s, t0)
			for i, got := range l.Scores(nil) {
				if math.Abs(got-tc.want[i]) > 1e-4 {
					t.Errorf("Pick: endpoint %d scored %v, want %v", i, got, tc.want[i])
				}
			}
		})
	}
}

// scheduling/scheduler_profile_test.go TestEnforceScoreRange.
func TestLLMD_EnforceScoreRange(t *testing.T) {
	for _, tc := range []struct {
		name        string
		score, want float64
	}{
		{"negative score clamped to 0", -0.5, 0},
		{"score above 1 clamped to 1", 1.5, 1},
		{"score at 0 stays 0", 0, 0},
		{"score at 1 stays 1", 1, 1},
		{"score in range stays unchanged", 0.5, 0.5},
	} {
		if got := clamp01(tc.score); got != tc.want {
			t.Errorf("%s: clamp01(%v) = %v, want %v", tc.name, tc.score, got, tc.want)
		}
	}
}

// tinyLLMD is the producer of the peer's tests: the 64-token floor off
// (disableMinBlockSizeClamp) and blockSize tokens a block.
func tinyLLMD(blockSize int) *LLMD {
	return NewLLMD(LLMDConfig{MinBlockTokens: 1, VLLMBlockSize: blockSize, Seed: 1})
}

// approximateprefix/plugin_test.go TestPrefixPluginPartialPrefixMatch: after
// [1, 2] went to pod1, [1, 3] matches one of its two blocks there and none
// elsewhere. (The prefill profile's pod3 of that test is not modelled:
// warden serves no P/D disaggregation.)
func TestLLMD_PrefixPluginPartialPrefixMatch(t *testing.T) {
	l := tinyLLMD(1)
	s := farm(3, 32)
	s.Replicas[1].Waiting, s.Replicas[2].Waiting = 1, 1 // pod1 (index 0) wins the first pick
	if got := mustPick(t, l, preq("a", tokenPrompt(1, 2)), s, t0); got != 0 {
		t.Fatalf("first request went to %d, want 0", got)
	}
	if len(l.hashes) != 2 {
		t.Fatalf("[1, 2] hashed to %d blocks, want 2", len(l.hashes))
	}
	pick(t, l, preq("b", tokenPrompt(1, 3)), s, t0)
	if len(l.hashes) != 2 {
		t.Errorf("[1, 3]: %d blocks, want 2", len(l.hashes))
	}
	if want := []int{1, 0, 0}; !equalInts(l.matched, want) {
		t.Errorf("matched blocks %v, want %v", l.matched, want)
	}
}

// approximateprefix/plugin_test.go TestPrefixPluginPrefixGrowth: a prompt
// that extends one the pod served has more blocks and hits there.
func TestLLMD_PrefixPluginPrefixGrowth(t *testing.T) {
	l := tinyLLMD(2)
	s := farm(1, 32)
	pick(t, l, preq("a", tokenPrompt(seqTokens(1, 7)...)), s, t0)
	initial := len(l.hashes)
	if initial != 3 {
		t.Fatalf("6 tokens in blocks of 2: %d hashes, want 3", initial)
	}
	pick(t, l, preq("a", tokenPrompt(seqTokens(1, 13)...)), s, t0)
	if len(l.hashes) <= initial {
		t.Errorf("extended prompt: %d hashes, want more than %d", len(l.hashes), initial)
	}
	if l.matched[0] == 0 {
		t.Error("should have prefix cache hit")
	}
	if l.matched[0] != 3 || len(l.hashes) != 6 {
		t.Errorf("matched %d of %d blocks, want 3 of 6", l.matched[0], len(l.hashes))
	}
}

// approximateprefix/plugin_test.go TestPrefixPluginAutoTune: the pod's
// block size (128) and num_gpu_blocks (1000) from cache_config_info rule.
func TestLLMD_PrefixPluginAutoTune(t *testing.T) {
	l := NewLLMD(LLMDConfig{VLLMBlockSize: 128, LRUCapacity: 1})
	s := farm(1, 32)
	s.Replicas[0].KVCapacityTokens = 1000 * 128
	p := tokenPrompt(seqTokens(1, 193)...)
	pick(t, l, preq("a", p), s, t0)
	if len(l.hashes) != 2 {
		t.Errorf("192 tokens at 128 a block: %d hashes, want 2", len(l.hashes))
	}
	if l.index.size(0) != 2 || l.index.lrus[0].cap != 1000 {
		t.Errorf("pod holds %d hashes in an LRU of %d, want 2 in 1000", l.index.size(0), l.index.lrus[0].cap)
	}
}

// approximateprefix/plugin_test.go TestGetBlockSize_*: the router's block
// is max(64, vLLM's block_size).
func TestLLMD_GetBlockSize(t *testing.T) {
	for _, tc := range []struct {
		name       string
		vllm, want int
	}{
		{"AutotuneClampsBelowMinimum", 16, 64},
		{"AutotuneAboveMinimumPassesThrough", 128, 128},
		{"AutotuneFallbackClampsLowConfig", 0, 64},
	} {
		if got := NewLLMD(LLMDConfig{VLLMBlockSize: tc.vllm}).blockTokens(); got != tc.want {
			t.Errorf("%s: block size %d, want %d", tc.name, got, tc.want)
		}
	}
}

// approximateprefix/plugin_test.go TestMaxPrefixTokensToMatch: at most
// MaxPrefixTokensToMatch / block size blocks are hashed.
func TestLLMD_MaxPrefixTokensToMatch(t *testing.T) {
	l := NewLLMD(LLMDConfig{MinBlockTokens: 1, VLLMBlockSize: 1, MaxPrefixTokens: 2})
	pick(t, l, preq("a", tokenPrompt(1, 2, 3, 4)), farm(1, 32), t0)
	if len(l.hashes) != 2 {
		t.Errorf("%d hashes, want 2 (MaxPrefixTokensToMatch / BlockSizeTokens)", len(l.hashes))
	}
}

// approximateprefix/indexer_test.go TestIndexer_AddAndGet: the pod's own
// capacity (2) bounds its LRU; the oldest hash leaves the index.
func TestLLMD_IndexerAddAndGet(t *testing.T) {
	x := llmdIndex{pods: map[uint64][]int32{}}
	x.add([]uint64{1}, 0, 2)
	if x.size(0) != 1 || len(x.pods[1]) != 1 {
		t.Fatalf("after one add: size %d, pods of hash 1 %v", x.size(0), x.pods[1])
	}
	x.add([]uint64{2}, 0, 2)
	if x.size(0) != 2 {
		t.Errorf("size %d, want 2", x.size(0))
	}
	x.add([]uint64{3}, 0, 2)
	if x.size(0) != 2 {
		t.Errorf("size %d after the third add, want 2", x.size(0))
	}
	if len(x.pods[1]) != 0 || len(x.pods[4]) != 0 {
		t.Errorf("hash 1 (evicted) on %v, hash 4 (never added) on %v; want neither", x.pods[1], x.pods[4])
	}
}

// picker/maxscore/picker_test.go TestPickMaxScorePicker: the highest
// score wins; endpoints tied at the top are all picked in turn (the
// shuffle before the stable sort).
func TestLLMD_PickMaxScorePicker(t *testing.T) {
	s := farm(3, 32)
	s.Replicas[0].KVUsage, s.Replicas[1].KVUsage, s.Replicas[2].KVUsage = 0.5, 0.2, 0.8
	l := NewLLMD(LLMDConfig{Seed: 7})
	for range 10 {
		if got := mustPick(t, l, Request{Pinned: NoPin}, s, t0); got != 1 {
			t.Fatalf("Single max score: picked %d, want 1 (kv 0.2)", got)
		}
	}
	s.Replicas[0].KVUsage, s.Replicas[2].KVUsage = 0.2, 0.2
	seen := make([]int, 3)
	for range 60 {
		seen[mustPick(t, l, Request{Pinned: NoPin}, s, t0)]++
	}
	for i, n := range seen {
		if n < 10 {
			t.Errorf("Multiple max scores, all equally scored: endpoint %d picked %d of 60 times", i, n)
		}
	}
}

// The default profile end to end: 2 x queue + 2 x kv + 3 x prefix. A pod
// that holds the whole prompt wins over an idle one unless the queue and
// KV terms together outweigh the prefix.
func TestLLMD_DefaultProfile(t *testing.T) {
	l := NewLLMD(LLMDConfig{Seed: 3})
	s := farm(2, 32)
	s.Replicas[1].Waiting = 1
	conv := tokenPrompt(seqTokens(0, 640)...)
	conv.BlockTokens = 1
	if got := mustPick(t, l, preq("a", conv), s, t0); got != 0 {
		t.Fatalf("first turn on %d, want 0 (shorter queue)", got)
	}
	// Pod 0 now has the longer queue: 2*0 + 2*(1-kv) + 3*1 against pod
	// 1's 2*1 + 2*1 + 0 = 4.
	s.Replicas[0].Waiting, s.Replicas[1].Waiting = 3, 0
	s.Replicas[0].KVUsage = 0.4 // 4.2 > 4: the prefix wins
	if got := mustPick(t, l, preq("a", conv), s, t0); got != 0 {
		t.Errorf("picked %d, want 0 (scores %v)", got, l.Scores(nil))
	}
	if sc := l.Scores(nil); math.Abs(sc[0]-4.2) > 1e-9 || math.Abs(sc[1]-4) > 1e-9 {
		t.Errorf("scores %v, want [4.2 4]", sc)
	}
	s.Replicas[0].KVUsage = 0.6 // 3.8 < 4: the load wins
	if got := mustPick(t, l, preq("a", conv), s, t0); got != 1 {
		t.Errorf("picked %d, want 1 (scores %v)", got, l.Scores(nil))
	}
}

// The precise profile reads Prompt.Held in 64-token blocks, full ones.
func TestLLMD_Precise(t *testing.T) {
	l := NewLLMDPrecise(1)
	s := farm(2, 32)
	p := Prompt{BlockTokens: 16, Blocks: make([]uint64, 20), Held: []int{8, 16}}
	r := preq("a", p) // 320 tokens: 5 router blocks
	if got := mustPick(t, l, r, s, t0); got != 1 {
		t.Fatalf("picked %d, want 1 (holds 256 of 320 tokens)", got)
	}
	if want := []int{2, 4}; !equalInts(l.matched, want) {
		t.Errorf("matched %v, want %v", l.matched, want)
	}
	if !l.ReadsHeld() || NewLLMD(LLMDConfig{}).ReadsHeld() {
		t.Error("only the precise profile reads Prompt.Held")
	}
}
