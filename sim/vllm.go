package sim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/hardware"
)

// This file is the one table of vLLM's releases that the simulator models:
// each switch is a change of vLLM's behaviour that moves a figure the
// simulator prints, with the pull request that made it, the file and
// function it changed, when it was merged and the first release that
// carries it. vllm.version picks the row; VLLMBehaviourFor reads it.
// testdata/vllm/versions.golden prints the table and what every release
// from 0.13 to 0.28 does (TestVLLMVersionTable; -update rewrites it).
//
// Where a first release is inferred rather than read off a tag, Evidence
// says so and how. Dates are those of vLLM's release notes and GitHub.

// DPBalancer is the load balancer of vLLM's data-parallel front end
// (vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request)
// as a release runs it for the model served.
type DPBalancer int

const (
	// DPPublishedFixed: every data-parallel rank is a DPEngineCoreProc that
	// publishes its [waiting, running] counts after each step
	// (_maybe_publish_request_counts); the coordinator forwards them at
	// most every 100 ms; each API server scores 4 x waiting + running from
	// a fixed eng_start_index. Releases before 0.14 for every model. (Those
	// releases also ran a dense model's ranks in lockstep waves, which the
	// simulator does not model.)
	DPPublishedFixed DPBalancer = iota
	// DPBlindFixed: a dense model's ranks run as plain EngineCoreProc
	// (PR #30739), which never publishes counts; the coordinator
	// republishes its own, all zero, every 5 s; each API server scores its
	// local increments only (+client_count per pick, reset by each
	// republish) from a fixed start: a rotation blind to load and caches.
	// Dense models, 0.14 to 0.24.
	DPBlindFixed
	// DPBlindRotating: as DPBlindFixed, and the start index advances after
	// every pick (PR #47420). Dense models, 0.25 and 0.26.
	DPBlindRotating
	// DPPublishedInFlight: EngineCoreProc publishes its counts too
	// (PR #49204); each API server scores max(client_count x its own
	// in-flight requests on the engine, waiting + running), plus
	// waiting x 6 x max(0, kv_cache_usage - 0.5), from a rotating start.
	// From 0.27.
	DPPublishedInFlight
)

func (b DPBalancer) String() string {
	switch b {
	case DPPublishedFixed:
		return "published counts, 4 x waiting + running, fixed start"
	case DPBlindFixed:
		return "no counts published (all zero), local increments, fixed start: load-blind rotation"
	case DPBlindRotating:
		return "no counts published (all zero), local increments, rotating start: load-blind rotation"
	case DPPublishedInFlight:
		return "published counts, max(client_count x own in-flight, waiting + running) + KV-pressure penalty, rotating start"
	}
	return "DPBalancer(" + strconv.Itoa(int(b)) + ")"
}

// Model runners (VLLMBehaviour.ModelRunner), as hardware.Deployment takes
// them.
const (
	ModelRunnerV1 = hardware.ModelRunnerV1
	ModelRunnerV2 = hardware.ModelRunnerV2
)

// VLLMBehaviour is what the modelled vLLM release does, for the model it
// serves.
type VLLMBehaviour struct {
	Version [2]int
	// ReserveFullISL is scheduler_reserve_full_isl's default: a waiting
	// request is admitted only if its whole sequence fits (PR #37307).
	ReserveFullISL bool
	// StatsAtAdmission: prefix-cache queries and hits are counted once, when
	// a request is admitted (PR #48860); before it, at every lookup, so a
	// request blocked at the head of the queue is counted every step.
	StatsAtAdmission bool
	// Balancer is what the data-parallel front end balances on.
	Balancer DPBalancer
	// ModelRunner is ModelRunnerV1 or ModelRunnerV2, the default runner
	// for the model in this release; it decides how the start-up profile
	// counts CUDA graphs (hardware.SizeKV).
	ModelRunner string
	// ModelRunnerSwitch names the change that made ModelRunnerV2 the
	// default for the model, e.g. "PR #39337 (0.22): Model Runner V2 is
	// the default runner for Qwen3 dense models"; "" for V1.
	ModelRunnerSwitch string
	// RepublishIntervalUs is how often the DP coordinator republishes its
	// counts when none changed (coordinator.py process_input_socket:
	// the poll's timeout when stats_changed is false), µs.
	RepublishIntervalUs int64
}

// DefaultRepublishInterval is the DP coordinator's idle republication
// period, µs (coordinator.py process_input_socket: 5000 ms when no count
// changed; earlier releases used 3000 and 4000 ms; the audit of 0.26 reads
// 5000).
const DefaultRepublishInterval = 5_000_000

// vllmSwitch is one row of the table.
type vllmSwitch struct {
	Key      string
	What     string
	PR       string // vllm-project/vllm pull request
	Code     string // file and function it changed
	Merged   string // merge date, or "" when unknown
	Since    [2]int // first release that carries it
	Evidence string // how Since was established
	// Applies limits the switch to some models (nil: every model).
	Applies func(hardware.Model) bool
}

func dense(m hardware.Model) bool { return !m.IsMoE() }

// family reports whether a dense model's name names one of the families.
func family(names ...string) func(hardware.Model) bool {
	return func(m hardware.Model) bool {
		if m.IsMoE() {
			return false
		}
		n := strings.ToLower(m.Name)
		for _, f := range names {
			if strings.Contains(n, f) {
				return true
			}
		}
		return false
	}
}

// vllmSwitches is the table, oldest first.
var vllmSwitches = []vllmSwitch{
	{
		Key:      "dense_dp_independent",
		What:     "a dense model's data-parallel ranks run as independent EngineCoreProc (DP 1 each), which never publish request counts",
		PR:       "#30739",
		Code:     "vllm/v1/engine/core.py EngineCoreProc.run_engine_core (\"Non-MoE DP ranks are completely independent, so treat like DP=1\")",
		Merged:   "2025-12",
		Since:    [2]int{0, 14},
		Evidence: "released in 0.14.0 (TRL's documentation of the PR; vllm-ascend's 0.14 adaptation)",
		Applies:  dense,
	},
	{
		Key:      "reserve_full_isl",
		What:     "scheduler_reserve_full_isl on by default: a waiting request is admitted only if its whole sequence fits; the waiting loop stops at the first that does not",
		PR:       "#37307",
		Code:     "vllm/v1/core/sched/scheduler.py Scheduler.schedule (allocate_slots(full_sequence_must_fit=...)); vllm/config/scheduler.py",
		Merged:   "2026-03 (opened 2026-03-17); the default on by 2026-05-19",
		Since:    [2]int{0, 22},
		Evidence: "inferred: NVIDIA Dynamo's mocker mirrored the upstream default (true) on 2026-05-19 (ai-dynamo/dynamo#9721); 0.22.0 (2026-06-10) is the first release known to follow that date; set vllm.scheduler_reserve_full_isl to override",
	},
	{
		Key:      "mrv2_qwen3",
		What:     "Model Runner V2 is the default runner for Qwen3 dense models",
		PR:       "#39337",
		Code:     "vllm/v1/worker/gpu/model_runner.py (Model Runner V2); vllm/v1/worker/gpu_worker.py Worker.determine_available_memory",
		Merged:   "2026-06",
		Since:    [2]int{0, 22},
		Evidence: "0.22.0 release notes (2026-06-10): \"MRv2 is now default for Qwen3 dense models (#39337)\"",
		Applies:  family("qwen3"),
	},
	{
		Key:      "mrv2_llama_mistral",
		What:     "Model Runner V2 is the default runner for Llama and Mistral dense models",
		PR:       "#43458",
		Code:     "vllm/v1/worker/gpu/model_runner.py (Model Runner V2)",
		Merged:   "2026-06",
		Since:    [2]int{0, 23},
		Evidence: "0.23.0 release notes (2026-06-22): \"MRv2 is now selected by default for Llama and Mistral dense models (#43458)\"",
		Applies:  family("llama", "mistral"),
	},
	{
		Key:      "mrv2_dense",
		What:     "Model Runner V2 is the default runner for every dense model",
		PR:       "#44443",
		Code:     "vllm/v1/worker/gpu/model_runner.py (Model Runner V2)",
		Merged:   "2026-07",
		Since:    [2]int{0, 25},
		Evidence: "0.25.0 release notes (2026-07-11): \"Model Runner V2 is now the default for all dense models (#44443)\"",
		Applies:  dense,
	},
	{
		Key:      "dp_lb_rotation",
		What:     "each API server advances its scan start (eng_start_index) after every pick",
		PR:       "#47420",
		Code:     "vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request",
		Merged:   "2026-07 (opened 2026-07-02)",
		Since:    [2]int{0, 25},
		Evidence: "the issue's audit of the 0.25.0 tag; vllm#52463 (open) reports the rotation breaking multi-turn locality on the latest release",
	},
	{
		Key:      "prefix_stats_at_admission",
		What:     "prefix-cache queries and hits are recorded once, at admission (KVCacheManager.record_prefix_cache_stats), not at every lookup of a waiting request",
		PR:       "#48860",
		Code:     "vllm/v1/core/kv_cache_manager.py KVCacheManager.get_computed_blocks / record_prefix_cache_stats; vllm/v1/core/sched/scheduler.py Scheduler.schedule",
		Merged:   "2026-07-21 (opened 2026-07-16)",
		Since:    [2]int{0, 27},
		Evidence: "inferred not in 0.26.0 (tagged 2026-07-25): 0.26.0 holds 411 commits after 0.25.0 against ~60 a day on main, so its branch was cut about a week after 0.25.0's, before the PR was opened; it is not among 0.26.0's highlights",
	},
	{
		Key:      "dp_lb_published",
		What:     "EngineCoreProc publishes request counts too, and the API servers score max(client_count x own in-flight, waiting + running) + waiting x 6 x max(0, kv_cache_usage - 0.5)",
		PR:       "#49204",
		Code:     "vllm/v1/engine/core.py EngineCoreProc._maybe_publish_request_counts; vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request",
		Merged:   "2026-07-27",
		Since:    [2]int{0, 27},
		Evidence: "merged two days after 0.26.0 (2026-07-25); the PR: \"these stats were not actually getting published\" (fixes vllm#48808)",
		Applies:  dense,
	},
}

// switchOn reports whether the switch named key is on for version and m.
func switchOn(key string, version [2]int, m hardware.Model) bool {
	s := switchNamed(key)
	return versionAtLeast(version, s.Since) && (s.Applies == nil || s.Applies(m))
}

func switchNamed(key string) *vllmSwitch {
	for i := range vllmSwitches {
		if vllmSwitches[i].Key == key {
			return &vllmSwitches[i]
		}
	}
	panic("sim: no vLLM switch " + key)
}

// moeBalancerError is returned when vLLM's own
// balancer would run a mixture-of-experts model, whose ranks vLLM runs in
// lockstep waves (DPEngineCoreProc), which the simulator does not model.
type moeBalancerError struct{ model string }

func (e *moeBalancerError) Error() string {
	return fmt.Sprintf("%s is a mixture-of-experts model: vLLM runs its data-parallel ranks in lockstep waves (vllm/v1/engine/core.py run_engine_core: DPEngineCoreProc, dummy batches on idle ranks, an all-reduce every step), which the simulator does not model; simulate it behind warden (routing.balancer: warden) or with another strategy", e.model)
}

// VLLMBehaviourFor returns what release version does for model m.
func VLLMBehaviourFor(version [2]int, m hardware.Model) VLLMBehaviour {
	b := VLLMBehaviour{
		Version:             version,
		ReserveFullISL:      switchOn("reserve_full_isl", version, m),
		StatsAtAdmission:    switchOn("prefix_stats_at_admission", version, m),
		ModelRunner:         ModelRunnerV1,
		RepublishIntervalUs: DefaultRepublishInterval,
	}
	for _, key := range []string{"mrv2_qwen3", "mrv2_llama_mistral", "mrv2_dense"} {
		if switchOn(key, version, m) {
			sw := switchNamed(key)
			b.ModelRunner = ModelRunnerV2
			b.ModelRunnerSwitch = fmt.Sprintf("PR %s (%d.%d): %s", sw.PR, sw.Since[0], sw.Since[1], sw.What)
			break
		}
	}
	switch {
	case m.IsMoE() || !switchOn("dense_dp_independent", version, m):
		b.Balancer = DPPublishedFixed
	case switchOn("dp_lb_published", version, m):
		b.Balancer = DPPublishedInFlight
	case switchOn("dp_lb_rotation", version, m):
		b.Balancer = DPBlindRotating
	default:
		b.Balancer = DPBlindFixed
	}
	return b
}

// The releases the table was audited for: testdata/vllm prints what each
// of them does. A release outside them is refused rather than taken as
// the nearest one: the table cannot say what it does (a later release may
// have changed any of the behaviours above).
var (
	oldestKnownVLLM = [2]int{0, 13}
	newestKnownVLLM = [2]int{0, 28}
)

// KnownVLLMReleases lists the releases the simulator's table knows,
// oldest first: "0.13" to "0.28".
func KnownVLLMReleases() []string {
	var out []string
	for v := oldestKnownVLLM; !versionAtLeast(v, [2]int{newestKnownVLLM[0], newestKnownVLLM[1] + 1}); v[1]++ {
		out = append(out, fmt.Sprintf("%d.%d", v[0], v[1]))
	}
	return out
}

// ParseVLLMVersion reads "0.26", "0.26.0" or "v0.26.1" as {0, 26}, and
// refuses a release the table does not know (KnownVLLMReleases).
func ParseVLLMVersion(v string) ([2]int, error) {
	out, ok := parseVLLMVersion(v)
	if !ok {
		return out, fmt.Errorf("want a vLLM release such as \"0.26\" or \"0.26.1\", got %q", v)
	}
	if !versionAtLeast(out, oldestKnownVLLM) || versionAtLeast(out, [2]int{newestKnownVLLM[0], newestKnownVLLM[1] + 1}) {
		known := KnownVLLMReleases()
		return out, fmt.Errorf("vLLM %d.%d is not a release the simulator's table knows (%s to %s: %s); it cannot say what that release does",
			out[0], out[1], known[0], known[len(known)-1], strings.Join(known, ", "))
	}
	return out, nil
}

// VLLMRelease writes a release as "0.26".
func VLLMRelease(v [2]int) string { return fmt.Sprintf("%d.%d", v[0], v[1]) }
