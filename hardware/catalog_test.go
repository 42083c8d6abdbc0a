package hardware

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestCatalogHasRequiredEntries(t *testing.T) {
	for _, name := range []string{"RTX A4000", "RTX 4090", "RTX 5090", "L4", "L40S", "A10", "A100 40GB", "A100 80GB", "H100 SXM", "H100 PCIe", "H200", "B200", "MI300X"} {
		g, err := LookupGPU(name)
		if err != nil {
			t.Errorf("LookupGPU(%q): %v", name, err)
			continue
		}
		if g.Name != name {
			t.Errorf("LookupGPU(%q).Name = %q", name, g.Name)
		}
		if g.Source == "" || g.MemoryBandwidthBytesPerSec <= 0 || g.BF16FLOPS <= 0 {
			t.Errorf("%s: incomplete entry %+v", name, g)
		}
		// The CUDA-visible total is below the (binary) marketing figure, but not by much.
		if mb := g.MarketingMemoryGB * GiB; float64(g.MemoryBytes) > mb || float64(g.MemoryBytes) < 0.9*mb {
			t.Errorf("%s: memory %d bytes is not within 90%%..100%% of the marketing %g GiB", name, g.MemoryBytes, g.MarketingMemoryGB)
		}
		if ic := g.Interconnect; ic.Kind == "" || ic.BytesPerSec < 10e9 || ic.AllReduceLatencySec <= 0 || ic.Source == "" {
			t.Errorf("%s: incomplete interconnect %+v", name, ic)
		}
		if g.FP8FLOPS != 0 && g.FP8FLOPS < 1.9*g.BF16FLOPS {
			t.Errorf("%s: FP8 %.3g FLOP/s should be about twice BF16 %.3g (dense both)", name, g.FP8FLOPS, g.BF16FLOPS)
		}
	}
	for _, name := range []string{"Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", "google/gemma-3-27b-it"} {
		m, err := LookupModel(name)
		if err != nil {
			t.Errorf("LookupModel(%q): %v", name, err)
			continue
		}
		// The published count and the architecture estimate agree within 3%
		// (the estimate leaves out vision towers and norms of q/k).
		est := EstimateParams(m, 0, m.IntermediateSize)
		if d := relDiff(est, m.ParamCount); d > 0.03 {
			t.Errorf("%s: param_count %d vs architecture estimate %d (%.1f%% apart)", name, m.ParamCount, est, 100*d)
		}
	}
}

func TestCatalogSorted(t *testing.T) {
	gs, ms := GPUs(), Models()
	if !slices.IsSortedFunc(gs, func(a, b GPU) int { return strings.Compare(a.Name, b.Name) }) {
		t.Error("GPUs() not sorted by name")
	}
	if !slices.IsSortedFunc(ms, func(a, b Model) int { return strings.Compare(a.Name, b.Name) }) {
		t.Error("Models() not sorted by name")
	}
	gs[0].Name = "mutated"
	if GPUs()[0].Name == "mutated" {
		t.Error("GPUs() returned the catalogue's own slice")
	}
}

func TestLookupGPU(t *testing.T) {
	tests := []struct{ in, want string }{
		{"RTX A4000", "RTX A4000"},
		{"A4000", "RTX A4000"},
		{"rtx-a4000", "RTX A4000"},
		{"rtx_a4000", "RTX A4000"},
		{"4090", "RTX 4090"},
		{"rtx 4090", "RTX 4090"},
		{"h100", "H100 SXM"},
		{"H100-PCIe", "H100 PCIe"},
		{"a100", "A100 80GB"},
		{"A100-40GB", "A100 40GB"},
		{"NVIDIA GeForce RTX 4090", "RTX 4090"},
		{"NVIDIA RTX A4000", "RTX A4000"},
		{"NVIDIA H200", "H200"},
		{"mi300x", "MI300X"},
	}
	for _, tt := range tests {
		g, err := LookupGPU(tt.in)
		if err != nil || g.Name != tt.want {
			t.Errorf("LookupGPU(%q) = %q, %v; want %q", tt.in, g.Name, err, tt.want)
		}
	}
}

func TestLookupModel(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B-Instruct-2507"},
		{"qwen/qwen3-4b-instruct-2507", "Qwen/Qwen3-4B-Instruct-2507"},
		{"Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B-Instruct-2507"},
		{"qwen3-4b", "Qwen/Qwen3-4B-Instruct-2507"},
		{"llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"},
		{"Llama 3.1 70B", "meta-llama/Llama-3.1-70B-Instruct"},
		{"gemma-3-27b-it", "google/gemma-3-27b-it"},
		{"Qwen3-32B", "Qwen/Qwen3-32B"},
	}
	for _, tt := range tests {
		m, err := LookupModel(tt.in)
		if err != nil || m.Name != tt.want {
			t.Errorf("LookupModel(%q) = %q, %v; want %q", tt.in, m.Name, err, tt.want)
		}
	}
}

func TestLookupUnknownSuggests(t *testing.T) {
	tests := []struct {
		lookup func(string) error
		in     string
		want   []string // must be among the suggestions
	}{
		{gpuErr, "RTX 4080", []string{"RTX 4090"}},
		{gpuErr, "H20", []string{"H200"}},
		{gpuErr, "A400", []string{"RTX A4000"}},
		{modelErr, "qwen3-4", []string{"Qwen/Qwen3-4B-Instruct-2507"}},
		{modelErr, "llama-3.1-7b", []string{"meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"}},
		{gpuErr, "zzzzzzzz", nil},
	}
	for _, tt := range tests {
		err := tt.lookup(tt.in)
		var ue *UnknownNameError
		if !errors.As(err, &ue) {
			t.Fatalf("%q: got %v, want *UnknownNameError", tt.in, err)
		}
		for _, w := range tt.want {
			if !slices.Contains(ue.Suggestions, w) {
				t.Errorf("%q: suggestions %q lack %q", tt.in, ue.Suggestions, w)
			}
		}
		if tt.want == nil && len(ue.Suggestions) != 0 {
			t.Errorf("%q: unexpected suggestions %q", tt.in, ue.Suggestions)
		}
		if !strings.Contains(err.Error(), tt.in) {
			t.Errorf("error %q does not name the input", err)
		}
	}
}

func gpuErr(s string) error   { _, err := LookupGPU(s); return err }
func modelErr(s string) error { _, err := LookupModel(s); return err }

func TestMatchNVMLName(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" = not found
	}{
		{"NVIDIA GeForce RTX 4090", "RTX 4090"},
		{"NVIDIA GeForce RTX 5090", "RTX 5090"},
		{"NVIDIA RTX A4000", "RTX A4000"},
		{"NVIDIA H200", "H200"},
		{"NVIDIA H100 80GB HBM3", "H100 SXM"},
		{"NVIDIA A100-SXM4-40GB", "A100 40GB"},
		{"NVIDIA A100-SXM4-80GB", "A100 80GB"},
		{"NVIDIA L40S", "L40S"},
		{"NVIDIA A10G", ""}, // not an A10: no guessing by substring
		{"Tesla T4", ""},
	}
	for _, tt := range tests {
		g, ok := MatchNVMLName(tt.in)
		if tt.want == "" {
			if ok {
				t.Errorf("MatchNVMLName(%q) = %q, want not found", tt.in, g.Name)
			}
			continue
		}
		if !ok || g.Name != tt.want {
			t.Errorf("MatchNVMLName(%q) = %q, %v; want %q", tt.in, g.Name, ok, tt.want)
		}
	}
}

// interconnectYAML completes a test GPU entry.
const interconnectYAML = "  interconnect: PCIe\n  interconnect_gb_per_s: 32\n  peer_to_peer: true\n  all_reduce_latency_us: 40\n  interconnect_source: test\n"

func TestParseCatalogErrors(t *testing.T) {
	okModels := mustRead("catalog/models.yaml")
	okGPUs := mustRead("catalog/gpus.yaml")
	gpu := func(extra string) []byte {
		return []byte(`- name: X1
  aliases: [x]
  cuda_total_memory_gib: 10
  memory_bandwidth_gb_per_s: 100
  bf16_dense_tflops: 10
  source: test
  ecc: none
  ecc_source: test
  interconnect: PCIe
  interconnect_gb_per_s: 32
  peer_to_peer: true
  all_reduce_latency_us: 40
  interconnect_source: test
` + extra)
	}
	tests := []struct {
		name         string
		gpus, models []byte
		want         []string
	}{
		{"unknown field has its line", gpu("  colour: red\n"), okModels, []string{"gpus.yaml", "line 14", "colour"}},
		{"no interconnect", []byte(strings.Replace(string(gpu("")), "  interconnect: PCIe\n", "", 1)), okModels, []string{"entry 1", "interconnect: missing"}},
		{"no peer_to_peer", []byte(strings.Replace(string(gpu("")), "  peer_to_peer: true\n", "", 1)), okModels, []string{"entry 1", "peer_to_peer"}},
		{"NaN link", []byte(strings.Replace(string(gpu("")), "gb_per_s: 32", "gb_per_s: .nan", 1)), okModels, []string{"entry 1", "interconnect_gb_per_s"}},
		{"zero latency", []byte(strings.Replace(string(gpu("")), "latency_us: 40", "latency_us: 0", 1)), okModels, []string{"entry 1", "all_reduce_latency_us"}},
		{"no interconnect source", []byte(strings.Replace(string(gpu("")), "  interconnect_source: test\n", "", 1)), okModels, []string{"entry 1", "interconnect_source"}},
		{"bad ecc", []byte("- name: X\n  cuda_total_memory_gib: 1\n  memory_bandwidth_gb_per_s: 1\n  bf16_dense_tflops: 1\n  source: s\n  ecc: maybe\n  ecc_source: s\n"), okModels, []string{"entry 1", "ecc", "maybe"}},
		{"missing ecc source", []byte("- name: X\n  cuda_total_memory_gib: 1\n  memory_bandwidth_gb_per_s: 1\n  bf16_dense_tflops: 1\n  source: s\n  ecc: \"on\"\n"), okModels, []string{"entry 1", "ecc_source"}},
		{"duplicate alias", append(gpu(""), gpu("")[0:0]...), append([]byte{}, okModels...), nil},
		{"alias clash", []byte(string(gpu("")) + "- name: X2\n  aliases: [X-1]\n  cuda_total_memory_gib: 1\n  memory_bandwidth_gb_per_s: 1\n  bf16_dense_tflops: 1\n  source: t\n  ecc: hbm\n  ecc_source: t\n" + interconnectYAML), okModels, []string{"X-1", "already used"}},
		{"missing source", []byte("- name: X\n  cuda_total_memory_gib: 1\n  memory_bandwidth_gb_per_s: 1\n  bf16_dense_tflops: 1\n"), okModels, []string{"entry 1", "source"}},
		{"NaN memory", []byte("- name: X\n  cuda_total_memory_gib: .nan\n  memory_bandwidth_gb_per_s: 1\n  bf16_dense_tflops: 1\n  source: s\n"), okModels, []string{"entry 1", "cuda_total_memory_gib"}},
		{"infinite bandwidth", []byte("- name: X\n  cuda_total_memory_gib: 1\n  memory_bandwidth_gb_per_s: .inf\n  bf16_dense_tflops: 1\n  source: s\n"), okModels, []string{"entry 1", "memory_bandwidth_gb_per_s"}},
		{"NaN fp8", []byte("- name: X\n  cuda_total_memory_gib: 1\n  memory_bandwidth_gb_per_s: 1\n  bf16_dense_tflops: 1\n  fp8_dense_tflops: .nan\n  source: s\n"), okModels, []string{"entry 1", "fp8_dense_tflops"}},
		{"memory overflow", []byte("- name: X\n  cuda_total_memory_gib: 1e300\n  memory_bandwidth_gb_per_s: 1\n  bf16_dense_tflops: 1\n  source: s\n"), okModels, []string{"entry 1", "cuda_total_memory_gib"}},
		{"bad model", okGPUs, []byte("- name: m\n  num_layers: 0\n  source: s\n"), []string{"models.yaml", "num_layers"}},
	}
	for _, tt := range tests {
		_, err := parseCatalog(tt.gpus, tt.models)
		if tt.want == nil {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		wantErrContains(t, tt.name, err, tt.want)
	}
}

// FuzzParseCatalog checks that any pair of catalogue files either fails
// with an error naming the file at fault or gives entries that are complete,
// finite and findable by every name and alias.
func FuzzParseCatalog(f *testing.F) {
	gpus, models := mustRead("catalog/gpus.yaml"), mustRead("catalog/models.yaml")
	f.Add(gpus, models)
	f.Add([]byte("- name: X\n  cuda_total_memory_gib: .inf\n  memory_bandwidth_gb_per_s: 1\n  bf16_dense_tflops: 1\n  source: s\n"), []byte("[]"))
	f.Add([]byte("- {name: X, aliases: [\"\"]}\n"), []byte("- name: a/b\n  aliases: [b]\n"))
	f.Add([]byte("{}"), []byte("null"))
	f.Fuzz(func(t *testing.T, gpuYAML, modelYAML []byte) {
		c, err := parseCatalog(gpuYAML, modelYAML)
		if err != nil {
			if !strings.Contains(err.Error(), "catalog/") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for i, g := range c.gpus {
			if g.MemoryBytes <= 0 || !positive(g.MemoryBandwidthBytesPerSec) || !positive(g.BF16FLOPS) || !(g.FP8FLOPS >= 0) || math.IsInf(g.FP8FLOPS, 1) {
				t.Fatalf("accepted GPU %+v", g)
			}
			for _, n := range append([]string{g.Name}, g.Aliases...) {
				if j, ok := c.gpuKey[normalize(n)]; !ok || j != i {
					t.Fatalf("GPU %q: name %q finds entry %d, %v", g.Name, n, j, ok)
				}
			}
		}
		for i, m := range c.models {
			if err := m.Validate(); err != nil {
				t.Fatalf("accepted model %+v: %v", m, err)
			}
			if j, ok := c.modelKey[normalize(m.Name)]; !ok || j != i {
				t.Fatalf("model %q finds entry %d, %v", m.Name, j, ok)
			}
		}
	})
}

func relDiff(a, b int64) float64 {
	d := float64(a-b) / float64(b)
	if d < 0 {
		return -d
	}
	return d
}
