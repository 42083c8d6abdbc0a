package sim

import (
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/examples"
	"github.com/lm-warden/warden/placement"
)

func mustDefaultFarm(t testing.TB) *Farm {
	t.Helper()
	f, err := ParseFarm(examples.Default, examples.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func mustExampleFarm(t testing.TB, name string) *Farm {
	t.Helper()
	data, err := fs.ReadFile(examples.FS, name)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseFarm(data, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestExampleFarms(t *testing.T) {
	entries, err := fs.ReadDir(examples.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 3 {
		t.Fatalf("examples holds %d farms, want at least 3", len(entries))
	}
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) {
			f := mustExampleFarm(t, e.Name())
			if f.NumGPUBlocks < 1000 {
				t.Errorf("%d KV blocks per replica: implausibly few", f.NumGPUBlocks)
			}
			t.Logf("%s: %d replicas x TP %d, %d blocks = %d KV tokens per replica, max_num_seqs %d, batched %d",
				f.Name(), f.Spec.Replicas, f.Spec.TensorParallelSize, f.NumGPUBlocks, f.KVTokensPerReplica(),
				f.Spec.VLLM.MaxNumSeqs, f.Spec.VLLM.MaxNumBatchedTokens)
		})
	}
}

func TestDefaultFarm(t *testing.T) {
	f := mustDefaultFarm(t)
	v := f.Spec.VLLM
	if f.Spec.Replicas != 4 || v.MaxNumSeqs != 32 || v.BlockSize != 16 || v.MaxNumBatchedTokens != 2048 {
		t.Errorf("spec = %+v", f.Spec)
	}
	if got := f.Spill.Resolve(v.MaxNumSeqs); got != 8 {
		t.Errorf("spill threshold = %d, want 8", got)
	}
	// The rough figure operators quote: about 39k KV tokens per A4000 for Qwen3-4B at
	// vLLM's default max_num_seqs 256; at 32 the sampler's dummy run and
	// the CUDA graphs take ~0.7 GiB less (hardware's profile): ~45k.
	if tok := f.KVTokensPerReplica(); tok < 42000 || tok > 48000 {
		t.Errorf("KV tokens per replica = %d, want about 45k", tok)
	}
	if time.Duration(f.Spec.ScrapeInterval) != time.Second {
		t.Errorf("scrape interval = %v", time.Duration(f.Spec.ScrapeInterval))
	}
}

func TestParseFarmDefaults(t *testing.T) {
	f, err := ParseFarm([]byte("model: Qwen/Qwen3-4B-Instruct-2507\ngpu: H100 SXM\n"), "min.yaml")
	if err != nil {
		t.Fatal(err)
	}
	v := f.Spec.VLLM
	// vLLM's defaults on a >= 70 GiB GPU other than the A100.
	if v.MaxNumSeqs != 1024 || v.MaxNumBatchedTokens != 8192 || v.GPUMemoryUtilization != 0.9 || v.BlockSize != 16 {
		t.Errorf("vllm defaults = %+v", v)
	}
	if f.Spec.Replicas != 1 || f.Spec.TensorParallelSize != 1 || f.Spec.Routing.Strategy != "affinity" {
		t.Errorf("defaults = %+v", f.Spec)
	}
	if f.Spec.StepTime.PrefillEfficiency != DefaultPrefillEfficiency {
		t.Errorf("step_time defaults = %+v", f.Spec.StepTime)
	}
	f, err = ParseFarm([]byte("model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX A4000\nvllm:\n  num_gpu_blocks: 1000\n"), "blocks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if f.NumGPUBlocks != 1000 || f.Spec.VLLM.MaxNumSeqs != 256 || f.Spec.VLLM.MaxNumBatchedTokens != 2048 {
		t.Errorf("num_gpu_blocks read back = %d, vllm = %+v", f.NumGPUBlocks, f.Spec.VLLM)
	}
}

func TestParseFarmErrors(t *testing.T) {
	base := "model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX A4000\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"bad max_num_seqs", base + "replicas: 4\nvllm:\n  block_size: 16\n  max_num_seqs: -3\n", "farm.yaml:6: vllm.max_num_seqs: must be >= 1"},
		{"unknown key", base + "vllm:\n  max_num_sequences: 8\n", "farm.yaml:4: vllm.max_num_sequences: unknown key"},
		{"unknown top key", base + "gpus: 4\n", "farm.yaml:3: gpus: unknown key"},
		{"wrong type", base + "replicas: four\n", "farm.yaml:3: replicas: cannot unmarshal"},
		{"bad duration", base + "scrape_interval: soon\n", `farm.yaml:3: scrape_interval: "soon" is not a duration`},
		{"bad strategy", base + "routing:\n  strategy: random\n", "farm.yaml:4: routing.strategy: must be one of hash, least-loaded, affinity"},
		{"bad spill", base + "routing:\n  spill_threshold: lots\n", "farm.yaml:4: routing.spill_threshold: " + placement.SpillThresholdError("lots")},
		{"zero spill", base + "routing:\n  spill_threshold: 0\n", "farm.yaml:4: routing.spill_threshold: " + placement.SpillThresholdError("0")},
		{"bad dtype", base + "weights_dtype: fp4\n", "farm.yaml:3: weights_dtype: must be bf16, fp8 or int4"},
		{"unknown gpu", "model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX A4001\n", "farm.yaml:2: gpu: unknown GPU"},
		{"no model", "gpu: RTX A4000\n", "farm.yaml: model: required"},
		{"bad efficiency", base + "step_time:\n  prefill_efficiency: 1.5\n", "farm.yaml:4: step_time.prefill_efficiency: must be in (0, 1]"},
		{"bad overhead", base + "step_time:\n  step_overhead: -1ms\n", "farm.yaml:4: step_time.step_overhead: must be >= 0"},
		{"too many blocks", base + "vllm:\n  num_gpu_blocks: 3000000000\n", "farm.yaml:4: vllm.num_gpu_blocks: must be at most 2147483647"},
		{"empty", "", "farm.yaml: empty farm spec"},
		{"not yaml", "model: [\n", "farm.yaml:1: did not find expected node content"},
		{"too big for the card", "model: meta-llama/Llama-3.1-70B-Instruct\ngpu: RTX A4000\n", "farm.yaml:2: gpu: "},
		{"bad version", base + "vllm:\n  version: latest\n", `farm.yaml:4: vllm.version: want a vLLM release such as "0.26"`},
		{"unknown release", base + "vllm:\n  version: \"0.99\"\n", `farm.yaml:4: vllm.version: vLLM 0.99 is not a release the simulator's table knows (0.13 to 0.28`},
		{"bad full isl", base + "vllm:\n  scheduler_reserve_full_isl: maybe\n", `farm.yaml:4: vllm.scheduler_reserve_full_isl: want true or false, got "maybe"`},
		{"bad watermark", base + "vllm:\n  watermark: 1.5\n", "farm.yaml:4: vllm.watermark: must be in [0, 1)"},
		{"bad api servers", base + "vllm:\n  api_server_count: -2\n", "farm.yaml:4: vllm.api_server_count: must be in [1, 1024]"},
		{"bad stats interval", base + "vllm:\n  stats_update_interval: 10us\n", "farm.yaml:4: vllm.stats_update_interval: must be in [1ms, 1m]"},
		{"bad balancer", base + "routing:\n  balancer: nginx\n", `farm.yaml:4: routing.balancer: want vllm or warden, got "nginx"`},
		{"bad active window", base + "routing:\n  active_window: -1m\n", "farm.yaml:4: routing.active_window: must be >= 0"},
		{"bad kv scale", base + "kv_capacity_scale: 40\n", "farm.yaml:3: kv_capacity_scale: must be in [0.1, 10]"},
		{"bad ecc", base + "ecc: sometimes\n", "farm.yaml:3: ecc: want on or off"},
		{"ecc on a card without", "model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX 4090\necc: on\n", "farm.yaml:3: ecc: RTX 4090 has no ECC mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseFarm([]byte(tt.yaml), "farm.yaml")
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error = %q, want prefix %q", err, tt.want)
			}
		})
	}
}

func FuzzParseFarm(f *testing.F) {
	f.Add(examples.Default)
	f.Add([]byte("model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX A4000\nvllm: {max_num_seqs: 0}\n"))
	f.Add([]byte("routing: {strategy: hash, spill_threshold: 3, session_ttl: 1h}\n"))
	f.Add([]byte("step_time: {prefill_efficiency: 0.3}\nscrape_interval: 100ms\n"))
	f.Add([]byte("model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX A4000\nkv_capacity_scale: 0.85\necc: on\nvllm: {version: \"0.20\", watermark: 0.01, api_server_count: 2}\nrouting: {balancer: warden, active_window: 1m}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		// model_config names a file to read and gpu: auto probes NVML: no
		// I/O from the fuzzer (a path such as /dev/stdin would block).
		if spec, _, err := parseFarmSpec(data, "fuzz.yaml"); err == nil && (spec.GPU == "auto" || spec.ModelConfig != "") {
			return
		}
		fm, err := ParseFarm(data, "fuzz.yaml")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Errorf("error does not name the file: %v", err)
			}
			return
		}
		if fm.NumGPUBlocks < 2 || fm.Spec.Replicas < 1 || fm.Spec.VLLM.MaxNumSeqs < 1 || fm.Spec.VLLM.BlockSize < 1 {
			t.Errorf("accepted an unusable farm: %+v", fm.Spec)
		}
	})
}

// TestKVCapacityScale: the band scales the blocks sized from hardware and
// leaves num_gpu_blocks, read back from a server, exact.
func TestKVCapacityScale(t *testing.T) {
	base := mustDefaultFarm(t)
	for _, c := range []struct {
		scale     float64
		numBlocks int
		want      int
	}{
		{0, 0, base.NumGPUBlocks},
		{0.85, 0, int(float64(base.Sizing.KVBlocksPerReplica) * 0.85)},
		{1.10, 0, int(float64(base.Sizing.KVBlocksPerReplica) * 1.10)},
		{0.85, 2500, 2500},
	} {
		spec := base.Spec
		spec.KVCapacityScale, spec.VLLM.NumGPUBlocks = c.scale, c.numBlocks
		f, err := Resolve(spec)
		if err != nil {
			t.Fatal(err)
		}
		if f.NumGPUBlocks != c.want {
			t.Errorf("scale %g, num_gpu_blocks %d: %d blocks, want %d", c.scale, c.numBlocks, f.NumGPUBlocks, c.want)
		}
	}
	spec := base.Spec
	spec.KVCapacityScale = -1
	if _, err := Resolve(spec); err == nil || !strings.Contains(err.Error(), "kv_capacity_scale") {
		t.Errorf("scale -1: %v, want an error naming kv_capacity_scale", err)
	}
}
