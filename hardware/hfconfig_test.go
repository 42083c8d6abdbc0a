package hardware

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadHFConfigMatchesCatalogue(t *testing.T) {
	tests := []struct {
		file, catalogue string
	}{
		{"qwen3-4b-instruct-2507.config.json", "Qwen/Qwen3-4B-Instruct-2507"},
		{"llama-3.1-8b-instruct.config.json", "meta-llama/Llama-3.1-8B-Instruct"},
		{"gemma-3-27b-it.config.json", "google/gemma-3-27b-it"},
	}
	for _, tt := range tests {
		got, err := LoadHFConfig(filepath.Join("testdata", tt.file))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := LookupModel(tt.catalogue)
		type arch struct {
			L, H, I, Q, KV, D, V, Sw, Sl, Pos int
			Tied                              bool
		}
		ga := arch{got.NumLayers, got.HiddenSize, got.IntermediateSize, got.NumAttentionHeads, got.NumKVHeads, got.HeadDim, got.VocabSize, got.SlidingWindowTokens, got.SlidingLayers, got.MaxPositionTokens, got.TieWordEmbeddings}
		wa := arch{want.NumLayers, want.HiddenSize, want.IntermediateSize, want.NumAttentionHeads, want.NumKVHeads, want.HeadDim, want.VocabSize, want.SlidingWindowTokens, want.SlidingLayers, want.MaxPositionTokens, want.TieWordEmbeddings}
		if ga != wa {
			t.Errorf("%s:\n got %+v\nwant %+v", tt.file, ga, wa)
		}
		if d := relDiff(got.ParamCount, want.ParamCount); d > 0.03 || !got.ParamCountEstimated {
			t.Errorf("%s: estimated params %d vs published %d (%.1f%%)", tt.file, got.ParamCount, want.ParamCount, 100*d)
		}
		if got.WeightsDType != BF16 {
			t.Errorf("%s: weights dtype %q, want bf16", tt.file, got.WeightsDType)
		}
	}
}

func TestLoadHFConfigShapes(t *testing.T) {
	tests := []struct {
		file                  string
		name                  string
		layers, sliding, win  int
		weights               DType
		paramsLow, paramsHigh float64 // billions
	}{
		{"qwen3-32b-awq.config.json", "Qwen/Qwen3-32B-AWQ", 64, 0, 0, INT4, 32, 33.5},
		{"qwen3-30b-a3b.config.json", "qwen3-30b-a3b", 48, 0, 0, BF16, 30, 31}, // MoE: 128 experts x 768 wide
		{"gpt-oss-style-layer-types.config.json", "gpt-oss-style-layer-types", 8, 4, 128, BF16, 0.1, 5},
	}
	for _, tt := range tests {
		m, err := LoadHFConfig(filepath.Join("testdata", tt.file))
		if err != nil {
			t.Fatal(err)
		}
		b := float64(m.ParamCount) / 1e9
		if m.Name != tt.name || m.NumLayers != tt.layers || m.SlidingLayers != tt.sliding || m.SlidingWindowTokens != tt.win || m.WeightsDType != tt.weights || b < tt.paramsLow || b > tt.paramsHigh {
			t.Errorf("%s: got name %q layers %d sliding %d/%d weights %q params %.2fB", tt.file, m.Name, m.NumLayers, m.SlidingLayers, m.SlidingWindowTokens, m.WeightsDType, b)
		}
	}
}

func TestParseHFConfigErrors(t *testing.T) {
	base := `"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100`
	tests := []struct {
		name, json string
		want       []string
	}{
		{"not json", `{`, []string{"cfg.json", "not a JSON config object"}},
		{"array", `[]`, []string{"cfg.json", "not a JSON config object"}},
		{"missing layers", `{"hidden_size": 64}`, []string{"cfg.json", "num_hidden_layers: missing"}},
		{"zero hidden", `{"num_hidden_layers": 4, "hidden_size": 0}`, []string{"hidden_size", "positive"}},
		{"string heads", `{"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": "four"}`, []string{"num_attention_heads"}},
		{"type error has file, line and field", "{\n\"text_config\": {\"hidden_size\": 64,\n \"num_attention_heads\": \"four\"}}", []string{"cfg.json:3: text_config.num_attention_heads: want int, got JSON string"}},
		{"trailing data", `{` + base + `}}`, []string{"cfg.json:1: not a JSON config object: unexpected data"}},
		{"kv heads not dividing", `{` + base + `, "num_key_value_heads": 3}`, []string{"num_key_value_heads", "divide"}},
		{"head_dim underivable", `{"num_hidden_layers": 4, "hidden_size": 66, "num_attention_heads": 4, "intermediate_size": 1, "vocab_size": 1}`, []string{"head_dim", "not a multiple"}},
		{"missing vocab", `{"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}`, []string{"vocab_size: missing"}},
		{"nested field", `{"text_config": {"hidden_size": 64}}`, []string{"text_config.num_hidden_layers: missing"}},
		{"layer_types length", `{` + base + `, "sliding_window": 16, "layer_types": ["full_attention"]}`, []string{"layer_types", "1 entries", "(4)"}},
		{"layer_types value", `{` + base + `, "sliding_window": 16, "layer_types": ["full_attention", "x", "full_attention", "full_attention"]}`, []string{"layer_types[1]", `"x"`}},
		{"bad quantization", `{` + base + `, "quantization_config": {"quant_method": "exotic", "bits": 3}}`, []string{"quantization_config", "exotic"}},
		{"overflow", `{"num_hidden_layers": 4000000000, "hidden_size": 4000000000, "num_attention_heads": 1, "intermediate_size": 1, "vocab_size": 1}`, []string{"cfg.json"}},
	}
	for _, tt := range tests {
		_, err := ParseHFConfig("cfg.json", []byte(tt.json))
		wantErrContains(t, tt.name, err, tt.want)
	}
}

func TestParseHFConfigSlidingVariants(t *testing.T) {
	base := `"num_hidden_layers": 12, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100`
	tests := []struct {
		name, extra  string
		sliding, win int
	}{
		{"no window", ``, 0, 0},
		{"null window", `, "sliding_window": null`, 0, 0},
		{"window unused (Qwen)", `, "sliding_window": 4096, "use_sliding_window": false`, 0, 0},
		{"window on every layer (Mistral)", `, "sliding_window": 4096`, 12, 4096},
		{"pattern 6", `, "sliding_window": 512, "sliding_window_pattern": 6`, 10, 512},
		{"pattern 4 with 12 layers", `, "sliding_window": 512, "sliding_window_pattern": 4`, 9, 512},
	}
	for _, tt := range tests {
		m, err := ParseHFConfig("cfg.json", []byte(`{`+base+tt.extra+`}`))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if m.SlidingLayers != tt.sliding || m.SlidingWindowTokens != tt.win {
			t.Errorf("%s: sliding %d/%d, want %d/%d", tt.name, m.SlidingLayers, m.SlidingWindowTokens, tt.sliding, tt.win)
		}
	}
}

func TestLoadHFConfigFileErrors(t *testing.T) {
	if _, err := LoadHFConfig(filepath.Join(t.TempDir(), "missing.json")); err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(big, make([]byte, maxHFConfigBytes+10), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadHFConfig(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("huge file: %v", err)
	}
}

func TestModelNameFromPath(t *testing.T) {
	for in, want := range map[string]string{
		"models/Qwen3-4B/config.json": "Qwen3-4B",
		"config.json":                 "config",
		"x/llama.config.json":         "llama",
		"a/b/my-model.json":           "my-model",
	} {
		if got := modelNameFromPath(in); got != want {
			t.Errorf("modelNameFromPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzParseHFConfig checks that any input either parses into a model that
// SizeKV accepts the shape of, or fails with an error naming the file.
func FuzzParseHFConfig(f *testing.F) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".config.json") {
			b, err := os.ReadFile(filepath.Join("testdata", e.Name()))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Add([]byte(`{"text_config": {"model_type": "gemma3_text", "num_hidden_layers": 6, "hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 8, "sliding_window": 4}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseHFConfig("fuzz.json", data)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.json") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("parsed model does not validate: %v (%+v)", err, m)
		}
		if m.ParamCount <= 0 || m.SlidingLayers > m.NumLayers {
			t.Fatalf("inconsistent model %+v", m)
		}
	})
}

// A top-level gemma3_text config (gemma-3-1b style) omits what
// Gemma3TextConfig defaults: vocab, window, pattern, KV heads.
func TestParseHFConfigGemmaTextDefaults(t *testing.T) {
	m, err := ParseHFConfig("gemma-3-1b/config.json", []byte(`{"model_type": "gemma3_text", "num_hidden_layers": 26, "hidden_size": 1152,
		"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6912, "sliding_window": 512}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "gemma-3-1b" || m.VocabSize != 262208 || m.SlidingWindowTokens != 512 || m.SlidingLayers != 26-26/6 || !m.TieWordEmbeddings || m.MaxPositionTokens != 131072 {
		t.Errorf("%+v", m)
	}
}
