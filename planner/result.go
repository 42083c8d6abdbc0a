package planner

import (
	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/sim"
)

// Kind marks a planner result in JSON, so that `warden report --from` can
// tell it from a simulator report.
const Kind = "warden-plan"

// Result is the answer to a Plan. Its JSON form (encoding/json, fixed field
// order, floats rounded as sim.Float does, NaN as null) is what `warden plan
// --json` prints and what ReadResult reads back: the round trip keeps every
// figure, so a saved result renders the same report.
type Result struct {
	Kind     string `json:"kind"` // always Kind
	Title    string `json:"title"`
	Question string `json:"question"`
	// Answer is the answer in one sentence.
	Answer string `json:"answer"`

	Concurrency int          `json:"concurrency"` // the wanted concurrency
	Sessions    []int        `json:"sessions"`    // levels simulated, ascending
	DurationS   float64      `json:"duration_s"`  // of one step
	Seed        uint64       `json:"seed"`
	Strategies  []string     `json:"strategies"`
	Spills      []string     `json:"spill_thresholds"`
	Targets     Targets      `json:"targets"`
	Workload    WorkloadInfo `json:"workload"`
	// CostUnit is "per hour" when the plan gave prices (Cost is then the sum
	// of the GPUs' hourly prices), else "cards" (Cost is the card count).
	CostUnit string `json:"cost_unit"`

	// Candidates in plan order: farm sets, then GPUs, tensor parallel sizes
	// and replica counts as listed.
	Candidates []Candidate `json:"candidates"`
	// Best is the index in Candidates of the cheapest candidate that meets
	// the targets at Concurrency, or -1 when none does.
	Best int `json:"best"`
	// Closest, when Best is -1, is the index of the candidate that comes
	// closest (see Closeness), or -1 when no candidate fits at all.
	Closest int `json:"closest"`
	// Timeline is the answer's farm (Best, else Closest) with its chosen
	// routing over the step at Concurrency, as PromQL range queries gave it;
	// nil when no candidate fits.
	Timeline *Timeline `json:"timeline,omitempty"`
	// Observation, for a plan of the farm a Prometheus watches
	// (SolveObserved), is its prediction against what was observed.
	Observation *Observation `json:"observation,omitempty"`
}

// WorkloadInfo says what load the candidates were simulated with.
type WorkloadInfo struct {
	Spec WorkloadSpec `json:"spec"`
	// TypicalContextTokens is the context of one session that the rule of
	// thumb multiplies by the concurrency; TypicalContextHow says how it was
	// computed.
	TypicalContextTokens int    `json:"typical_context_tokens"`
	TypicalContextHow    string `json:"typical_context_how"`
	// Description is the workload in a few sentences, for the report.
	Description []string `json:"description"`
}

// Candidate is one farm of the plan: its sizing, the rule-of-thumb check at
// the wanted concurrency and, when its model fits, one Config per strategy
// and spill threshold tried.
type Candidate struct {
	Name               string  `json:"name"` // e.g. "3 x RTX A4000"
	GPU                string  `json:"gpu"`  // catalogue name
	Model              string  `json:"model"`
	Replicas           int     `json:"replicas"`
	TensorParallelSize int     `json:"tensor_parallel_size"`
	Cards              int     `json:"cards"` // replicas x tensor parallel size
	Cost               float64 `json:"cost"`  // see Result.CostUnit

	// Fits is false when the model does not fit on the GPUs (or leaves no
	// room for a KV cache); Error then says why and nothing was simulated.
	Fits  bool   `json:"fits"`
	Error string `json:"error,omitempty"`

	MaxNumSeqs         int   `json:"max_num_seqs,omitempty"`
	NumGPUBlocks       int   `json:"num_gpu_blocks,omitempty"` // per replica
	KVTokensPerReplica int   `json:"kv_tokens_per_replica,omitempty"`
	KVTokensTotal      int64 `json:"kv_tokens_total,omitempty"`
	// RuleOfThumb is concurrency x typical context against KVTokensTotal.
	RuleOfThumb hardware.Verdict `json:"rule_of_thumb"`

	Configs []Config `json:"configs,omitempty"`
	// Chosen is the index in Configs of the routing to run this farm with:
	// among the configs that meet the targets at the wanted concurrency the
	// one with the lowest TTFB p95 there; when none meets, the closest one.
	// -1 when the farm does not fit.
	Chosen int `json:"chosen"`
	// Meets reports whether Configs[Chosen] meets the targets at the wanted
	// concurrency.
	Meets bool `json:"meets"`
	// MaxSessions is the highest sessions level at which the best config
	// (the one with the highest such level) still meets the targets, and
	// FailsAt the level at which it stops meeting them (0: not within the
	// levels simulated). See Config.MaxSessions.
	MaxSessions int `json:"max_sessions"`
	FailsAt     int `json:"fails_at"`
}

// Config is one routing of one candidate: a strategy and, for affinity, a
// spill threshold, simulated at every sessions level.
type Config struct {
	Strategy string `json:"strategy"`
	Spill    string `json:"spill,omitempty"` // "" for strategies without a threshold
	// Rows are the simulator's rows, one per sessions level (Result.Sessions).
	Rows []sim.Row `json:"rows"`
	// Checks are the targets checked on each row, in the same order.
	Checks []Check `json:"checks"`
	// MaxSessions is the top of the first run of consecutive sessions
	// levels (scanning upwards) at which the targets are met; FailsAt is the
	// next level, where they stop being met (0 if they never do). Both are 0
	// when no level meets them.
	MaxSessions int `json:"max_sessions"`
	FailsAt     int `json:"fails_at"`
}

// Check is the targets checked on one row.
type Check struct {
	Sessions int    `json:"sessions"`
	Meets    bool   `json:"meets"`
	Misses   []Miss `json:"misses,omitempty"`
	// Shortfall is the sum of the misses' normalised shortfalls.
	Shortfall sim.Float `json:"shortfall"`
}

// Miss is one target not met.
type Miss struct {
	Target string    `json:"target"` // the Targets JSON key, e.g. "ttfb_p95_s_max"
	Value  sim.Float `json:"value"`  // NaN (null) when the step measured nothing
	Limit  float64   `json:"limit"`
	// Shortfall is how far the value is from the limit, relative to the
	// limit: (value-limit)/limit for a maximum, (limit-value)/limit for a
	// minimum; a missing value counts as NoValueShortfall.
	Shortfall sim.Float `json:"shortfall"`
}

// NoValueShortfall is the shortfall of a target whose figure the step did
// not measure (no request finished): as bad as a TTFB ten times its limit.
const NoValueShortfall = 10
