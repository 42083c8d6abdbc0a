package hardware

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// maxHFConfigBytes bounds what LoadHFConfig reads; real config.json files are
// a few kilobytes.
const maxHFConfigBytes = 4 << 20

// LoadHFConfig reads a Hugging Face config.json and returns the model it
// describes. Errors name the file and the field.
//
// Fields read (from the top level, or from "text_config" for multimodal
// models such as gemma-3, whose text_config omits fields that then take the
// Transformers defaults of its model_type): num_hidden_layers, hidden_size,
// num_attention_heads, num_key_value_heads (default: num_attention_heads),
// head_dim (default: hidden_size / num_attention_heads), intermediate_size,
// vocab_size, tie_word_embeddings, max_position_embeddings, sliding_window with
// layer_types / sliding_window_pattern / use_sliding_window, num_experts or
// num_local_experts with moe_intermediate_size, and quantization_config.
//
// The parameter count is estimated from the architecture (config.json does
// not carry it): see EstimateParams.
func LoadHFConfig(path string) (Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return Model{}, fmt.Errorf("model config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxHFConfigBytes+1))
	if err != nil {
		return Model{}, fmt.Errorf("model config %s: %w", path, err)
	}
	if len(data) > maxHFConfigBytes {
		return Model{}, fmt.Errorf("model config %s: larger than %d bytes; is it a config.json?", path, maxHFConfigBytes)
	}
	return ParseHFConfig(path, data)
}

// hfConfig is the subset of config.json that sizing needs; pointers tell a
// missing field from a zero.
type hfConfig struct {
	ModelType             string          `json:"model_type"`
	NameOrPath            string          `json:"_name_or_path"`
	Architectures         []string        `json:"architectures"`
	NumHiddenLayers       *int            `json:"num_hidden_layers"`
	HiddenSize            *int            `json:"hidden_size"`
	NumAttentionHeads     *int            `json:"num_attention_heads"`
	NumKeyValueHeads      *int            `json:"num_key_value_heads"`
	HeadDim               *int            `json:"head_dim"`
	IntermediateSize      *int            `json:"intermediate_size"`
	MoEIntermediateSize   *int            `json:"moe_intermediate_size"`
	NumExperts            *int            `json:"num_experts"`
	NumLocalExperts       *int            `json:"num_local_experts"`
	VocabSize             *int            `json:"vocab_size"`
	TieWordEmbeddings     *bool           `json:"tie_word_embeddings"`
	MaxPositionEmbeddings *int            `json:"max_position_embeddings"`
	SlidingWindow         *int            `json:"sliding_window"`
	SlidingWindowPattern  *int            `json:"sliding_window_pattern"`
	UseSlidingWindow      *bool           `json:"use_sliding_window"`
	LayerTypes            []string        `json:"layer_types"`
	QuantizationConfig    *hfQuantization `json:"quantization_config"`
	TextConfig            *hfConfig       `json:"text_config"`
}

type hfQuantization struct {
	QuantMethod string `json:"quant_method"`
	Bits        int    `json:"bits"`
	WBits       int    `json:"w_bit"`
}

// textDefaults are Transformers' defaults (Gemma3TextConfig) for fields a
// config may omit, by model_type; they apply to the top level or to a nested
// text_config, whichever describes the language model.
var textDefaults = map[string]hfConfig{
	"gemma3_text": {
		VocabSize:             ptr(262208),
		MaxPositionEmbeddings: ptr(131072),
		SlidingWindowPattern:  ptr(6),
		TieWordEmbeddings:     ptr(true),
		NumKeyValueHeads:      ptr(4),
		HeadDim:               ptr(256),
		SlidingWindow:         ptr(4096),
	},
}

func ptr[T any](v T) *T { return &v }

// ParseHFConfig is LoadHFConfig on bytes already read; file names the source
// in errors and is the model's name when the config has no _name_or_path.
func ParseHFConfig(file string, data []byte) (Model, error) {
	var top hfConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&top); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			line := 1 + bytes.Count(data[:min(max(te.Offset, 0), int64(len(data)))], []byte("\n"))
			return Model{}, fmt.Errorf("model config %s:%d: %s: want %s, got JSON %s", file, line, te.Field, te.Type, te.Value)
		}
		return Model{}, fmt.Errorf("model config %s: not a JSON config object: %w", file, err)
	}
	if rest := bytes.TrimSpace(data[dec.InputOffset():]); len(rest) > 0 {
		line := 1 + bytes.Count(data[:dec.InputOffset()], []byte("\n"))
		return Model{}, fmt.Errorf("model config %s:%d: not a JSON config object: unexpected data after the object", file, line)
	}
	errf := func(field, format string, args ...any) error {
		return fmt.Errorf("model config %s: %s: %s", file, field, fmt.Sprintf(format, args...))
	}
	c, prefix := top, ""
	if top.TextConfig != nil {
		c, prefix = *top.TextConfig, "text_config."
		// A few fields live at the top level of some multimodal configs.
		if c.TieWordEmbeddings == nil {
			c.TieWordEmbeddings = top.TieWordEmbeddings
		}
		if c.QuantizationConfig == nil {
			c.QuantizationConfig = top.QuantizationConfig
		}
	}
	if d, ok := textDefaults[c.ModelType]; ok {
		c = withDefaults(c, d)
	}
	req := func(p *int, field string) (int, error) {
		if p == nil {
			return 0, errf(prefix+field, "missing")
		}
		if *p <= 0 {
			return 0, errf(prefix+field, "want a positive integer, got %d", *p)
		}
		return *p, nil
	}
	var m Model
	var err error
	if m.NumLayers, err = req(c.NumHiddenLayers, "num_hidden_layers"); err != nil {
		return Model{}, err
	}
	if m.HiddenSize, err = req(c.HiddenSize, "hidden_size"); err != nil {
		return Model{}, err
	}
	if m.NumAttentionHeads, err = req(c.NumAttentionHeads, "num_attention_heads"); err != nil {
		return Model{}, err
	}
	m.NumKVHeads = m.NumAttentionHeads
	if c.NumKeyValueHeads != nil {
		if m.NumKVHeads, err = req(c.NumKeyValueHeads, "num_key_value_heads"); err != nil {
			return Model{}, err
		}
	}
	if m.NumKVHeads > m.NumAttentionHeads || m.NumAttentionHeads%m.NumKVHeads != 0 {
		return Model{}, errf(prefix+"num_key_value_heads", "%d must divide num_attention_heads %d", m.NumKVHeads, m.NumAttentionHeads)
	}
	if c.HeadDim != nil {
		if m.HeadDim, err = req(c.HeadDim, "head_dim"); err != nil {
			return Model{}, err
		}
	} else {
		if m.HiddenSize%m.NumAttentionHeads != 0 {
			return Model{}, errf(prefix+"head_dim", "missing, and hidden_size %d is not a multiple of num_attention_heads %d", m.HiddenSize, m.NumAttentionHeads)
		}
		m.HeadDim = m.HiddenSize / m.NumAttentionHeads
	}
	if m.IntermediateSize, err = req(c.IntermediateSize, "intermediate_size"); err != nil {
		return Model{}, err
	}
	if m.VocabSize, err = req(c.VocabSize, "vocab_size"); err != nil {
		return Model{}, err
	}
	if c.MaxPositionEmbeddings != nil {
		if m.MaxPositionTokens, err = req(c.MaxPositionEmbeddings, "max_position_embeddings"); err != nil {
			return Model{}, err
		}
	}
	m.TieWordEmbeddings = c.TieWordEmbeddings != nil && *c.TieWordEmbeddings

	if err := sliding(&m, c, prefix, errf); err != nil {
		return Model{}, err
	}

	experts := 0
	for _, p := range []*int{c.NumExperts, c.NumLocalExperts} {
		if p != nil && *p > 0 {
			experts = *p
		}
	}
	moeWidth := m.IntermediateSize
	if experts > 0 && c.MoEIntermediateSize != nil {
		if moeWidth, err = req(c.MoEIntermediateSize, "moe_intermediate_size"); err != nil {
			return Model{}, err
		}
	}
	m.Experts = experts
	m.ParamCount = EstimateParams(m, experts, moeWidth)
	if m.ParamCount <= 0 {
		return Model{}, errf(prefix+"hidden_size", "the architecture is too large to count (overflow)")
	}
	m.ParamCountEstimated = true

	if m.WeightsDType, err = weightsDType(c.QuantizationConfig); err != nil {
		return Model{}, errf(prefix+"quantization_config", "%v", err)
	}
	m.Name = top.NameOrPath
	if m.Name == "" {
		m.Name = modelNameFromPath(file)
	}
	m.Source = "config.json " + file + " (parameter count estimated from the architecture)"
	if err := m.Validate(); err != nil {
		return Model{}, fmt.Errorf("model config %s: %w", file, err)
	}
	return m, nil
}

// sliding fills the sliding-window layout: layer_types when present, else
// sliding_window_pattern (every p-th layer global), else sliding_window on
// every layer unless use_sliding_window is false (Qwen's configs carry a
// window they do not use).
func sliding(m *Model, c hfConfig, prefix string, errf func(field, format string, args ...any) error) error {
	if c.SlidingWindow == nil || *c.SlidingWindow <= 0 || (c.UseSlidingWindow != nil && !*c.UseSlidingWindow) {
		return nil
	}
	w := *c.SlidingWindow
	switch {
	case len(c.LayerTypes) > 0:
		if len(c.LayerTypes) != m.NumLayers {
			return errf(prefix+"layer_types", "has %d entries, want num_hidden_layers (%d)", len(c.LayerTypes), m.NumLayers)
		}
		for i, t := range c.LayerTypes {
			switch t {
			case "sliding_attention":
				m.SlidingLayers++
			case "full_attention":
			default:
				return errf(fmt.Sprintf("%slayer_types[%d]", prefix, i), "want \"sliding_attention\" or \"full_attention\", got %q", t)
			}
		}
	case c.SlidingWindowPattern != nil:
		p := *c.SlidingWindowPattern
		if p <= 0 {
			return errf(prefix+"sliding_window_pattern", "want a positive integer, got %d", p)
		}
		m.SlidingLayers = m.NumLayers - m.NumLayers/p // layers i with (i+1) % p == 0 are global
	default:
		m.SlidingLayers = m.NumLayers
	}
	if m.SlidingLayers > 0 {
		m.SlidingWindowTokens = w
	}
	return nil
}

func weightsDType(q *hfQuantization) (DType, error) {
	if q == nil {
		return BF16, nil
	}
	bits := max(q.Bits, q.WBits)
	method := strings.ToLower(q.QuantMethod)
	switch {
	case bits == 4 || method == "awq" || method == "bitsandbytes":
		return INT4, nil
	case strings.Contains(method, "fp8") || bits == 8:
		return FP8, nil
	case method == "compressed-tensors":
		return FP8, nil // the common case; pass --weights-dtype to override
	default:
		return "", fmt.Errorf("quant_method %q with %d bits: not understood (want 4-bit awq/gptq or fp8)", q.QuantMethod, bits)
	}
}

// EstimateParams counts the parameters of a decoder-only transformer with a
// gated MLP (Llama, Qwen, Gemma, Mistral shape):
//
//	embeddings  vocab x hidden, twice unless tied (lm_head)
//	per layer   q and o: 2 x hidden x heads x head_dim
//	            k and v: 2 x hidden x kv_heads x head_dim
//	            MLP:     3 x hidden x width (x experts, plus a hidden x experts router)
//	            norms:   2 x hidden
//	final norm  hidden
//
// Biases, q/k norms and vision towers are left out (under 2% for the models in
// the catalogue). experts = 0 means a dense model. The result is 0 when the
// count would overflow int64.
func EstimateParams(m Model, experts, mlpWidth int) int64 {
	h := float64(m.HiddenSize)
	emb := float64(m.VocabSize) * h
	if !m.TieWordEmbeddings {
		emb *= 2
	}
	attn := 2*h*float64(m.NumAttentionHeads)*float64(m.HeadDim) + 2*h*float64(m.NumKVHeads)*float64(m.HeadDim)
	if mlpWidth == 0 {
		mlpWidth = 4 * m.HiddenSize
	}
	mlp := 3 * h * float64(mlpWidth)
	if experts > 0 {
		mlp = mlp*float64(experts) + h*float64(experts)
	}
	total := emb + float64(m.NumLayers)*(attn+mlp+2*h) + h
	if total >= math.MaxInt64/2 || math.IsNaN(total) {
		return 0
	}
	return int64(total)
}

func withDefaults(c, d hfConfig) hfConfig {
	if c.VocabSize == nil {
		c.VocabSize = d.VocabSize
	}
	if c.MaxPositionEmbeddings == nil {
		c.MaxPositionEmbeddings = d.MaxPositionEmbeddings
	}
	if c.SlidingWindowPattern == nil && len(c.LayerTypes) == 0 {
		c.SlidingWindowPattern = d.SlidingWindowPattern
	}
	if c.TieWordEmbeddings == nil {
		c.TieWordEmbeddings = d.TieWordEmbeddings
	}
	if c.NumKeyValueHeads == nil {
		c.NumKeyValueHeads = d.NumKeyValueHeads
	}
	if c.HeadDim == nil {
		c.HeadDim = d.HeadDim
	}
	if c.SlidingWindow == nil {
		c.SlidingWindow = d.SlidingWindow
	}
	return c
}

// modelNameFromPath names a model after its folder when the file is the
// usual config.json ("models/Qwen3-4B/config.json" -> "Qwen3-4B").
func modelNameFromPath(p string) string {
	base := filepath.Base(p)
	if base == "config.json" {
		if dir := filepath.Base(filepath.Dir(p)); dir != "." && dir != string(filepath.Separator) {
			return dir
		}
	}
	return strings.TrimSuffix(strings.TrimSuffix(base, ".json"), ".config")
}
