package planner

import (
	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
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

	Concurrency int `json:"concurrency"` // the wanted concurrency
	// Headroom is the plan's headroom as a fraction (0.2: 20 %), and
	// HeadroomSessions the level a candidate must also meet the targets at,
	// HeadroomLevel(Concurrency, Headroom); both 0 without headroom (and in
	// a result from before it).
	Headroom         float64      `json:"headroom,omitempty"`
	HeadroomSessions int          `json:"headroom_sessions,omitempty"`
	Sessions         []int        `json:"sessions"`   // levels simulated, ascending
	DurationS        float64      `json:"duration_s"` // of one step
	Seed             uint64       `json:"seed"`
	Strategies       []string     `json:"strategies"`
	Spills           []string     `json:"spill_thresholds"`
	Targets          Targets      `json:"targets"`
	Workload         WorkloadInfo `json:"workload"`
	// CostUnit is "per hour" when the candidates are ranked by money (Cost
	// is then the sum of the GPUs' hourly prices), else "cards" (Cost is
	// the card count): by money whenever the plan mixes GPU kinds or gives
	// a price.
	CostUnit string `json:"cost_unit"`
	// Prices are the hourly prices the candidates were ranked by, one per
	// GPU kind in plan order, each with where it came from (price.go);
	// empty when ranked by card count.
	Prices []PriceUsed `json:"prices,omitempty"`
	// VLLMReleases are the vLLM releases the candidates were simulated as
	// ("0.26"), distinct, in plan order: the release decides admission,
	// the balancer and the KV sizing, so an answer holds for it alone.
	VLLMReleases []string `json:"vllm_releases,omitempty"`
	// Band says which runs make each KPI's low / nominal / high (band.go).
	Band BandInfo `json:"band"`

	// Candidates in plan order: farm sets, then GPUs, tensor parallel sizes
	// and replica counts as listed.
	Candidates []Candidate `json:"candidates"`
	// Best is the index in Candidates of the cheapest candidate that meets
	// the targets at Concurrency, or -1 when none does.
	Best int `json:"best"`
	// Closest, when Best is -1, is the index of the candidate that comes
	// closest (a marginal one first, see Closeness), or -1 when no candidate
	// fits at all.
	Closest int `json:"closest"`
	// Marginal are the indexes of the candidates whose verdict is marginal
	// and that are cheaper than Best (all marginal ones when Best is -1),
	// cheapest first: the answer's sentence names the first.
	Marginal []int `json:"marginal,omitempty"`
	// RoutingCards are, when the plan tries two strategies or more, each
	// one's cheapest farm that meets the targets (routings.go), in plan
	// order: the answer per routing, side by side.
	RoutingCards []RoutingCard `json:"routing_cards,omitempty"`
	// BuyerCheck, when the answer names a marginal candidate whose KV
	// cache or speed is estimated, says what to rent for an hour and run
	// to decide it, or what margin to buy instead (buyer.go).
	BuyerCheck *BuyerCheck `json:"buyer_check,omitempty"`
	// Reconcile is the answer's (Best, else Closest) Candidate.Reconcile.
	Reconcile string `json:"reconcile,omitempty"`
	// Timeline is the answer's farm (Best, else Closest) with its chosen
	// routing over the step at Concurrency, as PromQL range queries gave it;
	// nil when no candidate fits.
	Timeline *Timeline `json:"timeline,omitempty"`
	// Observation, for a plan of the farm a Prometheus watches
	// (SolveObserved), is its prediction against what was observed.
	Observation *Observation `json:"observation,omitempty"`
	// Skipped is the simulation work Solve left out because it could not
	// change the answer, and the warm-ups it did once for two uses
	// (skip.go); nil in a result from before it.
	Skipped *Skipped `json:"skipped,omitempty"`

	skips Skipped // counted while solving
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
	// Summary is the synthetic workload measured on the sessions the plan
	// simulated (traces.Summarize, the plan's seed): its figures and the
	// histogram of the requests' prompt lengths the report charts; for a
	// trace, the histogram of its requests alone.
	Summary *traces.WorkloadSummary `json:"summary,omitempty"`
	// PausedPct is the share of the sessions' time paused between turns
	// (tools, a person) on the answer's farm with its routing at the
	// wanted concurrency (sim.Row.PausedPct); 0 when nothing paused.
	PausedPct sim.Float `json:"paused_pct,omitempty"`
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
	Cards              int     `json:"cards"`                  // replicas x tensor parallel size
	VLLMRelease        string  `json:"vllm_release,omitempty"` // the vLLM release simulated, "0.26"
	Cost               float64 `json:"cost"`                   // see Result.CostUnit
	// CostPerHour (the GPUs' hourly prices summed) and CostPer1kTurns
	// (CostPerHour over the session-turns, requests, its chosen routing
	// finishes per hour at the wanted concurrency, x 1,000; null when none
	// finished) are given only when the plan has prices.
	CostPerHour    *float64   `json:"cost_per_hour,omitempty"`
	CostPer1kTurns *sim.Float `json:"cost_per_1k_turns,omitempty"`
	// TurnsPerHour are the session-turns (requests) the chosen routing
	// finishes per hour at the wanted concurrency, nominal run.
	TurnsPerHour sim.Float `json:"turns_per_hour"`

	// Fits is false when the model does not fit on the GPUs (or leaves no
	// room for a KV cache); Error then says why and nothing was simulated.
	Fits  bool   `json:"fits"`
	Error string `json:"error,omitempty"`
	// NotSimulated, for a candidate that fits, says why it was not
	// simulated: it costs more than a farm that meets the targets, so it
	// cannot be the answer (Solve: by cost, cheapest first; Plan.EveryCandidate
	// simulates it anyway), e.g. "it costs more than 16 x H100 SXM, which
	// meets the targets". Its Configs are then empty and Chosen is -1.
	NotSimulated string `json:"not_simulated,omitempty"`

	MaxNumSeqs   int `json:"max_num_seqs,omitempty"`
	NumGPUBlocks int `json:"num_gpu_blocks,omitempty"` // per replica, nominal
	// KVTokensPerReplica is NumGPUBlocks x block_size, the figure vLLM logs
	// as its KV cache size and `warden kv` prints; KVTokensTotal is that x
	// replicas. The rule of thumb and the report use these two.
	KVTokensPerReplica int   `json:"kv_tokens_per_replica,omitempty"`
	KVTokensTotal      int64 `json:"kv_tokens_total,omitempty"`
	// KVBand is false when the candidate's num_gpu_blocks is given (read
	// back from a server: no KV band, only seeds). KVTokensTotalBand is the
	// farm's KV tokens at the band's scales: low at x0.85, high at x1.10.
	KVBand            bool  `json:"kv_band"`
	KVTokensTotalBand Range `json:"kv_tokens_total_band"`
	// SpeedBand is false when the candidate's step_time gives both
	// efficiencies (calibrated: no speed band); else its engine is also
	// simulated 20 % slower and 20 % faster (band.go).
	SpeedBand bool `json:"speed_band"`
	// RuleOfThumb is concurrency x typical context against KVTokensTotal.
	RuleOfThumb hardware.Verdict `json:"rule_of_thumb"`
	// Reconcile is one sentence that sets the rule of thumb and the
	// simulation side by side and says why they agree or differ.
	Reconcile string `json:"reconcile,omitempty"`

	Configs []Config `json:"configs,omitempty"`
	// Chosen is the index in Configs of the routing to run this farm with:
	// among the configs that meet the targets at the wanted concurrency the
	// one with the lowest TTFB p95 there; when none meets, the closest one.
	// -1 when the farm does not fit.
	Chosen int `json:"chosen"`
	// Verdict is Configs[Chosen]'s at the wanted concurrency: "meets" when
	// the band's pessimistic edge meets every target there and at the
	// headroom level (Result.HeadroomSessions), "marginal" when only the
	// nominal run does, or when the pessimistic edge meets at the wanted
	// concurrency but not at the headroom level, else "misses". Meets is
	// Verdict == "meets".
	Verdict string `json:"verdict"`
	Meets   bool   `json:"meets"`
	// Why says, for a marginal candidate, what the nominal run meets and
	// which target the band's pessimistic edge misses, in which run; or,
	// marginal for want of headroom, where its cliff is.
	Why string `json:"why,omitempty"`
	// KPIs is Configs[Chosen]'s band at the wanted concurrency.
	KPIs *Band `json:"kpis,omitempty"`
	// MaxSessions is the highest number of concurrent sessions at which the
	// chosen routing still meets the targets at the band's pessimistic
	// edge, found by bisection between the last sessions level that meets
	// and the first that misses (or, when the highest level meets, upwards
	// to MaxSessionsCap: the highest level plus the sweep's last spacing); FailsAt is the number at which it stops (0 when
	// it still meets at the cap, or when no level meets, MaxSessions 0) and
	// FailsAtMisses what it misses there. Probes are the bands of the
	// levels the bisection simulated, ascending.
	MaxSessions    int        `json:"max_sessions"`
	FailsAt        int        `json:"fails_at"`
	FailsAtMisses  []BandMiss `json:"fails_at_misses,omitempty"`
	MaxSessionsCap int        `json:"max_sessions_cap,omitempty"`
	Probes         []Band     `json:"probes,omitempty"`

	decided bool // decideConfigs has decided its routing and verdict
}

// Config is one routing of one candidate: a strategy and, for affinity, a
// spill threshold, simulated at every sessions level.
type Config struct {
	Strategy string `json:"strategy"`
	Spill    string `json:"spill,omitempty"` // "" for strategies without a threshold
	// Rows are the simulator's rows, one per sessions level (Result.Sessions).
	Rows []sim.Row `json:"rows"`
	// Checks are the targets checked on each (nominal) row, in the same order.
	Checks []Check `json:"checks"`
	// Bands are each level over the band's runs (KV scales x speed scales
	// x seeds), in the same order, each with its verdict.
	Bands []Band `json:"bands"`
	// MaxSessions is the top of the first run of consecutive sessions
	// levels (scanning upwards) whose band verdict is meets; FailsAt is the
	// next level, where it stops being so (0 if it never does). Both are 0
	// when no level meets.
	MaxSessions int `json:"max_sessions"`
	FailsAt     int `json:"fails_at"`

	// runs are the rows of every band run (runs[0] = Rows), and vs the
	// runs' KV scales, speed scales and seeds; banded is the number of
	// levels, from the lowest, that every run simulated (above them only
	// the nominal run did: solve.go's simulate). Not kept in JSON.
	runs   [][]sim.Row
	vs     []variant
	banded int
	// ahead are the rows of the band's runs (runs[0]'s excepted) that went
	// on from the highest level to aheadAt sessions (skip.go); nil when
	// none did.
	ahead   []sim.Row
	aheadAt int
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
