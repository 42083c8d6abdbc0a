package planner

import (
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/traces"
)

// TestWorkloadLine: the workload a plan assumed, in one line, for the shapes a plan file can give.
func TestWorkloadLine(t *testing.T) {
	base := traces.Workload{SystemPromptTokens: 3500, FirstMessageTokens: 7300, FirstMessageSpread: 0.05, Turns: 6,
		NewTokensPerTurn: 400, MaxOutputTokens: 256}
	lognormal := base
	lognormal.OutputTokens, lognormal.OutputTokensMean, lognormal.ThinkTime = traces.OutputLognormal, 120, 30*time.Second
	tests := []struct {
		name string
		info WorkloadInfo
		want string
	}{
		{"the built-in plan's", WorkloadInfo{Spec: WorkloadSpec{Workload: base}, TypicalContextTokens: 12696},
			"Workload assumed: a 3,500-token system prompt shared by every session, a first message of 7,300 tokens (±5 %), " +
				"6 turns per conversation each adding 400 tokens, answers of 256 tokens and no think time between turns " +
				"(typical context 12,696 tokens)."},
		{"lognormal answers and think time", WorkloadInfo{Spec: WorkloadSpec{Workload: lognormal}},
			"Workload assumed: a 3,500-token system prompt shared by every session, a first message of 7,300 tokens (±5 %), " +
				"6 turns per conversation each adding 400 tokens, answers of about 120 tokens (at most 256) and 30s of think time between turns."},
		{"a trace", WorkloadInfo{Spec: WorkloadSpec{Trace: "agents.jsonl"}, TypicalContextTokens: 20000},
			"Workload assumed: the sessions of trace agents.jsonl, replayed with their own prompts, turns and answers (typical context 20,000 tokens)."},
		{"a result without its workload", WorkloadInfo{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.info.WorkloadLine(); got != tt.want {
				t.Errorf("got\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

// TestRoutingWords: each routing a farm runs with is said once, the auto spill threshold with
// its number when every farm has the same max_num_seqs.
func TestRoutingWords(t *testing.T) {
	cand := func(seqs int, strategy, spill string) Candidate {
		return Candidate{Fits: true, MaxNumSeqs: seqs, Chosen: 0, Configs: []Config{{Strategy: strategy, Spill: spill}}}
	}
	res := &Result{Candidates: []Candidate{cand(32, "affinity", "auto"), cand(32, "affinity", "auto"), cand(32, "least-loaded", ""),
		{Fits: false, Chosen: -1}}}
	got := res.RoutingWords()
	if len(got) != 2 || !strings.HasPrefix(got[0], "affinity (spill auto): each conversation stays on the replica") ||
		!strings.Contains(got[0], "more than a quarter of its max_num_seqs requests in flight (8 of 32)") ||
		!strings.HasPrefix(got[1], "least-loaded: vLLM's own data-parallel balancer, no warden in front (not the proxy's least-loaded, warden's balancer): every turn goes to the replica with the fewest requests") {
		t.Errorf("got %q", got)
	}
	// On 0.26 with a dense model vLLM's balancer rotates blind to load: said so, where it
	// used to read as the proxy's least-loaded.
	res.Candidates[2].Model, res.Candidates[2].VLLMRelease = "Qwen/Qwen3-4B-Instruct-2507", "0.26"
	if got := res.RoutingWords(); !strings.Contains(got[1], "as vLLM 0.26 runs it for a dense model, its API servers learn no engine's load and send each turn to the next replica in rotation") {
		t.Errorf("0.26, dense: got %q", got[1])
	}
	res.Candidates[2].VLLMRelease = "0.27"
	if got := res.RoutingWords(); !strings.Contains(got[1], "the fewest requests waiting and running") {
		t.Errorf("0.27: got %q", got[1])
	}
	res.Candidates[2].VLLMRelease = ""
	res.Candidates[1].MaxNumSeqs = 256
	res.Candidates[2] = cand(256, "affinity+kv+admit", "8")
	got = res.RoutingWords()
	if len(got) != 2 || strings.Contains(got[0], " of 32)") || !strings.Contains(got[1], "judged by its KV cache fill too") ||
		!strings.Contains(got[1], "more than 8 requests in flight") {
		t.Errorf("mixed max_num_seqs and a variant: got %q", got)
	}
}

// TestRuleOfThumbWords: the answer reconciles the rule of thumb only when its farm is over it.
func TestRuleOfThumbWords(t *testing.T) {
	res := &Result{Concurrency: 16, Best: 0, Workload: WorkloadInfo{TypicalContextTokens: 19896,
		Spec: WorkloadSpec{Workload: traces.Workload{SystemPromptTokens: 16000}}}}
	res.Candidates = []Candidate{{Name: "4 x RTX A4000", Fits: true, Verdict: VerdictMeets, KVTokensTotal: 186496,
		RuleOfThumb: hardware.RuleOfThumb(16, 19896, 186496)}}
	want := "4 x RTX A4000 meets the targets at 16 sessions although 16 x 19,896 tokens of typical context (171 % of its KV cache " +
		"of 186,496 tokens) are over the rule of thumb: the 16,000-token system prompt is cached once, not 16 times (about 78,336 " +
		"tokens, 42 % of the cache), and conversations rarely all reach their full length at once, while vLLM evicts what idle ones " +
		"hold; the simulation, not the rule, decides."
	if got := res.RuleOfThumbWords(); got != want {
		t.Errorf("over the rule:\n%q\nwant\n%q", got, want)
	}
	if got := RuleOfThumbVerdict(&res.Candidates[0]); got != "over the rule of thumb; simulated: meets" {
		t.Errorf("verdict %q", got)
	}
	res.Candidates[0].RuleOfThumb = hardware.RuleOfThumb(16, 19896, 400000)
	if got := res.RuleOfThumbWords(); got != "" {
		t.Errorf("within the rule: %q, want nothing", got)
	}
	res.Best = -1
	if got := res.RuleOfThumbWords(); got != "" {
		t.Errorf("no answer: %q, want nothing", got)
	}
}
