package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/lm-warden/warden/hardware"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// runWarden executes the root command with args and returns stdout and the error.
func runWarden(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/warden -run %s -update)", err, t.Name())
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs from the golden file (-want +got; -update rewrites it):\n%s", path, diff)
	}
}

func TestKVGolden(t *testing.T) {
	tests := []struct {
		golden string
		args   []string
	}{
		{"kv_a4000_qwen3-4b_farm.json", []string{"kv", "--gpu", "RTX A4000", "--model", "Qwen/Qwen3-4B-Instruct-2507", "--replicas", "4", "--context", "13000", "--sessions", "16", "--json"}},
		{"kv_4090_llama-3.1-8b.json", []string{"kv", "--gpu", "RTX 4090", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--json"}},
		{"kv_5090_gemma-3-27b_int4.json", []string{"kv", "--gpu", "5090", "--model", "gemma-3-27b-it", "--weights-dtype", "int4", "--max-model-len", "65536", "--replicas", "7", "--context", "58000", "--sessions", "7", "--json"}},
		{"kv_a4000_qwen3-4b_farm.txt", []string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--replicas", "4", "--context", "13000", "--sessions", "16"}},
		// The product's farm: 4 x A4000, max_num_seqs 32.
		{"kv_a4000_qwen3-4b_seqs32.json", []string{"kv", "--gpu", "RTX A4000", "--model", "Qwen/Qwen3-4B-Instruct-2507", "--max-num-seqs", "32", "--replicas", "4", "--json"}},
		{"kv_a4000_qwen3-4b_tp2_ecc_eager.txt", []string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--tensor-parallel-size", "2", "--ecc", "on", "--enforce-eager"}},
		// The runner: 0.26 runs Model Runner V2 for Qwen3 (no CUDA graph
		// memory subtracted), 0.21 the V1 runner (its estimate subtracted).
		{"kv_a4000_qwen3-4b_seqs32.txt", []string{"kv", "--gpu", "RTX A4000", "--model", "Qwen/Qwen3-4B-Instruct-2507", "--max-num-seqs", "32"}},
		{"kv_a4000_qwen3-4b_seqs32_vllm0.21.txt", []string{"kv", "--gpu", "RTX A4000", "--model", "Qwen/Qwen3-4B-Instruct-2507", "--max-num-seqs", "32", "--vllm-version", "0.21"}},
		{"kv_l40s_llama-3.1-8b_ecc_off_vllm0.22.txt", []string{"kv", "--gpu", "L40S", "--model", "llama-3.1-8b", "--ecc", "off", "--vllm-version", "v0.22.1"}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			out, err := runWarden(t, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tt.golden, out)
		})
	}
}

// The must-show figures, checked on the JSON keys of the contract.
//
// The anchor's vLLM release is not recorded. hardware checks it against the
// V1 runner's profile (TestSizeKVAnchors), and so does this test: 0.22 is the
// last release in warden's version table whose default runner for Llama is
// V1 (Model Runner V2 from 0.23, vLLM PR #43458). Under 0.26's Model Runner
// V2 the same card holds the V1 CUDA graph estimate more (TestKVModelRunner).
func TestKVMustShow(t *testing.T) {
	tests := []struct {
		gpu, model, version string
		want                float64
		tolerance           float64
	}{
		{"RTX A4000", "Qwen/Qwen3-4B-Instruct-2507", "", 39000, 0.25},
		{"RTX 4090", "meta-llama/Llama-3.1-8B-Instruct", "0.22", 41408, 0.03}, // measured: 2,588 blocks
	}
	for _, tt := range tests {
		args := []string{"kv", "--gpu", tt.gpu, "--model", tt.model, "--json"}
		if tt.version != "" {
			args = append(args, "--vllm-version", tt.version)
		}
		out, err := runWarden(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"kv_tokens_per_replica", "kv_blocks_per_replica", "kv_bytes_per_token", "weights_bytes", "fits", "sessions_that_fit"} {
			if _, ok := got[k]; !ok {
				t.Errorf("JSON lacks key %q", k)
			}
		}
		tokens := got["kv_tokens_per_replica"].(float64)
		if d := (tokens - tt.want) / tt.want; d > tt.tolerance || d < -tt.tolerance {
			t.Errorf("%s/%s: %v tokens, want %v within %.0f%%", tt.gpu, tt.model, tokens, tt.want, 100*tt.tolerance)
		}
	}
}

func TestKVRuleOfThumbJSON(t *testing.T) {
	out, err := runWarden(t, "kv", "--gpu", "a4000", "--model", "qwen3-4b", "--replicas", "4", "--context", "13000", "--sessions", "11", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Fits            *bool `json:"fits"`
		SessionsThatFit *int  `json:"sessions_that_fit"`
		FarmKVTokens    int   `json:"farm_kv_tokens"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Fits == nil || !*r.Fits || r.SessionsThatFit == nil || *r.SessionsThatFit != r.FarmKVTokens/13000 {
		t.Errorf("11 x 13k on 4 x A4000: %+v (farm %d)", r, r.FarmKVTokens)
	}
}

func TestKVFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"kv", "--model", "qwen3-4b"}, "--gpu is required"},
		{[]string{"kv", "--gpu", "a4000"}, "one of --model or --model-config"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--model-config", "x.json"}, "none of the others"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--gpu-memory-utilization", "0"}, "--gpu-memory-utilization must be in (0, 1]"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--gpu-memory-utilization", "1.5"}, "--gpu-memory-utilization must be in (0, 1]"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--tensor-parallel-size", "0"}, "--tensor-parallel-size must be >= 1"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--tensor-parallel-size", "3"}, "does not divide the 32 attention heads"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--block-size", "24"}, "--block-size must be one of"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--replicas", "0"}, "--replicas must be >= 1"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--context", "1000"}, "sessions"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--context", "-1", "--sessions", "2"}, "--context and --sessions must both be >= 1"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--weights-dtype", "fp4"}, "--weights-dtype"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--kv-cache-dtype", "int4"}, "--kv-cache-dtype"},
		{[]string{"kv", "--gpu", "rtx 4080", "--model", "qwen3-4b"}, `unknown GPU "rtx 4080"; did you mean RTX 4090`},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-5b"}, `unknown model "qwen3-5b"; did you mean`},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-32b"}, "short by"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--max-model-len", "65536"}, "larger than the maximum number of tokens that can be stored in KV cache"},
		{[]string{"kv", "--gpu", "a4000", "--model-config", "testdata/no-such-config.json"}, "no-such-config.json"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--ecc", "maybe"}, `--ecc: want on or off (or default), got "maybe"`},
		{[]string{"kv", "--gpu", "4090", "--model", "qwen3-4b", "--ecc", "on"}, "--ecc on: RTX 4090 has no ECC mode"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--max-num-seqs", "-1"}, "--max-num-seqs"},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--vllm-version", "latest"}, `--vllm-version: want a vLLM release such as "0.26"`},
		{[]string{"kv", "--gpu", "a4000", "--model", "qwen3-4b", "--vllm-version", "0"}, "--vllm-version: "},
	}
	for _, tt := range tests {
		_, err := runWarden(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("warden %s: got %v, want an error containing %q", strings.Join(tt.args, " "), err, tt.want)
		}
	}
}

func TestKVModelConfig(t *testing.T) {
	sized := map[string]struct {
		Tokens int    `json:"kv_tokens_per_replica"`
		Bytes  int64  `json:"kv_bytes_per_token"`
		Runner string `json:"model_runner"`
	}{}
	for _, src := range [][]string{
		{"--model-config", filepath.Join("..", "..", "hardware", "testdata", "llama-3.1-8b-instruct.config.json")},
		{"--model", "meta-llama/Llama-3.1-8B-Instruct"},
	} {
		out, err := runWarden(t, append([]string{"kv", "--gpu", "RTX 4090", "--json"}, src...)...)
		if err != nil {
			t.Fatal(err)
		}
		r := sized[src[0]]
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		sized[src[0]] = r
	}
	// The estimated parameter count is within 1% of the published one, so the
	// KV capacity is within a few percent of the catalogue entry's, sized by
	// the same runner (the name says Llama either way).
	cfg, cat := sized["--model-config"], sized["--model"]
	if d := float64(cfg.Tokens-cat.Tokens) / float64(cat.Tokens); cfg.Bytes != 128<<10 || cfg.Runner != cat.Runner || d > 0.03 || d < -0.03 {
		t.Errorf("from config.json: %+v, from the catalogue: %+v", cfg, cat)
	}
}

func fakeProbe(gpus []hardware.DetectedGPU, err error) func() ([]hardware.DetectedGPU, error) {
	return func() ([]hardware.DetectedGPU, error) { return gpus, err }
}

func TestKVGPUAuto(t *testing.T) {
	noDriver := fmt.Errorf("%w (NVML: ERROR_LIBRARY_NOT_FOUND)", hardware.ErrNoDriver)
	g4090, _ := hardware.MatchNVMLName("NVIDIA GeForce RTX 4090")
	tests := []struct {
		name    string
		probe   func() ([]hardware.DetectedGPU, error)
		wantErr string
		wantGPU string
	}{
		{"no driver", fakeProbe(nil, noDriver), "--gpu auto: no NVIDIA driver found (NVML: ERROR_LIBRARY_NOT_FOUND)", ""},
		{"no device", fakeProbe([]hardware.DetectedGPU{}, nil), "NVML lists no GPU", ""},
		{"known", fakeProbe([]hardware.DetectedGPU{{Name: "NVIDIA GeForce RTX 4090", MemoryTotalBytes: 24564 << 20, Catalog: &g4090}}, nil), "", "RTX 4090"},
		{"unknown", fakeProbe([]hardware.DetectedGPU{{Name: "NVIDIA A10G", MemoryTotalBytes: 23028 << 20}}, nil), "", "NVIDIA A10G"},
		{"mixed", fakeProbe([]hardware.DetectedGPU{{Name: "NVIDIA L4"}, {Index: 1, Name: "NVIDIA A10G"}}, nil), "different GPUs", ""},
	}
	for _, tt := range tests {
		opts := &kvOptions{GPU: "auto", Model: "llama-3.1-8b", GPUMemoryUtilization: 0.9, TensorParallelSize: 1, BlockSize: 16, Replicas: 1, KVCacheDType: "auto", JSON: true, probe: tt.probe}
		var out bytes.Buffer
		err := runKV(context.Background(), opts, &out)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: got %v, want %q", tt.name, err, tt.wantErr)
			}
			if tt.name == "no driver" && !errors.Is(err, hardware.ErrNoDriver) {
				t.Errorf("%s: error does not wrap ErrNoDriver", tt.name)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var r struct{ GPU, GPUDetected string }
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.GPU != tt.wantGPU {
			t.Errorf("%s: sized %q, want %q", tt.name, r.GPU, tt.wantGPU)
		}
	}
}

// On this machine (no NVIDIA driver) `warden kv --gpu auto` must fail with the
// plain message; on a GPU machine it must size the local card.
func TestKVGPUAutoReal(t *testing.T) {
	_, probeErr := hardware.Probe()
	out, err := runWarden(t, "kv", "--gpu", "auto", "--model", "qwen3-4b", "--json")
	if probeErr != nil {
		if err == nil || !errors.Is(err, hardware.ErrNoDriver) || !strings.Contains(err.Error(), "no NVIDIA driver found") {
			t.Fatalf("without a driver: got %v, want a 'no NVIDIA driver found' error", err)
		}
		return
	}
	if err != nil && !hardware.IsNoFit(err) {
		t.Fatalf("with a driver: %v", err)
	}
	if err == nil && !strings.Contains(out, `"gpu_detected"`) {
		t.Errorf("with a driver: no gpu_detected in %s", out)
	}
}

// The JSON "memory" object: its five parts add up to requested_bytes, over
// GPUs, models, TP, ECC and eager mode; --enforce-eager zeroes the graphs.
func TestKVMemoryJSON(t *testing.T) {
	tests := [][]string{
		{"--gpu", "RTX 4090", "--model", "llama-3.1-8b"},
		{"--gpu", "RTX A4000", "--model", "qwen3-4b", "--max-num-seqs", "32"},
		{"--gpu", "RTX A4000", "--model", "qwen3-4b", "--ecc", "on", "--tensor-parallel-size", "4"},
		{"--gpu", "L40S", "--model", "qwen3-8b", "--ecc", "off", "--weights-dtype", "fp8"},
		{"--gpu", "H100", "--model", "llama-3.1-70b", "--tensor-parallel-size", "4", "--enforce-eager"},
		{"--gpu", "5090", "--model", "gemma-3-27b-it", "--weights-dtype", "int4", "--max-model-len", "65536"},
		{"--gpu", "RTX A4000", "--model", "qwen3-4b", "--max-num-seqs", "32", "--vllm-version", "0.21"},
		{"--gpu", "RTX 4090", "--model", "llama-3.1-8b", "--vllm-version", "0.22", "--enforce-eager"},
	}
	for _, args := range tests {
		out, err := runWarden(t, append(append([]string{"kv"}, args...), "--json")...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		var r struct {
			EnforceEager bool   `json:"enforce_eager"`
			ModelRunner  string `json:"model_runner"`
			Memory       map[string]int64
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		m := r.Memory
		for _, k := range []string{"requested_bytes", "weights_bytes", "activation_peak_bytes", "non_torch_bytes", "cuda_graph_bytes", "kv_bytes"} {
			if _, ok := m[k]; !ok {
				t.Errorf("%v: memory lacks %q", args, k)
			}
		}
		if sum := m["weights_bytes"] + m["activation_peak_bytes"] + m["non_torch_bytes"] + m["cuda_graph_bytes"] + m["kv_bytes"]; sum != m["requested_bytes"] {
			t.Errorf("%v: parts add up to %d, requested_bytes %d", args, sum, m["requested_bytes"])
		}
		// Model Runner V2's profile_cudagraph_memory returns 0 (vLLM PR #36520).
		if (r.EnforceEager || r.ModelRunner == hardware.ModelRunnerV2) != (m["cuda_graph_bytes"] == 0) {
			t.Errorf("%v: enforce_eager %v, model_runner %q, cuda_graph_bytes %d", args, r.EnforceEager, r.ModelRunner, m["cuda_graph_bytes"])
		}
	}
}

// --vllm-version picks the model runner through warden's version table, and
// the report says which runner and which ECC mode it assumed, and why.
func TestKVModelRunner(t *testing.T) {
	type report struct {
		VLLMVersion     string `json:"vllm_version"`
		ModelRunner     string `json:"model_runner"`
		ModelRunnerNote string `json:"model_runner_note"`
		ECC             bool   `json:"ecc"`
		ECCSetBy        string `json:"ecc_set_by"`
		ECCCostBytes    int64  `json:"ecc_cost_bytes"`
		ECCNote         string `json:"ecc_note"`
		KVBytes         int64  `json:"kv_bytes"`
		CUDAGraphs      struct {
			Bytes int64 `json:"bytes"`
		} `json:"cuda_graphs"`
	}
	tests := []struct {
		args                []string
		version, runner     string
		runnerNote          string
		ecc                 bool
		eccSetBy, eccNote   string
		eccCost             bool // ecc_cost_bytes > 0
		textRunner, textECC string
	}{
		{[]string{"--gpu", "RTX A4000", "--model", "qwen3-4b", "--max-num-seqs", "32"}, "0.26", "v2",
			"Model Runner V2: vLLM 0.26's default for this model (PR #39337 (0.22)", false, "catalogue", "off, as the RTX A4000 ships (catalogue); --ecc on would cost 1/16 of its memory, 0.98 GiB", false,
			"runner   Model Runner V2", "ECC      off, as the RTX A4000 ships"},
		{[]string{"--gpu", "RTX A4000", "--model", "qwen3-4b", "--max-num-seqs", "32", "--vllm-version", "0.21.2", "--ecc", "on"}, "0.21", "v1",
			"V1 model runner: vLLM 0.21's default for this model; Model Runner V2 from 0.22", true, "--ecc", "on (--ecc on; the RTX A4000 ships with it off): costs 1/16 of its memory, 0.98 GiB", true,
			"runner   V1 model runner", "ECC      on (--ecc on;"},
		{[]string{"--gpu", "RTX 4090", "--model", "llama-3.1-8b", "--vllm-version", "0.23"}, "0.23", "v2",
			"Model Runner V2: vLLM 0.23's default for this model (PR #43458 (0.23)", false, "catalogue", "none: the RTX 4090 has no ECC mode (catalogue)", false,
			"runner   Model Runner V2", "ECC      none"},
		{[]string{"--gpu", "L40S", "--model", "qwen3-8b"}, "0.26", "v2",
			"Model Runner V2", true, "catalogue", "on, as the L40S ships (catalogue): check bits take 1/16 of its memory", true,
			"runner   Model Runner V2", "ECC      on, as the L40S ships"},
		{[]string{"--gpu", "L40S", "--model", "qwen3-8b", "--ecc", "off"}, "0.26", "v2",
			"Model Runner V2", false, "--ecc", "off (--ecc off; the L40S ships with it on): gives back the 1/16", false,
			"runner   Model Runner V2", "ECC      off (--ecc off;"},
		{[]string{"--gpu", "H100", "--model", "qwen3-4b"}, "0.26", "v2",
			"Model Runner V2", true, "catalogue", "on, as HBM always runs it (catalogue): check bits out of band, no memory cost", false,
			"runner   Model Runner V2", "ECC      on, as HBM"},
		{[]string{"--gpu", "H100", "--model-config", filepath.Join("..", "..", "hardware", "testdata", "qwen3-30b-a3b.config.json")}, "0.26", "v1",
			"V1 model runner: vLLM 0.26's default for this model", true, "catalogue", "on, as HBM", false,
			"runner   V1 model runner: vLLM 0.26's default for this model\n", "ECC      on, as HBM"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, err := runWarden(t, append(append([]string{"kv"}, tt.args...), "--json")...)
			if err != nil {
				t.Fatal(err)
			}
			var r report
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			if r.VLLMVersion != tt.version || r.ModelRunner != tt.runner || !strings.HasPrefix(r.ModelRunnerNote, tt.runnerNote) {
				t.Errorf("vllm_version %q, model_runner %q, note %q; want %q, %q, %q...", r.VLLMVersion, r.ModelRunner, r.ModelRunnerNote, tt.version, tt.runner, tt.runnerNote)
			}
			if r.ECC != tt.ecc || r.ECCSetBy != tt.eccSetBy || !strings.HasPrefix(r.ECCNote, tt.eccNote) || (r.ECCCostBytes > 0) != tt.eccCost {
				t.Errorf("ecc %v set by %q costing %d: %q; want %v, %q, cost %v, %q...", r.ECC, r.ECCSetBy, r.ECCCostBytes, r.ECCNote, tt.ecc, tt.eccSetBy, tt.eccCost, tt.eccNote)
			}
			text, err := runWarden(t, append([]string{"kv"}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{tt.textRunner, tt.textECC} {
				if !strings.Contains(text, want) {
					t.Errorf("text output lacks %q:\n%s", want, text)
				}
			}
		})
	}

	// The same deployment under 0.26 (Model Runner V2) and 0.21 (V1):
	// the KV caches differ by exactly V1's CUDA graph estimate.
	sized := map[string]report{}
	for _, v := range []string{"0.26", "0.21"} {
		out, err := runWarden(t, "kv", "--gpu", "RTX A4000", "--model", "qwen3-4b", "--max-num-seqs", "32", "--vllm-version", v, "--json")
		if err != nil {
			t.Fatal(err)
		}
		var r report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		sized[v] = r
	}
	v2, v1 := sized["0.26"], sized["0.21"]
	if v1.CUDAGraphs.Bytes <= 0 || v2.CUDAGraphs.Bytes != v1.CUDAGraphs.Bytes || v2.KVBytes-v1.KVBytes != v1.CUDAGraphs.Bytes {
		t.Errorf("kv_bytes v2 %d - v1 %d, want V1's estimate %d (v2 reports %d)", v2.KVBytes, v1.KVBytes, v1.CUDAGraphs.Bytes, v2.CUDAGraphs.Bytes)
	}
}
