package planner

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
)

// The plain-words side of a result: what `warden plan` prints under its
// table and what the report says once, for a buyer who has not read the
// simulator's notes. Every sentence is computed from the result's JSON
// fields, so that a saved result (`warden report --from`) says the same.

// WorkloadLine is the workload the plan assumed, in one line: "Workload
// assumed: a 3,500-token system prompt shared by every session, a first
// message of 7,300 tokens, 6 turns per conversation each adding 400 tokens,
// answers of 256 tokens, no think time between turns (typical context
// 12,696 tokens)."
func (w WorkloadInfo) WorkloadLine() string {
	typical := ""
	if w.TypicalContextTokens > 0 {
		typical = fmt.Sprintf(" (typical context %s tokens)", group(int64(w.TypicalContextTokens)))
	}
	if w.Spec.Trace != "" {
		return fmt.Sprintf("Workload assumed: the sessions of trace %s, replayed with their own prompts, turns and answers%s.",
			w.Spec.Trace, typical)
	}
	s := w.Spec.Workload
	if s.Turns == 0 && s.SystemPromptTokens == 0 && s.FirstMessageTokens == 0 {
		return "" // a result without its workload
	}
	if s.Shaped() && w.Summary != nil {
		return w.shapedLine() // distributions (issue 48): planner/workload.go
	}
	var parts []string
	if s.SystemPromptTokens > 0 {
		parts = append(parts, fmt.Sprintf("a %s-token system prompt shared by every session", group(int64(s.SystemPromptTokens))))
	}
	first := fmt.Sprintf("a first message of %s tokens", group(int64(s.FirstMessageTokens)))
	if s.FirstMessageSpread > 0 {
		first += fmt.Sprintf(" (±%s %%)", strconv.FormatFloat(100*s.FirstMessageSpread, 'f', -1, 64))
	}
	parts = append(parts, first)
	turns := fmt.Sprintf("%d turns per conversation", s.Turns)
	if s.Turns > 1 {
		turns += fmt.Sprintf(" each adding %s tokens", group(int64(s.NewTokensPerTurn)))
	}
	parts = append(parts, turns)
	answer := fmt.Sprintf("answers of %s tokens", group(int64(s.MaxOutputTokens)))
	if mean := meanOutput(s); mean < float64(s.MaxOutputTokens) {
		answer = fmt.Sprintf("answers of about %s tokens (at most %s)", group(int64(math.Round(mean))), group(int64(s.MaxOutputTokens)))
	}
	parts = append(parts, answer)
	if s.ThinkTime > 0 {
		parts = append(parts, s.ThinkTime.String()+" of think time between turns")
	} else {
		parts = append(parts, "no think time between turns")
	}
	if s.SubagentProbability > 0 {
		parts = append(parts, fmt.Sprintf("a subagent after a turn with probability %g", s.SubagentProbability))
	}
	return "Workload assumed" + workloadName(w.Spec.Preset) + ": " + joinAnd(parts) + typical + "."
}

// RoutingWords explains, once, each routing the result names for a farm,
// e.g. "affinity (spill auto): each conversation stays on the replica that
// already holds it in its prefix cache; while that replica has more than a
// quarter of its max_num_seqs in flight (8 of 32), a new turn spills to the
// least-loaded replica instead." Variants' options (kv, priced, admit) get
// a clause each.
func (res *Result) RoutingWords() []string {
	var out []string
	seen := map[string]bool{}
	say := func(c *Candidate, k int) {
		cfg := &c.Configs[k]
		if label := cfg.label(); !seen[label] {
			seen[label] = true
			out = append(out, label+": "+res.routingWords(cfg, c)+".")
		}
	}
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Fits || c.Chosen < 0 || c.Chosen >= len(c.Configs) {
			continue
		}
		say(c, c.Chosen)
	}
	// The routing cards' routings too; one that meets the targets nowhere
	// as it ran on the dearest farm simulated.
	for _, rc := range res.RoutingCards {
		switch d := res.DearestSimulated(); {
		case rc.Candidate >= 0:
			say(&res.Candidates[rc.Candidate], rc.Config)
		case d >= 0:
			c := &res.Candidates[d]
			if k := slices.IndexFunc(c.Configs, func(cfg Config) bool { return cfg.Strategy == rc.Strategy }); k >= 0 {
				say(c, k)
			}
		}
	}
	return out
}

func (res *Result) routingWords(cfg *Config, c *Candidate) string {
	// The registry's words: the strategy's, then its options' clauses.
	v, err := placement.ParseSpec(cfg.Strategy)
	if err != nil {
		v = placement.Spec{Strategy: cfg.Strategy}
	}
	s := placement.Words(v.Strategy)
	if v.Strategy == placement.StrategyLeastLoaded {
		// The simulator's least-loaded is vLLM's own data-parallel front
		// end, as the release runs it; the proxy's strategy of that name
		// is warden's balancer. Named apart: they behave differently.
		s = "vLLM's own data-parallel balancer, no warden in front (not the proxy's least-loaded, warden's balancer): " + vllmBalancerWords(c)
	}
	for _, w := range v.OptionWords() {
		s += "; " + w
	}
	switch spill := cfg.Spill; {
	case spill == "":
	case spill == "auto":
		s += "; while that replica has more than a quarter of its max_num_seqs requests in flight" + res.autoSpill() +
			", a new turn spills to the least-loaded replica instead (it is computed again there)"
	case spill == "priced":
		s += "; a turn spills to another replica when waiting at home would cost more time than computing its context again there"
	default:
		s += fmt.Sprintf("; while that replica has more than %s requests in flight, a new turn spills to the least-loaded replica instead", spill)
	}
	return s
}

// vllmBalancerWords says what vLLM's own balancer does for candidate c's
// model on the release simulated (sim.VLLMBehaviourFor), in plain words.
func vllmBalancerWords(c *Candidate) string {
	fewest := "every turn goes to the replica with the fewest requests waiting and running as vLLM's API servers count them, wherever the conversation is cached"
	v, err := sim.ParseVLLMVersion(c.VLLMRelease)
	m, merr := hardware.LookupModel(c.Model)
	if c.VLLMRelease == "" || err != nil || merr != nil {
		return fewest
	}
	switch sim.VLLMBehaviourFor(v, m).Balancer {
	case sim.DPBlindFixed, sim.DPBlindRotating:
		return "as vLLM " + c.VLLMRelease + " runs it for a dense model, its API servers learn no engine's load and send each turn to the next replica in rotation, wherever the conversation is cached"
	}
	return fewest
}

// autoSpill is " (8 of 32)" when every candidate that fits has the same
// max_num_seqs, else "".
func (res *Result) autoSpill() string {
	n := 0
	for i := range res.Candidates {
		c := &res.Candidates[i]
		if !c.Fits {
			continue
		}
		if c.MaxNumSeqs <= 0 || (n != 0 && c.MaxNumSeqs != n) {
			return ""
		}
		n = c.MaxNumSeqs
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d of %d)", max(n/4, 1), n)
}

// BandWords explains the band in plain words, "" for a result without one:
// "[band]: the KV cache and the engine's speed are estimates, so each farm
// is simulated with its KV cache 15 % smaller, as estimated and 10 % larger
// (...)".
func (res *Result) BandWords() string {
	b := res.Band
	if len(b.Seeds) < 2 && len(b.KVScales) < 2 && len(b.SpeedScales) < 2 {
		return ""
	}
	var parts []string
	runs := 1
	if len(b.KVScales) > 1 {
		parts = append(parts, "its KV cache "+scaleWords(b.KVScales, "smaller", "larger")+" (not where num_gpu_blocks is given: that is exact)")
		runs *= len(b.KVScales)
	}
	if len(b.SpeedScales) > 1 {
		parts = append(parts, "its engine "+scaleWords(b.SpeedScales, "slower", "faster")+" (not where step_time is calibrated, as warden calibrate does)")
		runs *= len(b.SpeedScales)
	}
	if n := len(b.Seeds); n > 1 {
		var seeds []string
		for _, s := range b.Seeds {
			seeds = append(seeds, strconv.FormatUint(s, 10))
		}
		parts = append(parts, fmt.Sprintf("%d different sets of sessions (seeds %s)", n, joinAnd(seeds)))
		runs *= n
	}
	lead := ""
	switch kv, speed := len(b.KVScales) > 1, len(b.SpeedScales) > 1; {
	case kv && speed:
		lead = "the KV cache and the engine's speed are estimates, so "
	case kv:
		lead = "the KV cache is an estimate, so "
	case speed:
		lead = "the engine's speed is an estimate, so "
	}
	return fmt.Sprintf("%seach farm is simulated with %s, every combination (up to %d runs per routing and level; only the nominal "+
		"run where that already misses). The band is the lowest and highest figure over those runs; a farm meets the targets only "+
		"if it does at the band's worse end.", lead, joinAnd(parts), runs)
}

// scaleWords says scales as changes: [1, 0.85, 1.1] is "as estimated, 15 %
// smaller and 10 % larger".
func scaleWords(scales []float64, less, more string) string {
	out := []string{"as estimated"}
	for _, k := range slices.Sorted(slices.Values(scales)) {
		switch {
		case k < 1:
			out = append(out, pct(1-k)+" % "+less)
		case k > 1:
			out = append(out, pct(k-1)+" % "+more)
		}
	}
	return joinAnd(out)
}

// RuleOfThumbWords reconciles the rule of thumb with the answer: when the
// farm the answer recommends is over it (sessions x typical context above
// its KV cache) and yet meets the targets, one sentence says why both hold
// and which decides; "" otherwise (no answer, or within the rule).
func (res *Result) RuleOfThumbWords() string {
	if res.Best < 0 || res.Best >= len(res.Candidates) {
		return ""
	}
	c := &res.Candidates[res.Best]
	v := c.RuleOfThumb
	if !c.Fits || v.Fits || c.KVTokensTotal <= 0 {
		return ""
	}
	n := res.Concurrency
	var b strings.Builder
	fmt.Fprintf(&b, "%s meets the targets at %d sessions although %d x %s tokens of typical context (%s %% of its KV cache of %s tokens) "+
		"are over the rule of thumb: ", c.Name, n, n, group(int64(res.Workload.TypicalContextTokens)), fmtPct(100*v.Ratio), group(c.KVTokensTotal))
	shared := 0
	if res.Workload.Spec.Trace == "" {
		shared = res.Workload.Spec.SystemPromptTokens
	}
	if held := v.DemandTokens - int64(n-1)*int64(shared); shared > 0 && n > 1 && held > 0 {
		fmt.Fprintf(&b, "the %s-token system prompt is cached once, not %d times (about %s tokens, %s %% of the cache), and ",
			group(int64(shared)), n, group(held), fmtPct(100*float64(held)/float64(c.KVTokensTotal)))
	}
	b.WriteString("conversations rarely all reach their full length at once, while vLLM evicts what idle ones hold; " +
		"the simulation, not the rule, decides.")
	return b.String()
}

// RuleOfThumbVerdict is one candidate's rule of thumb said beside its
// simulated verdict, for the report's table and dials: "within",
// "over the rule of thumb; simulated: meets".
func RuleOfThumbVerdict(c *Candidate) string {
	if c.RuleOfThumb.Fits {
		return "within"
	}
	if c.Verdict == "" {
		return "over the rule of thumb"
	}
	return "over the rule of thumb; simulated: " + c.Verdict
}
