package hardware

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/profile/")

// golden compares got with testdata/profile/name (-update rewrites it).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "profile", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./hardware -run %s -update)", err, t.Name())
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs from the golden file (-want +got; -update rewrites it):\n%s", path, diff)
	}
}

// goldenCases are the deployments every mechanism golden covers.
var goldenCases = []struct {
	gpu, model string
	tp, seqs   int
}{
	{"RTX 4090", "meta-llama/Llama-3.1-8B-Instruct", 1, 0},
	{"RTX A4000", "Qwen/Qwen3-4B-Instruct-2507", 1, 0},
	{"RTX A4000", "Qwen/Qwen3-4B-Instruct-2507", 1, 32},
	{"H100 SXM", "Qwen/Qwen3-4B-Instruct-2507", 1, 0},
	{"H100 SXM", "meta-llama/Llama-3.1-70B-Instruct", 4, 0},
	{"RTX 5090", "google/gemma-3-27b-it", 1, 0},
}

func mib(b int64) string { return fmt.Sprintf("%.2f MiB", float64(b)/MiB) }

// Mirrors vllm/v1/worker/gpu_worker.py Worker.init_device (requested_memory)
// with the ECC override of the catalogue's cards.
func TestGoldenRequestedMemory(t *testing.T) {
	var b strings.Builder
	b.WriteString("# mirrors vllm/v1/worker/gpu_worker.py Worker.init_device: requested_memory = total_memory x gpu_memory_utilization\n")
	b.WriteString("# gpu | ecc as shipped | override | total | requested at 0.9\n")
	on, off := true, false
	for _, g := range GPUs() {
		for _, o := range []*bool{nil, &on, &off} {
			name := "default"
			if o != nil {
				name = map[bool]string{true: "on", false: "off"}[*o]
			}
			total, ecc, err := TotalMemory(g, o)
			if err != nil {
				fmt.Fprintf(&b, "%s | %s | %s | error: %v\n", g.Name, g.ECC, name, err)
				continue
			}
			fmt.Fprintf(&b, "%s | %s | %s | %d (ecc %v) | %d\n", g.Name, g.ECC, name, total, ecc, requestedBytes(total, 0.9))
		}
	}
	golden(t, "requested_memory.golden", b.String())
}

// Mirrors vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_run:
// _dummy_run(max_num_tokens) then _dummy_sampler_run, peak of the two.
func TestGoldenProfileRun(t *testing.T) {
	var b strings.Builder
	b.WriteString("# mirrors vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_run (_dummy_run, _dummy_sampler_run)\n")
	b.WriteString("# gpu | model | tp | max_num_seqs | max_num_batched_tokens | forward | sampler | peak\n")
	for _, c := range goldenCases {
		d := deployment(t, c.gpu, c.model)
		d.TensorParallelSize, d.MaxNumSeqs = c.tp, c.seqs
		d, err := withDeploymentDefaults(d)
		if err != nil {
			t.Fatal(err)
		}
		fwd := forwardActivationBytes(d.Model, int64(c.tp), d.MaxNumBatchedTokens)
		smp := samplerRunBytes(d.Model, d.MaxNumSeqs, d.MaxNumBatchedTokens)
		fmt.Fprintf(&b, "%s | %s | %d | %d | %d | %s | %s | %s\n", c.gpu, c.model, c.tp, d.MaxNumSeqs, d.MaxNumBatchedTokens, mib(fwd), mib(smp), mib(activationPeakBytes(fwd, smp)))
	}
	golden(t, "profile_run.golden", b.String())
}

// Mirrors vllm/utils/mem_utils.py memory_profiling (non_torch_increase).
func TestGoldenNonTorch(t *testing.T) {
	var b strings.Builder
	b.WriteString("# mirrors vllm/utils/mem_utils.py memory_profiling: non_torch_increase since Worker.init_device's snapshot\n")
	for _, tp := range []int{1, 2, 4, 8} {
		fmt.Fprintf(&b, "tp %d | %s\n", tp, mib(nonTorchBytes(tp)))
	}
	golden(t, "non_torch.golden", b.String())
}

// Mirrors vllm/config/vllm.py VllmConfig._set_cudagraph_sizes and
// vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_cudagraph_memory.
func TestGoldenCUDAGraphEstimate(t *testing.T) {
	var b strings.Builder
	b.WriteString("# mirrors vllm/config/vllm.py VllmConfig._set_cudagraph_sizes (capture sizes)\n")
	for _, c := range [][2]int{{1, 2048}, {32, 2048}, {128, 2048}, {256, 2048}, {256, 256}, {1024, 8192}} {
		fmt.Fprintf(&b, "max_num_seqs %d, max_num_batched_tokens %d: %v\n", c[0], c[1], CUDAGraphCaptureSizes(c[0], c[1]))
	}
	b.WriteString("# mirrors vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_cudagraph_memory (FULL_AND_PIECEWISE)\n")
	b.WriteString("# gpu | model | tp | max_num_seqs | piecewise | full | largest | first capture | per graph | estimate\n")
	for _, c := range goldenCases {
		d := deployment(t, c.gpu, c.model)
		d.TensorParallelSize, d.MaxNumSeqs = c.tp, c.seqs
		d, err := withDeploymentDefaults(d)
		if err != nil {
			t.Fatal(err)
		}
		e := cudaGraphEstimate(d.Model, int64(c.tp), d.MaxNumSeqs, d.MaxNumBatchedTokens)
		fmt.Fprintf(&b, "%s | %s | %d | %d | %d | %d | %d | %s | %s | %s\n", c.gpu, c.model, c.tp, d.MaxNumSeqs, e.PiecewiseGraphs, e.FullGraphs, e.LargestSize, mib(e.FirstCaptureBytes), mib(e.PerGraphBytes), mib(e.Bytes))
	}
	golden(t, "cuda_graph_estimate.golden", b.String())
}

// Mirrors vllm/v1/worker/gpu/model_runner.py GPUModelRunner.profile_cudagraph_memory
// of Model Runner V2 (PR #36520: returns 0), against the V1 runner's
// estimate that Worker.determine_available_memory would subtract instead.
func TestGoldenModelRunnerV2CUDAGraphs(t *testing.T) {
	var b strings.Builder
	b.WriteString("# mirrors vllm/v1/worker/gpu/model_runner.py GPUModelRunner.profile_cudagraph_memory (Model Runner V2): PR #36520 added it as a dummy API that returns 0\n")
	b.WriteString("# vllm/v1/worker/gpu_worker.py Worker.determine_available_memory subtracts what the runner returns: V1 (vllm/v1/worker/gpu_model_runner.py) its estimate, V2 nothing\n")
	b.WriteString("# gpu | model | tp | max_num_seqs | eager | V1 profile_cudagraph_memory | V2 profile_cudagraph_memory | KV blocks V1 | KV blocks V2 | V2 - V1 KV bytes\n")
	type runnerCase struct {
		gpu, model string
		tp, seqs   int
		eager      bool
	}
	cases := []runnerCase{{"RTX A4000", "Qwen/Qwen3-4B-Instruct-2507", 1, 32, true}}
	for _, c := range goldenCases {
		cases = append(cases, runnerCase{c.gpu, c.model, c.tp, c.seqs, false})
	}
	for _, c := range cases {
		var s [2]KVSizing
		for i, runner := range []string{ModelRunnerV1, ModelRunnerV2} {
			d := deployment(t, c.gpu, c.model)
			d.TensorParallelSize, d.MaxNumSeqs, d.EnforceEager, d.ModelRunner = c.tp, c.seqs, c.eager, runner
			if strings.Contains(c.model, "gemma") {
				d.WeightsDType, d.MaxModelLen = INT4, 65536
			}
			var err error
			if s[i], err = SizeKV(d); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(&b, "%s | %s | %d | %d | %v | %s | %s | %d | %d | %d\n", c.gpu, c.model, c.tp, s[0].MaxNumSeqs, c.eager,
			mib(s[0].Memory.CUDAGraphBytes), mib(s[1].Memory.CUDAGraphBytes), s[0].KVBlocksPerReplica, s[1].KVBlocksPerReplica, s[1].KVBytes-s[0].KVBytes)
	}
	golden(t, "model_runner_v2_cuda_graphs.golden", b.String())
}

// Mirrors vllm/v1/worker/gpu_worker.py Worker.determine_available_memory and
// vllm/v1/core/kv_cache_utils.py (num_gpu_blocks = available // page size),
// for both model runners.
func TestGoldenDetermineAvailableMemory(t *testing.T) {
	var b strings.Builder
	b.WriteString("# mirrors vllm/v1/worker/gpu_worker.py Worker.determine_available_memory; blocks as vllm/v1/core/kv_cache_utils.py\n")
	b.WriteString("# cuda graphs: the runner's profile_cudagraph_memory(), V1 vllm/v1/worker/gpu_model_runner.py, V2 vllm/v1/worker/gpu/model_runner.py (0, PR #36520)\n")
	b.WriteString("# gpu | model | tp | max_num_seqs | runner | requested | weights | activation peak | non-torch | cuda graphs | kv | blocks\n")
	for _, runner := range []string{ModelRunnerV1, ModelRunnerV2} {
		for _, c := range goldenCases {
			d := deployment(t, c.gpu, c.model)
			d.TensorParallelSize, d.MaxNumSeqs, d.ModelRunner = c.tp, c.seqs, runner
			if strings.Contains(c.model, "gemma") {
				d.WeightsDType, d.MaxModelLen = INT4, 65536
			}
			s, err := SizeKV(d)
			if err != nil {
				t.Fatal(err)
			}
			m := s.Memory
			fmt.Fprintf(&b, "%s | %s | %d | %d | %s | %d | %d | %d | %d | %d | %d | %d\n", c.gpu, c.model, c.tp, s.MaxNumSeqs, s.ModelRunner,
				m.RequestedBytes, m.WeightsBytes, m.ActivationPeakBytes, m.NonTorchBytes, m.CUDAGraphBytes, m.KVBytes, s.KVBlocksPerReplica)
		}
	}
	golden(t, "determine_available_memory.golden", b.String())
}
