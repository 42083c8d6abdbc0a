package sim

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/internal/strictyaml"
	"github.com/lm-warden/warden/placement"
)

// FarmSpec is a farm as written in YAML (see examples/ and issue 3):
//
//	name: 4x RTX A4000, Qwen3-4B
//	model: Qwen/Qwen3-4B-Instruct-2507     # or model_config: path/to/config.json
//	weights_dtype: bf16                     # bf16 | fp8 | int4
//	kv_cache_dtype: auto                    # auto | fp8
//	gpu: RTX A4000                          # or auto (NVML)
//	replicas: 4
//	tensor_parallel_size: 1
//	vllm: {max_num_seqs: 32, max_num_batched_tokens: 2048, gpu_memory_utilization: 0.9,
//	       block_size: 16, num_gpu_blocks: 0}
//	routing: {strategy: affinity, spill_threshold: auto, session_ttl: 30m}
//	scrape_interval: 1s
//	step_time: {prefill_efficiency: 0.5, bandwidth_efficiency: 0.8, step_overhead: 100us}
//
// Zero values mean "the default" (vLLM's where vLLM has one).
type FarmSpec struct {
	Name         string `yaml:"name"`
	Model        string `yaml:"model"`
	ModelConfig  string `yaml:"model_config"`
	WeightsDType string `yaml:"weights_dtype"`
	KVCacheDType string `yaml:"kv_cache_dtype"`
	GPU          string `yaml:"gpu"`
	// ECC is on, off or empty (as the card ships, hardware's catalogue):
	// ECC on a GDDR card costs 1/16 of its memory.
	ECC                string      `yaml:"ecc"`
	Replicas           int         `yaml:"replicas"`
	TensorParallelSize int         `yaml:"tensor_parallel_size"`
	VLLM               VLLMSpec    `yaml:"vllm"`
	Routing            RoutingSpec `yaml:"routing"`
	ScrapeInterval     Duration    `yaml:"scrape_interval"`
	// KVCapacityScale multiplies the KV blocks sized from hardware: the
	// estimate is uncertain by about +-15 % before a server runs, so a
	// planner simulates a band (0.85, 1.10). 0 means 1. It does not apply
	// to vllm.num_gpu_blocks, read back from a real server: that is exact.
	KVCapacityScale float64 `yaml:"kv_capacity_scale"`
	// SpeedScale multiplies the engine's speed: the step-time model's
	// effective FLOP/s and memory bandwidth (not its per-step overhead).
	// The roofline's efficiencies are defaults, not measurements of the
	// card, so a planner simulates a band (0.8, 1.2) unless the farm was
	// calibrated. 0 means 1.
	SpeedScale float64  `yaml:"speed_scale"`
	StepTime   StepTime `yaml:"step_time"`
}

// VLLMSpec holds the engine arguments of every replica.
type VLLMSpec struct {
	MaxNumSeqs           int     `yaml:"max_num_seqs"`
	MaxNumBatchedTokens  int     `yaml:"max_num_batched_tokens"`
	GPUMemoryUtilization float64 `yaml:"gpu_memory_utilization"`
	BlockSize            int     `yaml:"block_size"`
	// NumGPUBlocks, when > 0, is num_gpu_blocks read back from a real
	// server (vllm:cache_config_info); 0 sizes the cache from hardware.
	NumGPUBlocks int `yaml:"num_gpu_blocks"`
	MaxModelLen  int `yaml:"max_model_len"`
	// Version is the vLLM release modelled, "MAJOR.MINOR" (default
	// DefaultVLLMVersion); it selects the version-dependent behaviour of
	// VLLMBehaviour.
	Version string `yaml:"version"`
	// ReserveFullISL is scheduler_reserve_full_isl: "true" or "false" (a
	// YAML boolean); empty: the version's default. Resolved, it is one of
	// the two.
	ReserveFullISL string `yaml:"scheduler_reserve_full_isl"`
	// Watermark is the fraction of KV blocks kept free when admitting a
	// waiting request (vLLM's --watermark, default 0).
	Watermark float64 `yaml:"watermark"`
	// APIServerCount is vLLM's --api-server-count: the API servers in
	// front of the data-parallel engines, each balancing on its own (the
	// least-loaded strategy); 0 means vLLM's default, the DP size.
	APIServerCount int `yaml:"api_server_count"`
	// StatsUpdateInterval is how often, at most, the DP coordinator
	// publishes the engines' counts to the API servers when one changed
	// (vLLM: 100 ms). Whether the engines report any is the release's
	// (vllm.go: none for a dense model up to 0.26).
	StatsUpdateInterval Duration `yaml:"stats_update_interval"`
}

// What the least-loaded strategy runs (RoutingSpec.Balancer).
const (
	BalancerVLLM   = "vllm"
	BalancerWarden = "warden"
)

// DefaultStatsUpdateInterval is the DP coordinator's publishing interval
// (vllm/v1/engine/coordinator.py, stats_update_interval_ms = 100).
const DefaultStatsUpdateInterval = 100 * time.Millisecond

// DefaultVLLMVersion is the release the simulator models unless a farm says
// otherwise: the one of the product's published benchmark.
const DefaultVLLMVersion = "0.26"

// parseVLLMVersion reads "0.26", "0.26.0" or "v0.26.1" as {0, 26}.
func parseVLLMVersion(v string) ([2]int, bool) {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	parts := strings.Split(v, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return [2]int{}, false
	}
	var out [2]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 1000 {
			return [2]int{}, false
		}
		if i < 2 {
			out[i] = n
		}
	}
	return out, true
}

func versionAtLeast(v, since [2]int) bool {
	return v[0] > since[0] || (v[0] == since[0] && v[1] >= since[1])
}

// RoutingSpec is the router's configuration.
type RoutingSpec struct {
	Strategy       string   `yaml:"strategy"`        // hash | least-loaded | affinity
	SpillThreshold string   `yaml:"spill_threshold"` // auto | N
	SessionTTL     Duration `yaml:"session_ttl"`
	// Balancer is what the least-loaded strategy runs: BalancerVLLM
	// ("vllm", the default: vLLM's own data-parallel front end, its API
	// servers balancing on the coordinator's counts) or BalancerWarden
	// ("warden": warden proxy with affinity off, placement.LeastLoaded on
	// the scraped counts, in front of one server per replica).
	Balancer string `yaml:"balancer"`
	// ActiveWindow: a session counts as load (conversations held) while
	// seen within it; 0: learned from the sessions' gaps (placement).
	ActiveWindow Duration `yaml:"active_window"`
	MaxSessions  int      `yaml:"max_sessions"`
	// Balance is what affinity balances new conversations on: sessions
	// (the default, the load score) or kv (the most KV headroom).
	Balance string `yaml:"balance"`
	// Admission is off (the default) or kv: a new conversation whose
	// expected footprint fits on no replica waits at the router, FIFO.
	Admission string `yaml:"admission"`
	// AdmissionTimeout refuses a conversation that waited longer (429 or
	// 529 in the proxy); 0 waits as long as it takes.
	AdmissionTimeout Duration `yaml:"admission_timeout"`
}

// Duration is the duration of a farm spec or a plan: strictyaml's, with
// negative values read as written (AnySign); the sections that must refuse
// them do, by key (Resolve).
type Duration = strictyaml.Duration[strictyaml.AnySign]

// MaxReplicas bounds a farm's replica count (each has its own block pool).
const MaxReplicas = 4096

// Defaults of a farm spec where vLLM has none.
const (
	DefaultScrapeInterval = time.Second
	DefaultBlockSize      = 16
)

// Farm is a resolved farm: the spec with every default filled, the hardware
// looked up and the KV cache sized.
type Farm struct {
	Spec       FarmSpec // as resolved: defaults filled
	GPU        hardware.GPU
	Model      hardware.Model
	Deployment hardware.Deployment
	// Sizing is hardware's estimate of one replica's KV cache; when the
	// spec gives num_gpu_blocks, NumGPUBlocks is that value instead.
	Sizing       hardware.KVSizing
	NumGPUBlocks int
	Spill        placement.SpillThreshold
	Balance      placement.Balance
	Admission    placement.Admission
	Behaviour    VLLMBehaviour
}

// Name is the farm's display name.
func (f *Farm) Name() string { return f.Spec.Name }

// KVTokensPerReplica is the KV capacity of one replica in tokens
// (usable blocks x block size).
func (f *Farm) KVTokensPerReplica() int { return (f.NumGPUBlocks - 1) * f.Spec.VLLM.BlockSize }

// LoadFarm reads and resolves a farm spec file.
func LoadFarm(path string) (*Farm, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseFarm(data, path)
}

// ParseFarm parses and resolves a farm spec; name is used in errors, which
// read "name:line: key: reason".
func ParseFarm(data []byte, name string) (*Farm, error) {
	return ParseFarmWith(data, name, nil)
}

// ParseFarmWith is ParseFarm with edit, when not nil, applied to the spec
// before it is resolved (command-line overrides such as --replicas).
func ParseFarmWith(data []byte, name string, edit func(*FarmSpec)) (*Farm, error) {
	spec, doc, err := parseFarmSpec(data, name)
	if err != nil {
		return nil, err
	}
	if edit != nil {
		edit(&spec)
	}
	f, err := Resolve(spec)
	if err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			if l, ok := doc.Line(fe.key); ok {
				return nil, fmt.Errorf("%s:%d: %w", name, l, err)
			}
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return f, nil
}

func parseFarmSpec(data []byte, name string) (FarmSpec, *strictyaml.Doc, error) {
	var spec FarmSpec
	doc, err := strictyaml.Decode(name, data, &spec)
	if err == nil && doc.Empty() {
		err = fmt.Errorf("%s: empty farm spec (want at least model and gpu)", name)
	}
	return spec, doc, err
}

// fieldError is a bad value; key is its dotted YAML path.
type fieldError struct {
	key, reason string
	err         error // the cause, if any (hardware.NoFitError, say)
}

func (e *fieldError) Error() string { return e.key + ": " + e.reason }
func (e *fieldError) Unwrap() error { return e.err }

func bad(key, format string, args ...any) error {
	return &fieldError{key: key, reason: fmt.Sprintf(format, args...)}
}

// Resolve checks a spec, fills its defaults, looks up its GPU and model and
// sizes its KV cache. Errors name the spec key at fault. Each section fills
// its own defaults and checks its own keys (resolveHardware, resolveShape,
// VLLMSpec.resolve, RoutingSpec.resolve, StepTime, resolveKV), in the
// order of the keys.
func Resolve(spec FarmSpec) (*Farm, error) {
	s := spec
	model, gpu, err := s.resolveHardware()
	if err != nil {
		return nil, err
	}
	if err := s.resolveShape(); err != nil {
		return nil, err
	}
	behaviour, err := s.VLLM.resolve(gpu, model, s.Replicas)
	if err != nil {
		return nil, err
	}
	routing, err := s.Routing.resolve()
	if err != nil {
		return nil, err
	}
	if s.ScrapeInterval == 0 {
		s.ScrapeInterval = Duration(DefaultScrapeInterval)
	}
	if time.Duration(s.ScrapeInterval) < time.Millisecond {
		return nil, bad("scrape_interval", "must be >= 1ms, got %s", time.Duration(s.ScrapeInterval))
	}
	s.StepTime = s.StepTime.withDefaults()
	if err := s.StepTime.validate(); err != nil {
		return nil, err
	}
	f := &Farm{GPU: gpu, Model: model, Spill: routing.spill, Balance: routing.balance, Admission: routing.admission, Behaviour: behaviour}
	if err := s.resolveKV(f); err != nil {
		return nil, err
	}
	if s.Name == "" {
		s.Name = fmt.Sprintf("%d x %s, %s", s.Replicas*s.TensorParallelSize, gpu.Name, model.Name)
	}
	f.Spec = s
	return f, nil
}

// resolveHardware checks model (or model_config) and gpu and looks them
// up; a spec of model_config gets the config's model name.
func (s *FarmSpec) resolveHardware() (hardware.Model, hardware.GPU, error) {
	var (
		model hardware.Model
		gpu   hardware.GPU
		err   error
	)
	if s.Model == "" && s.ModelConfig == "" {
		return model, gpu, bad("model", "required (a model name, or model_config: path/to/config.json)")
	}
	if s.Model != "" && s.ModelConfig != "" {
		return model, gpu, bad("model_config", "give model or model_config, not both")
	}
	if s.GPU == "" {
		return model, gpu, bad("gpu", "required (a GPU name such as \"RTX A4000\", or auto)")
	}
	if s.ModelConfig != "" {
		model, err = hardware.LoadHFConfig(s.ModelConfig)
		if err != nil {
			return model, gpu, bad("model_config", "%v", err)
		}
	} else {
		model, err = hardware.LookupModel(s.Model)
		if err != nil {
			return model, gpu, bad("model", "%v", err)
		}
	}
	if s.Model == "" {
		s.Model = model.Name
	}
	if s.GPU == "auto" {
		gpu, err = probeGPU()
		if err != nil {
			return model, gpu, bad("gpu", "auto: %v", err)
		}
	} else {
		gpu, err = hardware.LookupGPU(s.GPU)
		if err != nil {
			return model, gpu, bad("gpu", "%v", err)
		}
	}
	return model, gpu, nil
}

// resolveShape fills and checks the dtypes, the replicas and the tensor
// parallel size.
func (s *FarmSpec) resolveShape() error {
	switch s.WeightsDType {
	case "":
		s.WeightsDType = string(hardware.BF16)
	case string(hardware.BF16), string(hardware.FP8), string(hardware.INT4):
	default:
		return bad("weights_dtype", "must be bf16, fp8 or int4, got %q", s.WeightsDType)
	}
	switch s.KVCacheDType {
	case "":
		s.KVCacheDType = "auto"
	case "auto", string(hardware.FP8):
	default:
		return bad("kv_cache_dtype", "must be auto or fp8, got %q", s.KVCacheDType)
	}
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	if s.Replicas < 1 || s.Replicas > MaxReplicas {
		return bad("replicas", "must be in [1, %d], got %d", MaxReplicas, s.Replicas)
	}
	if s.TensorParallelSize == 0 {
		s.TensorParallelSize = 1
	}
	if s.TensorParallelSize < 1 {
		return bad("tensor_parallel_size", "must be >= 1, got %d", s.TensorParallelSize)
	}
	return nil
}

// resolve fills and checks the engine arguments of a farm of replicas
// replicas of model on gpu, and returns the behaviour of its vLLM release.
func (v *VLLMSpec) resolve(gpu hardware.GPU, model hardware.Model, replicas int) (VLLMBehaviour, error) {
	// vLLM's defaults for the OpenAI server (hardware.VLLMSchedulerDefaults):
	// 256 sequences and 2048 batched tokens, or 1024 and 8192 on GPUs of
	// 70 GiB or more other than the A100.
	defSeqs, defBatched := hardware.VLLMSchedulerDefaults(gpu)
	if v.MaxNumSeqs == 0 {
		v.MaxNumSeqs = defSeqs
	}
	if v.MaxNumSeqs < 1 {
		return VLLMBehaviour{}, bad("vllm.max_num_seqs", "must be >= 1, got %d", v.MaxNumSeqs)
	}
	if v.MaxNumBatchedTokens == 0 {
		v.MaxNumBatchedTokens = defBatched
	}
	if v.MaxNumBatchedTokens < 1 {
		return VLLMBehaviour{}, bad("vllm.max_num_batched_tokens", "must be >= 1, got %d", v.MaxNumBatchedTokens)
	}
	if v.GPUMemoryUtilization == 0 {
		v.GPUMemoryUtilization = 0.9
	}
	if !(v.GPUMemoryUtilization > 0 && v.GPUMemoryUtilization <= 1) {
		return VLLMBehaviour{}, bad("vllm.gpu_memory_utilization", "must be in (0, 1], got %g", v.GPUMemoryUtilization)
	}
	if v.BlockSize == 0 {
		v.BlockSize = DefaultBlockSize
	}
	if v.BlockSize < 1 || v.BlockSize > 1024 {
		return VLLMBehaviour{}, bad("vllm.block_size", "must be in [1, 1024], got %d", v.BlockSize)
	}
	if v.NumGPUBlocks < 0 || v.NumGPUBlocks == 1 {
		return VLLMBehaviour{}, bad("vllm.num_gpu_blocks", "must be 0 (size from hardware) or >= 2, got %d", v.NumGPUBlocks)
	}
	if v.MaxModelLen < 0 {
		return VLLMBehaviour{}, bad("vllm.max_model_len", "must be >= 0, got %d", v.MaxModelLen)
	}
	if v.Version == "" {
		v.Version = DefaultVLLMVersion
	}
	version, err := ParseVLLMVersion(v.Version)
	if err != nil {
		return VLLMBehaviour{}, bad("vllm.version", "%v", err)
	}
	behaviour := VLLMBehaviourFor(version, model)
	switch v.ReserveFullISL {
	case "":
		v.ReserveFullISL = strconv.FormatBool(behaviour.ReserveFullISL)
	case "true", "false":
	default:
		return behaviour, bad("vllm.scheduler_reserve_full_isl", "want true or false, got %q", v.ReserveFullISL)
	}
	if v.APIServerCount == 0 {
		v.APIServerCount = replicas
	}
	if v.APIServerCount < 1 || v.APIServerCount > 1024 {
		return behaviour, bad("vllm.api_server_count", "must be in [1, 1024] (0 = the DP size), got %d", v.APIServerCount)
	}
	if v.StatsUpdateInterval == 0 {
		v.StatsUpdateInterval = Duration(DefaultStatsUpdateInterval)
	}
	if time.Duration(v.StatsUpdateInterval) < time.Millisecond || time.Duration(v.StatsUpdateInterval) > time.Minute {
		return behaviour, bad("vllm.stats_update_interval", "must be in [1ms, 1m], got %s", time.Duration(v.StatsUpdateInterval))
	}
	if !(v.Watermark >= 0 && v.Watermark < 1) {
		return behaviour, bad("vllm.watermark", "must be in [0, 1), got %g", v.Watermark)
	}
	return behaviour, nil
}

// resolvedRouting is what a routing block resolves to.
type resolvedRouting struct {
	spill     placement.SpillThreshold
	balance   placement.Balance
	admission placement.Admission
}

// resolve fills and checks the routing block.
func (r *RoutingSpec) resolve() (resolvedRouting, error) {
	var out resolvedRouting
	if r.Strategy == "" {
		r.Strategy = placement.StrategyAffinity
	}
	if _, ok := placement.LookupStrategy(r.Strategy); !ok {
		return out, bad("routing.strategy", "must be one of %s, got %q", strings.Join(placement.Strategies(), ", "), r.Strategy)
	}
	if r.SpillThreshold == "" {
		r.SpillThreshold = "auto"
	}
	var err error
	if out.spill, err = placement.ParseSpillThreshold(r.SpillThreshold); err != nil {
		return out, bad("routing.spill_threshold", "%v", err)
	}
	if r.Balance == "" {
		r.Balance = placement.BalanceSessions.String()
	}
	if out.balance, err = placement.ParseBalance(r.Balance); err != nil {
		return out, bad("routing.balance", "want sessions or kv, got %q", r.Balance)
	}
	if r.Admission == "" {
		r.Admission = placement.AdmissionOff.String()
	}
	if out.admission, err = placement.ParseAdmission(r.Admission); err != nil {
		return out, bad("routing.admission", "want off or kv, got %q", r.Admission)
	}
	if r.AdmissionTimeout < 0 {
		return out, bad("routing.admission_timeout", "must be >= 0 (0 = wait as long as it takes), got %s", time.Duration(r.AdmissionTimeout))
	}
	if r.SessionTTL == 0 {
		r.SessionTTL = Duration(placement.DefaultSessionTTL)
	}
	if r.SessionTTL < 0 {
		return out, bad("routing.session_ttl", "must be > 0")
	}
	switch r.Balancer {
	case "":
		r.Balancer = BalancerVLLM
	case BalancerVLLM, BalancerWarden:
	default:
		return out, bad("routing.balancer", "want %s or %s, got %q", BalancerVLLM, BalancerWarden, r.Balancer)
	}
	if r.ActiveWindow < 0 {
		return out, bad("routing.active_window", "must be >= 0 (0 = learned from the sessions' gaps, from %s up)", placement.DefaultActiveWindow)
	}
	if r.MaxSessions < 0 {
		return out, bad("routing.max_sessions", "must be >= 0 (0 = default), got %d", r.MaxSessions)
	}
	return out, nil
}

// resolveKV checks ecc and the capacity and speed scales and sizes f's KV
// cache on f's GPU and model (the deployment, its sizing, the blocks).
func (s *FarmSpec) resolveKV(f *Farm) error {
	v := &s.VLLM
	ecc, err := hardware.ParseECC(s.ECC)
	if err != nil {
		return bad("ecc", "%v", err)
	}
	if _, _, err := hardware.TotalMemory(f.GPU, ecc); err != nil {
		return bad("ecc", "%v", err)
	}
	kvDType := hardware.DType(s.KVCacheDType)
	if s.KVCacheDType == "auto" {
		kvDType = hardware.BF16
	}
	f.Deployment = hardware.Deployment{
		GPU:                  f.GPU,
		Model:                f.Model,
		WeightsDType:         hardware.DType(s.WeightsDType),
		KVCacheDType:         kvDType,
		TensorParallelSize:   s.TensorParallelSize,
		GPUMemoryUtilization: v.GPUMemoryUtilization,
		BlockSize:            v.BlockSize,
		MaxModelLen:          v.MaxModelLen,
		MaxNumSeqs:           v.MaxNumSeqs,
		MaxNumBatchedTokens:  v.MaxNumBatchedTokens,
		ECC:                  ecc,
		ModelRunner:          f.Behaviour.ModelRunner,
	}
	f.Sizing, err = hardware.SizeKV(f.Deployment)
	if err != nil && v.NumGPUBlocks == 0 {
		return &fieldError{key: "gpu", reason: err.Error(), err: err}
	}
	if s.KVCapacityScale == 0 {
		s.KVCapacityScale = 1
	}
	if !(s.KVCapacityScale >= 0.1 && s.KVCapacityScale <= 10) {
		return bad("kv_capacity_scale", "must be in [0.1, 10] (0 = 1), got %g", s.KVCapacityScale)
	}
	if s.SpeedScale == 0 {
		s.SpeedScale = 1
	}
	if !(s.SpeedScale >= 0.1 && s.SpeedScale <= 10) {
		return bad("speed_scale", "must be in [0.1, 10] (0 = 1), got %g", s.SpeedScale)
	}
	blocks := v.NumGPUBlocks
	if blocks == 0 {
		blocks = int(float64(f.Sizing.KVBlocksPerReplica) * s.KVCapacityScale)
	}
	if blocks > math.MaxInt32 {
		// Blocks are numbered by int32 (blockpool.go).
		return bad("vllm.num_gpu_blocks", "must be at most %d, got %d", math.MaxInt32, blocks)
	}
	if blocks < 2 {
		return bad("gpu", "%s on %d x %s leaves no room for a KV cache (%d blocks)", f.Model.Name, s.TensorParallelSize, f.GPU.Name, blocks)
	}
	f.NumGPUBlocks = blocks
	return nil
}

// probeGPU returns the first local GPU as NVML reports it (gpu: auto).
func probeGPU() (hardware.GPU, error) {
	gpus, err := hardware.Probe()
	if err != nil {
		return hardware.GPU{}, err
	}
	if len(gpus) == 0 {
		return hardware.GPU{}, errors.New("NVML reports no GPU")
	}
	g := gpus[0].AsGPU()
	if g.MemoryBandwidthBytesPerSec == 0 || g.BF16FLOPS == 0 {
		return hardware.GPU{}, fmt.Errorf("%s is not in the catalogue (its bandwidth and FLOP/s are unknown); name a catalogue GPU", g.Name)
	}
	return g, nil
}
